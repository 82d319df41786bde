"""How far selection is above chance, from a result only (the chance diagnostic's fields).

Every P and R of a run with ``diagnostics=["chance"]`` comes with its chance
level: the floor N / L of Precision and the mean of random top-N sets
(`tl_geometry.diagnostics.chance`). The excess over chance is a field of its
own, computed per row, so its mean over documents and its bootstrap interval
are those of any field; here it is summarised over heads and by regime.
"""

import math
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tl_geometry.analysis.summaries import mean_over_heads
from tl_geometry.analysis.taxonomy import REGIMES, HeadTaxonomy
from tl_geometry.errors import GeometryError
from tl_geometry.results.result import GeometryResult

METRICS = ("precision", "recall")


def _check(result: GeometryResult, metric: str) -> None:
    if metric not in METRICS:
        raise GeometryError(f"metric: expected one of {METRICS}, got {metric!r}")
    if f"chance_{metric}" not in result.fields:
        raise GeometryError(
            f"result: no chance baselines (field 'chance_{metric}'); analyse with diagnostics including 'chance'"
        )


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


def excess_over_chance(result: GeometryResult, metric: str = "precision", level: float = 0.95) -> ExcessOverChance:
    """P or R against chance, averaged over layers and heads, with a bootstrap interval over documents.

    The interval comes from the replicates of ``excess_{metric}``, kept when
    the run asks for them (``bootstrap_fields``): each replicate's mean over
    heads, then its percentiles. Without them it is NaN.

    Raises:
        GeometryError: an unknown metric, or a result without the chance diagnostic.
    """
    _check(result, metric)
    name = f"excess_{metric}"
    low = high = torch.full((len(result.n_grid),), math.nan, dtype=torch.float64)
    if result.has_replicates(name):
        means = torch.nanmean(result.replicates(name).flatten(1, 2), dim=1)  # [replicate, n]
        tail = (1 - level) / 2
        low, high = torch.nanquantile(means, tail, dim=0), torch.nanquantile(means, 1 - tail, dim=0)
    return ExcessOverChance(
        n_grid=result.n_grid,
        measured=mean_over_heads(result, metric),
        chance=mean_over_heads(result, f"chance_{metric}"),
        excess=mean_over_heads(result, name),
        low=low,
        high=high,
    )


def chance_by_regime(result: GeometryResult, taxonomy: HeadTaxonomy, metric: str = "precision") -> Float[Tensor, "regime n"]:
    """Mean random-control level of P (or R) over the heads of each of ``REGIMES`` (Figure 11's chance lines)."""
    _check(result, metric)
    curve = result.per_head(f"chance_{metric}")
    member = torch.nn.functional.one_hot(taxonomy.labels, len(REGIMES)).bool()  # [layer, head, regime]
    masked = torch.where(member.unsqueeze(-1), curve.unsqueeze(-2), torch.full((), math.nan, dtype=curve.dtype))
    return torch.nanmean(masked.flatten(0, 1), dim=0)
