"""Top-N selection in value-state space: orders, representative vectors, distances.

For one query, keys are ranked by a score (the attention weight alpha_i by
default, or the contribution alpha_i * ||v_i||), ties broken by increasing key
index. The top-N set I_N gives the representative vector
s(N) = sum_{i in I_N} y_i with y_i = alpha_i * v_i (not renormalised), and every
key gets a distance D_i = d(s(N), y_i).

Everything here works on a chunk of rows at once and on every N of the grid at
once: the prefix sums of the sorted y_i give s(N) for all N, and one batched
matrix product gives <s(N), y_i> for all (N, i).
"""

import math
from collections.abc import Sequence
from typing import NamedTuple, get_args

import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from tl_geometry._types import Distance, Ranking
from tl_geometry.errors import GeometryError

RANKINGS: tuple[str, ...] = get_args(Ranking)
DISTANCES: tuple[str, ...] = get_args(Distance)

# Cosine distance guard, as fixed in DESIGN.md: 1 - <s, y> / (||s|| ||y|| + 1e-12).
COSINE_EPS = 1e-12

# Loose on purpose: resolve_n_grid checks the entries and explains what is wrong.
NGridLike = Sequence | Tensor | np.ndarray | None


def working_dtype(*tensors: Tensor) -> torch.dtype:
    """float64 if any input is float64, else float32 (never less than float32)."""
    if any(t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32


def resolve_n_grid(n_grid: NGridLike, n_keys: int) -> Int[Tensor, " n"]:
    """Validate the selection sizes and return them as an int64 tensor.

    Args:
        n_grid: selection sizes N (any order, repeats allowed), or None for
            every N from 1 to ``n_keys``.
        n_keys: length of the key axis.

    Returns:
        The grid, shape ``[n]``. N above ``n_keys`` is allowed here (it gives
        NaN downstream); N < 1 or non-integer N raises.

    Raises:
        GeometryError: empty grid, non-integer entries, or N < 1.
    """
    if n_grid is None:
        return torch.arange(1, n_keys + 1, dtype=torch.int64)
    if isinstance(n_grid, str):
        raise GeometryError(
            f"n_grid: expected a sequence of positive integers or None, got the string {n_grid!r}"
        )
    grid = torch.as_tensor(np.asarray(n_grid)).reshape(-1)
    if grid.numel() == 0:
        raise GeometryError("n_grid: expected at least one selection size N, got an empty grid")
    if grid.dtype == torch.bool or grid.is_complex():
        raise GeometryError(f"n_grid: expected integers, got dtype {grid.dtype}")
    if grid.is_floating_point():
        bad = ~torch.isfinite(grid) | (grid != torch.round(grid))
        if bad.any():
            raise GeometryError(
                f"n_grid: every N must be a whole number, got {grid[bad][0].item()!r}; "
                "pass integers such as [1, 2, 4, 8]"
            )
    grid = grid.to(torch.int64)
    if (grid < 1).any():
        raise GeometryError(f"n_grid: every N must be >= 1, got {int(grid.min())}")
    return grid


def check_selection_inputs(
    alpha: Tensor, values: Tensor, key_mask: Tensor | None, ranking: str, distance: str
) -> None:
    """Raise GeometryError naming the first thing wrong with the engine's inputs."""
    if ranking not in RANKINGS:
        raise GeometryError(f"ranking: expected one of {RANKINGS}, got {ranking!r}")
    if distance not in DISTANCES:
        raise GeometryError(f"distance: expected one of {DISTANCES}, got {distance!r}")
    for name, t in (("alpha", alpha), ("values", values)):
        if not isinstance(t, Tensor) or not t.is_floating_point():
            kind = t.dtype if isinstance(t, Tensor) else type(t).__name__
            raise GeometryError(f"{name}: expected a floating-point torch.Tensor, got {kind}")
    if alpha.ndim < 1:
        raise GeometryError("alpha: expected shape [*batch, key], got a 0-d tensor")
    if values.ndim != alpha.ndim + 1 or values.shape[:-1] != alpha.shape:
        raise GeometryError(
            f"values: expected shape [*batch, key, d_head] = [{', '.join(map(str, alpha.shape))}, d_head] "
            f"to match alpha {tuple(alpha.shape)}, got {tuple(values.shape)}"
        )
    if alpha.shape[-1] == 0:
        raise GeometryError("alpha: the key axis is empty; each row needs at least one key")
    if values.shape[-1] == 0:
        raise GeometryError("values: d_head is 0; value vectors need at least one dimension")
    if key_mask is not None:
        if not isinstance(key_mask, Tensor) or key_mask.dtype != torch.bool:
            kind = key_mask.dtype if isinstance(key_mask, Tensor) else type(key_mask).__name__
            raise GeometryError(f"key_mask: expected a bool tensor, got {kind}")
        if key_mask.shape != alpha.shape:
            raise GeometryError(
                f"key_mask: expected the shape of alpha {tuple(alpha.shape)}, got {tuple(key_mask.shape)}"
            )
    for name, t in (("alpha", alpha), ("values", values)):
        # amax/amin propagate NaN: a cheap test that allocates nothing of the input's size.
        if not (torch.isfinite(t.amax()) and torch.isfinite(t.amin())):
            n_bad = int((~torch.isfinite(t)).sum())
            raise GeometryError(f"{name}: contains {n_bad} NaN or Inf entries; all entries must be finite")
    if (alpha < 0).any():
        raise GeometryError(
            f"alpha: attention weights must be >= 0, found {int((alpha < 0).sum())} negative "
            f"(smallest {alpha.min().item():.3g}); pass the post-softmax pattern"
        )


class Rows(NamedTuple):
    """Validated engine inputs flattened to rows, in the working dtype."""

    batch_shape: torch.Size
    alpha: Float[Tensor, "row key"]
    values: Float[Tensor, "row key d_head"]
    key_mask: Bool[Tensor, "row key"]
    grid: Int[Tensor, " n"]


def as_rows(
    alpha: Tensor,
    values: Tensor,
    n_grid: NGridLike,
    key_mask: Tensor | None,
    ranking: str,
    distance: str,
    memory_budget_mib: object,
) -> Rows:
    """Check the inputs of an engine call (GeometryError naming what is wrong) and flatten them to rows."""
    check_selection_inputs(alpha, values, key_mask, ranking, distance)
    if isinstance(memory_budget_mib, bool) or not isinstance(memory_budget_mib, (int, float)) or not (
        memory_budget_mib > 0
    ):
        raise GeometryError(f"memory_budget_mib: expected a positive number of MiB, got {memory_budget_mib!r}")
    n_keys, d_head = alpha.shape[-1], values.shape[-1]
    dtype = working_dtype(alpha, values)
    rows_alpha = alpha.reshape(-1, n_keys).to(dtype)
    mask = torch.ones_like(rows_alpha, dtype=torch.bool) if key_mask is None else key_mask.reshape(-1, n_keys)
    return Rows(
        batch_shape=alpha.shape[:-1],
        alpha=rows_alpha,
        values=values.reshape(-1, n_keys, d_head).to(dtype),
        key_mask=mask,
        grid=resolve_n_grid(n_grid, n_keys),
    )


def selection_order(
    alpha: Float[Tensor, "row key"],
    values: Float[Tensor, "row key d_head"],
    key_mask: Bool[Tensor, "row key"],
    ranking: Ranking,
) -> Int[Tensor, "row key"]:
    """Key indices sorted by decreasing score, ties by increasing key index.

    Keys outside ``key_mask`` sort last, so position p < n_visible of the order
    is always a visible key.
    """
    score = alpha if ranking == "attention" else alpha * torch.linalg.vector_norm(values, dim=-1)
    score = score.masked_fill(~key_mask, -math.inf)
    # A stable descending sort keeps equal scores in increasing key order.
    return torch.sort(score, dim=-1, descending=True, stable=True).indices


class Workspace(NamedTuple):
    """Buffers reused by every chunk of one engine call.

    Allocating the large per-chunk tensors afresh for each chunk costs page
    faults and fragments the C heap, which then keeps hundreds of MiB that
    the engine no longer uses; reusing one set keeps peak memory at the budget.
    """

    y: Float[Tensor, "row key d_head"]
    y_sorted: Float[Tensor, "row key d_head"]
    prefix: Float[Tensor, "row key d_head"]
    s: Float[Tensor, "row n d_head"]
    at_radius: Float[Tensor, "row n d_head"]
    proximity: Float[Tensor, "row n key"]
    scratch: Float[Tensor, "row n key"]
    flags: Bool[Tensor, "row n key"]

    @classmethod
    def allocate(cls, rows: int, n: int, n_keys: int, d_head: int, dtype: torch.dtype) -> "Workspace":
        """Uninitialised buffers for chunks of up to ``rows`` rows."""
        vectors = (rows, n_keys, d_head)
        grid = (rows, n, n_keys)
        return cls(
            y=torch.empty(vectors, dtype=dtype),
            y_sorted=torch.empty(vectors, dtype=dtype),
            prefix=torch.empty(vectors, dtype=dtype),
            s=torch.empty((rows, n, d_head), dtype=dtype),
            at_radius=torch.empty((rows, n, d_head), dtype=dtype),
            proximity=torch.empty(grid, dtype=dtype),
            scratch=torch.empty(grid, dtype=dtype),
            flags=torch.empty(grid, dtype=torch.bool),
        )

    def first(self, rows: int) -> "Workspace":
        """Views of the buffers for a chunk of ``rows`` rows (the last chunk may be short)."""
        return Workspace(*(buffer[:rows] for buffer in self))


class ChunkGeometry(NamedTuple):
    """Geometry of a chunk of rows for every N of the grid, keys in selection order.

    ``proximity`` orders keys exactly as D_i does for each (row, N), but is
    computed without the term shared by the whole row: for the Euclidean
    distance it is D_i^2 - ||s||^2 = ||y_i||^2 - 2<s, y_i>. Adding ||s||^2
    would round away the tiny differences between the many small alpha_i v_i
    of a real attention row, and those differences decide the counts. Hidden
    keys (sorted last) have proximity +inf.
    """

    y_sorted: Float[Tensor, "row key d_head"]
    s: Float[Tensor, "row n d_head"]
    s_norm: Float[Tensor, "row n"]
    proximity: Float[Tensor, "row n key"]
    n_visible: Int[Tensor, " row"]


def chunk_geometry(
    alpha: Float[Tensor, "row key"],
    values: Float[Tensor, "row key d_head"],
    key_mask: Bool[Tensor, "row key"],
    grid: Int[Tensor, " n"],
    ranking: Ranking,
    distance: Distance,
    workspace: Workspace,
) -> ChunkGeometry:
    """Sorted contributions, s(N) and the proximity of every key, for all N at once.

    Writes into ``workspace`` (its views for this chunk); the returned tensors
    are valid until the next chunk.
    """
    n_keys = alpha.shape[-1]
    order = selection_order(alpha, values, key_mask, ranking)
    y = torch.mul(alpha.unsqueeze(-1), values, out=workspace.y)
    y_sorted = torch.gather(y, 1, order.unsqueeze(-1).expand_as(y), out=workspace.y_sorted)
    # s(N) is the prefix sum up to rank N - 1; N beyond the keys is NaN later anyway.
    prefix = torch.cumsum(y_sorted, dim=1, out=workspace.prefix)
    s = torch.index_select(prefix, 1, grid.clamp(max=n_keys) - 1, out=workspace.s)
    s_norm = torch.linalg.vector_norm(s, dim=-1)
    y_sq = (y_sorted * y_sorted).sum(-1)
    proximity = workspace.proximity
    if distance == "euclidean":
        torch.baddbmm(y_sq.unsqueeze(1), s, y_sorted.transpose(1, 2), alpha=-2.0, out=proximity)
    else:
        torch.bmm(s, y_sorted.transpose(1, 2), out=proximity)
        scale = s_norm.unsqueeze(-1) * y_sq.sqrt().unsqueeze(1) + COSINE_EPS
        proximity.div_(scale).neg_().add_(1.0)
    n_visible = key_mask.sum(-1)
    hidden = torch.arange(n_keys) >= n_visible.unsqueeze(-1)
    if hidden.any():
        proximity.masked_fill_(hidden.unsqueeze(1), math.inf)
    return ChunkGeometry(y_sorted, s, s_norm, proximity, n_visible)


def distance_to_rank(
    geometry: ChunkGeometry, rank: Int[Tensor, "row n"], distance: Distance, workspace: Workspace
) -> Float[Tensor, "row n"]:
    """The distance D between s(N) and the key at sorted position ``rank``, per (row, N).

    Computed directly from the vectors (not from the proximity) so radii keep
    full precision even when D is tiny.
    """
    if distance == "cosine":
        # The cosine proximity is the distance itself.
        return torch.gather(geometry.proximity, 2, rank.unsqueeze(-1)).squeeze(-1)
    d_head = geometry.y_sorted.shape[-1]
    index = rank.unsqueeze(-1).expand(*rank.shape, d_head)
    y_at = torch.gather(geometry.y_sorted, 1, index, out=workspace.at_radius)
    return torch.linalg.vector_norm(y_at.sub_(geometry.s), dim=-1)
