"""The attention-sink effect (paper section 4.1, Figure 6): corr(R(r_min, N), rho_0) as a function of N.

For every N of the grid, Recall ``R(r_min, N)`` is correlated with the sink
similarity ``rho_0 = mean_j cos(v_0, v_j)`` across heads: one pair per
(layer, head), each the mean over documents of R and of rho_0 (as in the
paper's per-head figures). Pairs with a NaN (N larger than every document's
visible keys) are left out of that N. Spearman uses average ranks for ties
(Recall takes few distinct values).

The bounds are a percentile bootstrap over documents from the result's own
Poisson-bootstrap replicates of ``recall`` and ``rho0``: for each replicate,
the same correlations of its per-head replicate means.

Each head's means carry the documents' noise, which pulls the correlation
towards 0. ``disattenuated`` corrects Pearson's for it (Spearman's
correction, `tl_geometry.analysis.correlation.disattenuated_pearson`, with
the errors' (co)variances from the replicates times n / (n - 1) for n
documents), as the claims scorecard does at N = 3; its bounds are the basic
interval on Fisher's z of the replicates' disattenuated correlations in a
bootstrap world as noisy as the real one (`shrunk_replicates`), pivoting on
the uncorrected value, at the plain level (docs: The paper's claims,
"Intervals"; `replicate_z` says what a replicate corrected to +-1 counts
as). A result keeps
statistics over documents, not each document's values, so the pairing
``over="sequence_heads"`` of format-1 results (one pair per sequence and head) is gone. With
fewer than two documents, or without replicates of both fields, the bounds
are NaN and ``n_bootstrap`` is 0.
"""

import math
from dataclasses import dataclass, fields
from typing import Literal, get_args

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tl_geometry.analysis.correlation import correlations, disattenuated_correlation, fisher_z, replicate_z
from tl_geometry.diagnostics.assumptions import RHO0
from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.diagnostics.selection import RECALL
from tl_geometry.errors import GeometryError
from tl_geometry.results.display import field_summary
from tl_geometry.results.result import GeometryResult

Pairing = Literal["heads"]
_CHUNK_ELEMENTS = 1 << 23  # replicates per chunk are bounded by this many (replicate x n x pair) entries


@dataclass(frozen=True)
class SinkRecallCorrelation:
    """corr(R(r_min, N), rho_0) for every N, with bootstrap bounds (each ``[n]``).

    Attributes:
        n_grid: the selection sizes N.
        pearson, spearman: the correlations over the pairs (NaN with fewer than 3 pairs or no spread).
        pearson_low, pearson_high, spearman_low, spearman_high: percentile
            bootstrap bounds over documents at level ``confidence`` (NaN
            without replicates or with one document).
        disattenuated, disattenuated_low, disattenuated_high: Pearson's
            correlation of the heads' true means, corrected for the noise of
            their means over documents, and its bounds (NaN without
            replicates, with one document, or where the heads spread less
            than their noise).
        n_pairs: pairs entering each N (float).
        over: the pairing, ``"heads"``.
        confidence: the level of the bounds.
        n_bootstrap: the replicates behind the bounds (0: no bounds).
    """

    n_grid: Int[Tensor, " n"]
    pearson: Float[Tensor, " n"]
    spearman: Float[Tensor, " n"]
    pearson_low: Float[Tensor, " n"]
    pearson_high: Float[Tensor, " n"]
    spearman_low: Float[Tensor, " n"]
    spearman_high: Float[Tensor, " n"]
    disattenuated: Float[Tensor, " n"]
    disattenuated_low: Float[Tensor, " n"]
    disattenuated_high: Float[Tensor, " n"]
    n_pairs: Float[Tensor, " n"]
    over: str
    confidence: float
    n_bootstrap: int

    def __repr__(self) -> str:  # a line per field, not every N of every tensor
        return field_summary(self, "correlation.pearson is [n], at the N of correlation.n_grid").text()

    def _repr_html_(self) -> str:
        return field_summary(self, "correlation.pearson is [n], at the N of correlation.n_grid").html()

    def __post_init__(self) -> None:
        for f in fields(self):
            t = getattr(self, f.name)
            if isinstance(t, Tensor) and t.shape != self.n_grid.shape:
                raise GeometryError(f"SinkRecallCorrelation.{f.name}: expected shape {list(self.n_grid.shape)}, got {list(t.shape)}")


def _pairs(
    recall: Float[Tensor, "*b layer head_index n"], rho0: Float[Tensor, "*b layer head_index"]
) -> tuple[Float[Tensor, "*b n pair"], Float[Tensor, "*b n pair"]]:
    """(recall, rho0) of every head for every N: one pair per (layer, head)."""
    x = recall.flatten(-3, -2).transpose(-1, -2)  # [*b, n, layer*head]
    y = rho0.flatten(-2).unsqueeze(-2).expand_as(x)
    return x, y


def sink_recall_correlation(
    result: GeometryResult,
    *,
    over: str = "heads",
    n_bootstrap: int | None = None,
    confidence: float = 0.95,
    seed: int | None = None,
) -> SinkRecallCorrelation:
    """corr(R(r_min, N), rho_0) across heads for every N of a result's grid (Figure 6), with bootstrap bounds.

    Args:
        result: a GeometryResult run with ``diagnostics=["assumptions"]`` (it
            needs the fields ``recall`` and ``rho0``).
        over: ``"heads"``, the one pairing a result supports.
        n_bootstrap: None (default) uses the result's replicates; an integer
            must equal their number (0: skip the bounds). Kept for calls
            written when this function resampled the sequences itself.
        confidence: level of the percentile bounds, in (0, 1).
        seed: ignored (kept for older calls): the replicates were drawn when the
            result was analysed, with the run's bootstrap seed.

    Returns:
        SinkRecallCorrelation with ``[n]`` tensors.

    Raises:
        GeometryError: the result lacks rho0 (run without the "assumptions"
            diagnostic), ``over="sequence_heads"`` (needs per-document
            values), or a bad ``over``, ``n_bootstrap`` or ``confidence``.
    """
    if not isinstance(result, GeometryResult):
        raise GeometryError(f"result: expected a GeometryResult, got {type(result).__name__}")
    if RHO0.name not in result.fields or RECALL.name not in result.fields:
        raise GeometryError(
            "result: no 'rho0' field; run run_with_geometry_hooks(..., diagnostics=['assumptions']) to measure "
            "the sink similarity"
        )
    if over == "sequence_heads":
        raise GeometryError(
            "over='sequence_heads' needs each document's values, and a GeometryResult keeps statistics over "
            "documents instead; use over='heads' (per-head means), or analyse with keep_queries=True and pair "
            "the per-query rows yourself"
        )
    if over not in get_args(Pairing):
        raise GeometryError(f"over: expected {' or '.join(map(repr, get_args(Pairing)))}, got {over!r}")
    if not 0 < confidence < 1:
        raise GeometryError(f"confidence: expected a level in (0, 1), e.g. 0.95, got {confidence}")
    kept = min(_replicates_kept(result, RECALL), _replicates_kept(result, RHO0))
    if n_bootstrap is not None and n_bootstrap not in (0, kept):
        raise GeometryError(
            f"n_bootstrap: the bounds use the result's {kept} bootstrap replicates of recall and rho0, drawn when "
            f"it was analysed; got n_bootstrap={n_bootstrap}. Pass None (or 0 for no bounds), or analyse again "
            "with GeometryConfig(n_bootstrap=...) and recall and rho0 in GeometryConfig.bootstrap_fields"
        )
    x, y = _pairs(result.per_head(RECALL).double(), result.per_head(RHO0).double())
    ones = torch.ones_like(x)
    pearson, spearman = correlations(x, y, ones)
    n_pairs = (~(x.isnan() | y.isnan())).double().sum(-1)
    n = x.shape[0]
    bounds = torch.full((4, n), math.nan, dtype=torch.float64)
    corrected = torch.full((3, n), math.nan, dtype=torch.float64)
    used = kept if n_bootstrap != 0 and result.n_documents >= 2 else 0  # one document: nothing to resample
    if used:
        corrected = _disattenuated(result, x, y, pearson, confidence)
        recall, rho0 = result.replicates(RECALL).double(), result.replicates(RHO0).double()
        chunk = max(1, _CHUNK_ELEMENTS // max(1, n * x.shape[-1]))
        boot = [
            torch.stack(correlations(*_pairs(r, h), torch.ones(len(r), n, x.shape[-1], dtype=torch.float64)))
            for r, h in zip(recall.split(chunk), rho0.split(chunk))
        ]
        stats = torch.cat(boot, dim=1)  # [2 stat, replicate, n]
        tail = (1 - confidence) / 2
        q = torch.nanquantile(stats, torch.tensor([tail, 1 - tail], dtype=torch.float64), dim=1)  # [2 q, 2 stat, n]
        bounds = torch.stack([q[0, 0], q[1, 0], q[0, 1], q[1, 1]])
    return SinkRecallCorrelation(
        n_grid=result.n_grid.long(),
        pearson=pearson.float(),
        spearman=spearman.float(),
        pearson_low=bounds[0].float(),
        pearson_high=bounds[1].float(),
        spearman_low=bounds[2].float(),
        spearman_high=bounds[3].float(),
        disattenuated=corrected[0].float(),
        disattenuated_low=corrected[1].float(),
        disattenuated_high=corrected[2].float(),
        n_pairs=n_pairs.float(),
        over=over,
        confidence=confidence,
        n_bootstrap=used,
    )


def _disattenuated(
    result: GeometryResult, x: Float[Tensor, "n pair"], y: Float[Tensor, "n pair"], pearson: Float[Tensor, " n"],
    confidence: float,
) -> Float[Tensor, "3 n"]:
    """The disattenuated correlation at every N and its bounds (the module docstring says how)."""
    rx, ry = _pairs(result.replicates(RECALL).double(), result.replicates(RHO0).double())  # [replicate, n, pair]
    corrected = disattenuated_correlation(x, y, rx, ry, result.n_documents)
    deviations = replicate_z(corrected.replicates) - fisher_z(pearson)  # around the bootstrap world's truth
    tail = (1 - confidence) / 2
    q = torch.nanquantile(deviations, torch.tensor([tail, 1 - tail], dtype=torch.float64), dim=0)  # [2, n]
    z = fisher_z(corrected.value)
    return torch.stack([corrected.value, torch.tanh(z - q[1]), torch.tanh(z - q[0])])


def _replicates_kept(result: GeometryResult, field: FieldSpec) -> int:
    return result.stats[field.name].n_replicates
