"""Reductions of a GeometryResult that figures and reports show.

Kept apart from `tl_geometry.report.paper_figures` so that figures only draw, and so
that every number a figure shows can be had as a tensor too.
"""

import torch
from jaxtyping import Float
from torch import Tensor

from tl_geometry.diagnostics.selection import ATTENTION_MASS
from tl_geometry.errors import GeometryError
from tl_geometry.results.result import GeometryResult
from tl_geometry.results.table import FieldName, field_name


def n_index(result: GeometryResult, n: int) -> int:
    """Position of selection size ``n`` on the result's grid.

    Raises:
        GeometryError: ``n`` is not on the grid (the message lists the grid).
    """
    matches = (result.n_grid == n).nonzero()
    if len(matches) == 0:
        raise GeometryError(f"n: N = {n} is not on this result's grid {result.n_grid.tolist()}; pick one of those")
    return int(matches[0, 0])


def mean_over_heads(result: GeometryResult, name: FieldName) -> Float[Tensor, " n"]:
    """The global mean of a ``[layer, head_index, n]`` field over layers and heads (NaN skipped)."""
    return torch.nanmean(result.per_head(name).flatten(0, 1), dim=0)


def spread_over_heads(result: GeometryResult, name: FieldName, q: float = 0.25) -> tuple[Tensor, Tensor]:
    """Lower and upper ``q`` quantiles of a ``[layer, head_index, n]`` field across layers and heads."""
    flat = result.per_head(name).flatten(0, 1)
    return torch.nanquantile(flat, q, dim=0), torch.nanquantile(flat, 1 - q, dim=0)


def at_n(result: GeometryResult, name: FieldName, n: int) -> Float[Tensor, "layer head_index"]:
    """A ``[layer, head_index, n]`` field at one selection size N."""
    return result.per_head(name)[..., n_index(result, n)]


EFFECTIVE_MASS = 0.9
"""The share of attention a head's effective N must cover (`effective_n`)."""


def effective_n(result: GeometryResult, mass: float = EFFECTIVE_MASS) -> Float[Tensor, "layer head_index"]:
    """Each head's effective N: the smallest N of the grid whose top-N set holds ``mass`` of the attention.

    Read from the field ``attention_mass`` (the sum of alpha_i over the
    top-N set, averaged over the analysed queries and documents, recorded by
    every run): the smallest grid N where that mean reaches ``mass`` (less
    1e-6: weights summed in float32 may miss 1 by that much). It
    says how many keys a head actually uses, so its P and R are best read
    near it. NaN where no N of the grid reaches ``mass`` (e.g. a grid that
    stops short of the context).

    Raises:
        GeometryError: ``mass`` outside (0, 1], or a result without
            ``attention_mass`` (saved before it was recorded: analyse again).
    """
    if isinstance(mass, bool) or not isinstance(mass, (int, float)) or not 0 < mass <= 1:
        raise GeometryError(f"mass: expected a share of the attention in (0, 1], e.g. 0.9, got {mass!r}")
    if ATTENTION_MASS.name not in result.fields:
        raise GeometryError(
            "result: no field 'attention_mass' (results saved by older versions lack it); analyse the text again "
            "to get each head's effective N"
        )
    covered = result.per_head(ATTENTION_MASS) >= mass - 1e-6  # float32 sums of weights that add up to 1
    grid = result.n_grid.to(torch.float64)
    first = torch.where(covered, grid, torch.full((), float("inf"), dtype=torch.float64)).amin(-1)
    return first.masked_fill(torch.isinf(first), float("nan"))


def at_each_head(values: Float[Tensor, "layer head_index n"], grid: Tensor, n: Float[Tensor, "layer head_index"]) -> Float[Tensor, "layer head_index"]:
    """``values`` of each head at its own N (e.g. its effective N); NaN where that N is NaN."""
    index = (grid.to(n.dtype).view(1, 1, -1) == n.unsqueeze(-1)).to(torch.int64).argmax(-1, keepdim=True)
    picked = values.gather(-1, index).squeeze(-1).to(torch.float64)
    return picked.masked_fill(torch.isnan(n), float("nan"))


def by_query_position(result: GeometryResult, name: FieldName) -> tuple[list[int], Float[Tensor, "layer head_index position n"]]:
    """A per-query field of a ``keep_queries=True`` run, averaged over documents at each query position.

    Positions count from each sequence's first real token (as
    ``query_positions``); a position only some documents reach is averaged
    over those.

    Returns:
        The positions present (sorted) and the mean ``[layer, head_index, position, n]``.

    Raises:
        GeometryError: the result keeps no per-query rows of ``name``.
    """
    name = field_name(name)
    if result.queries is None or result.query_positions is None or name not in result.queries:
        raise GeometryError(
            f"result: keeps no per-query rows of {name!r}; analyse with keep_queries=True (and query_positions='all' "
            "or a list) to see it by query position"
        )
    values = result.queries[name].to(torch.float64)  # [doc, layer, head, query, n]
    where = result.query_positions  # [doc, query], -1 where a document has fewer queries
    positions = sorted(p for p in set(where.flatten().tolist()) if p >= 0)
    member = (where.unsqueeze(-1) == torch.tensor(positions, device=where.device)).to(values.dtype)  # [doc, query, p]
    seen = (~values.isnan()).to(values.dtype)
    total = torch.einsum("dlhqn,dqp->lhpn", torch.nan_to_num(values), member)
    count = torch.einsum("dlhqn,dqp->lhpn", seen, member)
    return positions, total / count  # NaN (0 / 0) where no document has a value
