"""The margins and envelopes of Theorems 1-2 as a diagnostic, on exactly the rows of the metrics.

Every analysed query row gets its margins (Delta, Delta_0, B, ...) and the
envelopes of E[P], E[R] and the F-scores (see `tl_geometry.theory.bounds`),
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
from tl_geometry.errors import GeometryError
from tl_geometry.theory.bounds import DEFAULT_KAPPA, MARGINS_COST, SelectionMargins, Variant, chunk_margins, envelopes

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
    return FieldSpec(f"bound_{metric.name}_{side}",
                     f"{side} envelope of E[{metric.name}] (Theorems 1-2, Corollary 1; settings['bounds'].variant)",
                     ("n",))


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
# The margins are read as means (to redraw the envelopes); their spread over documents is not kept.
MARGINS = tuple(FieldSpec(f"margin_{name}", doc, ("n",), documents="mean") for name, doc in _MARGINS.items())
MARGIN_N_KEYS = FieldSpec("margin_n_keys", "L: the keys the query sees, the sink included")


class BoundDiagnostic(Diagnostic):
    name = "bounds"
    Settings = BoundSettings
    cost = MARGINS_COST
    fields = (*ENVELOPES, *MARGINS, MARGIN_N_KEYS)

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
        bounds = envelopes(margins, d_head=chunk.values.shape[-1], kappa=float(settings.kappa), variant=settings.variant)
        out = {f"bound_{name}": t for name, t in bounds.as_dict().items()}
        out.update({f"margin_{name}": raw[name] for name in _MARGINS})
        out["margin_n_keys"] = chunk.n_visible.to(chunk.alpha.dtype)
        return out


DIAGNOSTIC = BoundDiagnostic()
