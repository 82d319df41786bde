"""Figures of top-N interventions (plotly, drawing only): dNLL against N, N*_tau by layer and head, F_N against dNLL.

The numbers come from `tl_geometry.analysis.sweep_statistics` (curves,
effective set sizes, correlations); nothing here computes a statistic.
"""

import math
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tl_geometry.analysis.sweep_statistics import (
    EffectiveSetSize,
    GeometryFunctionCorrelation,
    dnll_curve,
)
from tl_geometry.report.paper_figures import fit_cells
from tl_geometry.results.display import head_name, plural
from tl_geometry.results.intervention_result import ALL, InterventionResult

_COLOURS = {"renormalise": "#1f77b4", "delete": "#d62728"}


def _band(x: list, low: list, high: list, colour: str, name: str) -> go.Scatter:
    return go.Scatter(x=x + x[::-1], y=high + low[::-1], fill="toself", fillcolor=colour, opacity=0.2,
                      line=dict(width=0), hoverinfo="skip", name=name, showlegend=True)


def dnll_vs_n_figure(sweep: InterventionResult, *, layer: int | None = None, head: int | None = None,
                     relative: bool = True) -> go.Figure:
    """dNLL (relative by default) against N for each mode, with its bootstrap interval and the random-control band.

    ``layer`` and ``head`` are unit labels (-1: all); default the sweep's first unit (the model for scope "model").
    """
    layer = sweep.layers[0] if layer is None else layer
    head = sweep.heads[0] if head is None else head
    fig = go.Figure()
    for mode in sweep.modes:
        c = dnll_curve(sweep, mode, layer=layer, head=head, relative=relative)
        colour = _COLOURS.get(mode, "#444")
        if c.control_low is not None:
            fig.add_trace(_band(c.n, c.control_low, c.control_high, "#7f7f7f", f"random control, {mode} (min-max)"))
            fig.add_trace(go.Scatter(x=c.n, y=c.control_mean, mode="lines", line=dict(color=colour, dash="dot"),
                                     name=f"random, {mode} (mean)"))
        if c.low is not None:
            fig.add_trace(_band(c.n, c.low, c.high, colour, f"top-N, {mode} (95% CI)"))
        fig.add_trace(go.Scatter(x=c.n, y=c.mean, mode="lines+markers", line=dict(color=colour), name=f"top-N, {mode}"))
    unit = "model" if layer == ALL else (f"layer {layer}" if head == ALL else head_name(layer, head))
    fig.add_hline(y=0, line=dict(color="#7f7f7f", width=1))
    # A linear dNLL axis: a log one drops every N where keeping the top N keys lowers the loss (dNLL < 0).
    fig.update_layout(
        title=f"{'Relative ' if relative else ''}dNLL against N ({unit}, {sweep.ranking} ranking, "
              f"{plural(sweep.n_documents, 'window')})",
        xaxis=dict(title="N (keys kept per row)", type="log"),
        yaxis=dict(title="dNLL / NLL(clean)" if relative else "dNLL (nats)", type="linear"),
        height=480,
    )
    return fig


def n_star_figure(n_star: EffectiveSetSize, tau: float = 0.05) -> go.Figure:
    """N*_tau by layer (rows) and head (columns) as a heatmap; hover shows the bootstrap interval."""
    t = n_star.taus.index(tau)
    z = n_star.n_star[t].tolist()
    text = [[_n_star_text(v, lo, hi, n_star.max_n) for v, lo, hi in zip(zr, lr, hr)]
            for zr, lr, hr in zip(z, n_star.low[t].tolist(), n_star.high[t].tolist())]
    columns = ["all heads" if h == ALL else f"H{h}" for h in n_star.heads]
    rows = ["model" if layer == ALL else f"L{layer}" for layer in n_star.layers]
    fig = go.Figure(go.Heatmap(z=[[None if math.isnan(v) else math.log2(v) for v in zr] for zr in z], x=columns, y=rows,
                               text=text, hoverinfo="text+x+y", colorscale="Viridis",
                               colorbar=dict(title="log2 N*")))
    fig.update_layout(title=f"N*_{tau:g}: smallest N with relative dNLL <= {tau:g} ({n_star.mode})",
                      height=max(300, 18 * len(rows) + 150))
    fit_cells(fig, len(rows), len(columns))
    return fig


def _n_star_text(n_star: float, low: float, high: float, max_n: int) -> str:
    """A cell's hover: N* and its interval, or why either is missing."""
    if math.isnan(n_star):
        return f"N* not reached: no N up to {max_n} keeps the relative dNLL within tau"
    interval = "no interval (no bootstrap replicates)" if math.isnan(low) or math.isnan(high) else f"[{low:g}, {high:g}]"
    return f"N*={n_star:g} {interval}"


def _rho_title(corr: GeometryFunctionCorrelation, k: int) -> str:
    """A panel's title: rho with its interval, or why either is missing (never "nan")."""
    n = int(corr.n_grid[k])
    why = corr.why_undefined(k)
    if why is not None:
        return f"N={n}: no rho ({why})"
    low, high = float(corr.low[k]), float(corr.high[k])
    interval = "no interval" if math.isnan(low) or math.isnan(high) else f"[{low:.2f}, {high:.2f}]"
    return f"N={n}: rho={float(corr.rho[k]):.2f} {interval}"


def geometry_scatter_figure(corr: GeometryFunctionCorrelation, ns: Sequence[int] | None = None) -> go.Figure:
    """One panel per N: the geometric field against dNLL per unit, titled with Spearman's rho and its interval."""
    grid = corr.n_grid.tolist()
    chosen = [n for n in (ns or grid) if n in grid]
    fig = make_subplots(rows=1, cols=len(chosen), subplot_titles=[_rho_title(corr, grid.index(n)) for n in chosen])
    labels = [f"L{layer}" + ("" if head == ALL else f"H{head}") for layer, head in corr.units]
    for col, n in enumerate(chosen, start=1):
        k = grid.index(n)
        fig.add_trace(go.Scatter(x=corr.x[:, k].tolist(), y=corr.y[:, k].tolist(), mode="markers", text=labels,
                                 showlegend=False, marker=dict(size=6)), row=1, col=col)
        fig.update_xaxes(title_text=corr.field, row=1, col=col)
    fig.update_yaxes(title_text=f"dNLL ({corr.mode})", row=1, col=1)
    fig.update_layout(title=f"{corr.field} against dNLL across units (Spearman per N)", height=420)
    return fig
