"""The attention-sink effect (paper section 4.1, Figure 6): corr(R(r_min, N), rho_0) as a function of N.

For every N of the grid, Recall ``R(r_min, N)`` is correlated with the sink
similarity ``rho_0 = mean_j cos(v_0, v_j)`` across heads. Two pairings:

- ``over="heads"`` (default, as in the paper's per-head figures): one pair per
  (layer, head), each the mean over sequences (nanmean) of R and of rho_0;
- ``over="sequence_heads"``: one pair per (sequence, layer, head).

Pairs with a NaN (N larger than a sequence's visible keys) are left out of
that N. Spearman uses average ranks for ties (Recall takes few distinct
values). The confidence interval is a percentile bootstrap over sequences
(resampled with replacement, seeded): each resample reweights the sequences
by their multiplicities, so no data are copied. With fewer than two sequences
there is nothing to resample and the bounds are NaN.
"""

import math
from dataclasses import dataclass, fields
from typing import Literal, get_args

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tl_geometry.errors import GeometryError

Pairing = Literal["heads", "sequence_heads"]
_CHUNK_ELEMENTS = 1 << 23  # bootstrap resamples per chunk are bounded by this many (resample x n x pair) entries


@dataclass(frozen=True)
class SinkRecallCorrelation:
    """corr(R(r_min, N), rho_0) for every N, with bootstrap bounds (each ``[n]``).

    Attributes:
        n_grid: the selection sizes N.
        pearson, spearman: the correlations over the pairs (NaN with fewer than 3 pairs or no spread).
        pearson_low, pearson_high, spearman_low, spearman_high: percentile
            bootstrap bounds over sequences at level ``confidence`` (NaN with one sequence).
        n_pairs: pairs entering each N (float).
        over: the pairing, ``"heads"`` or ``"sequence_heads"``.
        confidence: the level of the bounds.
        n_bootstrap: the number of resamples.
        seed: the seed of the resampling.
    """

    n_grid: Int[Tensor, " n"]
    pearson: Float[Tensor, " n"]
    spearman: Float[Tensor, " n"]
    pearson_low: Float[Tensor, " n"]
    pearson_high: Float[Tensor, " n"]
    spearman_low: Float[Tensor, " n"]
    spearman_high: Float[Tensor, " n"]
    n_pairs: Float[Tensor, " n"]
    over: str
    confidence: float
    n_bootstrap: int
    seed: int

    def __post_init__(self) -> None:
        for f in fields(self):
            t = getattr(self, f.name)
            if isinstance(t, Tensor) and t.shape != self.n_grid.shape:
                raise GeometryError(f"SinkRecallCorrelation.{f.name}: expected shape {list(self.n_grid.shape)}, got {list(t.shape)}")


def _weighted_pearson(
    x: Float[Tensor, "*b pair"], y: Float[Tensor, "*b pair"], w: Float[Tensor, "*b pair"]
) -> Float[Tensor, "*b"]:
    total = w.sum(-1, keepdim=True)
    mx = (w * x).sum(-1, keepdim=True) / total
    my = (w * y).sum(-1, keepdim=True) / total
    dx, dy = x - mx, y - my
    cov, vx, vy = (w * dx * dy).sum(-1), (w * dx * dx).sum(-1), (w * dy * dy).sum(-1)
    r = cov / (vx * vy).sqrt()
    # Fewer than 3 distinct pairs or a constant variable: no correlation to speak of.
    undefined = ((w > 0).sum(-1) < 3) | (vx <= 1e-12 * total.squeeze(-1) * (mx.squeeze(-1) ** 2 + 1)) | (vy <= 1e-24)
    return r.masked_fill(undefined, math.nan).clamp(-1, 1)


def _weighted_ranks(x: Float[Tensor, "*b pair"], w: Float[Tensor, "*b pair"]) -> Float[Tensor, "*b pair"]:
    """Average ranks (1-based) of x in the sample where pair i appears w_i times; entries with w = 0 do not count."""
    key = x.masked_fill(w <= 0, math.inf)
    ordered, order = torch.sort(key, dim=-1)
    cum = torch.cat([torch.zeros_like(w[..., :1]), w.gather(-1, order).cumsum(-1)], dim=-1)
    below = cum.gather(-1, torch.searchsorted(ordered, key.contiguous(), right=False))
    upto = cum.gather(-1, torch.searchsorted(ordered, key.contiguous(), right=True))
    return below + (upto - below + 1) / 2


def _correlations(
    x: Float[Tensor, "*b pair"], y: Float[Tensor, "*b pair"], w: Float[Tensor, "*b pair"]
) -> tuple[Float[Tensor, "*b"], Float[Tensor, "*b"]]:
    w = w * ~(x.isnan() | y.isnan())
    x, y = torch.nan_to_num(x), torch.nan_to_num(y)
    return _weighted_pearson(x, y, w), _weighted_pearson(_weighted_ranks(x, w), _weighted_ranks(y, w), w)


def _pairs(
    recall: Float[Tensor, "sequence layer head_index n"], rho0: Float[Tensor, "sequence layer head_index"],
    weights: Float[Tensor, "b sequence"], over: str,
) -> tuple[Float[Tensor, "b n pair"], Float[Tensor, "b n pair"], Float[Tensor, "b n pair"]]:
    """(recall, rho0, weight) of every pair for every N, under each weighting of the sequences."""
    b, n = weights.shape[0], recall.shape[-1]
    if over == "heads":
        def mean(t: Tensor) -> Tensor:  # weighted nanmean over sequences: [b, ...]
            present = ~t.isnan()
            total = torch.einsum("bs,s...->b...", weights, torch.nan_to_num(t))
            count = torch.einsum("bs,s...->b...", weights, present.double())
            return (total / count).masked_fill(count == 0, math.nan)

        x = mean(recall).flatten(1, 2).transpose(1, 2)  # [b, n, layer*head]
        y = mean(rho0).flatten(1).unsqueeze(1).expand_as(x)
        return x, y, torch.ones_like(x)
    s = recall.shape[0]
    x = recall.permute(3, 0, 1, 2).reshape(1, n, -1).expand(b, -1, -1)
    y = rho0.reshape(1, 1, -1).expand_as(x)
    w = weights[:, :, None].expand(b, s, recall.shape[1] * recall.shape[2]).reshape(b, 1, -1).expand_as(x)
    return x, y, w


def sink_recall_correlation(
    result: object,
    *,
    over: str = "heads",
    n_bootstrap: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> SinkRecallCorrelation:
    """corr(R(r_min, N), rho_0) across heads for every N of a result's grid (Figure 6), with bootstrap bounds.

    Args:
        result: a GeometryResult run with ``diagnostics=["assumptions"]`` (it
            needs ``per_sequence["rho0"]`` and ``per_sequence["recall"]``).
        over: ``"heads"`` (pairs are per-head means over sequences) or
            ``"sequence_heads"`` (one pair per sequence and head).
        n_bootstrap: resamples of the sequences for the bounds.
        confidence: level of the percentile bounds, in (0, 1).
        seed: seed of the resampling (a private generator; global RNG untouched).

    Returns:
        SinkRecallCorrelation with ``[n]`` tensors.

    Raises:
        GeometryError: the result lacks rho0 (run without the "assumptions"
            diagnostic), or a bad ``over``, ``n_bootstrap`` or ``confidence``.
    """
    per_sequence = getattr(result, "per_sequence", None)
    if per_sequence is None or "rho0" not in per_sequence:
        raise GeometryError(
            "result: no 'rho0' field; run run_with_geometry_hooks(..., diagnostics=['assumptions']) to measure "
            "the sink similarity"
        )
    if over not in get_args(Pairing):
        raise GeometryError(f"over: expected {' or '.join(map(repr, get_args(Pairing)))}, got {over!r}")
    if n_bootstrap < 1:
        raise GeometryError(f"n_bootstrap: expected an integer >= 1, got {n_bootstrap}")
    if not 0 < confidence < 1:
        raise GeometryError(f"confidence: expected a level in (0, 1), e.g. 0.95, got {confidence}")
    recall = per_sequence["recall"].double()
    rho0 = per_sequence["rho0"].double()
    s, n = recall.shape[0], recall.shape[-1]
    x, y, w = _pairs(recall, rho0, torch.ones(1, s, dtype=torch.float64), over)
    pearson, spearman = (c[0] for c in _correlations(x, y, w))
    n_pairs = (w * ~(x.isnan() | y.isnan()))[0].sum(-1)
    bounds = torch.full((4, n), math.nan, dtype=torch.float64)
    if s >= 2:
        generator = torch.Generator().manual_seed(seed)
        draws = torch.randint(0, s, (n_bootstrap, s), generator=generator)
        weights = torch.zeros(n_bootstrap, s, dtype=torch.float64).scatter_add_(1, draws, torch.ones_like(draws, dtype=torch.float64))
        chunk = max(1, _CHUNK_ELEMENTS // max(1, n * x.shape[-1]))
        boot = [torch.stack(_correlations(*_pairs(recall, rho0, part, over))) for part in weights.split(chunk)]
        stats = torch.cat(boot, dim=1)  # [2, b, n]
        tail = (1 - confidence) / 2
        q = torch.nanquantile(stats, torch.tensor([tail, 1 - tail], dtype=torch.float64), dim=1)  # [2 q, 2 stat, n]
        bounds = torch.stack([q[0, 0], q[1, 0], q[0, 1], q[1, 1]])
    return SinkRecallCorrelation(
        n_grid=torch.as_tensor(getattr(result, "n_grid")).long(),
        pearson=pearson.float(),
        spearman=spearman.float(),
        pearson_low=bounds[0].float(),
        pearson_high=bounds[1].float(),
        spearman_low=bounds[2].float(),
        spearman_high=bounds[3].float(),
        n_pairs=n_pairs.float(),
        over=over,
        confidence=confidence,
        n_bootstrap=n_bootstrap,
        seed=seed,
    )
