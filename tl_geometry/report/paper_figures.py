"""Plotly figures of the paper, drawn from a GeometryResult (no computation here, only drawing).

Every function takes a result (or its HeadRoles) and returns a
``plotly.graph_objects.Figure``. The look is shared: titles and axis labels
say what is shown and in which units, log axes where the paper uses them, and
a colour-blind-safe palette (Okabe-Ito) in which one role always has one
colour. Every value is drawn: a log axis only where its values are positive
(Figure 2's positions start at the sink, 0, so that axis is linear; zeros
elsewhere are left out and counted in the legend), ranges that hold what
they frame, one cell per analysed layer and head, and no "nan" in a title
(a missing value says why). `tl_geometry.plots` calls these from a result.
"""

import math
from collections.abc import Sequence

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from torch import Tensor

from tl_geometry._renamed import old_names
from tl_geometry.errors import GeometryError
from tl_geometry.diagnostics.assumptions import (
    ATTENTION_PROFILE,
    COSINE_BY_LAG,
    DECAY_BETA,
    DECAY_MAE,
    VALUE_NORM_BY_POSITION,
    VALUE_NORM_CV,
)
from tl_geometry.diagnostics.bounds import ENVELOPE_OF, EXCEEDED_OF, REALISED_BOUND_OF, Envelope
from tl_geometry.diagnostics.chance import CHANCE_OF, CHANCE_PRECISION_FLOOR
from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.diagnostics.profile_fit import MIN_POSITIONS, ProfileFit
from tl_geometry.diagnostics.selection import PRECISION, RECALL, S_NORM
from tl_geometry.diagnostics.role_features import (
    CONTRIBUTION_BY_POSITION,
    COS_LAST_BY_POSITION,
    EXCESS_COS_SELF,
    EXCESS_COS_SINK,
    S_NORM_WITHOUT_LAST,
    S_NORM_WITHOUT_SINK,
)
from tl_geometry.results.selection_picture import SelectionPicture
from tl_geometry.results.result import GeometryResult
from tl_geometry.results.table import FieldName, field_name
from tl_geometry.analysis.sink import SinkRecallCorrelation
from tl_geometry.theory.synthetic import Toy2D
from tl_geometry.analysis.head_roles import ROLE_LABELS, HeadRoles
from tl_geometry.analysis.summaries import at_n, mean_over_heads, spread_over_heads
from tl_geometry.analysis.chance_excess import chance_by_role

# Okabe & Ito (2008), safe for the common colour-vision deficiencies.
BLUE, ORANGE, GREEN, VERMILLION, SKY, PURPLE, GREY = (
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#D55E00",
    "#56B4E9",
    "#CC79A7",
    "#7F7F7F",
)
ROLE_COLOURS = {"retriever": BLUE, "mixer": ORANGE, "reset": PURPLE, "content": GREEN, "uncertain": GREY}
TEMPLATE = "plotly_white"


def _style(fig: go.Figure, title: str, height: int = 420) -> go.Figure:
    fig.update_layout(template=TEMPLATE, title=title, height=height, legend={"orientation": "h", "y": -0.2})
    return fig


UPPER_NAME = "Theorems 1-2 upper envelope (bounds re-drawn rows, not the measured ones)"
LOWER_NAME = "Theorems 1-2 lower envelope"
REALISED_NAME = "bound on the measured rows: 1 - 1{r_min <= r_max}/(N+1) (P), /N (R)"


def _exceeded_share(result: GeometryResult, metric: FieldSpec, where: tuple[int, int] | None = None) -> str:
    """``", exceeded by x % of measured rows at 1 < N < L"`` from the exceedance field, when the result has it."""
    spec = EXCEEDED_OF.get(metric)
    if spec is None or spec.name not in result.fields:
        return ""
    grid = result.n_grid
    values = result.per_head(spec).double()
    if where is not None:
        values = values[where]
    inner = values[..., (grid > 1) & (grid < grid.max())]
    share = float(inner.nanmean()) if bool((~inner.isnan()).any()) else math.nan
    return "" if math.isnan(share) else f"; measured rows above it: {share:.1%}"


def _sides(envelope: Envelope, result: GeometryResult, metric: FieldSpec,
           where: tuple[int, int] | None = None) -> tuple[tuple[FieldSpec, str, str, str], ...]:
    """Each envelope field with its legend name, dash and colour: upper dotted, lower dashed (as the paper draws
    them); the upper one named for what it bounds, with the share of measured rows above it."""
    upper = UPPER_NAME[:-1] + _exceeded_share(result, metric, where) + ")"
    return (envelope.upper, upper, "dot", ORANGE), (envelope.lower, LOWER_NAME, "dash", GREEN)


def _n_axes(fig: go.Figure, grid: Sequence[int], **where: int) -> None:
    """Log N axes spanning exactly the grid (plotly's autorange pads a log axis below N = 1)."""
    low, high = math.log10(min(grid)), math.log10(max(grid))
    pad = 0.02 * max(high - low, 0.1)  # room for the last marker; none below the first N (N >= 1 always)
    fig.update_xaxes(type="log", range=[low, high + pad], **where)


def fit_cells(fig: go.Figure, n_rows: int, n_columns: int) -> None:
    """One cell per analysed layer (rows, the first on top) and head (columns), on category axes.

    A numeric axis would place the cells at their labels: layers 0 and 20 alone
    would be stretched over -10..30. Categories are indexed 0..n-1, so the
    ranges are exactly the cells.
    """
    fig.update_xaxes(type="category", range=[-0.5, n_columns - 0.5])
    fig.update_yaxes(type="category", range=[n_rows - 0.5, -0.5])


def metric_heatmap(
    result: GeometryResult, metric: FieldName = PRECISION, n: int = 4, roles: Sequence[Sequence[str]] | None = None
) -> go.Figure:
    """Any ``[layer, head_index, n]`` metric at one N, layers down and heads across.

    Args:
        result: the analysis.
        metric: a per-sequence field of the result, e.g. ``"precision"``, ``"recall"``, ``"f_score"``.
        n: the selection size N (must be on the result's grid).
        roles: optional ``[layer, head_index]`` role names (e.g. ``HeadRoles.label_names()``) shown on hover.

    Returns:
        A heatmap whose hover shows layer, head, value and role.
    """
    values = at_n(result, metric, n)
    metric = field_name(metric)
    hover = [[f"role: {roles[i][j]}" if roles is not None else "" for j in range(values.shape[1])]
             for i in range(values.shape[0])]
    fig = go.Figure(
        go.Heatmap(
            z=values.tolist(),
            x=list(result.heads),
            y=list(result.layers),
            customdata=hover,
            colorscale="Viridis",
            colorbar={"title": metric},
            hovertemplate="layer %{y}, head %{x}<br>" + metric + " = %{z:.3f}<br>%{customdata}<extra></extra>",
        )
    )
    fit_cells(fig, len(result.layers), len(result.heads))
    fig.update_yaxes(title="layer")
    fig.update_xaxes(title="head")
    return _style(fig, f"{metric} at N = {n}, per layer and head", height=max(420, 18 * len(result.layers)))


def precision_recall_vs_n(result: GeometryResult) -> go.Figure:
    """Figure 5: global means of Precision(r_max) and Recall(r_min) against N, with envelopes when present.

    The band is the interquartile range across layers and heads. The
    theoretical envelopes of Theorems 1-2 are drawn when the result was run
    with the ``"bounds"`` diagnostic (upper dotted, lower dashed and capped at
    0, as in the paper), and the chance band when it was run with ``"chance"``
    (grey: random top-N sets, interquartile range and mean over heads; for
    Precision also the floor N / L).
    """
    grid = result.n_grid.tolist()
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Precision P(r_max, N)", "Recall R(r_min, N)"))
    for col, metric in enumerate((PRECISION, RECALL), start=1):
        low, high = spread_over_heads(result, metric)
        fig.add_trace(go.Scatter(x=grid, y=high.tolist(), mode="lines", line={"width": 0}, showlegend=False, hoverinfo="skip"),
                      row=1, col=col)
        fig.add_trace(
            go.Scatter(x=grid, y=low.tolist(), fill="tonexty", fillcolor="rgba(0,114,178,0.15)", mode="lines", line={"width": 0},
                       name="interquartile range over heads", showlegend=col == 1, hoverinfo="skip"),
            row=1, col=col,
        )
        fig.add_trace(
            go.Scatter(x=grid, y=mean_over_heads(result, metric).tolist(), mode="lines+markers",
                       line={"color": BLUE}, name="measured mean", showlegend=col == 1),
            row=1, col=col,
        )
        _add_chance(fig, result, metric, grid, col, col == 1)
        if ENVELOPE_OF[metric].upper.name in result.fields:
            for bound, name, dash, colour in _sides(ENVELOPE_OF[metric], result, metric):
                fig.add_trace(
                    go.Scatter(x=grid, y=mean_over_heads(result, bound).tolist(), mode="lines",
                               line={"color": colour, "dash": dash}, name=name, showlegend=True),
                    row=1, col=col,
                )
        if REALISED_BOUND_OF[metric].name in result.fields:
            fig.add_trace(
                go.Scatter(x=grid, y=mean_over_heads(result, REALISED_BOUND_OF[metric]).tolist(), mode="lines",
                           line={"color": VERMILLION, "dash": "dashdot"}, name=REALISED_NAME, showlegend=col == 1),
                row=1, col=col,
            )
        _n_axes(fig, grid, row=1, col=col)
        fig.update_xaxes(title="N (selected keys)", row=1, col=col)
        fig.update_yaxes(range=[0, 1.05], title=metric.name, row=1, col=col)
    return _style(fig, "Separability of top-N selection vs N (mean over layers and heads)")


def _add_chance(fig: go.Figure, result: GeometryResult, metric: FieldSpec, grid: list[int], col: int,
                legend: bool) -> None:
    """The chance band of ``metric`` (random top-N sets over heads) and, for Precision, the floor N / L."""
    chance = CHANCE_OF[metric]
    if chance.name not in result.fields:
        return
    low, high = spread_over_heads(result, chance)
    fig.add_trace(go.Scatter(x=grid, y=high.tolist(), mode="lines", line={"width": 0}, showlegend=False, hoverinfo="skip"),
                  row=1, col=col)
    fig.add_trace(
        go.Scatter(x=grid, y=low.tolist(), fill="tonexty", fillcolor="rgba(127,127,127,0.2)", mode="lines", line={"width": 0},
                   name="chance: random top-N sets (interquartile range)", showlegend=legend, hoverinfo="skip"),
        row=1, col=col,
    )
    fig.add_trace(
        go.Scatter(x=grid, y=mean_over_heads(result, chance).tolist(), mode="lines",
                   line={"color": GREY}, name="chance: random top-N sets (mean)", showlegend=legend),
        row=1, col=col,
    )
    if metric == PRECISION:
        fig.add_trace(
            go.Scatter(x=grid, y=mean_over_heads(result, CHANCE_PRECISION_FLOOR).tolist(), mode="lines",
                       line={"color": GREY, "dash": "dot"}, name="floor N / L", showlegend=legend),
            row=1, col=col,
        )


def head_curves(result: GeometryResult, layer: int | None = None, head: int | None = None) -> go.Figure:
    """One head's Precision and Recall against N (mean over documents, bootstrap interval where kept),
    with its envelopes (``"bounds"``) and its chance level (``"chance"``: random top-N sets, and N / L)."""
    li, hi = _example(result, layer, head)
    grid = result.n_grid.tolist()
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Precision P(r_max, N)", "Recall R(r_min, N)"))
    for col, metric in enumerate((PRECISION, RECALL), start=1):
        legend = col == 1
        if result.has_replicates(metric):
            low, high = (t[li, hi] for t in result.ci(metric))
            fig.add_trace(go.Scatter(x=grid, y=high.tolist(), mode="lines", line={"width": 0}, showlegend=False, hoverinfo="skip"),
                          row=1, col=col)
            fig.add_trace(go.Scatter(x=grid, y=low.tolist(), fill="tonexty", fillcolor="rgba(0,114,178,0.15)",
                                     mode="lines", line={"width": 0}, name="95 % bootstrap interval", showlegend=legend,
                                     hoverinfo="skip"), row=1, col=col)
        fig.add_trace(go.Scatter(x=grid, y=result.per_head(metric)[li, hi].tolist(), mode="lines+markers",
                                 line={"color": BLUE}, name="measured", showlegend=legend), row=1, col=col)
        if CHANCE_OF[metric].name in result.fields:
            fig.add_trace(go.Scatter(x=grid, y=result.per_head(CHANCE_OF[metric])[li, hi].tolist(), mode="lines",
                                     line={"color": GREY}, name="chance: random top-N sets", showlegend=legend),
                          row=1, col=col)
            if metric == PRECISION:
                fig.add_trace(go.Scatter(x=grid, y=result.per_head(CHANCE_PRECISION_FLOOR)[li, hi].tolist(),
                                         mode="lines", line={"color": GREY, "dash": "dot"}, name="floor N / L",
                                         showlegend=legend), row=1, col=col)
        if ENVELOPE_OF[metric].lower.name in result.fields:
            for bound, name, dash, colour in _sides(ENVELOPE_OF[metric], result, metric, (li, hi)):
                fig.add_trace(go.Scatter(x=grid, y=result.per_head(bound)[li, hi].tolist(),
                                         mode="lines", line={"color": colour, "dash": dash},
                                         name=name, showlegend=True), row=1, col=col)
        if REALISED_BOUND_OF[metric].name in result.fields:
            fig.add_trace(go.Scatter(x=grid, y=result.per_head(REALISED_BOUND_OF[metric])[li, hi].tolist(),
                                     mode="lines", line={"color": VERMILLION, "dash": "dashdot"}, name=REALISED_NAME,
                                     showlegend=legend), row=1, col=col)
        _n_axes(fig, grid, row=1, col=col)
        fig.update_xaxes(title="N (selected keys)", row=1, col=col)
        fig.update_yaxes(range=[0, 1.05], title=metric.name, row=1, col=col)
    return _style(fig, f"Layer {result.layers[li]}, head {result.heads[hi]}: Precision and Recall against N")


def _left_off(count: int, what: str) -> str:
    """The legend's note of values a log axis cannot draw (``""`` when there are none)."""
    return f" ({count} {'key' if count == 1 else 'keys'} {what} not drawn on the log axis)" if count else ""


def _example_head_label(where: tuple[int, int] | None, role: str) -> str:
    return f"{role}: none" if where is None else f"{role}: layer {where[0]}, head {where[1]}"


def role_diagnostics(roles: HeadRoles) -> go.Figure:
    """Figure 7: for one example head per role, ||s(N)|| and its leave-one-out norms (top)
    and the alignment of s(N) with the sink v_0 and the last token v_L over chance (bottom), against N."""
    examples = roles.example_heads()
    fig = make_subplots(rows=2, cols=len(ROLE_LABELS), shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=[_example_head_label(examples[r], r) for r in ROLE_LABELS] + [""] * len(ROLE_LABELS))
    grid = roles.n_grid.tolist()
    lines = (
        (1, S_NORM, "||s(N)||", "solid"),
        (1, S_NORM_WITHOUT_SINK, "||s(N) without the sink||", "dashdot"),
        (1, S_NORM_WITHOUT_LAST, "||s(N) without the last token||", "dash"),
        (2, EXCESS_COS_SINK, "cos(s(N), v_0) over chance", "solid"),
        (2, EXCESS_COS_SELF, "cos(s(N), v_L) over chance", "dash"),
    )
    for col, role in enumerate(ROLE_LABELS, start=1):
        where = examples[role]
        if where is None:
            continue
        layer, head = roles.layers.index(where[0]), roles.heads.index(where[1])
        for row, spec, label, dash in lines:
            fig.add_trace(
                go.Scatter(x=grid, y=roles.features[spec.name][layer, head].tolist(), mode="lines", name=label,
                           line={"color": ROLE_COLOURS[role], "dash": dash}, showlegend=False, legendgroup=spec.name,
                           hovertemplate=label + " = %{y:.3g} at N = %{x}<extra></extra>"),
                row=row, col=col,
            )
    for row, spec, label, dash in lines:  # the legend: one neutral entry per line style (colour = role)
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=f"{label} ({'top' if row == 1 else 'bottom'})",
                                 line={"color": "#444", "dash": dash}, legendgroup=spec.name), row=row, col=1)
    _n_axes(fig, grid)
    fig.update_xaxes(title="N (selected keys)", row=2)
    fig.update_yaxes(title="norm", row=1, col=1)
    excess = [roles.features[spec.name] for row, spec, _, _ in lines if row == 2]
    reach = max([1.0] + [float(t.nan_to_num(0).abs().max()) for t in excess])  # differences of cosines: up to 2
    fig.update_yaxes(title="cosine minus its random-set mean", range=[-1.05 * reach, 1.05 * reach], row=2)
    fig = _style(fig, "Role diagnostics of one example head per label (colour: role; line style: see legend)",
                 height=620)
    fig.update_layout(legend={"orientation": "h", "y": -0.15})
    return fig


def roles_by_layer(roles: HeadRoles) -> go.Figure:
    """Figure 8: how many heads of each role every layer has (stacked)."""
    counts = roles.counts_by_layer()
    fig = go.Figure(
        [go.Bar(x=list(roles.layers), y=counts[:, i].tolist(), name=role, marker_color=ROLE_COLOURS[role])
         for i, role in enumerate(ROLE_LABELS)]
    )
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title="layer", type="category", range=[-0.5, len(roles.layers) - 0.5])
    fig.update_yaxes(title="heads")
    return _style(fig, "Head roles by depth")


def contributions_by_role(roles: HeadRoles) -> go.Figure:
    """Figure 10: ||alpha_i v_i|| by key position for an example head of each role, coloured by cos(v_i, v_L)."""
    examples = roles.example_heads()
    fig = make_subplots(rows=1, cols=len(ROLE_LABELS), subplot_titles=[_example_head_label(examples[r], r) for r in ROLE_LABELS])
    for col, role in enumerate(ROLE_LABELS, start=1):
        where = examples[role]
        if where is None:
            continue
        layer, head = roles.layers.index(where[0]), roles.heads.index(where[1])
        size = roles.features[CONTRIBUTION_BY_POSITION.name][layer, head]
        cosine = roles.features[COS_LAST_BY_POSITION.name][layer, head]
        positive = size > 0  # a log axis cannot show 0 (the legend says how many); NaN: positions not reached
        zeros = int((size <= 0).sum())
        fig.add_trace(
            go.Scatter(x=positive.nonzero().flatten().tolist(), y=size[positive].tolist(), mode="markers",
                       name=role + _left_off(zeros, "with ||alpha_i v_i|| = 0"), showlegend=zeros > 0,
                       marker={"color": cosine[positive].tolist(), "colorscale": "RdBu", "cmin": -1, "cmax": 1, "size": 5,
                               "colorbar": {"title": "cos(v_i, v_L)"} if col == len(ROLE_LABELS) else None,
                               "showscale": col == len(ROLE_LABELS)},
                       hovertemplate="position %{x}<br>||alpha_i v_i|| = %{y:.3g}<extra></extra>"),
            row=1, col=col,
        )
    fig.update_xaxes(title="key position")
    fig.update_yaxes(type="log")
    fig.update_yaxes(title="||alpha_i v_i||", row=1, col=1)
    return _style(fig, "Contributions of each key to the head output, by role")


def precision_recall_by_role(roles: HeadRoles, result: GeometryResult | None = None) -> go.Figure:
    """Figure 11: mean Precision(r_max) and Recall(r_min) against N for the heads of each role.

    With a ``result`` run with the ``"chance"`` diagnostic, each role's
    chance level (random top-N sets, mean over its heads) is drawn dotted in
    its colour, and the range between the roles' chance levels shaded grey.
    """
    grid = roles.n_grid.tolist()
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Precision P(r_max, N)", "Recall R(r_min, N)"))
    for col, metric in enumerate((PRECISION, RECALL), start=1):
        curves = roles.curves_by_role(metric)
        if result is not None and CHANCE_OF[metric].name in result.fields:
            chance = chance_by_role(result, roles, metric)
            top, bottom = torch.nan_to_num(chance, nan=-math.inf).amax(0), torch.nan_to_num(chance, nan=math.inf).amin(0)
            fig.add_trace(go.Scatter(x=grid, y=top.tolist(), mode="lines", line={"width": 0}, showlegend=False, hoverinfo="skip"),
                          row=1, col=col)
            fig.add_trace(go.Scatter(x=grid, y=bottom.tolist(), fill="tonexty", fillcolor="rgba(127,127,127,0.2)",
                                     mode="lines", line={"width": 0}, name="chance band (random top-N sets)",
                                     showlegend=col == 1, hoverinfo="skip"), row=1, col=col)
            for i, role in enumerate(ROLE_LABELS):
                fig.add_trace(go.Scatter(x=grid, y=chance[i].tolist(), mode="lines", name=f"{role}: chance",
                                         line={"color": ROLE_COLOURS[role], "dash": "dot", "width": 1},
                                         showlegend=col == 1), row=1, col=col)
        for i, role in enumerate(ROLE_LABELS):
            fig.add_trace(
                go.Scatter(x=grid, y=curves[i].tolist(), mode="lines+markers", name=role,
                           line={"color": ROLE_COLOURS[role]}, showlegend=col == 1),
                row=1, col=col,
            )
        _n_axes(fig, grid, row=1, col=col)
        fig.update_xaxes(title="N (selected keys)", row=1, col=col)
        fig.update_yaxes(range=[0, 1.05], title=metric.name, row=1, col=col)
    return _style(fig, "Precision and Recall by head role")


def _example(result: GeometryResult, layer: int | None, head: int | None) -> tuple[int, int]:
    """Indices into the result's layer and head axes; default the middle analysed layer, first head."""
    layer = result.layers[len(result.layers) // 2] if layer is None else layer
    head = result.heads[0] if head is None else head
    if layer not in result.layers or head not in result.heads:
        raise GeometryError(
            f"layer, head: ({layer}, {head}) was not analysed; this result has layers {list(result.layers)} "
            f"and heads {list(result.heads)}"
        )
    return result.layers.index(layer), result.heads.index(head)


def _circle(centre: Tensor, radius: float, name: str, colour: str, dash: str) -> go.Scatter:
    angle = torch.linspace(0, 2 * math.pi, 200)
    return go.Scatter(x=(centre[0] + radius * torch.cos(angle)).tolist(),
                      y=(centre[1] + radius * torch.sin(angle)).tolist(),
                      mode="lines", line={"color": colour, "dash": dash}, name=name)


def toy_selection(toy: Toy2D) -> go.Figure:
    """Figure 1: the 2-D picture. Tokens on a circle (left), scaled by their attention
    weights (middle), and s(N) with the r_min and r_max balls (right)."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=(
        "value states v_i", "scaled: alpha_i v_i",
        f"s(N) and the balls: P = {toy.precision:.2f}, R = {toy.recall:.2f}"))
    for col, points in ((1, toy.points), (2, toy.scaled), (3, toy.scaled)):
        for chosen, name, colour, symbol in ((True, "selected", PURPLE, "star"), (False, "not selected", "black", "circle")):
            mask = toy.selected == chosen
            fig.add_trace(go.Scatter(x=points[mask, 0].tolist(), y=points[mask, 1].tolist(), mode="markers",
                                     marker={"color": colour, "symbol": symbol, "size": 11}, name=name,
                                     showlegend=col == 1), row=1, col=col)
    fig.add_trace(go.Scatter(x=[float(toy.s[0])], y=[float(toy.s[1])], mode="markers", name="s(N)",
                             marker={"color": VERMILLION, "symbol": "x", "size": 12}), row=1, col=3)
    fig.add_trace(_circle(toy.s, toy.r_min, "r_min ball", GREEN, "dash"), row=1, col=3)
    fig.add_trace(_circle(toy.s, toy.r_max, "r_max ball", ORANGE, "dot"), row=1, col=3)
    for col in (1, 2, 3):
        fig.update_yaxes(scaleanchor=f"x{'' if col == 1 else col}", row=1, col=col)
    return _style(fig, "Top-N selection in value-state space (2-D toy example)", height=420)


def value_norms(result: GeometryResult) -> go.Figure:
    """Figure 2: mean ||v_i|| by position over all layer-heads (left) and the
    coefficient of variation of the non-sink norms across heads (right).

    The position axis is linear (the paper's is log): a log axis cannot show
    position 0, the sink the figure is about, so it is drawn and marked.
    """
    norms = result.per_head(VALUE_NORM_BY_POSITION).flatten(0, 1)  # [layer*head, pos]
    mean, low, high = torch.nanmean(norms, 0), torch.nanquantile(norms, 0.1, 0), torch.nanquantile(norms, 0.9, 0)
    positions = list(range(norms.shape[-1]))
    fig = make_subplots(rows=1, cols=2, subplot_titles=("value-state norm by position", "CV of non-sink norms"))
    fig.add_trace(go.Scatter(x=positions, y=high.tolist(), mode="lines", line={"width": 0}, showlegend=False, hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=positions, y=low.tolist(), fill="tonexty", fillcolor="rgba(0,114,178,0.15)",
                             mode="lines", line={"width": 0}, name="10-90 % of layer-heads", hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=positions, y=mean.tolist(), mode="lines", line={"color": BLUE},
                             name="mean over layer-heads"))
    fig.add_trace(go.Scatter(x=positions[:1], y=mean[:1].tolist(), mode="markers", name="the sink (position 0)",
                             marker={"color": VERMILLION, "size": 10, "symbol": "diamond"}))
    cv = result.per_head(VALUE_NORM_CV).flatten()
    fig.add_trace(go.Histogram(x=cv[~torch.isnan(cv)].tolist(), marker_color=BLUE, name="heads", showlegend=False),
                  row=1, col=2)
    fig.update_xaxes(title="position i (0 = sink)", range=[-0.02 * len(positions) - 0.5, len(positions) - 0.5],
                     row=1, col=1)
    fig.update_yaxes(title="||v_i||", row=1, col=1)
    fig.update_xaxes(title="CV = std / mean of ||v_i||, i > 0", row=1, col=2)
    fig.update_yaxes(title="layer-heads", row=1, col=2)
    return _style(fig, "Assumption 1: value-state norms are stable except at the sink")


def cosine_decay(result: GeometryResult, layer: int | None = None, head: int | None = None) -> go.Figure:
    """Figure 3: the error of the exponential fit of cosine similarity vs lag across heads
    (left) and one head's mean cosine by lag with its fit exp(-beta lag) (right)."""
    li, hi = _example(result, layer, head)
    mae = result.per_head(DECAY_MAE).flatten()
    curve = result.per_head(COSINE_BY_LAG)[li, hi]
    beta = result.per_head(DECAY_BETA)[li, hi]
    lags = torch.arange(len(curve))
    shown = (lags >= 1) & ~torch.isnan(curve)
    fig = make_subplots(rows=1, cols=2, subplot_titles=(
        "MAE of the exponential fit", f"layer {result.layers[li]}, head {result.heads[hi]}: beta = {beta:.3f}"))
    fig.add_trace(go.Histogram(x=mae[~torch.isnan(mae)].tolist(), marker_color=BLUE, showlegend=False), row=1, col=1)
    fig.add_trace(go.Scatter(x=lags[shown].tolist(), y=curve[shown].tolist(), mode="markers", name="mean cosine",
                             marker={"color": BLUE, "size": 4}), row=1, col=2)
    fig.add_trace(go.Scatter(x=lags[shown].tolist(), y=torch.exp(-beta * lags[shown]).tolist(), mode="lines",
                             name="fit exp(-beta lag)", line={"color": ORANGE}), row=1, col=2)
    fig.update_xaxes(title="mean absolute error over lags 1..64", row=1, col=1)
    fig.update_yaxes(title="layer-heads", row=1, col=1)
    fig.update_xaxes(type="log", title="lag |i - j|", row=1, col=2)
    fig.update_yaxes(title="cos(v_i, v_j)", row=1, col=2)
    return _style(fig, "Assumption 2: cosine similarity decays with the lag")


def attention_profile(result: GeometryResult, layer: int | None = None, head: int | None = None) -> go.Figure:
    """Figure 4: one head's attention weights by position for the final query (mean over
    documents, log scale) with the four-phase profile of its mean fitted parameters."""
    li, hi = _example(result, layer, head)
    profile = result.per_head(ATTENTION_PROFILE)[li, hi]
    fit = ProfileFit(**{name: value[li, hi] for name, value in vars(result.profile_fit).items()})
    positions = torch.arange(len(profile))
    shown = ~torch.isnan(profile)
    fitted = fit.evaluate(int(shown.sum()))
    positive = shown & (profile > 0)
    fig = go.Figure([
        go.Scatter(x=positions[positive].tolist(), y=profile[positive].tolist(), mode="markers",
                   name="attention weight" + _left_off(int((shown & ~positive).sum()), "with weight 0"),
                   marker={"color": BLUE, "size": 4}),
    ])
    if bool((fitted > 0).any()):
        drawn = fitted > 0
        fig.add_trace(go.Scatter(x=positions[shown][drawn].tolist(), y=fitted[drawn].tolist(), mode="lines",
                                 name="four-phase fit", line={"color": ORANGE}))
    for value, label in ((fit.t1, "T1"), (fit.t2, "T2")):
        if not torch.isnan(value):
            fig.add_vline(x=float(value), line={"dash": "dot", "color": GREY}, annotation_text=label)
    fig.update_xaxes(title="key position i (0 = sink)")
    fig.update_yaxes(type="log", title="alpha_i")
    error = (f"fit error {float(fit.error):.2f} in log space" if not math.isnan(float(fit.error))
             else f"no four-phase fit: fewer than {MIN_POSITIONS} non-sink positions")
    return _style(fig, f"Assumption 3: attention profile of layer {result.layers[li]}, head {result.heads[hi]} ({error})")


def sink_recall(correlation: SinkRecallCorrelation) -> go.Figure:
    """Figure 6: corr(R(r_min, N), rho_0) against N, Pearson with its bootstrap interval, Spearman, and Pearson
    disattenuated for the noise of the heads' means (with its interval) where the result measures that noise."""
    grid = correlation.n_grid.tolist()
    level = f"{100 * correlation.confidence:.0f} %"
    fig = go.Figure([
        go.Scatter(x=grid, y=correlation.pearson_high.tolist(), mode="lines", line={"width": 0}, showlegend=False,
                   hoverinfo="skip"),
        go.Scatter(x=grid, y=correlation.pearson_low.tolist(), fill="tonexty", fillcolor="rgba(0,114,178,0.15)",
                   mode="lines", line={"width": 0}, name=f"{level} bootstrap interval over sequences", hoverinfo="skip"),
        go.Scatter(x=grid, y=correlation.pearson.tolist(), mode="lines+markers", name="Pearson",
                   line={"color": BLUE}),
        go.Scatter(x=grid, y=correlation.spearman.tolist(), mode="lines", name="Spearman",
                   line={"color": ORANGE, "dash": "dash"}),
    ])
    if not bool(correlation.disattenuated.isnan().all()):  # the claims' statistic: corrected for the noise
        fig.add_trace(go.Scatter(
            x=grid, y=correlation.disattenuated.tolist(), mode="lines+markers", name="Pearson, disattenuated",
            line={"color": PURPLE, "dash": "dot"},
            error_y={"type": "data", "symmetric": False, "color": PURPLE, "thickness": 1,
                     "array": (correlation.disattenuated_high - correlation.disattenuated).tolist(),
                     "arrayminus": (correlation.disattenuated - correlation.disattenuated_low).tolist()},
        ))
    fig.add_hline(y=0, line={"color": GREY, "width": 1})
    _n_axes(fig, grid)
    fig.update_xaxes(title="N (selected keys)")
    fig.update_yaxes(range=[-1.05, 1.05], title="corr(R(r_min, N), rho_0)")
    return _style(fig, f"Sink similarity and Recall, across {correlation.over}")


# ---- Figure 1 on the model's data: one head's kept selection picture ----

PICTURE_CLASSES = (  # (name, colour, plotly symbol) of each key: the balls' true membership in d_head dimensions
    ("selected, inside the r_min ball", PURPLE, "star"),
    ("selected, outside the r_min ball", PURPLE, "star-open"),
    ("not selected, inside the r_max ball", VERMILLION, "circle"),
    ("not selected, outside the r_max ball", GREY, "circle-open"),
)
PICTURE_CAPTION = (
    "Each point is one key the query can see: y_i = alpha_i v_i projected onto the first two principal components "
    "of the y_i (centred SVD, computed for display). The cross is s(N), the circles the r_max (dotted) and r_min "
    "(dashed) balls. An orthogonal projection of a ball of radius r is a disc of radius r around the projected "
    "centre, so keys inside a ball stay inside its disc, but keys outside it may land in the disc too: membership "
    "is decided in all d_head dimensions, and the colours show the true membership the run measured."
)


def picture_projection(picture: SelectionPicture) -> tuple[Tensor, Tensor]:
    """The display projection of a picture: the mean of its y_i and the first two principal directions.

    Returns ``(centre [d_head], basis [2, d_head])`` (float64, orthonormal rows; a
    zero row where the y_i span fewer than two dimensions): a point x is drawn
    at ``basis @ (x - centre)``.
    """
    y = picture.y.double()
    centre = y.mean(0)
    _, _, vh = torch.linalg.svd(y - centre, full_matrices=False)
    basis = torch.zeros(2, y.shape[-1], dtype=torch.float64)
    basis[: min(2, len(vh))] = vh[:2]
    return centre, basis


def _picture_class(picture: SelectionPicture, n: int) -> Tensor:
    """Each key's index into PICTURE_CLASSES at N."""
    i = picture.n_index(n)
    selected = picture.selected(n)
    return torch.where(selected, torch.where(picture.in_r_min[i], 0, 1), torch.where(picture.in_r_max[i], 2, 3))


def _disc(centre: Sequence[float], radius: float, colour: str, dash: str) -> dict:
    return {"type": "circle", "xref": "x", "yref": "y", "x0": centre[0] - radius, "x1": centre[0] + radius,
            "y0": centre[1] - radius, "y1": centre[1] + radius, "line": {"color": colour, "dash": dash}}


def selection_picture(picture: SelectionPicture, n: int, slider: Sequence[int] = ()) -> go.Figure:
    """Figure 1 on the model's data: one query's keys, s(N) and the two balls, projected to 2-D.

    Args:
        picture: a kept picture (``result.picture(layer, head)``).
        n: the N shown first.
        slider: other N values a slider offers (those the picture has no
            top-N set for are left out); none: no slider.

    The traces: the keys (``data[0]``, one marker per key in the order of
    ``picture.positions``, hover: position, alpha, ||y_i||), the sink, then
    s(N) for every N offered; the discs are layout shapes (r_min none when
    every key is selected). With the cosine distance the balls are not
    Euclidean, so no discs are drawn.
    """
    shown = [m for m in sorted({n, *slider}) if m in picture.n_grid.tolist() and m <= picture.n_keys]
    picture.n_index(n)  # GeometryError naming the N this picture has
    centre, basis = picture_projection(picture)
    xy = (picture.y.double() - centre) @ basis.T  # [key, 2]
    s_xy = (picture.s.double() - centre) @ basis.T  # [n, 2]
    norms = torch.linalg.vector_norm(picture.y.double(), dim=-1)
    custom = torch.stack([picture.positions.double(), picture.alpha.double(), norms], -1).tolist()

    def styled(m: int) -> tuple[list[str], list[str]]:
        classes = _picture_class(picture, m).tolist()
        return [PICTURE_CLASSES[c][1] for c in classes], [PICTURE_CLASSES[c][2] for c in classes]

    def shapes(m: int) -> list[dict]:
        if picture.distance != "euclidean":
            return []
        i = picture.n_index(m)
        at = s_xy[i].tolist()
        out = [_disc(at, float(picture.r_max[i]), ORANGE, "dot")]
        if math.isfinite(float(picture.r_min[i])):
            out.append(_disc(at, float(picture.r_min[i]), GREEN, "dash"))
        return out

    def title(m: int) -> str:
        i = picture.n_index(m)
        return (f"layer {picture.layer}, head {picture.head}, query at position {picture.query_position} "
                f"({picture.n_keys} keys): N = {m}, P = {float(picture.precision[i]):.2f}, "
                f"R = {float(picture.recall[i]):.2f}")

    colours, symbols = styled(n)
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=xy[:, 0].tolist(), y=xy[:, 1].tolist(), mode="markers", name="keys", showlegend=False, customdata=custom,
        marker={"color": colours, "symbol": symbols, "size": 9, "line": {"width": 1}},
        hovertemplate="position %{customdata[0]:.0f}<br>alpha %{customdata[1]:.4f}<br>||y_i|| %{customdata[2]:.4f}"
                      "<extra></extra>"))  # fmt: skip
    sink = [picture.sink] if picture.sink >= 0 else []
    fig.add_trace(go.Scatter(x=xy[sink, 0].tolist(), y=xy[sink, 1].tolist(), mode="markers", name="sink",
                             marker={"color": BLUE, "symbol": "diamond-open", "size": 18, "line": {"width": 2}},
                             hoverinfo="skip"))
    for m in shown:
        i = picture.n_index(m)
        fig.add_trace(go.Scatter(x=[float(s_xy[i, 0])], y=[float(s_xy[i, 1])], mode="markers", name="s(N)",
                                 visible=m == n, marker={"color": VERMILLION, "symbol": "x", "size": 14}))
    for name, colour, symbol in PICTURE_CLASSES:  # legend entries for the keys' classes
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name,
                                 marker={"color": colour, "symbol": symbol, "size": 9}))
    for name, colour, dash in (("r_max disc", ORANGE, "dot"), ("r_min disc", GREEN, "dash")):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=name, line={"color": colour, "dash": dash}))
    fig.update_layout(shapes=shapes(n))
    fig.update_xaxes(title="first principal component of the y_i")
    fig.update_yaxes(title="second principal component", scaleanchor="x")
    _style(fig, title(n), height=560)
    if len(shown) > 1:
        fixed = len(fig.data) - 2 - len(shown)  # legend traces after the s(N) ones
        steps = []
        for j, m in enumerate(shown):
            colours, symbols = styled(m)
            visible = [True, True] + [k == j for k in range(len(shown))] + [True] * fixed
            colour_of = [colours, BLUE] + [VERMILLION] * len(shown) + [t.marker.color for t in fig.data[2 + len(shown):]]
            symbol_of = [symbols, "diamond-open"] + ["x"] * len(shown) + [t.marker.symbol for t in fig.data[2 + len(shown):]]
            steps.append({"label": str(m), "method": "update",
                          "args": [{"visible": visible, "marker.color": colour_of, "marker.symbol": symbol_of},
                                   {"shapes": shapes(m), "title.text": title(m)}]})
        fig.update_layout(sliders=[{"active": shown.index(n), "steps": steps, "currentvalue": {"prefix": "N = "},
                                    "pad": {"t": 60}}])
    return fig

__getattr__ = old_names(__name__, globals())  # the names they had before (tl_geometry._renamed)
