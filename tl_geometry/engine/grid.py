"""The grids of selection sizes N for model runs: the default one, and what a requested grid means."""

from collections.abc import Sequence

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from tl_geometry.errors import GeometryError


def default_n_grid(n_keys: int, *, dense_until: int = 16, n_points: int = 40) -> Int[Tensor, " n"]:
    """Every N from 1 to ``dense_until``, then log-spaced up to ``n_keys`` (included).

    About ``n_points`` values in all: small N, where the paper finds the
    strongest separability, is covered densely; large N sparsely.

    Args:
        n_keys: the number of visible keys (the largest N).
        dense_until: the last N of the dense part.
        n_points: the target number of values (fewer when ``n_keys`` is small).

    Returns:
        Strictly increasing int64 tensor ``[n]`` ending at ``n_keys``.

    Example:
        >>> default_n_grid(20).tolist()
        [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
        >>> g = default_n_grid(1024); len(g), g[-1].item()
        (40, 1024)
    """
    if n_keys < 1:
        raise GeometryError(f"n_keys: expected at least 1 key, got {n_keys}")
    dense = np.arange(1, min(dense_until, n_keys) + 1)
    if n_keys <= dense_until:
        return torch.as_tensor(dense, dtype=torch.int64)
    # Geometric steps from dense_until to n_keys; rounding may merge values,
    # so ask for more points until the unique count reaches the target.
    want = max(n_points - len(dense), 1)
    for extra in range(want, 4 * want):
        tail = np.unique(np.round(np.geomspace(dense_until, n_keys, extra + 1)[1:]).astype(np.int64))
        tail = tail[tail > dense_until]
        if len(tail) >= want or len(tail) == n_keys - dense_until:
            break
    return torch.as_tensor(np.concatenate([dense, tail]), dtype=torch.int64)


def grid_of(n_grid: str | Sequence[int], n_keys: int) -> Int[Tensor, " n"]:
    """The selection sizes a requested grid means for inputs whose longest query sees ``n_keys`` keys.

    ``"default"`` is `default_n_grid`, ``"all"`` every N from 1 to ``n_keys``, a sequence itself
    (N above ``n_keys`` included: such N is reported as missing, never clipped).

    >>> grid_of("all", 3).tolist(), grid_of((2, 9), 3).tolist()
    ([1, 2, 3], [2, 9])
    """
    if n_grid == "default":
        return default_n_grid(n_keys)
    if n_grid == "all":
        return torch.arange(1, n_keys + 1, dtype=torch.int64)
    return torch.tensor(list(n_grid), dtype=torch.int64)
