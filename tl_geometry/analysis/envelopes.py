"""What the upper envelopes of a result bound: kappa, sigma's form, the formula's floor and the exceedance share.

The theorem's upper envelopes (eq. 13, 15) put each row's realised gaps
under a Gaussian of scale sigma: they bound the mean of rows re-drawn around
the measured one, not the measured row (`tl_geometry.theory.theorem_bounds`). A
measured row with no intruder (P = R = 1) lies above them, so the share of
measured rows above the envelope is reported per head, at 1 < N < the
largest N (N = 1 and N = L are 1 on both sides). The envelope of P never
falls below 1 - 1/2 / (N + 1), and that of R below 1/2, whatever the data.
"""

import math
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from tl_geometry.diagnostics.bounds import BOUND_PRECISION_UPPER, EXCEEDED_OF
from tl_geometry.diagnostics.selection import PRECISION, RECALL
from tl_geometry.errors import GeometryError
from tl_geometry.results.result import GeometryResult
from tl_geometry.theory.theorem_bounds import sigma_form, upper_envelope_floor


@dataclass(frozen=True)
class UpperEnvelopeFacts:
    """The settings behind a result's upper envelopes and how often the measured rows exceed them.

    Attributes:
        kappa: the concentration constant the run used.
        variant: ``"sink_aware"`` or ``"paper"``.
        sigma: sigma's form in words (B'^2 or B over sqrt(2 kappa d)).
        precision_floor, recall_floor: the lowest value each envelope can take, per N ``[n]``.
        precision_exceeded, recall_exceeded: per head, the share of measured rows above the envelope
            at 1 < N < the largest N, ``[layer, head_index]`` (NaN for results saved before it was recorded).
    """

    kappa: float
    variant: str
    sigma: str
    precision_floor: Float[Tensor, " n"]
    recall_floor: Float[Tensor, " n"]
    precision_exceeded: Float[Tensor, "layer head"]
    recall_exceeded: Float[Tensor, "layer head"]

    def overall(self, metric: str) -> float:
        """The mean of the per-head shares (heads weigh alike); NaN when none was recorded."""
        t = getattr(self, f"{metric}_exceeded")
        return float(t.nanmean()) if bool((~t.isnan()).any()) else math.nan

    def summary(self) -> str:
        """One paragraph for the scorecard and the head explorer."""
        parts = []
        for metric in (PRECISION.name, RECALL.name):
            t = getattr(self, f"{metric}_exceeded")
            if bool((~t.isnan()).any()):
                parts.append(f"{metric} {self.overall(metric):.1%} (heads: median {float(t.nanmedian()):.1%}, "
                             f"largest {float(t[~t.isnan()].max()):.1%})")
        share = ("measured rows above the upper envelope at 1 < N < the largest N: " + "; ".join(parts)
                 if parts else "the share of measured rows above it was not recorded (a result saved before it was)")
        return (f"Upper envelopes: bounds on rows re-drawn around the measured ones (Gaussian noise of scale sigma = "
                f"{self.sigma}, kappa = {self.kappa:g}), not on the measured rows; {share}. Their floor for any data: "
                "1 - 0.5/(N+1) for Precision, 0.5 for Recall (N > 1). The bound on the measured rows is "
                "1 - 1{r_min <= r_max}/(N+1) for Precision and 1 - 1{r_min <= r_max}/N for Recall.")


def upper_envelope_facts(result: GeometryResult) -> UpperEnvelopeFacts:
    """The upper envelopes' settings, floor and per-head exceedance share of a result run with the bounds.

    Raises:
        GeometryError: the result was not run with the ``"bounds"`` diagnostic.
    """
    if BOUND_PRECISION_UPPER.name not in result.fields:
        raise GeometryError("upper_envelope_facts: the result has no envelopes (analyse with diagnostics=['bounds'])")
    settings = result.config.settings_for("bounds")
    grid = result.n_grid
    inner = (grid > 1) & (grid < grid.max())
    shape = (len(result.layers), len(result.heads))
    shares = {}
    for metric in (PRECISION, RECALL):
        spec = EXCEEDED_OF[metric]
        if spec.name in result.fields and bool(inner.any()):
            shares[metric.name] = result.per_head(spec).double()[..., inner].nanmean(-1)
        else:
            shares[metric.name] = torch.full(shape, math.nan, dtype=torch.float64)
    p_floor, r_floor = upper_envelope_floor(grid)
    return UpperEnvelopeFacts(
        kappa=float(settings.kappa), variant=settings.variant, sigma=sigma_form(settings.variant),
        precision_floor=p_floor, recall_floor=r_floor,
        precision_exceeded=shares[PRECISION.name], recall_exceeded=shares[RECALL.name],
    )  # fmt: skip
