"""The margins and envelopes of Theorems 1-2 as a diagnostic, on exactly the rows of the metrics.

Every analysed query row gets its margins (Delta, Delta_0, B, ...) and the
envelopes of E[P], E[R] and the F-scores (see `tl_geometry.theory.theorem_bounds`),
under the config's ranking, with the sink the context found for that row;
per sequence they are the nanmean over its analysed queries, like the metrics.
"""

import math
from dataclasses import dataclass
from typing import Any, NamedTuple, get_args

from torch import Tensor

from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.diagnostics.registry import Diagnostic
from tl_geometry.diagnostics.selection import F_RMAX, F_RMIN, PRECISION, RECALL
from tl_geometry.engine.context import SelectionChunk
from tl_geometry.engine.metrics import chunk_metrics
from tl_geometry.errors import GeometryError
from tl_geometry.theory.theorem_bounds import (
    DEFAULT_KAPPA,
    MARGINS_COST,
    SelectionMargins,
    Variant,
    chunk_margins,
    envelopes,
    realised_upper_bounds,
)

_MARGINS = {
    "delta": "the paper's Delta = a_min_in^2 - 2 a_max_out S_in rho_out (eq. 8; NaN when I_N holds only the sink)",
    "delta0": "the paper's Delta_0 = a_0^2 - (S_in rho_out)^2 (eq. 29; NaN when the sink is not selected)",
    "scale": "the paper's B = a_max_in + a_max_out + S_in",
    "delta_sink": "sink-aware Delta: a lower bound of every non-sink pair's gap, sink cross terms kept",
    "delta0_sink": "sink-aware Delta_0: a lower bound of every gap of the selected sink",
    "scale_sink": "B' = max a over I_N + a_max_out + sum of a over I_N, sink included (exponent uses Delta / B'^2)",
    "s_in": "S_in: sum of a_k = alpha_k ||v_k|| over the selected non-sink keys",
    "a_min_in": "smallest a_i over the selected non-sink keys",
    "a_max_in": "largest a_i over the selected non-sink keys",
    "a_max_out": "largest a_j over the visible non-selected keys",
    "a0": "the sink's a_0 (NaN where the query cannot see the sink)",
    "rho_out": "largest cosine between a non-selected key and a selected non-sink key",
    "rho_in": "smallest cosine between two selected non-sink keys",
    "rho0_in": "smallest cosine between the sink and a selected non-sink key",
    "rho0_out": "largest cosine between the sink and a non-selected key",
    "sink_selected": "1 where the sink is in the top-N set, else 0",
    "pair_gap": "r_min^2 - r_max^2: the smallest mean gap mu_ij over (selected i, non-selected j)",
}


@dataclass(frozen=True)
class BoundSettings:
    """Settings of the bounds diagnostic.

    Attributes:
        kappa: the universal constant of the concentration bounds (> 0).
        variant: ``"sink_aware"`` (margins that bound every pair's gap, scale-free
            exponent; the default) or ``"paper"`` (eq. 8 and Delta/B as printed).
    """

    kappa: float = DEFAULT_KAPPA
    variant: str = "sink_aware"  # one of Variant (checked below, with a message naming the choices)

    def __post_init__(self) -> None:
        if isinstance(self.kappa, bool) or not isinstance(self.kappa, (int, float)) or not (
            self.kappa > 0 and math.isfinite(self.kappa)
        ):
            raise GeometryError(f"settings['bounds'].kappa: expected a positive finite number, got {self.kappa!r}")
        if self.variant not in get_args(Variant):
            raise GeometryError(
                f"settings['bounds'].variant: expected one of {get_args(Variant)}, got {self.variant!r}"
            )


def _envelope(metric: FieldSpec, side: str) -> FieldSpec:
    if side == "upper":  # the realised gaps with Gaussian noise around them: a statement about re-drawn rows
        doc = (f"upper envelope of E[{metric.name}] over value states re-drawn around the measured row (Theorems 1-2, "
               "Corollary 1; sigma = B'^2 or B over sqrt(2 kappa d), settings['bounds']); not a bound on the measured "
               f"row: see bound_{metric.name}_realised and the exceedance share")
    else:
        doc = f"lower envelope of E[{metric.name}] (Theorems 1-2, Corollary 1; settings['bounds'].variant)"
    # The upper envelopes of P and R keep replicates: the tightness claim's interval reads them.
    return FieldSpec(f"bound_{metric.name}_{side}", doc, ("n",), bootstrap=side == "upper" and metric in (PRECISION, RECALL))


def _realised(metric: FieldSpec, formula: str) -> FieldSpec:
    return FieldSpec(f"bound_{metric.name}_realised",
                     f"upper bound on the measured {metric.name}: {formula} (eq. 13/15 with the realised swap "
                     "r_min <= r_max for its Gaussian tail; never exceeded)", ("n",))


class Envelope(NamedTuple):
    """A metric's two envelope fields."""

    lower: FieldSpec
    upper: FieldSpec


# The declarations, by name: ``result.per_head(BOUND_RECALL_LOWER)`` reads ``result.per_head("bound_recall_lower")``.
BOUND_PRECISION_LOWER, BOUND_PRECISION_UPPER = _envelope(PRECISION, "lower"), _envelope(PRECISION, "upper")
BOUND_RECALL_LOWER, BOUND_RECALL_UPPER = _envelope(RECALL, "lower"), _envelope(RECALL, "upper")
BOUND_F_RMIN_LOWER, BOUND_F_RMIN_UPPER = _envelope(F_RMIN, "lower"), _envelope(F_RMIN, "upper")
BOUND_F_RMAX_LOWER, BOUND_F_RMAX_UPPER = _envelope(F_RMAX, "lower"), _envelope(F_RMAX, "upper")
# Each metric's envelopes by the metric's declaration: ``ENVELOPE_OF[RECALL].upper`` is BOUND_RECALL_UPPER.
ENVELOPE_OF = {
    PRECISION: Envelope(BOUND_PRECISION_LOWER, BOUND_PRECISION_UPPER),
    RECALL: Envelope(BOUND_RECALL_LOWER, BOUND_RECALL_UPPER),
    F_RMIN: Envelope(BOUND_F_RMIN_LOWER, BOUND_F_RMIN_UPPER),
    F_RMAX: Envelope(BOUND_F_RMAX_LOWER, BOUND_F_RMAX_UPPER),
}
ENVELOPES = tuple(spec for envelope in ENVELOPE_OF.values() for spec in envelope)
# The bounds on the measured rows themselves: what a curve of measured means can be drawn against.
BOUND_PRECISION_REALISED = _realised(PRECISION, "1 - 1{r_min <= r_max} / (N + 1)")
BOUND_RECALL_REALISED = _realised(RECALL, "1 - 1{r_min <= r_max} / N")
BOUND_F_RMAX_REALISED = _realised(F_RMAX, "2P_up / (1 + P_up) of the realised P bound")
BOUND_F_RMIN_REALISED = _realised(F_RMIN, "2R_up / (1 + R_up) of the realised R bound")
REALISED_BOUND_OF = {PRECISION: BOUND_PRECISION_REALISED, RECALL: BOUND_RECALL_REALISED,
                     F_RMAX: BOUND_F_RMAX_REALISED, F_RMIN: BOUND_F_RMIN_REALISED}


def _exceeded(metric: FieldSpec) -> FieldSpec:
    return FieldSpec(f"bound_{metric.name}_upper_exceeded",
                     f"share of analysed rows whose measured {metric.name} lies above bound_{metric.name}_upper "
                     "(that envelope bounds rows re-drawn around the measured one, not the measured row)", ("n",))


# Per (head, N): the share of measured rows above the theorem's upper envelope.
BOUND_PRECISION_UPPER_EXCEEDED, BOUND_RECALL_UPPER_EXCEEDED = _exceeded(PRECISION), _exceeded(RECALL)
EXCEEDED_OF = {PRECISION: BOUND_PRECISION_UPPER_EXCEEDED, RECALL: BOUND_RECALL_UPPER_EXCEEDED}
# The margins are read as means (to redraw the envelopes); their spread over documents is not kept.
MARGINS = tuple(FieldSpec(f"margin_{name}", doc, ("n",), documents="mean") for name, doc in _MARGINS.items())
MARGIN_N_KEYS = FieldSpec("margin_n_keys", "L: the keys the query sees, the sink included")


class BoundDiagnostic(Diagnostic):
    name = "bounds"
    Settings = BoundSettings
    cost = MARGINS_COST
    fields = (*ENVELOPES, *REALISED_BOUND_OF.values(), *EXCEEDED_OF.values(), *MARGINS, MARGIN_N_KEYS)

    def check(self, config: Any) -> None:
        if config.distance != "euclidean":
            raise GeometryError(
                f"diagnostics: 'bounds' needs distance='euclidean' (got {config.distance!r}); the margins and "
                "envelopes of Theorems 1-2 are derived for the Euclidean distance. Run the bounds in a separate "
                "run with distance='euclidean', or drop 'bounds' from diagnostics"
            )

    def rows(self, chunk: SelectionChunk, settings: BoundSettings) -> dict[str, Tensor]:
        raw = chunk_margins(chunk)
        margins = SelectionMargins(n_grid=chunk.grid, n_visible=chunk.n_visible, **raw)
        bounds = envelopes(margins, d_head=chunk.y_sorted.shape[-1], kappa=float(settings.kappa), variant=settings.variant)
        out = {f"bound_{name}": t for name, t in bounds.as_dict().items()}
        # The metrics' own ball comparisons (recomputed on this chunk, bit for bit the selection diagnostic's), so
        # that the realised bound and the exceedances agree with P and R on ties.
        measured = chunk_metrics(chunk)
        swapped = measured["k_out"] > 0
        p_up, r_up = realised_upper_bounds(swapped, chunk.grid, measured["precision"].dtype)
        for metric, bound in ((PRECISION, p_up), (RECALL, r_up)):
            out[REALISED_BOUND_OF[metric].name] = bound.masked_fill(chunk.missing, math.nan)
        for metric, bound in ((F_RMAX, p_up), (F_RMIN, r_up)):
            out[REALISED_BOUND_OF[metric].name] = (2 * bound / (1 + bound)).masked_fill(chunk.missing, math.nan)
        for metric, exceeded in EXCEEDED_OF.items():
            above = (measured[metric.name] > out[ENVELOPE_OF[metric].upper.name].to(measured[metric.name].dtype))
            out[exceeded.name] = above.to(measured[metric.name].dtype).masked_fill(chunk.missing, math.nan)
        out.update({f"margin_{name}": raw[name] for name in _MARGINS})
        out["margin_n_keys"] = chunk.n_visible.to(chunk.alpha.dtype)
        return out


DIAGNOSTIC = BoundDiagnostic()
