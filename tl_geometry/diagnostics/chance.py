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
from jaxtyping import Float, Int
from torch import Tensor

from tl_geometry._hashing import MASK32, hash32
from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.diagnostics.registry import Diagnostic
from tl_geometry.diagnostics.selection import PRECISION, RECALL
from tl_geometry.engine.context import COSINE_EPS, RowCost, SelectionChunk
from tl_geometry.engine.metrics import ball_counts
from tl_geometry.errors import GeometryError

DEFAULT_CONTROLS = 16


def control_orders(
    chunk: SelectionChunk, n_controls: int, seed: int, ranks: int | None = None
) -> Int[Tensor, "row control place"]:
    """Random rankings of each row's visible keys, as ranks of the chunk's own order; hidden ranks last.

    Entry ``[r, c, p]`` is the rank (position in ``chunk.order``) of the key
    that control ``c`` puts at place ``p``; the top-N set of control ``c`` is
    its first N places, so the sets are nested across N. With ``ranks`` only
    the first ``ranks`` ranks are ranked (at least every row's visible ones,
    e.g. `SelectionChunk.seen_ranks`): the same places as the whole order's
    first ``ranks``, since the visible keys come first and the hidden ones
    after them in increasing rank.
    """
    order = chunk.order if ranks is None else chunk.order[:, :ranks]
    device = order.device
    # Positions are counted back from the query's own key (padding and batching leave them alone).
    row_key = hash32(hash32(chunk.head.to(torch.int64) + hash32(torch.full_like(chunk.head, seed, dtype=torch.int64)))
                      + chunk.n_visible.to(torch.int64))  # [row]
    control = torch.arange(n_controls, device=device, dtype=torch.int64)
    lag = (chunk.last_key.unsqueeze(-1) - order).to(torch.int64)  # by rank: the key at each rank, as a lag
    h = hash32(hash32(row_key[:, None] + hash32(control)[None, :])[:, :, None] + lag[:, None, :])
    hidden = torch.arange(order.shape[1], device=device) >= chunk.n_visible.unsqueeze(-1)
    score = h.masked_fill(hidden.unsqueeze(1), MASK32 + 1)  # above every hash: hidden keys sort last
    return torch.sort(score, dim=-1, stable=True).indices


def score_rankings(
    chunk: SelectionChunk, places: Int[Tensor, "row control place"], sizes: Int[Tensor, " size"]
) -> tuple[Float[Tensor, "row control size"], Float[Tensor, "row control size"]]:
    """P(r_max, N) and R(r_min, N) of each ranking for each N of ``sizes``, every ranking scored around its own s(N).

    ``places[r, c, p]`` is the rank (in the chunk's order) of the key at place
    p of ranking c, over the chunk's first ranks (at least every row's visible
    ones); hidden ranks must come last. Distances are the chunk's (Euclidean
    or cosine); closed r_max ball, open r_min ball, as the metrics.

    Everything is laid out by place: the top-N set of a ranking is its first
    N places, so s(N) is one product with a fixed staircase, and the engine's
    `ball_counts` counts the balls of every ranking and N at once.
    """
    n_rows, n_controls, n_keys = places.shape
    sizes = sizes.clamp(max=n_keys)
    n_grid = len(sizes)
    y = chunk.y_sorted[:, :n_keys]  # [row, key, d] by rank
    keys = torch.arange(n_keys, device=places.device)
    rows = torch.arange(n_rows, device=places.device)[:, None, None]
    y_placed = y[rows, places].view(n_rows * n_controls, n_keys, -1)  # [row*control, place, d]
    staircase = (keys < sizes.unsqueeze(-1)).to(y.dtype)  # [n, place]: the top-N sets, by place
    s = torch.matmul(staircase, y_placed)  # [row*control, n, d]
    y_sq = (y * y).sum(-1)
    hidden = keys >= chunk.n_visible.unsqueeze(-1)  # [row, rank]
    if chunk.distance == "euclidean":
        # ||y_i||^2 - 2 <s, y_i> orders keys as D^2 does (||s||^2 left out, as in the metrics); hidden keys +inf.
        y_sq = torch.gather(y_sq.masked_fill(hidden, math.inf), 1, places.view(n_rows, -1))
        near = torch.baddbmm(y_sq.view(-1, 1, n_keys), s, y_placed.transpose(1, 2), alpha=-2)
    else:
        inner = torch.bmm(s, y_placed.transpose(1, 2))
        y_norm = torch.gather(y_sq.sqrt(), 1, places.view(n_rows, -1)).view(-1, 1, n_keys)
        near = 1 - inner / (torch.linalg.vector_norm(s, dim=-1, keepdim=True) * y_norm + COSINE_EPS)
        placed_hidden = torch.gather(hidden, 1, places.view(n_rows, -1)).view(-1, 1, n_keys)
        near = near.masked_fill(placed_hidden, math.inf)
    balls = ball_counts(near.view(n_rows, n_controls, n_grid, n_keys), sizes)
    n = sizes.to(near.dtype)
    return n / (n + balls.k_out.to(near.dtype)), balls.k_in.to(near.dtype) / n


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
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= MASK32:
            raise GeometryError(f"settings['chance'].seed: expected an integer in [0, 2^32), got {self.seed!r}")


# The declarations, by name: ``result.per_head(EXCESS_RECALL)`` reads a field as ``result.per_head("excess_recall")``.
CHANCE_PRECISION_FLOOR = FieldSpec(
    "chance_precision_floor", "N / L: the least Precision any N keys can score (L visible keys)", ("n",))
CHANCE_PRECISION = FieldSpec("chance_precision", "mean Precision of random top-N sets (nested random rankings)", ("n",))
CHANCE_RECALL = FieldSpec("chance_recall", "mean Recall of random top-N sets (nested random rankings)", ("n",))
# Intervals on request (bootstrap_fields): replicates of two more N curves would double a result file.
EXCESS_PRECISION = FieldSpec("excess_precision", "Precision minus chance_precision, per row", ("n",), bootstrap=True)
EXCESS_RECALL = FieldSpec("excess_recall", "Recall minus chance_recall, per row", ("n",), bootstrap=True)
# Each metric's chance level and excess over it, by the metric's declaration (``CHANCE_OF[RECALL]``).
CHANCE_OF = {PRECISION: CHANCE_PRECISION, RECALL: CHANCE_RECALL}
EXCESS_OF = {PRECISION: EXCESS_PRECISION, RECALL: EXCESS_RECALL}


class ChanceDiagnostic(Diagnostic):
    name = "chance"
    Settings = ChanceSettings
    # Per row, for the row's own ranking and each control: its y by place (key x d), and its
    # proximities, the counting kernel's scratch and its flags (a bool plane, counted as a float) (n x key).
    cost = RowCost(key_d=DEFAULT_CONTROLS + 1, n_key=3 * (DEFAULT_CONTROLS + 1))
    fields = (CHANCE_PRECISION_FLOOR, CHANCE_PRECISION, CHANCE_RECALL, EXCESS_PRECISION, EXCESS_RECALL)

    def rows(self, chunk: SelectionChunk, settings: ChanceSettings) -> dict[str, Tensor]:
        n_rows = chunk.n_rows
        # Only the ranks and N some row of the chunk sees (a sliding-window row of a long context: its window's):
        # past them every key is hidden and every N missing, in every row.
        ranks, sizes = chunk.seen_ranks(), chunk.seen_sizes()
        controls = control_orders(chunk, settings.n_controls, settings.seed, ranks)
        own = torch.arange(ranks, device=controls.device).expand(n_rows, 1, ranks)  # the row's own ranking
        precision, recall = score_rankings(chunk, torch.cat([own, controls], dim=1), chunk.grid[sizes])
        if not bool(sizes.all()):  # back on the whole grid: the other N are missing in every row
            columns = sizes.nonzero().squeeze(-1)
            precision, recall = (t.new_full((*t.shape[:2], len(chunk.grid)), math.nan).index_copy_(2, columns, t)
                                 for t in (precision, recall))
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
