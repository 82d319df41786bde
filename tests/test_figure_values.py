"""Every figure of the report shows every value it holds: checked on the plotly figure objects of a 2-layer run,
a 30-layer run and a run over two layers far apart, with the top-N intervention figures beside them.

The properties (issue: "figures that show every value"):

- a log axis carries no value <= 0 (plotly drops them silently: the sink at position 0, a negative dNLL);
- no drawn value lies outside an axis range the figure fixes;
- a heatmap's or bar chart's layer and head axes hold exactly the analysed cells (numeric axes would stretch
  layers 5 and 20 over 0..25);
- no "nan" in any text a reader sees (titles, annotations, axis titles, legend names, hover text): a missing
  value says why it is missing;
- the figures and the JSON files the report writes are strict JSON (null, not NaN).

Mutants caught (checked by hand on the code before this file): Figure 2's log position axis, the interventions'
log dNLL axis, "rho=nan [nan, nan]" titles, numeric heatmap axes.
"""

import json
import math
import re
from collections.abc import Iterator
from typing import Any

import plotly.graph_objects as go
import pytest

from tests import tiny_models as tm
from tl_geometry import run_with_geometry_hooks
from tl_geometry.analysis.sweep_statistics import geometry_vs_dnll, n_star_of
from tl_geometry.interventions.sweep import intervention_sweep
from tl_geometry.report.html import intervention_figures, render_figures, write_report

pytestmark = pytest.mark.model

GRID = [1, 2, 4, 8, 17]
SWEEP_GRID = [1, 2, 3, 4]  # every N the search for N*_0.05 up to 4 needs: N* read from the sweep
QUIET = dict(progress=False, n_bootstrap=8, settings_per_pass=64)
NAN_WORD = re.compile(r"\bnan\b", re.IGNORECASE)


def _run(model: Any, layers: list[int] | None = None, modes: tuple[str, ...] = ("renormalise",),
         controls: int = 0) -> list[tuple[str, go.Figure]]:
    """Every figure the report draws for a run of ``model`` (with a picture) and of a layer-scope top-N sweep."""
    tokens = tm.with_bos(tm.random_tokens(2, 16))
    chosen = layers or list(range(model.cfg.n_layers))
    geometry = run_with_geometry_hooks(model, tokens, n_grid=GRID, diagnostics="all", n_bootstrap=8, layers=chosen,
                                       picture_heads=[(chosen[-1], 1)])
    sweep = intervention_sweep(model, tokens, SWEEP_GRID, scope="layer", layers=chosen, modes=modes, controls=controls,
                               **QUIET)
    n_star = n_star_of(sweep, "renormalise", (0.05,), max_n=SWEEP_GRID[-1])
    correlation = geometry_vs_dnll(geometry, sweep, field="precision")
    drawn = render_figures(geometry).figures + intervention_figures(sweep, n_star, correlation)
    return [(figure.key, fig) for figure, fig in drawn]


@pytest.fixture(scope="module")
def two_layers() -> list[tuple[str, go.Figure]]:
    return _run(tm.make_model("bridge-llama"), modes=("renormalise", "delete"), controls=2)


@pytest.fixture(scope="module")
def deep_model() -> Any:
    return tm.tiny_bridge("llama", n_layers=30)  # as deep as SmolLM2-135M


@pytest.fixture(scope="module")
def thirty_layers(deep_model) -> list[tuple[str, go.Figure]]:
    return _run(deep_model)


@pytest.fixture(scope="module")
def layers_apart(deep_model) -> list[tuple[str, go.Figure]]:
    return _run(deep_model, layers=[5, 20])


# ---- reading a figure object ----

def _axis(fig: go.Figure, ref: str | None, letter: str) -> Any:
    """The layout axis a trace's ``xaxis`` / ``yaxis`` reference (``"x2"``) names."""
    suffix = (ref or letter)[1:]
    return fig.layout[f"{letter}axis{suffix}"]


def _numbers(values: Any) -> list[float]:
    """The drawn numbers of a data array (None and NaN are gaps, not points)."""
    out = []
    for v in values if values is not None else ():
        if isinstance(v, (list, tuple)):
            out += _numbers(v)
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v):
            out.append(float(v))
    return out


def _categories(fig: go.Figure, ref: str | None, letter: str) -> list[Any]:
    """The categories of a category axis, in the order plotly places them (first appearance over the traces)."""
    seen: list[Any] = []
    for trace in fig.data:
        if getattr(trace, f"{letter}axis", None) == ref or (ref in (None, letter)
                                                             and getattr(trace, f"{letter}axis", None) in (None, letter)):
            for v in getattr(trace, letter) or ():
                if v is not None and v not in seen:
                    seen.append(v)
    return seen


def problems(fig: go.Figure) -> Iterator[str]:
    """Every value the figure hides, and every cell axis not fitted to its cells."""
    for k, trace in enumerate(fig.data):
        for letter in ("x", "y"):
            ref = getattr(trace, f"{letter}axis", None)
            axis = _axis(fig, ref, letter)
            data = getattr(trace, letter, None)
            if trace.type == "heatmap" or (trace.type == "bar" and letter == "x"):
                labels = list(data or ())
                if axis.type != "category" and not (axis.range is not None and labels == list(
                        range(int(min(labels)), int(max(labels)) + 1)) and sorted(axis.range) == [min(labels) - 0.5,
                                                                                                 max(labels) + 0.5]):
                    yield f"trace {k} ({trace.type}): {letter} axis of cells {labels} is numeric and not fitted to them"
                elif axis.type == "category":
                    cells = _categories(fig, ref, letter)
                    if axis.range is None or sorted(axis.range) != [-0.5, len(cells) - 0.5]:
                        yield f"trace {k} ({trace.type}): {letter} axis range {axis.range} is not its {len(cells)} cells"
                continue
            if trace.type == "histogram" and letter == "y":
                continue
            values = _numbers(data)
            if axis.type == "log":
                bad = [v for v in values if v <= 0]
                if bad:
                    yield f"trace {k} ({trace.name}): {len(bad)} values <= 0 on the log {letter} axis, e.g. {bad[0]}"
                values = [math.log10(v) for v in values if v > 0]
            if axis.range is not None and axis.type != "category" and values:
                low, high = sorted(axis.range)
                outside = [v for v in values if not low - 1e-9 <= v <= high + 1e-9]
                if outside:
                    yield (f"trace {k} ({trace.name}): {len(outside)} values outside the {letter} range {axis.range}, "
                           f"e.g. {outside[0]}")


def texts(fig: go.Figure) -> Iterator[str]:
    """Every text of the figure a reader sees: titles, annotations, axis and colour-bar titles, legend names, hover
    text, slider labels and the titles the slider sets."""
    layout = fig.layout
    yield layout.title.text or ""
    for annotation in layout.annotations:
        yield annotation.text or ""
    for name in dir(layout):
        if re.fullmatch(r"[xy]axis\d*", name):
            yield layout[name].title.text or ""
    for trace in fig.data:
        yield trace.name or ""
        for attribute in ("text", "hovertext"):
            value = getattr(trace, attribute, None)
            yield from (str(v) for v in _flat(value))
        colorbar = getattr(trace, "colorbar", None) or getattr(getattr(trace, "marker", None), "colorbar", None)
        if colorbar is not None and colorbar.title is not None:
            yield colorbar.title.text or ""
    for slider in layout.sliders:
        for step in slider.steps:
            yield step.label or ""
            yield from (str(arg.get("title.text", "")) for arg in step.args if isinstance(arg, dict))


def _flat(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [x for v in value for x in _flat(v)] if isinstance(value, (list, tuple)) else [value]


def strict_json(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


# ---- the tests ----

RUNS = ["two_layers", "thirty_layers", "layers_apart"]


@pytest.mark.parametrize("run", RUNS)
def test_every_figure_shows_every_value(run, request):
    found = {key: list(problems(fig)) for key, fig in request.getfixturevalue(run)}
    assert {key: p for key, p in found.items() if p} == {}


@pytest.mark.parametrize("run", RUNS)
def test_no_figure_text_reads_nan(run, request):
    found = {key: [t for t in texts(fig) if NAN_WORD.search(t)] for key, fig in request.getfixturevalue(run)}
    assert {key: t for key, t in found.items() if t} == {}


def test_the_runs_draw_every_figure_with_its_cases(two_layers, layers_apart):
    """The runs exercise what the checks are about: the sink, the intervention figures, a correlation across
    too few units (2 layers), a heatmap over layers far apart."""
    keys = [key for key, _ in two_layers]
    for key in ("figure-2", "figure-4", "figure-7", "figure-10", "heatmap-precision", "interventions-dnll",
                "interventions-nstar", "interventions-geometry"):
        assert key in keys
    assert any(key.startswith("figure-1-model") for key in keys)
    scatter = dict(two_layers)["interventions-geometry"]
    assert all("no rho (2 of 2 units have both values, 3 needed)" in a.text for a in scatter.layout.annotations)
    norms = dict(two_layers)["figure-2"]
    assert 0 in norms.data[2].x  # the mean's curve starts at the sink
    heat = dict(layers_apart)["heatmap-precision"]
    assert list(heat.data[0].y) == [5, 20] and sorted(heat.layout.yaxis.range) == [-0.5, 1.5]


def test_the_checks_catch_hidden_values():
    """The checks themselves fail on the faults they are for."""
    log_zero = go.Figure(go.Scatter(x=[0, 1, 2], y=[1.0, 2.0, 3.0])).update_xaxes(type="log")
    assert any("<= 0 on the log x axis" in p for p in problems(log_zero))
    clipped = go.Figure(go.Scatter(x=[1, 2], y=[0.5, 1.2])).update_yaxes(range=[0, 1.05])
    assert any("outside the y range" in p for p in problems(clipped))
    stretched = go.Figure(go.Heatmap(z=[[1, 2], [3, 4]], x=[0, 1], y=[5, 20]))
    assert any("numeric and not fitted" in p for p in problems(stretched))
    titled = go.Figure().update_layout(title="rho=nan [nan, nan]")
    assert any(NAN_WORD.search(t) for t in texts(titled))


def test_figures_and_report_files_are_strict_json(two_layers, tmp_path):
    for key, fig in two_layers:
        strict_json(fig.to_json())
    model = tm.make_model("bridge-llama")
    result = run_with_geometry_hooks(model, tm.with_bos(tm.random_tokens(2, 12)), n_grid=[1, 2, 13],
                                     diagnostics="all", n_bootstrap=4)
    write_report(result, tmp_path / "report")
    written = list((tmp_path / "report").rglob("*.json"))
    assert written
    for path in written:
        strict_json(path.read_text())
    page = (tmp_path / "report" / "index.html").read_text()
    data = re.search(r'<script type="application/json" id="explorer-data">(.*?)</script>', page, re.S).group(1)
    strict_json(data.replace("<\\/", "</"))
