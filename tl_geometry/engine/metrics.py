"""Precision, Recall, F-scores and radii of top-N selection (paper section 3, appendix A.1).

Definitions (fixed in DESIGN.md), for one query row and a selection size N:

- r_max = max of D_i over the selected keys, r_min = min of D_j over the
  visible non-selected keys (+inf when every visible key is selected);
- Precision P(r_max, N) = N / (N + K_out), K_out = #{non-selected j : D_j <= r_max}
  (closed ball);
- Recall R(r_min, N) = K_in / N, K_in = #{selected i : D_i < r_min} (open ball);
- F(r_max) = 2P / (1 + P), F(r_min) = 2R / (1 + R) (Corollary 1, since
  P(r_min) = R(r_max) = 1), and the extremal F_N = 2PR / (P + R).
"""

import math
from dataclasses import dataclass, fields

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from tl_geometry._types import Distance
from tl_geometry.engine.selection import (
    NGridLike,
    ChunkGeometry,
    Workspace,
    as_rows,
    chunk_geometry,
    distance_to_rank,
)

DEFAULT_MEMORY_BUDGET_MIB = 128


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


def _counts_and_radii(
    geometry: ChunkGeometry,
    grid: Int[Tensor, " n"],
    selected: Bool[Tensor, "n key"],
    distance: Distance,
    workspace: Workspace,
) -> dict[str, Float[Tensor, "row n"]]:
    """K_in, K_out and the radii of a chunk, from the proximities of all keys.

    Written to touch the ``[row, n, key]`` proximities as few times as
    possible: with hidden keys at +inf, every selected key lies inside the
    closed r_max ball and no non-selected key lies inside the open r_min ball,
    so K_out = #{keys within r_max} - N and K_in = #{keys within r_min}.
    ``selected[n, p]`` says whether sorted rank p is in I_N (p < N).
    """
    proximity = geometry.proximity

    inf = proximity.new_tensor(math.inf)
    far_in, far_in_rank = torch.where(selected, proximity, -inf, out=workspace.scratch).max(-1)
    near_out, near_out_rank = torch.where(selected, inf, proximity, out=workspace.scratch).min(-1)
    within_far = torch.le(proximity, far_in.unsqueeze(-1), out=workspace.flags)
    k_out = within_far.sum(-1, dtype=torch.int32) - grid.to(torch.int32)
    within_near = torch.lt(proximity, near_out.unsqueeze(-1), out=workspace.flags)
    k_in = within_near.sum(-1, dtype=torch.int32)

    r_max = distance_to_rank(geometry, far_in_rank, distance, workspace)
    everything_selected = torch.isinf(near_out)
    r_min = distance_to_rank(geometry, near_out_rank, distance, workspace).masked_fill(everything_selected, math.inf)
    return {"k_out": k_out.to(r_max.dtype), "k_in": k_in.to(r_max.dtype), "r_max": r_max, "r_min": r_min}


# Chunks whose [row, n, key] proximities fit in the last-level cache run the
# counting passes several times faster than larger ones (measured on 2-core
# EPYC machines with 32 MiB L3: about 10x between 4 MiB and 100 MiB chunks).
CACHE_FRIENDLY_BYTES = 4 * 2**20


def _chunk_rows(n_grid: int, n_keys: int, d_head: int, budget_mib: float, itemsize: int) -> int:
    """How many rows to process at once: cache-sized, and never above the memory budget.

    Per row the workspace holds the contributions, sorted and prefix-summed
    (3 x key x d_head), s(N) and one scratch of its size (2 x n x d_head),
    and the proximities with one float and one boolean scratch of their size
    (n x key each).
    """
    per_row = itemsize * (3 * n_keys * d_head + 2 * n_grid * d_head + 2 * n_grid * n_keys) + n_grid * n_keys
    within_budget = int(budget_mib * 2**20 // per_row)
    cache_sized = CACHE_FRIENDLY_BYTES // (itemsize * n_grid * n_keys)
    return max(1, min(within_budget, cache_sized))


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

    Returns:
        SelectionMetrics with fields shaped ``[*batch, n]``.

    Raises:
        GeometryError: mismatched shapes, NaN or Inf, negative weights, an
            empty key axis, N < 1 or non-integer N, unknown ranking or distance.

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
    batch_shape, grid = rows.batch_shape, rows.grid
    rows_alpha, rows_values, rows_mask = rows.alpha, rows.values, rows.key_mask
    n_keys, d_head, dtype = rows_alpha.shape[-1], rows_values.shape[-1], rows_alpha.dtype
    n_rows = rows_alpha.shape[0]
    chunk = _chunk_rows(len(grid), n_keys, d_head, float(memory_budget_mib), rows_alpha.element_size())

    selected = torch.arange(n_keys) < grid.unsqueeze(-1)
    workspace = Workspace.allocate(min(chunk, n_rows), len(grid), n_keys, d_head, dtype)
    # Results are written into tensors allocated up front: small per-chunk
    # outputs kept alive between chunks would pin fragments of the C heap and
    # grow memory by a chunk's temporaries at every chunk.
    chunk_fields = ("k_out", "k_in", "r_max", "r_min", "s_norm")
    joined = {name: torch.empty(n_rows, len(grid), dtype=dtype) for name in chunk_fields}
    with torch.no_grad():
        for start in range(0, n_rows, chunk):
            part = slice(start, start + chunk)
            buffers = workspace.first(rows_alpha[part].shape[0])
            geometry = chunk_geometry(
                rows_alpha[part], rows_values[part], rows_mask[part], grid, ranking, distance, buffers
            )
            out = _counts_and_radii(geometry, grid, selected, distance, buffers)
            out["s_norm"] = geometry.s_norm
            for name, tensor in out.items():
                joined[name][part].copy_(tensor)

    n_visible = rows_mask.sum(-1)
    missing = grid.unsqueeze(0) > n_visible.unsqueeze(-1)  # [row, n]: no top-N set
    n = grid.to(dtype).unsqueeze(0)
    for tensor in joined.values():
        tensor.masked_fill_(missing, math.nan)
    precision = n / (n + joined["k_out"])
    recall = joined["k_in"] / n
    metrics = {
        "precision": precision,
        "recall": recall,
        "f_rmax": 2 * precision / (1 + precision),
        "f_rmin": 2 * recall / (1 + recall),
        "f_score": 2 * precision * recall / (precision + recall),
        **joined,
    }
    shape = (*batch_shape, len(grid))
    return SelectionMetrics(n_grid=grid, **{name: t.reshape(shape) for name, t in metrics.items()})
