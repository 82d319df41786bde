"""Top-N interventions: keep each head's top-N attention, measure the loss, and relate it to the geometry.

    from tl_geometry.interventions import intervention_sweep, effective_set_size
"""

from tl_geometry.analysis.interventions import EffectiveSetSize, geometry_vs_dnll
from tl_geometry.capture.interventions import topn_hooks, topn_pattern_hook
from tl_geometry.capture.sweep import effective_set_size, intervention_sweep
from tl_geometry.results.interventions import InterventionResult

__all__ = [
    "EffectiveSetSize",
    "InterventionResult",
    "effective_set_size",
    "geometry_vs_dnll",
    "intervention_sweep",
    "topn_hooks",
    "topn_pattern_hook",
]
