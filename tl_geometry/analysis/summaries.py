"""Reductions of a GeometryResult that figures and reports show.

Kept apart from `tl_geometry.report.plots` so that figures only draw, and so
that every number a figure shows can be had as a tensor too.
"""

import torch
from jaxtyping import Float
from torch import Tensor

from tl_geometry.errors import GeometryError
from tl_geometry.results.result import GeometryResult


def n_index(result: GeometryResult, n: int) -> int:
    """Position of selection size ``n`` on the result's grid.

    Raises:
        GeometryError: ``n`` is not on the grid (the message lists the grid).
    """
    matches = (result.n_grid == n).nonzero()
    if len(matches) == 0:
        raise GeometryError(f"n: N = {n} is not on this result's grid {result.n_grid.tolist()}; pick one of those")
    return int(matches[0, 0])


def mean_over_heads(result: GeometryResult, name: str) -> Float[Tensor, " n"]:
    """The global mean of a ``[layer, head_index, n]`` field over layers and heads (NaN skipped)."""
    return torch.nanmean(result.per_head(name).flatten(0, 1), dim=0)


def spread_over_heads(result: GeometryResult, name: str, q: float = 0.25) -> tuple[Tensor, Tensor]:
    """Lower and upper ``q`` quantiles of a ``[layer, head_index, n]`` field across layers and heads."""
    flat = result.per_head(name).flatten(0, 1)
    return torch.nanquantile(flat, q, dim=0), torch.nanquantile(flat, 1 - q, dim=0)


def at_n(result: GeometryResult, name: str, n: int) -> Float[Tensor, "layer head_index"]:
    """A ``[layer, head_index, n]`` field at one selection size N."""
    return result.per_head(name)[..., n_index(result, n)]
