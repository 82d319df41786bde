"""Interventions: top-N attention (keep each head's top-N keys, measure the loss, relate it to the geometry), and
head ablations by role against random head sets, with the published sink and dormant measures beside the roles.

    from tl_geometry.interventions import intervention_sweep, effective_set_size, ablate_roles, published_measures

The one path that changes the forward pass: the top-N ``hook_pattern`` hook (`topn_attention`), the sweep over N
(`sweep`) and the head ablations (`head_ablation`) run here; their statistics are read from the result in
`tl_geometry.analysis.sweep_statistics` and `tl_geometry.analysis.role_ablation`, and their figures are drawn in
`tl_geometry.report` (the page draws them too).
"""

from tl_geometry.analysis.role_ablation import PublishedMeasures, RoleAblation
from tl_geometry.analysis.sweep_statistics import EffectiveSetSize, geometry_vs_dnll
from tl_geometry.interventions.head_ablation import ablate_roles, ablation_hooks
from tl_geometry.interventions.sweep import effective_set_size, intervention_sweep
from tl_geometry.interventions.topn_attention import topn_hooks, topn_pattern_hook
from tl_geometry.report.ablation_figure import ablation_figure
from tl_geometry.results.intervention_result import InterventionResult
from tl_geometry.roles.published import published_measures

__all__ = [
    "EffectiveSetSize",
    "InterventionResult",
    "PublishedMeasures",
    "RoleAblation",
    "ablate_roles",
    "ablation_figure",
    "ablation_hooks",
    "effective_set_size",
    "geometry_vs_dnll",
    "intervention_sweep",
    "published_measures",
    "topn_hooks",
    "topn_pattern_hook",
]
