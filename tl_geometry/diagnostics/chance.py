"""Chance baselines: what a random selection of the same size gives, on exactly the rows of the metrics.

Two baselines for every analysed row and N:

- the analytic floor of Precision, N / L (L the keys the query sees):
  K_out can never exceed the L - N non-selected keys, so no selection of N
  keys scores less;
- random controls (the follow-up protocol): ``n_controls`` random rankings
  of the visible keys per row, each nested across N (the top-N set of a
  control is the first N keys of its ranking) and each scored around its own
  aggregate s(N) = sum of y_i over its set, with the run's distance. Their
  mean Precision and Recall are the chance level; the row's own P and R are
  scored by the same code, and ``excess_*`` is the difference, per row, so
  that it is accumulated (and bootstrapped) like every other field.

The rankings are drawn from a counter-based hash of (seed, head, the
query's visible keys, control, and each key's lag behind the query), so the
same rows give the same controls whatever the padding, batching or chunking.
They do not depend on the row's values: a control is independent of the
data it is scored on. All controls of a chunk are scored in one batched
product.
"""

import math
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.diagnostics.registry import Diagnostic
from tl_geometry.engine.context import COSINE_EPS, RowCost, SelectionChunk
from tl_geometry.errors import GeometryError

DEFAULT_CONTROLS = 16

_MASK32 = 0xFFFFFFFF


def _hash32(x: Int[Tensor, "*shape"]) -> Int[Tensor, "*shape"]:
    """A 32-bit integer mix (lowbias32) of int64 tensors holding values in [0, 2^32); wraps like uint32."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def control_orders(chunk: SelectionChunk, n_controls: int, seed: int) -> Int[Tensor, "row control key"]:
    """Random rankings of each row's visible keys, as ranks of the chunk's own order; hidden ranks last.

    Entry ``[r, c, p]`` is the rank (position in ``chunk.order``) of the key
    that control ``c`` puts at place ``p``; the top-N set of control ``c`` is
    its first N places, so the sets are nested across N.
    """
    n_rows, n_keys = chunk.alpha.shape
    device = chunk.order.device
    # Positions are counted back from the query's own key (padding and batching leave them alone).
    row_key = _hash32(_hash32(chunk.head.to(torch.int64) + _hash32(torch.full_like(chunk.head, seed, dtype=torch.int64)))
                      + chunk.n_visible.to(torch.int64))  # [row]
    control = torch.arange(n_controls, device=device, dtype=torch.int64)
    lag = (chunk.last_key.unsqueeze(-1) - chunk.order).to(torch.int64)  # by rank: the key at each rank, as a lag
    h = _hash32(_hash32(row_key[:, None] + _hash32(control)[None, :])[:, :, None] + lag[:, None, :])
    score = h.to(torch.float64)
    hidden = torch.arange(n_keys, device=device) >= chunk.n_visible.unsqueeze(-1)
    score = score.masked_fill(hidden.unsqueeze(1), math.inf)
    return torch.sort(score, dim=-1, stable=True).indices


def score_rankings(
    chunk: SelectionChunk, places: Int[Tensor, "row control key"]
) -> tuple[Float[Tensor, "row control n"], Float[Tensor, "row control n"]]:
    """P(r_max, N) and R(r_min, N) of each ranking, every ranking scored around its own s(N).

    ``places[r, c, p]`` is the rank (in the chunk's order) of the key at place
    p of ranking c; hidden ranks must come last. Distances are the chunk's
    (Euclidean or cosine); closed r_max ball, open r_min ball, as the metrics.
    """
    n_rows, n_controls, n_keys = places.shape
    grid = chunk.grid
    d_head = chunk.y_sorted.shape[-1]
    y = chunk.y_sorted  # [row, key, d] by rank
    # Each ranking's y in its own order, prefix-summed: s_c(N) at the grid.
    y_placed = torch.gather(
        y.unsqueeze(1).expand(n_rows, n_controls, n_keys, d_head), 2, places.unsqueeze(-1).expand(-1, -1, -1, d_head)
    )
    s = torch.cumsum(y_placed, dim=2)[:, :, grid.clamp(max=n_keys) - 1]  # [row, control, n, d]
    del y_placed
    inner = torch.bmm(s.reshape(n_rows, n_controls * len(grid), d_head), y.transpose(1, 2))  # [row, c*n, key]
    inner = inner.reshape(n_rows, n_controls, len(grid), n_keys)
    y_sq = (y * y).sum(-1)[:, None, None, :]
    if chunk.distance == "euclidean":
        near = y_sq - 2 * inner  # orders keys as D^2 does (||s||^2 left out, as in the metrics)
    else:
        s_norm = torch.linalg.vector_norm(s, dim=-1).unsqueeze(-1)
        near = 1 - inner / (s_norm * y_sq.sqrt() + COSINE_EPS)
    hidden = torch.arange(n_keys, device=near.device) >= chunk.n_visible.unsqueeze(-1)  # by rank
    near = near.masked_fill(hidden[:, None, None, :], math.inf)
    # Place of every rank in each ranking, then membership of the top-N set.
    place_of = torch.empty_like(places).scatter_(2, places, torch.arange(n_keys, device=places.device).expand_as(places))
    selected: Bool[Tensor, "row control n key"] = place_of.unsqueeze(2) < grid[None, None, :, None]
    inf = near.new_tensor(math.inf)
    far_in = torch.where(selected, near, -inf).amax(-1, keepdim=True)
    near_out = torch.where(selected, inf, near).amin(-1, keepdim=True)
    n = grid.to(near.dtype)
    k_out = (near <= far_in).sum(-1).to(near.dtype) - n  # every selected key lies in the closed ball
    k_in = (near < near_out).sum(-1).to(near.dtype)  # no non-selected key lies in the open ball
    return n / (n + k_out), k_in / n


@dataclass(frozen=True)
class ChanceSettings:
    """Settings of the chance diagnostic.

    Attributes:
        n_controls: random rankings per row (>= 1; the follow-up protocol uses 16).
        seed: the seed of the rankings' hash (>= 0).
    """

    n_controls: int = DEFAULT_CONTROLS
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.n_controls, bool) or not isinstance(self.n_controls, int) or self.n_controls < 1:
            raise GeometryError(
                f"settings['chance'].n_controls: expected a positive integer (random rankings per row), "
                f"got {self.n_controls!r}"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= _MASK32:
            raise GeometryError(f"settings['chance'].seed: expected an integer in [0, 2^32), got {self.seed!r}")


class ChanceDiagnostic(Diagnostic):
    name = "chance"
    Settings = ChanceSettings
    # Per row: DEFAULT_CONTROLS rankings' y and prefix sums (key x d each), and their n x key
    # proximities with the selection masks and a comparison scratch.
    cost = RowCost(key_d=2 * DEFAULT_CONTROLS, n_key=4 * DEFAULT_CONTROLS)
    fields = (
        FieldSpec("chance_precision_floor", "N / L: the least Precision any N keys can score (L visible keys)", ("n",)),
        FieldSpec("chance_precision", "mean Precision of random top-N sets (nested random rankings)", ("n",)),
        FieldSpec("chance_recall", "mean Recall of random top-N sets (nested random rankings)", ("n",)),
        # Intervals on request (bootstrap_fields): replicates of two more N curves would double a result file.
        FieldSpec("excess_precision", "Precision minus chance_precision, per row", ("n",)),
        FieldSpec("excess_recall", "Recall minus chance_recall, per row", ("n",)),
    )

    def rows(self, chunk: SelectionChunk, settings: ChanceSettings) -> dict[str, Tensor]:
        n_rows, n_keys = chunk.alpha.shape
        controls = control_orders(chunk, settings.n_controls, settings.seed)
        own = torch.arange(n_keys, device=controls.device).expand(n_rows, 1, n_keys)  # the row's own ranking
        precision, recall = score_rankings(chunk, torch.cat([own, controls], dim=1))
        n = chunk.grid.to(precision.dtype)
        out = {
            "chance_precision_floor": n / chunk.n_visible.unsqueeze(-1).to(precision.dtype),
            "chance_precision": precision[:, 1:].mean(1),
            "chance_recall": recall[:, 1:].mean(1),
        }
        out["excess_precision"] = precision[:, 0] - out["chance_precision"]
        out["excess_recall"] = recall[:, 0] - out["chance_recall"]
        return {name: t.masked_fill(chunk.missing, math.nan) for name, t in out.items()}


DIAGNOSTIC = ChanceDiagnostic()
