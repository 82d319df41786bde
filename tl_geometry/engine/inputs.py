"""Inputs of the engine's public functions: checked once, with messages that say what to fix.

`as_rows` validates attention rows, value vectors, key masks and the N grid
and flattens them to ``[row, key]`` in the working dtype; the selection
context (`tl_geometry.engine.context`) takes it from there.
"""

import math
from collections.abc import Sequence
from typing import NamedTuple, get_args

import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from tl_geometry._types import Distance, Ranking
from tl_geometry.engine.context import working_dtype
from tl_geometry.errors import GeometryError

RANKINGS: tuple[str, ...] = get_args(Ranking)
DISTANCES: tuple[str, ...] = get_args(Distance)

# Loose on purpose: resolve_n_grid checks the entries and explains what is wrong.
NGridLike = Sequence | Tensor | np.ndarray | None


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


ROW_SUM_TOLERANCE = 1e-2
"""How far from 1 a row of attention weights may sum (`check_row_sums`): weights rounded to bfloat16 (a relative
error of at most 2^-9 each, so at most about 0.002 over a row, whatever its dtype now) pass; unnormalised scores,
logits and rows that lost keys to a mask do not."""


def check_row_sums(alpha: Tensor, key_mask: Tensor | None) -> None:
    """Raise GeometryError unless every row of ``alpha`` sums to 1 over its visible keys (within the tolerance).

    A row that sums to something else is not an attention distribution: its
    top-N sets and s(N) would mean something other than the paper's. Rows with
    no visible key are left alone (they give NaN). The inputs are checked by
    `check_selection_inputs` first.
    """
    tolerance = ROW_SUM_TOLERANCE
    weights = alpha.double() if key_mask is None else alpha.double().masked_fill(~key_mask, 0.0)
    sums = weights.sum(-1)
    has_keys = torch.ones_like(sums, dtype=torch.bool) if key_mask is None else key_mask.any(-1)
    bad = has_keys & ((sums - 1).abs() > tolerance)
    if bad.any():
        first = tuple(int(i) for i in bad.nonzero()[0])
        where = f" (row {list(first)})" if first else ""
        raise GeometryError(
            f"alpha: {int(bad.sum())} of {bad.numel()} rows do not sum to 1 over their visible keys (tolerance "
            f"{tolerance:g}); the first{where} sums to {float(sums[first]):.6g}. Pass post-softmax attention "
            "(e.g. alpha / alpha.sum(-1, keepdim=True)), or check_sums=False for weights that are meant not to sum to 1"
        )


class Rows(NamedTuple):
    """Validated engine inputs flattened to rows, in the working dtype."""

    batch_shape: torch.Size
    alpha: Float[Tensor, "row key"]
    values: Float[Tensor, "row key d_head"]
    key_mask: Bool[Tensor, "row key"]
    grid: Int[Tensor, " n"]


def check_mib(value: object, name: str, *, zero: bool = False) -> float:
    """A memory budget in MiB as a float: positive and finite (or 0 where ``zero`` allows none); else GeometryError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
        math.isfinite(value) and (value >= 0 if zero else value > 0)
    ):
        least = ">= 0" if zero else "> 0"
        raise GeometryError(f"{name}: expected a finite memory budget in MiB {least}, e.g. 128, got {value!r}")
    return float(value)


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
    check_mib(memory_budget_mib, "memory_budget_mib")
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
