"""How far selection is above chance, from a result only (the chance diagnostic's fields).

Every P and R of a run with ``diagnostics=["chance"]`` comes with its chance
level: the floor N / L of Precision and the mean of random top-N sets
(`tl_geometry.diagnostics.chance`). The excess over chance is a field of its
own, computed per row, so its mean over documents and its bootstrap interval
are those of any field; here it is summarised over heads and by role.
"""

import math
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tl_geometry._renamed import old_names
from tl_geometry.analysis.summaries import mean_over_heads
from tl_geometry.analysis.head_roles import ROLE_LABELS, HeadRoles
from tl_geometry.diagnostics.chance import CHANCE_OF, EXCESS_OF
from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.diagnostics.selection import PRECISION
from tl_geometry.errors import GeometryError
from tl_geometry.results.result import GeometryResult
from tl_geometry.results.table import FieldName, field_name

METRICS = tuple(CHANCE_OF)  # the metrics with a chance level: Precision and Recall


def _checked(result: GeometryResult, metric: FieldName) -> FieldSpec:
    """The declaration of ``metric`` (given by name or declaration), once ``result`` has its chance level."""
    by_name = {spec.name: spec for spec in METRICS}
    name = field_name(metric)
    if name not in by_name:
        raise GeometryError(f"metric: expected one of {tuple(by_name)}, got {name!r}")
    chance = CHANCE_OF[by_name[name]].name
    if chance not in result.fields:
        raise GeometryError(
            f"result: no chance baselines (field '{chance}'); analyse with diagnostics including 'chance'"
        )
    return by_name[name]


@dataclass(frozen=True)
class ExcessOverChance:
    """The mean over layers and heads of P (or R) minus its random-control level, against N.

    Attributes:
        n_grid: the selection sizes N, ``[n]``.
        measured: mean P (or R) over layers and heads, ``[n]``.
        chance: mean of the random controls, ``[n]``.
        excess: mean of the per-row excess, ``[n]``.
        low, high: percentile bootstrap interval of ``excess`` over documents
            (NaN without replicates), ``[n]``.
    """

    n_grid: Int[Tensor, " n"]
    measured: Float[Tensor, " n"]
    chance: Float[Tensor, " n"]
    excess: Float[Tensor, " n"]
    low: Float[Tensor, " n"]
    high: Float[Tensor, " n"]


def excess_over_chance(result: GeometryResult, metric: FieldName = PRECISION, level: float = 0.95) -> ExcessOverChance:
    """P or R against chance, averaged over layers and heads, with a bootstrap interval over documents.

    The interval comes from the replicates of ``excess_{metric}``, kept when
    the run asks for them (``bootstrap_fields``): each replicate's mean over
    heads, then its percentiles. Without them it is NaN.

    Raises:
        GeometryError: an unknown metric, or a result without the chance diagnostic.
    """
    metric = _checked(result, metric)
    excess = EXCESS_OF[metric]
    low = high = torch.full((len(result.n_grid),), math.nan, dtype=torch.float64)
    if result.has_replicates(excess):
        means = torch.nanmean(result.replicates(excess).flatten(1, 2), dim=1)  # [replicate, n]
        tail = (1 - level) / 2
        low, high = torch.nanquantile(means, tail, dim=0), torch.nanquantile(means, 1 - tail, dim=0)
    return ExcessOverChance(
        n_grid=result.n_grid,
        measured=mean_over_heads(result, metric),
        chance=mean_over_heads(result, CHANCE_OF[metric]),
        excess=mean_over_heads(result, excess),
        low=low,
        high=high,
    )


def chance_by_role(
    result: GeometryResult, roles: HeadRoles, metric: FieldName = PRECISION
) -> Float[Tensor, "role n"]:
    """Mean random-control level of P (or R) over the heads of each of ``ROLE_LABELS`` (Figure 11's chance lines)."""
    curve = result.per_head(CHANCE_OF[_checked(result, metric)])
    member = torch.nn.functional.one_hot(roles.labels, len(ROLE_LABELS)).bool()  # [layer, head, role]
    masked = torch.where(member.unsqueeze(-1), curve.unsqueeze(-2), torch.full((), math.nan, dtype=curve.dtype))
    return torch.nanmean(masked.flatten(0, 1), dim=0)

__getattr__ = old_names(__name__, globals())  # the names they had before (tl_geometry._renamed)
