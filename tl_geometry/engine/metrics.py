"""Precision, Recall, F-scores and radii of top-N selection (paper section 3, appendix A.1).

Definitions (see the Concepts page of the docs), for one query row and a selection size N:

- D_i = ||s(N) - y_i|| (Euclidean), or 1 - <s, y_i> / (||s|| ||y_i|| + 1e-12) (cosine);
- r_max = max of D_i over the selected keys, r_min = min of D_j over the
  visible non-selected keys (+inf when every visible key is selected);
- Precision P(r_max, N) = N / (N + K_out), K_out = #{non-selected j : D_j <= r_max}
  (closed ball);
- Recall R(r_min, N) = K_in / N, K_in = #{selected i : D_i < r_min} (open ball);
- F(r_max) = 2P / (1 + P), F(r_min) = 2R / (1 + R) (Corollary 1, since
  P(r_min) = R(r_max) = 1), and the extremal F_N = 2PR / (P + R).

Everything works on a chunk of rows of the selection context and on every N
at once: the prefix sums of the sorted y_i give s(N) for all N, and one
batched matrix product gives <s(N), y_i> for all (N, i).
"""

import math
from dataclasses import dataclass, fields
from typing import NamedTuple

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from tl_geometry.engine.context import COSINE_EPS, RowCost, SelectionChunk, rows_context
from tl_geometry.engine.inputs import NGridLike, as_rows, check_row_sums

DEFAULT_MEMORY_BUDGET_MIB = 128

# Per row: the proximities, one float and one boolean scratch plane of n x key each.
METRICS_COST = RowCost(n_key=3)


@dataclass(frozen=True)
class SelectionMetrics:
    """The selection metrics of every query row for every N of the grid.

    Every field but ``n_grid`` is shaped ``[*batch, n]`` (the leading axes of
    the engine's ``alpha``). Entries where N exceeds the row's visible keys are
    NaN: the top-N set does not exist there.

    Attributes:
        n_grid: the selection sizes N, ``[n]``.
        precision: P(r_max, N).
        recall: R(r_min, N).
        f_rmax: F(r_max) = 2P / (1 + P).
        f_rmin: F(r_min) = 2R / (1 + R).
        f_score: F_N = 2PR / (P + R).
        r_min: distance from s(N) to the nearest non-selected key (+inf if none).
        r_max: distance from s(N) to the farthest selected key.
        s_norm: ||s(N)||.
        k_out: K_out, non-selected keys inside the closed r_max ball.
        k_in: K_in, selected keys inside the open r_min ball.
    """

    n_grid: Int[Tensor, " n"]
    precision: Float[Tensor, "*batch n"]
    recall: Float[Tensor, "*batch n"]
    f_rmax: Float[Tensor, "*batch n"]
    f_rmin: Float[Tensor, "*batch n"]
    f_score: Float[Tensor, "*batch n"]
    r_min: Float[Tensor, "*batch n"]
    r_max: Float[Tensor, "*batch n"]
    s_norm: Float[Tensor, "*batch n"]
    k_out: Float[Tensor, "*batch n"]
    k_in: Float[Tensor, "*batch n"]

    def per_row_fields(self) -> dict[str, Tensor]:
        """Every ``[*batch, n]`` field by name (all but ``n_grid``)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "n_grid"}


# The metric names, in SelectionMetrics order.
METRIC_NAMES: tuple[str, ...] = tuple(f.name for f in fields(SelectionMetrics) if f.name != "n_grid")


def seen_part(chunk: SelectionChunk) -> tuple[int, Bool[Tensor, " n"] | None]:
    """The ranks and grid columns the metrics work on: the ranks some row of the chunk sees and the N it can
    select (`SelectionChunk.seen_ranks`, `SelectionChunk.seen_sizes`); None for the columns when every N is kept.

    Past them every key is hidden and every N missing in every row, so nothing there changes a metric: a
    sliding-window row of a long context (512 of 32,768 keys on Gemma-3) is worked on its window's width.
    """
    sizes = chunk.seen_sizes()
    return chunk.seen_ranks(), None if bool(sizes.all()) else sizes


def proximity(chunk: SelectionChunk) -> Float[Tensor, "row seen_n seen_key"]:
    """A quantity that orders keys exactly as D_i does, per (row, N), keys in selection order.

    For the Euclidean distance it is D_i^2 - ||s||^2 = ||y_i||^2 - 2<s, y_i>:
    adding ||s||^2 would round away the tiny differences between the many
    small alpha_i v_i of a real attention row, and those differences decide
    the counts. For the cosine distance it is the distance itself. Hidden
    keys (sorted last) get +inf. Only the ranks and the N of `seen_part`:
    ``[row, N <= seen, rank < seen]``. Written into a reused buffer of the chunk.
    """
    ranks, sizes = seen_part(chunk)
    s = chunk.s if sizes is None else chunk.s[:, sizes]
    y = chunk.y_sorted[:, :ranks]
    out = chunk.scratch("proximity", (s.shape[1], ranks))
    y_sq = (y * y).sum(-1)
    if chunk.distance == "euclidean":
        torch.baddbmm(y_sq.unsqueeze(1), s, y.transpose(1, 2), alpha=-2.0, out=out)
    else:
        torch.bmm(s, y.transpose(1, 2), out=out)
        s_norm = chunk.s_norm if sizes is None else chunk.s_norm[:, sizes]
        scale = s_norm.unsqueeze(-1) * y_sq.sqrt().unsqueeze(1) + COSINE_EPS
        out.div_(scale).neg_().add_(1.0)
    hidden = torch.arange(ranks, device=out.device) >= chunk.n_visible.unsqueeze(-1)
    if hidden.any():
        out.masked_fill_(hidden.unsqueeze(1), math.inf)
    return out


def distance_to_rank(chunk: SelectionChunk, near: Float[Tensor, "row seen_n seen_key"],
                     rank: Int[Tensor, "row seen_n"]) -> Float[Tensor, "row seen_n"]:
    """D between s(N) and the key at sorted position ``rank``, per (row, N) of `proximity`'s plane ``near``.

    Computed from the vectors (not from the proximity) so that radii keep full
    precision even when D is tiny; the cosine proximity is the distance itself.
    """
    if chunk.distance == "cosine":
        return torch.gather(near, 2, rank.unsqueeze(-1)).squeeze(-1)
    _, sizes = seen_part(chunk)
    s = chunk.s if sizes is None else chunk.s[:, sizes]
    d_head = chunk.y_sorted.shape[-1]
    y_at = torch.gather(chunk.y_sorted, 1, rank.unsqueeze(-1).expand(*rank.shape, d_head))
    return torch.linalg.vector_norm(y_at.sub_(s), dim=-1)


def ball_members(
    chunk: SelectionChunk, rows: Int[Tensor, " pick"]
) -> tuple[Bool[Tensor, "pick n seen_key"], Bool[Tensor, "pick n seen_key"]]:
    """Which keys (in selection order) lie in the closed r_max ball and in the open r_min ball, per (row, N).

    The comparisons whose counts `chunk_metrics` returns as K_out + N and K_in,
    read from the proximity plane it leaves in the chunk: call it right after
    `chunk_metrics`, before anything else reuses the plane. The key axis stops
    at the ranks some row of the chunk sees (`seen_part`; the keys past them are
    hidden everywhere); hidden keys (+inf) are in neither ball; rows where N
    exceeds the visible keys are meaningless (their metrics are NaN), and so
    are the N no row can select (all False).
    """
    ranks, sizes = seen_part(chunk)
    grid = chunk.grid if sizes is None else chunk.grid[sizes]
    near = chunk.scratch("proximity", (len(grid), ranks))[rows]
    selected = torch.arange(ranks, device=near.device) < grid.unsqueeze(-1)  # [n, key]
    far_in = torch.where(selected, near, -math.inf).amax(-1, keepdim=True)
    near_out = torch.where(selected, math.inf, near).amin(-1, keepdim=True)
    inside_max, inside_min = near <= far_in, near < near_out
    if sizes is None:
        return inside_max, inside_min
    planes = []
    for inside in (inside_max, inside_min):
        plane = inside.new_zeros(len(rows), len(chunk.grid), ranks)
        plane[:, sizes] = inside
        planes.append(plane)
    return planes[0], planes[1]


# Keys per block of `extreme_with_place`: amax over a block is vectorised, max with its index is not.
_PLACE_BLOCK = 128


def extreme_with_place(x: Float[Tensor, "*batch key"], largest: bool) -> tuple[Float[Tensor, "*batch"], Int[Tensor, "*batch"]]:
    """``x.max(-1)`` (or ``x.min(-1)``): the value and the first place holding it, faster on long rows.

    The extreme of each block of keys comes from a vectorised ``amax``; the
    index search then runs over the block extremes and inside the one block
    that holds the first extreme; keys past the last whole block are compared
    after (a tie keeps the earlier place, as ``max`` does).
    """
    n_blocks = x.shape[-1] // _PLACE_BLOCK
    if n_blocks < 2:
        found = x.max(-1) if largest else x.min(-1)
        return found.values, found.indices
    extreme, first = (torch.amax, torch.argmax) if largest else (torch.amin, torch.argmin)
    whole = n_blocks * _PLACE_BLOCK
    blocks = x[..., :whole].unflatten(-1, (n_blocks, _PLACE_BLOCK))
    block_extremes = extreme(blocks, -1)
    block = first(block_extremes, -1, keepdim=True)
    value = block_extremes.gather(-1, block).squeeze(-1)
    inside = blocks.gather(-2, block.unsqueeze(-1).expand(*block.shape, _PLACE_BLOCK)).squeeze(-2)
    place = block.squeeze(-1) * _PLACE_BLOCK + first(inside, -1)
    if x.shape[-1] > whole:
        rest = x[..., whole:].max(-1) if largest else x[..., whole:].min(-1)
        better = rest.values > value if largest else rest.values < value
        value = torch.where(better, rest.values, value)
        place = torch.where(better, rest.indices + whole, place)
    return value, place


class BallCounts(NamedTuple):
    """K_out and K_in of top-N sets, with the keys that set the two radii (see `ball_counts`)."""

    far_in: Float[Tensor, "*batch n"]  # the farthest selected key's proximity: the r_max ball
    far_in_place: Int[Tensor, "*batch n"]
    near_out: Float[Tensor, "*batch n"]  # the nearest non-selected key's proximity (+inf if none): the r_min ball
    near_out_place: Int[Tensor, "*batch n"]
    k_out: Int[Tensor, "*batch n"]  # non-selected keys in the closed r_max ball
    k_in: Int[Tensor, "*batch n"]  # selected keys in the open r_min ball


def ball_counts(
    near: Float[Tensor, "*batch n key"],
    sizes: Int[Tensor, " n"],
    scratch: Float[Tensor, "*batch n key"] | None = None,
    flags: Bool[Tensor, "*batch n key"] | None = None,
) -> BallCounts:
    """Count the two balls of eq. 3-4 for top-N sets laid out by place: the one counting kernel.

    ``near[..., j, p]`` orders the key at place p by its distance to s(N_j) as
    D does (see `proximity`); the top-N_j set is the first ``sizes[j]`` places
    and hidden keys are +inf, placed last. The engine reads each row's own
    ranking, the chance diagnostic random rankings laid out the same way.

    Touches the proximities as few times as possible: with hidden keys at
    +inf, every selected key lies inside the closed r_max ball and no
    non-selected key inside the open r_min ball, so
    K_out = #{keys within r_max} - N and K_in = #{keys within r_min}.
    ``scratch`` and ``flags`` (``near``'s shape) are reused buffers, allocated
    when not given.
    """
    selected = torch.arange(near.shape[-1], device=near.device) < sizes.unsqueeze(-1)  # [n, place]: in I_N
    scratch = torch.empty_like(near) if scratch is None else scratch
    flags = torch.empty(near.shape, dtype=torch.bool, device=near.device) if flags is None else flags
    # +inf on I_N, -inf off it: min(near, cap) keeps the selected keys, max(near, cap) the others (several times
    # faster than torch.where with a mask, and a hidden key's +inf meets no -inf sum).
    cap = torch.where(selected, math.inf, -math.inf).to(near.dtype)
    far_in, far_in_place = extreme_with_place(torch.minimum(near, cap, out=scratch), largest=True)
    near_out, near_out_place = extreme_with_place(torch.maximum(near, cap, out=scratch), largest=False)
    k_out = torch.le(near, far_in.unsqueeze(-1), out=flags).sum(-1, dtype=torch.int32) - sizes.to(torch.int32)
    k_in = torch.lt(near, near_out.unsqueeze(-1), out=flags).sum(-1, dtype=torch.int32)
    return BallCounts(far_in, far_in_place, near_out, near_out_place, k_out, k_in)


def chunk_metrics(chunk: SelectionChunk) -> dict[str, Float[Tensor, "row n"]]:
    """Every metric of `SelectionMetrics` for the rows of a chunk, NaN where N exceeds the visible keys.

    Worked on the ranks and N some row of the chunk sees (`seen_part`): the N past them are missing in every row.
    """
    near = proximity(chunk)
    _, sizes = seen_part(chunk)
    grid = chunk.grid if sizes is None else chunk.grid[sizes]
    balls = ball_counts(near, grid, chunk.scratch("metrics_scratch", tuple(near.shape[1:])),
                        chunk.scratch("metrics_flags", tuple(near.shape[1:]), torch.bool))
    r_max = distance_to_rank(chunk, near, balls.far_in_place)
    r_min = distance_to_rank(chunk, near, balls.near_out_place).masked_fill(torch.isinf(balls.near_out), math.inf)

    dtype = r_max.dtype
    seen = {"k_out": balls.k_out.to(dtype), "k_in": balls.k_in.to(dtype), "r_max": r_max, "r_min": r_min}
    if sizes is not None:  # back on the whole grid: the N no row can select are missing in every row
        for name, t in seen.items():
            seen[name] = t.new_full((t.shape[0], len(chunk.grid)), math.nan).index_copy_(
                1, sizes.nonzero().squeeze(-1), t)
    n = chunk.grid.to(dtype).unsqueeze(0)
    out = {name: t.masked_fill(chunk.missing, math.nan) for name, t in {**seen, "s_norm": chunk.s_norm}.items()}
    precision = n / (n + out["k_out"])
    recall = out["k_in"] / n
    return {
        "precision": precision,
        "recall": recall,
        "f_rmax": 2 * precision / (1 + precision),
        "f_rmin": 2 * recall / (1 + recall),
        "f_score": 2 * precision * recall / (precision + recall),
        **out,
    }


# The public entry point takes plain Tensors and checks them itself, so that
# bad input meets a GeometryError with a useful message rather than a type
# checker's; the shapes it enforces are the documented ones, and everything it
# calls is annotated and shape-checked in the tests.
def selection_metrics(
    alpha: Tensor,
    values: Tensor,
    n_grid: NGridLike = None,
    *,
    key_mask: Tensor | None = None,
    ranking: str = "attention",
    distance: str = "euclidean",
    memory_budget_mib: int | float = DEFAULT_MEMORY_BUDGET_MIB,
    check_sums: bool = True,
) -> SelectionMetrics:
    """Precision, Recall, F-scores and radii of top-N selection, for every row and N at once.

    Each row of ``alpha`` is the attention of one query over its keys, and
    ``values`` holds the value vectors of those keys. Keys are ranked by
    ``ranking`` (ties by increasing key index), the top N form I_N, and the
    metrics follow the definitions in `tl_geometry.engine.metrics`.

    Arithmetic is float32, or float64 when an input is float64. Rows are
    processed in chunks so that the working memory stays within about
    ``memory_budget_mib`` MiB, whatever the number of rows.

    Args:
        alpha: attention weights, ``[*batch, key]``, finite and >= 0.
        values: value vectors, ``[*batch, key, d_head]``.
        n_grid: selection sizes N; None means every N from 1 to the number of
            keys. Where N exceeds a row's visible keys the top-N set does not
            exist, and that row's entries are NaN (never clipped to the keys
            available).
        key_mask: keys visible to each row's query, ``[*batch, key]``
            (default: all). Hidden keys are neither selected nor counted.
        ranking: ``"attention"`` (alpha_i) or ``"contribution"`` (alpha_i ||v_i||).
        distance: ``"euclidean"`` (||s - y_i||) or ``"cosine"``
            (1 - <s, y_i> / (||s|| ||y_i|| + 1e-12)).
        memory_budget_mib: working-memory budget of one chunk of rows.
        check_sums: refuse rows that do not sum to 1 over their visible keys
            (within `tl_geometry.engine.inputs.ROW_SUM_TOLERANCE`, 0.01,
            which weights rounded to bfloat16 meet); False for weights meant
            not to sum to 1.

    Returns:
        SelectionMetrics with fields shaped ``[*batch, n]``.

    Raises:
        GeometryError: mismatched shapes, NaN or Inf, negative weights, rows
            that do not sum to 1, an empty key axis, N < 1 or non-integer N,
            unknown ranking or distance.

    Example:
        >>> import torch
        >>> alpha = torch.tensor([0.7, 0.2, 0.1])
        >>> values = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        >>> m = selection_metrics(alpha, values, [1, 2, 3])
        >>> m.k_out.tolist(), m.k_in.tolist()
        ([0.0, 1.0, 0.0], [1.0, 1.0, 3.0])
        >>> m.precision.tolist(), m.recall.tolist()
        ([1.0, 0.6666666865348816, 1.0], [1.0, 0.5, 1.0])
    """
    rows = as_rows(alpha, values, n_grid, key_mask, ranking, distance, memory_budget_mib)
    if check_sums:
        check_row_sums(alpha, key_mask)
    context = rows_context(
        rows.alpha, rows.values, rows.key_mask, rows.grid,
        ranking=ranking, distance=distance, memory_budget_mib=float(memory_budget_mib), costs=(METRICS_COST,),
    )  # fmt: skip
    n_rows, n = rows.alpha.shape[0], len(rows.grid)
    # Written into tensors allocated up front: small per-chunk outputs kept
    # alive between chunks would pin fragments of the C heap.
    joined = {name: torch.empty(n_rows, n, dtype=context.dtype, device=rows.alpha.device) for name in METRIC_NAMES}
    with torch.no_grad():
        start = 0
        for chunk in context.chunks():
            for name, t in chunk_metrics(chunk).items():
                joined[name][start : start + chunk.n_rows].copy_(t)
            start += chunk.n_rows
    shape = (*rows.batch_shape, n)
    return SelectionMetrics(n_grid=rows.grid, **{name: t.reshape(shape) for name, t in joined.items()})
