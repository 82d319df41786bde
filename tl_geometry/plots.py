"""The figures, one call each from what a run returns: ``tg.plots.<figure>(result)`` gives a plotly Figure.

    import tl_geometry as tg
    result = tg.run_with_geometry_hooks(model, tokens, diagnostics="all")
    tg.plots.available(result)                   # the figures this result can draw
    tg.plots.precision_recall_vs_n(result)       # Figure 5; .show() or .write_html(path)
    tg.plots.metric_heatmap(result, "recall", n=4)
    tg.plots.head_curves(result, layer=1, head=2)
    tg.plots.report_figures(result)              # every figure of the HTML report, by its anchor

Each function takes a `tl_geometry.GeometryResult` (and what it needs to
choose, such as a head or an N) and computes what the figure draws from it
(the head roles, the sink correlation) before drawing; the drawing itself is
`tl_geometry.report.paper_figures`, whose functions take those objects directly.
Figures of interventions take what `tl_geometry.interventions` returns.
"""

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from tl_geometry._renamed import old_names, renamed_keyword
from tl_geometry.analysis.role_ablation import RoleAblation
from tl_geometry.analysis.sweep_statistics import EffectiveSetSize, GeometryFunctionCorrelation
from tl_geometry.analysis.sink import sink_recall_correlation
from tl_geometry.analysis.head_roles import HeadRoles, roles_from_result
from tl_geometry.diagnostics.selection import PRECISION
from tl_geometry.errors import GeometryError
from tl_geometry.report import ablation_figure as _ablation
from tl_geometry.report import intervention_plots as _interventions
from tl_geometry.report import paper_figures as _draw
from tl_geometry.results.intervention_result import InterventionResult
from tl_geometry.results.result import GeometryResult
from tl_geometry.results.table import FieldName
from tl_geometry.theory.synthetic import toy_2d

OF_A_RESULT: dict[str, str | None] = {
    "selection_picture": None,  # needs a kept picture (picture_heads)
    "value_norms": "assumptions",
    "cosine_decay": "assumptions",
    "attention_profile": "assumptions",
    "precision_recall_vs_n": None,
    "metric_heatmap": None,
    "head_curves": None,
    "sink_recall": "assumptions",
    "role_diagnostics": "roles",
    "roles_by_layer": "roles",
    "contributions_by_role": "roles",
    "precision_recall_by_role": "roles",
}
"""The figures of a GeometryResult, each with the diagnostic whose fields it needs (None: every run has them)."""


def _result(result: object, figure: str) -> GeometryResult:
    if not isinstance(result, GeometryResult):
        raise GeometryError(f"plots.{figure}: expected a GeometryResult (from tl_geometry.run_with_geometry_hooks or "
                            f"GeometryResult.load), got {type(result).__name__}")
    need = OF_A_RESULT[figure]
    if need is not None and need not in _diagnostics(result):
        raise GeometryError(f"plots.{figure}: this result does not carry the fields of the {need!r} diagnostic; "
                            f"analyse with diagnostics='all' (or a list including {need!r}) to draw it")
    return result


def _diagnostics(result: GeometryResult) -> set[str]:
    from tl_geometry.report.html import available  # the page's module, loaded when a figure is asked for

    return available(result)


def _roles(result: GeometryResult | HeadRoles, figure: str) -> HeadRoles:
    return result if isinstance(result, HeadRoles) else roles_from_result(_result(result, figure))


def available(result: GeometryResult) -> list[str]:
    """The names of the figures of this module that ``result`` can draw (some need a diagnostic's fields, the
    selection picture a kept picture), plus ``toy_selection``, which needs no result."""
    present = _diagnostics(_result(result, "precision_recall_vs_n"))
    return ["toy_selection"] + [name for name, need in OF_A_RESULT.items() if need is None or need in present
                                if name != "selection_picture" or result.pictures]


def report_figures(result: GeometryResult) -> dict[str, go.Figure]:
    """Every figure the HTML report draws for ``result``, by its anchor in the page (``"figure-5"``, ...)."""
    from tl_geometry.report.html import render_figures  # the page's module, loaded when a figure is asked for

    rendered = render_figures(_result(result, "precision_recall_vs_n"))
    return {figure.key: drawn for figure, drawn in rendered.figures}


def toy_selection(n_points: int = 8, n_selected: int = 3, seed: int = 0) -> go.Figure:
    """Figure 1: the 2-D toy picture of top-N selection (no model; `tl_geometry.theory.synthetic.toy_2d`)."""
    return _draw.toy_selection(toy_2d(n_points=n_points, n_selected=n_selected, seed=seed))


def selection_picture(result: GeometryResult, layer: int, head: int, n: int | None = None,
                      slider: Sequence[int] = ()) -> go.Figure:
    """Figure 1 on the model's data: the kept picture of one head (analyse with ``picture_heads=[(layer, head)]``),
    at ``n`` (default the largest N up to 16 it has), with a slider over ``slider``."""
    picture = _result(result, "precision_recall_vs_n").picture(layer, head)
    offered = [m for m in picture.n_grid.tolist() if m <= min(16, picture.n_keys)]
    return _draw.selection_picture(picture, offered[-1] if n is None else n, slider)


def value_norms(result: GeometryResult) -> go.Figure:
    """Figure 2: value-state norms by position (the sink at 0) and the CV of the non-sink norms."""
    return _draw.value_norms(_result(result, "value_norms"))


def cosine_decay(result: GeometryResult, layer: int | None = None, head: int | None = None) -> go.Figure:
    """Figure 3: the exponential fit of cosine similarity against lag (default head: middle layer, first head)."""
    return _draw.cosine_decay(_result(result, "cosine_decay"), layer, head)


def attention_profile(result: GeometryResult, layer: int | None = None, head: int | None = None) -> go.Figure:
    """Figure 4: one head's attention profile with its four-phase fit."""
    return _draw.attention_profile(_result(result, "attention_profile"), layer, head)


def precision_recall_vs_n(result: GeometryResult) -> go.Figure:
    """Figure 5: mean Precision and Recall against N, with chance and the envelopes where the run has them."""
    return _draw.precision_recall_vs_n(_result(result, "precision_recall_vs_n"))


def metric_heatmap(result: GeometryResult, metric: FieldName = PRECISION, n: int = 4,
                   roles: Sequence[Sequence[str]] | None = None, *, regimes: Any = None) -> go.Figure:
    """Any ``[layer, head_index, n]`` field at one N, layers down and heads across (``roles`` on hover;
    ``regimes``, its former name, is deprecated)."""
    roles = renamed_keyword("metric_heatmap", "regimes", "roles", regimes, roles, GeometryError)
    return _draw.metric_heatmap(_result(result, "metric_heatmap"), metric, n, roles)


def head_curves(result: GeometryResult, layer: int | None = None, head: int | None = None) -> go.Figure:
    """One head's Precision and Recall against N, with its interval, chance level and envelopes."""
    return _draw.head_curves(_result(result, "head_curves"), layer, head)


def sink_recall(result: GeometryResult, over: str = "heads") -> go.Figure:
    """Figure 6: corr(R(r_min, N), rho_0) against N (`tl_geometry.sink_recall_correlation`, ``over`` heads or
    sequences)."""
    return _draw.sink_recall(sink_recall_correlation(_result(result, "sink_recall"), over=over))


def role_diagnostics(result: GeometryResult | HeadRoles) -> go.Figure:
    """Figure 7: ||s(N)||, its leave-one-out norms and the alignments, for an example head of each role."""
    return _draw.role_diagnostics(_roles(result, "role_diagnostics"))


def roles_by_layer(result: GeometryResult | HeadRoles) -> go.Figure:
    """Figure 8: how many heads of each role every analysed layer has."""
    return _draw.roles_by_layer(_roles(result, "roles_by_layer"))


def contributions_by_role(result: GeometryResult | HeadRoles) -> go.Figure:
    """Figure 10: ||alpha_i v_i|| by key position for an example head of each role."""
    return _draw.contributions_by_role(_roles(result, "contributions_by_role"))


def precision_recall_by_role(result: GeometryResult) -> go.Figure:
    """Figure 11: mean Precision and Recall against N over the heads of each role, with their chance levels."""
    return _draw.precision_recall_by_role(roles_from_result(_result(result, "precision_recall_by_role")), result)


def dnll_vs_n(sweep: InterventionResult, *, layer: int | None = None, head: int | None = None,
              relative: bool = True) -> go.Figure:
    """dNLL against N of a top-N sweep (`tl_geometry.interventions.intervention_sweep`), each mode, with the random
    control's band."""
    return _interventions.dnll_vs_n_figure(sweep, layer=layer, head=head, relative=relative)


def effective_set_size(n_star: EffectiveSetSize, tau: float = 0.05) -> go.Figure:
    """N*_tau by layer and head (`tl_geometry.interventions.effective_set_size`)."""
    return _interventions.n_star_figure(n_star, tau)


def geometry_vs_dnll(correlation: GeometryFunctionCorrelation, ns: Sequence[int] | None = None) -> go.Figure:
    """A geometric field against dNLL across units, one panel per N (`tl_geometry.interventions.geometry_vs_dnll`)."""
    return _interventions.geometry_scatter_figure(correlation, ns)


def role_ablation(ablation: RoleAblation) -> go.Figure:
    """Each head group's dNLL when ablated, against random head sets (`tl_geometry.interventions.ablate_roles`)."""
    return _ablation.ablation_figure(ablation)


__all__ = [
    "attention_profile",
    "available",
    "contributions_by_role",
    "cosine_decay",
    "dnll_vs_n",
    "effective_set_size",
    "geometry_vs_dnll",
    "head_curves",
    "metric_heatmap",
    "precision_recall_by_role",
    "precision_recall_vs_n",
    "role_diagnostics",
    "roles_by_layer",
    "report_figures",
    "role_ablation",
    "selection_picture",
    "sink_recall",
    "toy_selection",
    "value_norms",
]

__getattr__ = old_names(__name__, globals())  # the names they had before (tl_geometry._renamed)
