"""The figure of `tl_geometry.interventions.head_ablation.ablate_roles`: each group's change in loss against the random band."""

import plotly.graph_objects as go

from tl_geometry.analysis.role_ablation import RoleAblation
from tl_geometry.errors import GeometryError

_COLOURS = {"zero": "#d62728", "mean": "#1f77b4"}


def ablation_figure(result: RoleAblation) -> go.Figure:
    """One row per (group, task): the group's ΔNLL with its bootstrap interval (a point with error bars) over
    the random band, the 5-95 % range of random head sets of the same size and layers (a pale bar), per ablation."""
    if not isinstance(result, RoleAblation):
        raise GeometryError(f"result: expected a RoleAblation (from tl_geometry.interventions.ablate_roles), got {type(result).__name__}")
    fig = go.Figure()
    ablations = list(dict.fromkeys(row.ablation for row in result.rows))
    for k, ablation in enumerate(ablations):
        rows = [row for row in result.rows if row.ablation == ablation]
        labels = [f"{row.group} ({row.task}, {row.n_heads})" for row in rows]
        colour = _COLOURS.get(ablation, "#7f7f7f")
        fig.add_trace(go.Bar(
            y=labels, x=[row.random_high - row.random_low for row in rows], base=[row.random_low for row in rows],
            orientation="h", name=f"random band, {ablation}", marker_color=colour, opacity=0.25,
            offsetgroup=str(k), hovertemplate="%{y}: random sets %{base:.3f} to %{x:.3f} (width)<extra></extra>",
        ))
        fig.add_trace(go.Scatter(
            y=labels, x=[row.dnll for row in rows], mode="markers", name=f"group, {ablation}-ablated",
            marker=dict(color=colour, size=8),
            error_x=dict(type="data", symmetric=False, array=[row.high - row.dnll for row in rows],
                         arrayminus=[row.dnll - row.low for row in rows]),
            hovertemplate="%{y}: ΔNLL %{x:.4f}<extra></extra>",
        ))
    fig.update_layout(
        title=f"Ablating head groups of {result.model or 'the model'} against random head sets",
        xaxis_title="ΔNLL (nats; natural: next-token NLL, repeated: second-copy NLL)", barmode="overlay",
        height=max(360, 28 * len({(r.group, r.task) for r in result.rows}) + 160), template="plotly_white",
    )
    fig.update_yaxes(autorange="reversed")
    return fig
