"""Margins and the theoretical envelopes of Theorems 1-2 and Corollary 1 (paper section 3.4, appendix A.1).

For one query row and a selection size N, with effective weights
a_i = alpha_i ||v_i|| and cosines rho_jk = cos(v_j, v_k), keys sorted as the
selection context sorts them, I_N the top N, I' = I_N minus the sink (key 0)
and z = 1 when the sink is selected:

- S_in = sum of a_k over I', a_min_in / a_max_in = min / max of a_i over I',
  a_max_out = max of a_j over the visible keys outside I_N;
- rho_out = max cos between a key outside I_N and one in I'; rho_in = min cos
  between two keys of I'; rho0_in = min cos(v_0, v_k) over I'; rho0_out =
  max cos(v_0, v_j) over the keys outside I_N;
- the paper's margins (eq. 8, 27-29): Delta = a_min_in^2 - 2 a_max_out S_in rho_out,
  Delta_0 = a_0^2 - (S_in rho_out)^2, B = a_max_in + a_max_out + S_in;
- the sink-aware margins (derived on the docs' Concepts page, "A lower
  envelope that bounds"; x+ = max(x, 0), x- = min(x, 0)):
  Delta' = a_min_in^2 - 2 a_max_out (S_in rho_out+ + z a_0 rho0_out+)
           + 2 a_max_in (S_in - a_min_in) rho_in- + 2 z a_0 a_max_in rho0_in-,
  Delta_0' = a_0^2 - 2 a_max_out (S_in rho_out+ + a_0 rho0_out+) + 2 a_0 S_in rho0_in,
  B' = max of a over I_N + a_max_out + sum of a over I_N. Delta' and Delta_0'
  bound every pair's gap D_j^2 - D_i^2 from below; the paper's need not;
- lower envelopes (eq. 12, 14; capped at 0 as in Figure 5):
  P >= 1 / (1 + T), R >= max(0, 1 - T) with
  T = (L - N) e^{-kappa d (Delta/S)^2} + (L - N)/N e^{-kappa d (Delta_0/S)^2},
  S = B'^2 with the sink-aware margins (default; unchanged when the value
  vectors are rescaled) and S = B with ``variant="paper"`` (as printed);
- upper envelopes (eq. 13, 15): P <= 1 - max_{i,j} p_-ij / (N + 1),
  R <= (1/N) sum_{i in I_N} (1 - max_j p_-ij), p_-ij from eq. 9-10 with
  sigma = S / sqrt(2 kappa d): statements about the expectation over value
  states, to be compared with means over rows, not with single rows;
- F(r_min) and F(r_max) envelopes: 2x / (1 + x) of the R and P envelopes
  (Corollary 1; the map is increasing, so it carries the bounds over).

What the upper envelopes bound. With the measured cosines mu_ij is the
row's realised gap, so sigma spreads a Gaussian around the row that was
measured: eq. 13 and 15 then bound the mean over value states re-drawn
around that row, not the row itself. A measured row with no intruder
(r_min > r_max, so P = R = 1) lies above them whenever some p_- > 0, and
P's envelope never falls below 1 - 1/2 / (N + 1) (p_- <= 1/2), whatever the
data: its floor. The bound on the measured row is the same derivation
with the realised event in place of its Gaussian tail
(`realised_upper_bounds`): one intruder in the closed r_max ball (the event
r_min <= r_max) makes P <= N / (N + 1) and leaves the farthest selected key
outside the open r_min ball, R <= (N - 1) / N:
P <= 1 - 1{r_min <= r_max} / (N + 1) and R <= 1 - 1{r_min <= r_max} / N,
never exceeded by the row, nor by any mean of rows.

Readings chosen where the paper is ambiguous (listed on the docs page too):

1. Delta_0 of ``variant="paper"`` uses rho_out (appendix eq. 29), not the
   undefined rho_in of section 3.4.
2. a_max_in (used in B, never defined) is the max of a_i over I', the mirror
   of a_min_in's definition; 0 when that set is empty.
3. phi in p_-ij (eq. 9) is the standard normal density: phi(xi) / (xi + 1/xi)
   = phi(xi) xi / (1 + xi^2) is the Mills-ratio lower bound of the Gaussian
   tail P{X_ij <= 0} = 1 - Phi(xi), and 1/2 for xi < 0 is that tail's
   lower bound there. Written as phi(xi) xi / (1 + xi^2), so xi = 0 gives 0.
4. mu_ij is the mean gap of eq. 25 (the proof's definition mu_ij := E X_ij),
   summed over all of I_N, the sink included: with the measured cosines it
   is D_j^2 - D_i^2 exactly. Eq. 10's M_j drops the sink from the sum; we
   keep it because the sink pulls s(N) most of all (section 4.1).
5. max_{j} p_-ij is p_- at the closest pair, i.e. the smallest xi (the pair
   most likely to swap, which maximises the Gaussian tail that p_- bounds).
   p_-(xi) itself is not monotone for xi >= 0, so this can be smaller than
   the literal maximum; the upper envelope is then larger, never tighter.
6. L is the number of visible keys, the sink included, so that L - N is
   the number of non-selected keys the union bound of the proof sums over.
7. A margin <= 0 gives no concentration: the tail factor is 1 there (the
   theorem assumes Delta > 0, and squaring a negative margin would turn a
   violated assumption into a strong guarantee).
8. The Delta term is present only when I' is non-empty, the Delta_0 term
   only when the sink is in I_N (the pairs each bounds); the margins are NaN
   where their term is absent.
9. N = L (everything selected): no pair, every envelope is 1. N > L: the
   top-N set does not exist; every field is NaN.
10. N = 1: s(1) = y_1, so the selected key's distance is 0 and no pair can
   swap (P{X_1j <= 0} = 0 exactly, not a Gaussian tail): the derivation
   gives no upper bound below 1, and the upper envelopes are 1 (P = R = 1
   there by definition; eq. 13 read literally gives 1 - p_-/2 < 1, which is
   not a bound).

On measured rows the gaps are the row's own, so where Delta' > 0 no
non-sink pair is reversed: the sink-aware lower envelopes hold row by row
for every kappa, which only sets how informative they are.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Literal, get_args

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from tl_geometry.engine.context import RowCost, SelectionChunk, rows_context
from tl_geometry.engine.inputs import NGridLike, as_rows, resolve_n_grid
from tl_geometry.engine.metrics import DEFAULT_MEMORY_BUDGET_MIB
from tl_geometry.errors import GeometryError
from tl_geometry.theory.synthetic import AttentionProfile, attention_profile

# The universal constant kappa of Theorems 1-2 (dimensionless with the sink-aware exponent).
# Calibrated on the simulator (benchmarks/bench_theory.py): the largest kappa of the grid
# 1, 10, ..., 1e6 for which the lower envelopes from the settings' parameters hold on at
# least 99% of simulated (row, N) cells in every setting and seed, and under every Monte
# Carlo mean.
DEFAULT_KAPPA = 1000.0


@dataclass(frozen=True)
class SelectionMargins:
    """The quantities of eq. 7-11 for every row and N of the grid.

    Fields shaped ``[*batch, n]`` unless said otherwise; NaN where N exceeds
    the row's visible keys.

    Attributes:
        n_grid: the selection sizes N, ``[n]``.
        n_visible: visible keys of each row, the L of the envelopes, ``[*batch]``.
        delta: the paper's Delta (NaN when I_N holds only the sink).
        delta0: the paper's Delta_0 (NaN when the sink is not in I_N).
        scale: the paper's B = a_max_in + a_max_out + S_in.
        delta_sink: the sink-aware margin of the non-sink pairs (NaN when I_N
            holds only the sink); a lower bound of every mu_ij, i != 0.
        delta0_sink: the sink-aware margin of the sink's pairs (NaN when the
            sink is not in I_N); a lower bound of every mu_0j.
        scale_sink: B' = max a over I_N + a_max_out + sum of a over I_N (the
            sink included); the exponent uses (margin / B'^2)^2.
        s_in: S_in.
        a_min_in: min of a_i over I_N minus the sink (NaN if empty).
        a_max_in: max of a_i over I_N minus the sink (NaN if empty).
        a_max_out: max of a_j outside I_N (NaN if nothing is outside).
        a0: the sink's a_0 (NaN if key 0 is hidden).
        rho_out: max cosine between outside keys and non-sink inside keys
            (NaN if there is no such pair).
        rho_in: min cosine between two selected non-sink keys (NaN with fewer than two).
        rho0_in: min cosine between the sink and a selected non-sink key
            (NaN without a sink or such a key).
        rho0_out: max cosine between the sink and a non-selected non-sink key
            (NaN without a sink or such a key).
        sink_selected: whether the sink is in I_N (1.0 / 0.0).
        pair_gap: r_min^2 - r_max^2 = min over pairs (i in I_N, j outside)
            of mu_ij = D_j^2 - D_i^2 (+inf when nothing is outside).
        gap_in: min over j outside of mu_ij for the key at each rank
            (rank < N), ``[*batch, n, key]``; NaN at ranks >= N.
    """

    n_grid: Int[Tensor, " n"]
    n_visible: Int[Tensor, "*batch"]
    delta: Float[Tensor, "*batch n"]
    delta0: Float[Tensor, "*batch n"]
    scale: Float[Tensor, "*batch n"]
    delta_sink: Float[Tensor, "*batch n"]
    delta0_sink: Float[Tensor, "*batch n"]
    scale_sink: Float[Tensor, "*batch n"]
    s_in: Float[Tensor, "*batch n"]
    a_min_in: Float[Tensor, "*batch n"]
    a_max_in: Float[Tensor, "*batch n"]
    a_max_out: Float[Tensor, "*batch n"]
    a0: Float[Tensor, "*batch n"]
    rho_out: Float[Tensor, "*batch n"]
    rho_in: Float[Tensor, "*batch n"]
    rho0_in: Float[Tensor, "*batch n"]
    rho0_out: Float[Tensor, "*batch n"]
    sink_selected: Float[Tensor, "*batch n"]
    pair_gap: Float[Tensor, "*batch n"]
    gap_in: Float[Tensor, "*batch n key"]


@dataclass(frozen=True)
class Envelopes:
    """Lower and upper envelopes of E[P(r_max, N)], E[R(r_min, N)], E[F(r_min)], E[F(r_max)], ``[*batch, n]``."""

    precision_lower: Float[Tensor, "*batch n"]
    precision_upper: Float[Tensor, "*batch n"]
    recall_lower: Float[Tensor, "*batch n"]
    recall_upper: Float[Tensor, "*batch n"]
    f_rmin_lower: Float[Tensor, "*batch n"]
    f_rmin_upper: Float[Tensor, "*batch n"]
    f_rmax_lower: Float[Tensor, "*batch n"]
    f_rmax_upper: Float[Tensor, "*batch n"]

    def as_dict(self) -> dict[str, Tensor]:
        """Every envelope by field name."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


# Columns of a cosine tile: wide enough for the matrix product, narrow enough that a tile's rows are long.
COSINE_TILE_COLUMNS = 256
# Row segments of a tile folded into the table one by one; more go in one scatter.
FEW_RUNS = 4


def _along_columns(
    tile: Float[Tensor, "row q p"], columns: list[tuple[int, int, int]], q0: int, reduce: Callable[..., Tensor]
) -> Float[Tensor, "row a p"]:
    """``reduce`` (amax or amin) of the tile over the columns of each segment run ``(segment, first, last + 1)``."""
    if len(columns) == 1:
        return reduce(tile, 1, keepdim=True)
    return torch.stack([reduce(tile[:, s - q0:e - q0], 1) for _, s, e in columns], 1)


def _cosine_extremes(
    cosine_tile: Callable[[slice, slice], Float[Tensor, "row q p"]],
    candidate: Bool[Tensor, "row key"],
    visible: Bool[Tensor, "row key"],
    grid: Int[Tensor, " n"],
    dtype: torch.dtype,
    tile_elements: int,
) -> tuple[Float[Tensor, "row n"], Float[Tensor, "row n"]]:
    """rho_out and rho_in for every N of the grid, from one pass over the cosines of the pairs the grid needs.

    rho_out(N) = max of cos[p, q] over visible ranks p >= N and candidate
    ranks q < N; rho_in(N) = min of cos[p, q] over candidate ranks q != p,
    both < N. The grid cuts the ranks into segments (between consecutive
    values of N, and the ranks past the largest); each pair counts once in a
    table by the segments of its two ranks (the largest cosine of pairs with
    p in segment t and q in segment a, the smallest of candidate pairs),
    from which both follow for every N. Only the pairs below the largest N
    are formed, in tiles of at most ``tile_elements`` cosines per row
    (``cosine_tile(q, p)`` returns a fresh ``cos[:, q, p]``): about
    L^2 / 2 dot products on a grid that ends at L, never the whole matrix.
    -inf (rho_out) and +inf (rho_in) where there is no such pair.
    """
    n_rows, n_keys = candidate.shape
    bounds, position = torch.unique(grid.clamp(max=n_keys), sorted=True, return_inverse=True)
    ends = bounds.tolist()
    edges = [0, *ends, n_keys]  # segment t holds the ranks edges[t]..edges[t + 1]; the last one is never selected
    n_segments = len(edges) - 1
    device = candidate.device
    largest = torch.full((n_rows, n_segments, n_segments), -math.inf, dtype=dtype, device=device)  # [row, t, a]
    smallest = torch.full((n_rows, n_segments, n_segments), math.inf, dtype=dtype, device=device)
    segment_index = torch.bucketize(torch.arange(n_keys, device=device), bounds.to(device), right=True)
    segment_of = segment_index.tolist()

    def runs(start: int, stop: int) -> list[tuple[int, int, int]]:
        """(segment, first, last + 1) of the ranks start..stop, one per segment they cross."""
        crossed = range(segment_of[start], segment_of[stop - 1] + 1)
        return [(t, max(start, edges[t]), min(stop, edges[t + 1])) for t in crossed]

    # Which ranks some row cannot see, or cannot select (hidden or the sink): prefix counts, so that a tile masks
    # only where one of them falls in its range (most tiles need no mask, and no sync with the device to say so).
    unseen = [0, *torch.cumsum((~visible).any(0), 0).tolist()]
    barred = [0, *torch.cumsum((~candidate).any(0), 0).tolist()]

    top = ends[-1]  # no pair with a column at or past the largest N counts
    # Tiles of a few columns q against many rows p, [row, q, p]: the reductions over q run along contiguous p
    # (over a short last axis they measured several times slower), and few large operations keep the threads
    # busy on a loaded machine. The tile on the diagonal also forms the pairs q > p of its columns
    # (duplicates): columns of at most a sixteenth of the keys keep them under 1/16 of the pairs needed.
    width = max(1, min(top, COSINE_TILE_COLUMNS, max(32, top // 16), tile_elements))
    height = max(1, tile_elements // width)
    for q0 in range(0, top, width):
        q1 = min(q0 + width, top)
        columns = runs(q0, q1)
        a_first, a_last = columns[0][0], columns[-1][0] + 1
        hidden = ~candidate[:, q0:q1, None] if barred[q1] > barred[q0] else None
        for p0 in range(q0, n_keys, height):
            p1 = min(p0 + height, n_keys)
            tile = cosine_tile(slice(q0, q1), slice(p0, p1))  # [row, q, p], ours to overwrite
            if p0 < q1:  # the tile crosses the diagonal: no key pairs with itself
                tile.diagonal(offset=q0 - p0, dim1=1, dim2=2).fill_(math.inf)
            # Per row p: the extreme over each column segment a, [row, a, p]; the columns a row cannot select are
            # filled in place, first for the largest, then for the smallest.
            if hidden is not None:
                tile.masked_fill_(hidden, -math.inf)
            high = _along_columns(tile, columns, q0, torch.amax)
            if hidden is not None:
                tile.masked_fill_(hidden, math.inf)
            low = _along_columns(tile, columns, q0, torch.amin)
            del tile
            if unseen[p1] > unseen[p0]:
                high.masked_fill_(~visible[:, None, p0:p1], -math.inf)
            if barred[p1] > barred[p0]:
                low.masked_fill_(~candidate[:, None, p0:p1], math.inf)
            rows_of = runs(p0, p1)
            if len(rows_of) <= FEW_RUNS:
                for t, s, e in rows_of:
                    cell = largest[:, t, a_first:a_last]
                    torch.maximum(cell, high[:, :, s - p0:e - p0].amax(-1), out=cell)
                    cell = smallest[:, t, a_first:a_last]
                    torch.minimum(cell, low[:, :, s - p0:e - p0].amin(-1), out=cell)
            else:  # many segments (a dense grid): one scatter into the table instead of a loop over them
                index = segment_index[p0:p1].view(1, -1, 1).expand(n_rows, -1, a_last - a_first)
                largest[:, :, a_first:a_last].scatter_reduce_(1, index, high.transpose(1, 2), "amax")
                smallest[:, :, a_first:a_last].scatter_reduce_(1, index, low.transpose(1, 2), "amin")
    t = torch.arange(n_segments, device=device)
    u = t[: len(ends)]
    # rho_out at the u-th N: pairs with q in a segment a <= u and p in a segment t > u.
    below = largest.cummax(2).values[:, :, : len(ends)]  # [row, t, u]: max over a <= u
    rho_out = below.masked_fill(~(t[:, None] > u[None, :]), -math.inf).amax(1)
    # rho_in at the u-th N: pairs in segments a <= t <= u (the table holds a > t too: mirrors, left out).
    per_t = smallest.masked_fill(t[None, :] > t[:, None], math.inf).amin(2)  # [row, t]: min over a <= t
    rho_in = per_t.cummin(1).values[:, : len(ends)]
    return rho_out[:, position], rho_in[:, position]


def _margins_core(
    a: Float[Tensor, "row key"],
    sink: Bool[Tensor, "row key"],
    n_visible: Int[Tensor, " row"],
    grid: Int[Tensor, " n"],
    *,
    unit: Float[Tensor, "row key d_head"] | None = None,
    cos: Float[Tensor, "row key key"] | None = None,
) -> dict[str, Tensor]:
    """Every margin of a chunk of rows, keys in selection order (rank 0 first).

    ``a`` are the effective weights by rank and ``sink`` marks the rank
    holding key 0; ranks >= ``n_visible`` are hidden and must carry a = 0.
    The cosines come either as the unit value vectors by rank (measured
    margins: the key x key cosines are then never formed whole) or as a
    given matrix ``cos`` (margins from the assumptions); hidden ranks must
    have zero (or finite) entries.
    """
    n_keys = a.shape[-1]
    ranks = torch.arange(n_keys, device=a.device)
    grid = grid.to(a.device)
    visible = ranks < n_visible.unsqueeze(-1)  # [row, key]
    inside = ranks < grid.clamp(max=n_keys).unsqueeze(-1)  # [n, key]
    outside = ~inside & visible.unsqueeze(1)  # [row, n, key]
    inside_rows = inside & visible.unsqueeze(1)
    nonsink_in = inside_rows & ~sink.unsqueeze(1)
    a_n = a.unsqueeze(1)
    inf = math.inf

    has_in, has_out = nonsink_in.any(-1), outside.any(-1)
    sink_in = (inside_rows & sink.unsqueeze(1)).any(-1)
    s_in = (a_n * nonsink_in).sum(-1)
    a_min_in = torch.where(nonsink_in, a_n, inf).amin(-1)
    a_max_in = torch.where(nonsink_in, a_n, -inf).amax(-1)
    a_max_out = torch.where(outside, a_n, -inf).amax(-1)
    a0 = torch.where(sink, a, 0.0).sum(-1, keepdim=True).expand_as(s_in)
    a0 = torch.where(sink.any(-1, keepdim=True), a0, math.nan)

    # rho_out: candidates k are visible non-sink ranks, j any visible outside rank (the sink too, when it is
    # outside); rho_in: pairs of selected non-sink ranks.
    nonsink = visible & ~sink
    if unit is not None:
        def cosine_tile(q: slice, p: slice) -> Tensor:
            return torch.bmm(unit[:, q], unit[:, p].transpose(1, 2))
    else:
        def cosine_tile(q: slice, p: slice) -> Tensor:
            return cos[:, q, p].clone()
    # One tile of COSINE_TILE_COLUMNS columns against every rank at a time (counted in MARGINS_COST).
    rho_out, rho_in = _cosine_extremes(cosine_tile, nonsink, visible, grid, a.dtype, COSINE_TILE_COLUMNS * n_keys)
    has_pair = torch.isfinite(rho_out)
    rho_out = torch.where(has_pair, rho_out, math.nan)
    rho_in = torch.where(torch.isfinite(rho_in), rho_in, math.nan)
    rho_used = torch.where(has_pair, rho_out, 0.0)

    # The sink's cosines with every rank: the smallest over selected non-sink ranks (rho0_in), the
    # largest over non-selected ranks (rho0_out, used only when the sink is selected).
    sink_rank = sink.int().argmax(-1)
    rows = torch.arange(a.shape[0], device=a.device)
    if unit is not None:
        sink_cos = torch.bmm(unit, unit[rows, sink_rank].unsqueeze(-1)).squeeze(-1)
    else:
        sink_cos = cos[rows, sink_rank]
    last = grid.clamp(max=n_keys) - 1
    rho0_in = torch.cummin(sink_cos.masked_fill(~nonsink, inf), -1).values[:, last]
    tail_max = torch.flip(torch.cummax(torch.flip(sink_cos.masked_fill(~nonsink, -inf), [-1]), -1).values, [-1])
    rho0_out = torch.cat([tail_max, tail_max.new_full((a.shape[0], 1), -inf)], -1)[:, grid.clamp(max=n_keys)]
    has_sink = sink.any(-1, keepdim=True)
    rho0_in = torch.where(has_sink & torch.isfinite(rho0_in), rho0_in, math.nan)
    rho0_out = torch.where(has_sink & torch.isfinite(rho0_out), rho0_out, math.nan)

    # mu_ij = D_j^2 - D_i^2 with D^2 - ||s||^2 = a_i^2 - 2 a_i sum_{k in I_N} a_k rho_ki (eq. 25).
    # [row, n, key]: sum_k a_k rho_k,i over I_N. With the unit vectors at hand this is
    # <sum_k a_k u_k, u_i>: two thin products instead of one n x key x key product.
    weights = a_n * inside
    if unit is None:
        inner = torch.bmm(weights, cos)
    else:
        inner = torch.bmm(torch.bmm(weights, unit), unit.transpose(1, 2))
    proximity = a_n * a_n - 2 * a_n * inner
    far_in = torch.where(inside_rows, proximity, -inf).amax(-1)
    near_out = torch.where(outside, proximity, inf).amin(-1)
    pair_gap = torch.where(has_out, near_out - far_in, inf)
    gap_in = torch.where(inside_rows, torch.where(has_out, near_out, inf).unsqueeze(-1) - proximity, math.nan)

    # The paper's margins (eq. 8 with rho_out in Delta_0, eq. 27), as printed.
    delta = torch.where(has_in, a_min_in**2 - 2 * torch.where(has_pair, a_max_out * s_in * rho_used, 0.0), math.nan)
    delta0 = torch.where(sink_in, a0**2 - (s_in * rho_used) ** 2, math.nan)
    scale = torch.where(has_in, a_max_in, 0.0) + torch.where(has_out, a_max_out, 0.0) + s_in

    # The sink-aware margins (docs: Concepts, "A lower envelope that bounds"): every cross term kept,
    # each bounded by the extreme measured cosine of its kind; absent terms are 0.
    def pos(x: Tensor) -> Tensor:
        return torch.nan_to_num(x, nan=0.0).clamp(min=0)

    def neg(x: Tensor) -> Tensor:
        return torch.nan_to_num(x, nan=0.0).clamp(max=0)

    z = sink_in.to(a.dtype)
    a0_in = z * torch.nan_to_num(a0, nan=0.0)
    a_out = torch.where(has_out, a_max_out, 0.0)
    a_in_min = torch.where(has_in, a_min_in, 0.0)
    a_in_max = torch.where(has_in, a_max_in, 0.0)
    pull_out = 2 * a_out * (s_in * pos(rho_out) + a0_in * pos(rho0_out))  # the largest 2 a_j <s, u_j>
    delta_sink = torch.where(
        has_in,
        a_in_min**2 - pull_out + 2 * a_in_max * (s_in - a_in_min) * neg(rho_in) + 2 * a0_in * a_in_max * neg(rho0_in),
        math.nan,
    )
    delta0_sink = torch.where(sink_in, a0_in**2 - pull_out + 2 * a0_in * s_in * torch.nan_to_num(rho0_in, nan=0.0), math.nan)
    scale_sink = torch.maximum(a_in_max, a0_in) + a_out + s_in + a0_in
    out = {
        "delta": delta,
        "delta0": delta0,
        "scale": scale,
        "delta_sink": delta_sink,
        "delta0_sink": delta0_sink,
        "scale_sink": scale_sink,
        "s_in": s_in,
        "a_min_in": torch.where(has_in, a_min_in, math.nan),
        "a_max_in": torch.where(has_in, a_max_in, math.nan),
        "a_max_out": torch.where(has_out, a_max_out, math.nan),
        "a0": a0,
        "rho_out": rho_out,
        "rho_in": rho_in,
        "rho0_in": rho0_in,
        "rho0_out": rho0_out,
        "sink_selected": sink_in.to(a.dtype),
        "pair_gap": pair_gap,
    }
    missing = grid.unsqueeze(0) > n_visible.unsqueeze(-1)  # [row, n]
    out = {name: t.masked_fill(missing, math.nan) for name, t in out.items()}
    out["gap_in"] = gap_in.masked_fill(missing.unsqueeze(-1), math.nan)
    return out


# Per row of a chunk: the unit vectors by rank, about ten n x key planes and one cosine tile
# (COSINE_TILE_COLUMNS x key) with its reductions per column segment (at most as many again, twice).
MARGINS_COST = RowCost(key_d=1, n_key=10, key=3 * COSINE_TILE_COLUMNS)


def selection_margins(
    alpha: Tensor,
    values: Tensor,
    n_grid: NGridLike = None,
    *,
    key_mask: Tensor | None = None,
    ranking: str = "attention",
    memory_budget_mib: int | float = DEFAULT_MEMORY_BUDGET_MIB,
) -> SelectionMargins:
    """Delta, Delta_0, B and the quantities behind them, for every row and N at once.

    Measured reading of section 3.4: a_i = alpha_i ||v_i|| and the cosines are
    those of the given value vectors. Keys are sorted as the engine sorts
    them (`tl_geometry.engine.context.selection_order`); key 0 is the sink.
    rho_out needs the cosines of every (outside, inside) pair and rho_in
    those of the selected pairs: they are formed in tiles, for the pairs
    below the grid's largest N among the keys the row sees (about half of
    key x key per row, never at once), and rows are processed in chunks
    within about ``memory_budget_mib`` MiB. The readings chosen where the paper
    is ambiguous are listed in the module docstring.

    Args:
        alpha: attention weights, ``[*batch, key]``, finite and >= 0.
        values: value vectors, ``[*batch, key, d_head]``.
        n_grid: selection sizes N (None: every N from 1 to the keys).
        key_mask: visible keys, ``[*batch, key]`` (default: all).
        ranking: ``"attention"`` (the paper's) or ``"contribution"``.
        memory_budget_mib: working memory of one chunk of rows.

    Returns:
        SelectionMargins, fields ``[*batch, n]`` (``gap_in`` ``[*batch, n, key]``).

    Raises:
        GeometryError: as `tl_geometry.selection_metrics` for bad inputs.

    Example:
        >>> alpha = torch.tensor([0.6, 0.3, 0.1])
        >>> values = torch.tensor([[0.1, 0.0], [0.0, 1.0], [1.0, 0.0]])
        >>> m = selection_margins(alpha, values, [1, 2, 3])
        >>> m.s_in.tolist(), m.rho_out.tolist()[:2]
        ([0.0, 0.30000001192092896, 0.4000000059604645], [nan, 0.0])
    """
    rows = as_rows(alpha, values, n_grid, key_mask, ranking, "euclidean", memory_budget_mib)
    context = rows_context(
        rows.alpha, rows.values, rows.key_mask, rows.grid,
        ranking=ranking, distance="euclidean", memory_budget_mib=float(memory_budget_mib), costs=(MARGINS_COST,),
    )  # fmt: skip
    parts: dict[str, list[Tensor]] = {}
    with torch.no_grad():
        for chunk in context.chunks():
            for name, t in chunk_margins(chunk).items():
                parts.setdefault(name, []).append(t)
    joined = {name: torch.cat(ts) for name, ts in parts.items()}
    batch_shape, grid, n_keys = rows.batch_shape, rows.grid, rows.alpha.shape[-1]
    shape = (*batch_shape, len(grid))
    return SelectionMargins(
        n_grid=grid,
        n_visible=rows.key_mask.sum(-1).reshape(batch_shape),
        gap_in=joined.pop("gap_in").reshape(*shape, n_keys),
        **{name: t.reshape(shape) for name, t in joined.items()},
    )


def chunk_margins(chunk: SelectionChunk) -> dict[str, Tensor]:
    """The margins of a chunk of the selection context: a_i and the unit vectors by rank, then the core.

    The sink is the chunk's sink (the sequence's first real token where the
    query sees it); a row without one has no Delta_0 term.
    """
    n_rows, n_keys = chunk.alpha.shape
    # Only the ranks some row of the chunk sees: the rest are hidden in every row and carry nothing.
    seen = chunk.seen_ranks()
    order = chunk.order[:, :seen]
    hidden = torch.arange(seen, device=order.device) >= chunk.n_visible.unsqueeze(-1)
    values = chunk.value_source[chunk.batch[:, None], order, chunk.value_head[:, None]].to(chunk.alpha.dtype)
    norms = torch.linalg.vector_norm(values, dim=-1)
    a = (torch.gather(chunk.alpha, 1, order) * norms).masked_fill(hidden, 0.0)
    # A zero vector has no direction: its cosines are 0 (its a_i is 0 too).
    unit = values.div_(torch.where(norms > 0, norms, 1.0).unsqueeze(-1)).masked_fill_(hidden.unsqueeze(-1), 0.0)
    sink = torch.zeros(n_rows, seen, dtype=torch.bool, device=a.device)
    rows = torch.arange(n_rows, device=a.device)
    sink[rows, chunk.sink_rank().clamp(max=seen - 1)] = chunk.has_sink
    out = _margins_core(a, sink, chunk.n_visible, chunk.grid, unit=unit)
    out["gap_in"] = torch.nn.functional.pad(out["gap_in"], (0, n_keys - seen), value=math.nan)
    return out


def _p_minus(xi: Float[Tensor, "*shape"]) -> Float[Tensor, "*shape"]:
    """Eq. 9: phi(xi) xi / (1 + xi^2) for xi >= 0 (phi the standard normal pdf), 1/2 for xi < 0."""
    phi = torch.exp(-0.5 * xi * xi) / math.sqrt(2 * math.pi)
    mills = phi * xi / (1 + xi * xi)
    mills = torch.where(torch.isinf(xi), 0.0, mills)  # no outside key: no swap
    return torch.where(xi < 0, 0.5, mills)


def _tail(
    margin: Float[Tensor, "*shape"], scale: Float[Tensor, "*shape"], kappa: float, d_head: int
) -> Float[Tensor, "*shape"]:
    """exp(-kappa d (margin+/scale)^2); 1 for margin <= 0 (no guarantee), 0 where the term is absent (NaN)."""
    ratio = torch.where(scale > 0, margin.clamp(min=0) / torch.where(scale > 0, scale, 1.0), 0.0)
    return torch.where(torch.isnan(margin), 0.0, torch.exp(-kappa * d_head * ratio**2))


Variant = Literal["sink_aware", "paper"]
"""Which margins and scale the envelopes use: the sink-aware, scale-free ones (default) or the paper's as printed."""


def _variant_terms(margins: SelectionMargins, variant: str) -> tuple[Tensor, Tensor, Tensor]:
    """(Delta, Delta_0, the scale the margins are divided by) of a variant."""
    if variant == "paper":
        return margins.delta, margins.delta0, margins.scale
    if variant == "sink_aware":
        return margins.delta_sink, margins.delta0_sink, margins.scale_sink**2
    raise GeometryError(f"variant: expected one of {get_args(Variant)}, got {variant!r}")


def _check_envelope_args(d_head: int, n_keys: int | None, kappa: float) -> None:
    if isinstance(kappa, bool) or not isinstance(kappa, (int, float)) or not (kappa > 0 and math.isfinite(kappa)):
        raise GeometryError(f"kappa: expected a positive finite number, got {kappa!r}")
    if isinstance(d_head, bool) or not isinstance(d_head, int) or d_head < 1:
        raise GeometryError(f"d_head: expected a positive integer (the value dimension d), got {d_head!r}")
    if n_keys is not None and (isinstance(n_keys, bool) or not isinstance(n_keys, int) or n_keys < 1):
        raise GeometryError(f"n_keys: expected a positive integer L or None (visible keys), got {n_keys!r}")


def lower_envelopes(
    margins: SelectionMargins,
    d_head: int,
    n_keys: int | None = None,
    *,
    kappa: float = DEFAULT_KAPPA,
    variant: str = "sink_aware",
) -> tuple[Float[Tensor, "*batch n"], Float[Tensor, "*batch n"]]:
    """The lower envelopes (P_low, R_low) of eq. 12 and 14 alone (see `envelopes`); cheap enough for kappa sweeps.

    >>> alpha = torch.tensor([0.6, 0.3, 0.1])
    >>> values = torch.tensor([[0.1, 0.0], [0.0, 1.0], [1.0, 0.0]])
    >>> p, r = lower_envelopes(selection_margins(alpha, values, [1, 2, 3]), d_head=2)
    >>> tuple(round(x, 3) for x in p.tolist())
    (0.333, 0.667, 1.0)
    """
    _check_envelope_args(d_head, n_keys, kappa)
    delta, delta0, scale = _variant_terms(margins, variant)
    dtype = delta.dtype
    n = margins.n_grid.to(device=delta.device, dtype=dtype)
    length = (
        margins.n_visible.to(dtype).unsqueeze(-1)
        if n_keys is None
        else torch.tensor(float(n_keys), dtype=dtype, device=delta.device)
    )
    n_out = (length - n).clamp(min=0)
    union = n_out * _tail(delta, scale, kappa, d_head) + n_out / n * _tail(delta0, scale, kappa, d_head)
    missing = torch.isnan(margins.scale)
    precision_lower = (1 / (1 + union)).masked_fill(missing, math.nan)
    recall_lower = (1 - union).clamp(min=0).masked_fill(missing, math.nan)
    return precision_lower, recall_lower


def _f(x: Tensor) -> Tensor:
    return 2 * x / (1 + x)


def _ranks_below_n(grid: Int[Tensor, " n"], n_keys: int) -> tuple[Int[Tensor, " packed"], Int[Tensor, " packed"]]:
    """Every (N, rank < N) of the grid: its index in a flattened ``[n, key]`` plane, and its grid column.

    >>> _ranks_below_n(torch.tensor([1, 3]), 4)
    (tensor([0, 4, 5, 6]), tensor([0, 1, 1, 1]))
    """
    counts = grid.clamp(max=n_keys)
    column = torch.repeat_interleave(torch.arange(len(grid), device=grid.device), counts)
    rank = torch.arange(len(column), device=grid.device) - (counts.cumsum(0) - counts)[column]
    return column * n_keys + rank, column


def envelopes(
    margins: SelectionMargins,
    d_head: int,
    n_keys: int | None = None,
    *,
    kappa: float = DEFAULT_KAPPA,
    variant: str = "sink_aware",
) -> Envelopes:
    """Lower and upper envelopes of E[P], E[R] and the two F-scores (eq. 12-17).

    Lower envelopes (eq. 12, 14): ``P >= 1 / (1 + T)``, ``R >= max(0, 1 - T)``
    with ``T = (L - N) e^{-kappa d (Delta/S)^2} + (L - N)/N e^{-kappa d (Delta_0/S)^2}``.
    With ``variant="sink_aware"`` (default) Delta and Delta_0 are the
    sink-aware margins and S = B'^2: the margins bound every pair's mean gap
    from below, and the exponent does not change when the value vectors are
    rescaled. ``variant="paper"`` uses eq. 8 and S = B as printed. Upper
    envelopes (eq. 13, 15) with sigma = S / sqrt(2 kappa d): statements about
    the expectation over value states, to be compared with means over rows.

    Args:
        margins: from `selection_margins` or `assumption_margins`.
        d_head: the dimension d of the value vectors.
        n_keys: L, the keys of the union bound; None: each row's visible keys
            (``margins.n_visible``, the sink included; see the module docstring).
        kappa: the universal constant of the concentration bounds (> 0).
        variant: ``"sink_aware"`` or ``"paper"``.

    Returns:
        Envelopes, every field ``[*batch, n]``; lower envelopes capped at 0;
        NaN where N exceeds the visible keys.

    Raises:
        GeometryError: kappa <= 0, d_head < 1, n_keys < 1 or an unknown variant.

    Example:
        >>> alpha = torch.tensor([0.6, 0.3, 0.1])
        >>> values = torch.tensor([[0.1, 0.0], [0.0, 1.0], [1.0, 0.0]])
        >>> e = envelopes(selection_margins(alpha, values, [1, 3]), d_head=2)
        >>> [round(x, 3) for x in e.recall_upper.tolist()], e.recall_lower.tolist()
        ([1.0, 1.0], [0.0, 1.0])
        >>> e = envelopes(selection_margins(alpha, values, [2, 3]), d_head=2)
        >>> tuple(round(x, 3) for x in e.recall_upper.tolist())
        (0.967, 1.0)
    """
    precision_lower, recall_lower = lower_envelopes(margins, d_head, n_keys, kappa=kappa, variant=variant)
    _, _, scale = _variant_terms(margins, variant)
    n = margins.n_grid.to(device=scale.device, dtype=scale.dtype)
    sigma = scale / math.sqrt(2 * kappa * d_head)
    positive = sigma > 0
    safe_sigma = torch.where(positive, sigma, 1.0)
    xi_pair = torch.where(positive, margins.pair_gap / safe_sigma, margins.pair_gap.sign() * math.inf)
    precision_upper = 1 - _p_minus(xi_pair) / (n + 1)
    no_swap = n == 1  # reading 10: the selected key is s(1) itself
    # gap_in is defined at ranks < N only (most entries, on a log grid): p_- on those alone, packed.
    flat, column = _ranks_below_n(margins.n_grid, margins.gap_in.shape[-1])
    gap_in = margins.gap_in.flatten(-2)[..., flat]  # [*batch, packed]
    xi_in = torch.where(positive[..., column], gap_in / safe_sigma[..., column], gap_in.sign() * math.inf)
    terms = (1 - _p_minus(xi_in)).masked_fill(torch.isnan(gap_in), 0.0)  # NaN: hidden ranks, or N > L
    recall_upper = torch.zeros_like(scale).index_add_(-1, column, terms) / n
    missing = torch.isnan(margins.scale)
    precision_upper = precision_upper.masked_fill(no_swap, 1.0).masked_fill(missing, math.nan)
    recall_upper = recall_upper.masked_fill(no_swap, 1.0).masked_fill(missing, math.nan)
    return Envelopes(
        precision_lower=precision_lower,
        precision_upper=precision_upper,
        recall_lower=recall_lower,
        recall_upper=recall_upper,
        f_rmin_lower=_f(recall_lower),
        f_rmin_upper=_f(recall_upper),
        f_rmax_lower=_f(precision_lower),
        f_rmax_upper=_f(precision_upper),
    )


def realised_upper_bounds(
    swapped: Bool[Tensor, "*batch n"], n_grid: Int[Tensor, " n"], dtype: torch.dtype = torch.float32
) -> tuple[Float[Tensor, "*batch n"], Float[Tensor, "*batch n"]]:
    """The upper bounds of the measured P and R: eq. 13 and 15 with the realised event for its Gaussian tail.

    ``swapped`` is the event r_min <= r_max of each (row, N): a non-selected
    key at least as close to s(N) as the farthest selected one, i.e. K_out >= 1
    (the same comparison that counts K_out and K_in, so the bound agrees with
    the metrics on ties). Then P = N / (N + K_out) <= N / (N + 1) and
    R = K_in / N <= (N - 1) / N; without it P = R = 1. So
    ``P <= 1 - swapped / (N + 1)`` and ``R <= 1 - swapped / N``: never exceeded
    by the row, hence by no mean of rows. The F bounds follow by 2x / (1 + x).

    Example:
        >>> p, r = realised_upper_bounds(torch.tensor([[False, True, True]]), torch.tensor([1, 2, 4]))
        >>> p.tolist(), r.tolist()
        ([[1.0, 0.6666666865348816, 0.800000011920929]], [[1.0, 0.5, 0.75]])
    """
    if swapped.dtype != torch.bool:
        raise GeometryError(f"swapped: expected a boolean tensor (the event r_min <= r_max), got {swapped.dtype}")
    if swapped.shape[-1:] != n_grid.shape:
        raise GeometryError(
            f"swapped: its last axis ({tuple(swapped.shape)}) must match the N grid ({tuple(n_grid.shape)})"
        )
    n = n_grid.to(device=swapped.device, dtype=dtype)
    hit = swapped.to(dtype)
    # The metrics' own arithmetic (N / (N + K_out), K_in / N): 1 - 1/(N+1) can round 1 ulp below N/(N+1).
    return n / (n + hit), (n - hit) / n


def upper_envelope_floor(
    n_grid: Int[Tensor, " n"],
) -> tuple[Float[Tensor, " n"], Float[Tensor, " n"]]:
    """The lowest values eq. 13 and 15 can take, for any data: (1 - 1/2 / (N + 1), 1/2), both 1 at N = 1.

    p_- <= 1/2 (its value for a negative margin; phi(xi) xi / (1 + xi^2) stays
    below 0.2 for xi >= 0), so P's envelope is >= 1 - 1/2 / (N + 1) and each
    term of R's is >= 1/2. A gap between the envelope and a measured curve
    that lies below this floor is set by the formula, not by the data.

    Example:
        >>> tuple(round(x, 3) for x in upper_envelope_floor(torch.tensor([1, 2, 4]))[0].tolist())
        (1.0, 0.833, 0.9)
    """
    n = n_grid.to(torch.float64)
    one = n == 1  # reading 10: no swap at N = 1
    precision = torch.where(one, 1.0, 1 - 0.5 / (n + 1))
    recall = torch.where(one, 1.0, torch.full_like(n, 0.5))
    return precision, recall


def sigma_form(variant: str) -> str:
    """The scale of the upper envelopes' Gaussian, in words: B'^2 / sqrt(2 kappa d) (sink-aware) or the paper's B / sqrt(2 kappa d)."""
    _variant_terms_check(variant)
    return "B'^2 / sqrt(2 kappa d) (sink-aware)" if variant == "sink_aware" else "B / sqrt(2 kappa d) (the paper's eq. 10)"


def _variant_terms_check(variant: str) -> None:
    if variant not in get_args(Variant):
        raise GeometryError(f"variant: expected one of {get_args(Variant)}, got {variant!r}")


def assumption_margins(
    c: float,
    lam: float,
    beta: float,
    rho0: float,
    profile: AttentionProfile,
    n_keys: int,
    n_grid: NGridLike = None,
) -> SelectionMargins:
    """The margins implied by fitted Assumption 1-3 parameters instead of measured vectors.

    a_0 = alpha_0 lambda C and a_i = alpha_i C (Assumption 1), alpha from the
    four-phase profile (Assumption 3, normalised to sum 1, see
    `tl_geometry.theory.synthetic.attention_profile`), cosines
    rho_ij = e^{-beta |i - j|} between non-sink keys and rho_0j = rho0
    (Assumption 2). Pass the result to `envelopes` with d = d_head.

    Args:
        c: the value norm C (> 0).
        lam: the sink's norm ratio lambda (> 0).
        beta: the cosine decay rate (>= 0).
        rho0: the sink cosine, in [-1, 1].
        profile: the attention-profile parameters.
        n_keys: L, keys 0..L-1 with the sink at 0.
        n_grid: selection sizes N (None: 1..L).

    Returns:
        SelectionMargins of one row: fields ``[n]``, ``gap_in`` ``[n, key]``.

    Raises:
        GeometryError: parameters out of range.

    Example:
        >>> from tl_geometry.theory.synthetic import AttentionProfile
        >>> m = assumption_margins(1.0, 0.1, 0.5, 0.2, AttentionProfile(), 64, [1, 8, 64])
        >>> m.delta.shape
        torch.Size([3])
    """
    for name, value, ok, want in (
        ("c", c, c > 0, "> 0"),
        ("lam", lam, lam > 0, "> 0"),
        ("beta", beta, beta >= 0, ">= 0"),
        ("rho0", rho0, -1 <= rho0 <= 1, "in [-1, 1]"),
    ):
        if not (ok and math.isfinite(value)):
            raise GeometryError(f"{name}: expected a finite number {want}, got {value!r}")
    alpha = attention_profile(profile, n_keys).to(torch.float64)
    norms = torch.full((n_keys,), float(c), dtype=torch.float64)
    norms[0] = lam * c
    grid = resolve_n_grid(n_grid, n_keys)
    order = torch.sort(alpha, descending=True, stable=True).indices
    positions = order.to(torch.float64)
    cos = torch.exp(-beta * (positions[:, None] - positions[None, :]).abs())
    is_sink = order == 0
    cos = torch.where(is_sink[:, None] ^ is_sink[None, :], float(rho0), cos)
    out = _margins_core(
        (alpha * norms)[order].unsqueeze(0), is_sink.unsqueeze(0), torch.tensor([n_keys]), grid, cos=cos.unsqueeze(0)
    )
    return SelectionMargins(
        n_grid=grid,
        n_visible=torch.tensor(n_keys),
        gap_in=out.pop("gap_in")[0],
        **{name: t[0] for name, t in out.items()},
    )
