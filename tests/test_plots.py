"""Figures: the traces, axes and data ranges they show."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from tests import tiny_models as tm
from tests.fixtures import simulate_study, true_means
from tl_geometry import GeometryConfig, GeometryError, classify_heads, run_with_geometry_hooks
from tl_geometry.analysis import ROLE_LABELS
from tl_geometry.report import paper_figures as plots
from tl_geometry.analysis.sink import sink_recall_correlation
from tl_geometry.analysis.summaries import mean_over_heads
from tl_geometry.analysis.head_roles import roles_from_result
from tl_geometry.theory.synthetic import toy_2d


@pytest.fixture(scope="module")
def result():
    model = tm.make_model("bridge-llama")
    return run_with_geometry_hooks(model, tm.with_bos(tm.random_tokens(3, 30)), n_grid=[1, 2, 4, 8, 31])


def test_heatmap_shows_the_metric_at_n_with_roles_on_hover(result):
    roles = [["mixer"] * len(result.heads) for _ in result.layers]
    fig = plots.metric_heatmap(result, "recall", n=2, roles=roles)
    heat = fig.data[0]
    assert torch.allclose(torch.tensor(heat.z), result.recall[..., 1].float(), equal_nan=True)
    assert list(heat.y) == list(result.layers) and list(heat.x) == list(result.heads)
    assert "role: mixer" in heat.customdata[0][0]
    assert fig.layout.yaxis.title.text == "layer" and fig.layout.xaxis.title.text == "head"
    assert "N = 2" in fig.layout.title.text


def test_heatmap_refuses_an_n_off_the_grid(result):
    with pytest.raises(GeometryError, match=r"N = 3 is not on this result's grid \[1, 2, 4, 8, 31\]"):
        plots.metric_heatmap(result, n=3)


def test_precision_recall_vs_n_draws_the_means_on_log_axes(result):
    fig = plots.precision_recall_vs_n(result)
    means = [t for t in fig.data if t.name == "measured mean"]
    assert len(means) == 2
    assert list(means[0].x) == result.n_grid.tolist()
    torch.testing.assert_close(torch.tensor(means[0].y, dtype=torch.float64), mean_over_heads(result, "precision").double())
    torch.testing.assert_close(torch.tensor(means[1].y, dtype=torch.float64), mean_over_heads(result, "recall").double())
    assert fig.layout.xaxis.type == "log" and fig.layout.xaxis2.type == "log"
    assert all(0 <= y <= 1 for t in means for y in t.y)
    assert not any("envelope" in (t.name or "") for t in fig.data)  # no bounds diagnostic in this run


@pytest.fixture(scope="module")
def taxonomy():
    model = tm.make_model("bridge-llama")
    return classify_heads(model, tm.with_bos(tm.random_tokens(3, 30)), GeometryConfig(n_grid=[1, 2, 4, 8, 31]))


def test_roles_by_layer_stacks_the_counts(taxonomy):
    fig = plots.roles_by_layer(taxonomy)
    assert [bar.name for bar in fig.data] == list(ROLE_LABELS)
    stacked = torch.tensor([list(bar.y) for bar in fig.data]).T
    assert torch.equal(stacked, taxonomy.counts_by_layer())
    assert (stacked.sum(1) == len(taxonomy.heads)).all()
    assert [bar.marker.color for bar in fig.data] == [plots.ROLE_COLOURS[r] for r in ROLE_LABELS]


def test_precision_recall_by_role_draws_each_role(taxonomy):
    fig = plots.precision_recall_by_role(taxonomy)
    assert len(fig.data) == 2 * len(ROLE_LABELS)
    for trace, expected in zip(fig.data[:len(ROLE_LABELS)], taxonomy.curves_by_role("precision"), strict=True):
        torch.testing.assert_close(torch.tensor(trace.y, dtype=torch.float64), expected.double(), equal_nan=True)
    assert fig.layout.xaxis.type == "log"


def test_role_diagnostics_and_contributions_show_the_example_heads(taxonomy):
    examples = taxonomy.example_heads()
    present = [r for r in ROLE_LABELS if examples[r] is not None]
    fig7 = plots.role_diagnostics(taxonomy)
    curves = [t for t in fig7.data if t.showlegend is False]
    assert len(curves) == 5 * len(present)
    assert all(t.line.color in plots.ROLE_COLOURS.values() for t in curves)
    fig10 = plots.contributions_by_role(taxonomy)
    assert len(fig10.data) == len(present)
    for trace in fig10.data:
        assert all(y is None or math.isnan(y) or y >= 0 for y in trace.y)
        assert all(c is None or math.isnan(c) or abs(c) <= 1 + 1e-6 for c in trace.marker.color)
    assert fig10.layout.yaxis.type == "log"


@pytest.fixture(scope="module")
def full():
    """Every diagnostic, on a tiny model, with several sequences for the correlations."""
    model = tm.make_model("bridge-llama")
    return run_with_geometry_hooks(model, tm.with_bos(tm.random_tokens(4, 40)), n_grid=[1, 2, 4, 8, 41],
                                   diagnostics="all", n_bootstrap=50)


def test_toy_selection_draws_points_s_and_both_balls():
    toy = toy_2d(n_points=8, n_selected=3, seed=0)
    fig = plots.toy_selection(toy)
    names = [t.name for t in fig.data]
    assert names.count("selected") == 3 and "s(N)" in names and "r_min ball" in names and "r_max ball" in names
    ball = next(t for t in fig.data if t.name == "r_max ball")
    radius = torch.tensor([math.hypot(x - float(toy.s[0]), y - float(toy.s[1])) for x, y in zip(ball.x, ball.y)])
    torch.testing.assert_close(radius, torch.full_like(radius, float(toy.r_max)), atol=1e-5, rtol=1e-5)
    selected = next(t for t in fig.data if t.name == "selected" and t.xaxis == "x2")
    assert len(selected.x) == int(toy.selected.sum())


def test_value_norms_plots_the_mean_by_position_and_the_cv_histogram(full):
    fig = plots.value_norms(full)
    mean = next(t for t in fig.data if t.name == "mean over layer-heads")
    expected = torch.nanmean(full.value_norm_by_position.flatten(0, 1), 0)
    torch.testing.assert_close(torch.tensor(mean.y, dtype=torch.float64), expected.double(), equal_nan=True)
    histogram = next(t for t in fig.data if t.type == "histogram")
    assert len(histogram.x) == full.value_norm_cv.numel() and min(histogram.x) >= 0
    assert fig.layout.xaxis.type != "log" and fig.layout.xaxis.range[0] < 0  # the sink, position 0, is drawn
    sink = next(t for t in fig.data if t.name == "the sink (position 0)")
    assert list(sink.x) == [0] and sink.y[0] == pytest.approx(float(expected[0]))


def test_cosine_decay_shows_the_fit_of_the_chosen_head(full):
    fig = plots.cosine_decay(full, layer=1, head=2)
    fit = next(t for t in fig.data if t.name == "fit exp(-beta lag)")
    beta = float(full.decay_beta[1, 2])
    assert all(abs(y - math.exp(-beta * x)) < 1e-6 for x, y in zip(fit.x, fit.y))
    assert min(fit.x) >= 1 and "layer 1, head 2" in fig.layout.annotations[1].text
    with pytest.raises(GeometryError, match=r"\(7, 0\) was not analysed"):
        plots.cosine_decay(full, layer=7, head=0)


def test_attention_profile_is_on_a_log_axis_with_its_fit(full):
    fig = plots.attention_profile(full, layer=0, head=0)
    weights, fit = fig.data[0], fig.data[1]
    profile = full.per_head("attention_profile")[0, 0]  # the final query's row, mean over the sequences
    assert list(weights.y) == profile[~torch.isnan(profile)].tolist()
    assert len(fit.y) == len(weights.y) and all(y > 0 for y in fit.y)
    assert fig.layout.yaxis.type == "log"


def test_sink_recall_draws_pearson_spearman_and_interval(full):
    correlation = sink_recall_correlation(full, n_bootstrap=50)  # the run's 50 document-bootstrap replicates
    fig = plots.sink_recall(correlation)
    pearson = next(t for t in fig.data if t.name == "Pearson")
    torch.testing.assert_close(torch.tensor(pearson.y, dtype=torch.float64), correlation.pearson.double(),
                               equal_nan=True)
    assert fig.layout.yaxis.range == (-1.05, 1.05) and fig.layout.xaxis.type == "log"


def test_sink_recall_draws_the_disattenuated_curve_where_it_is_measured():
    study = simulate_study(true_means(), np.random.default_rng(2))
    correlation = sink_recall_correlation(study)
    fig = plots.sink_recall(correlation)
    corrected = next(t for t in fig.data if t.name == "Pearson, disattenuated")
    torch.testing.assert_close(torch.tensor(corrected.y, dtype=torch.float64), correlation.disattenuated.double())
    torch.testing.assert_close(torch.tensor(corrected.error_y.array, dtype=torch.float64),
                               (correlation.disattenuated_high - correlation.disattenuated).double())
    bare = dataclasses.replace(correlation, disattenuated=torch.full_like(correlation.disattenuated, math.nan))
    assert "Pearson, disattenuated" not in [t.name for t in plots.sink_recall(bare).data]


def test_precision_recall_vs_n_draws_envelopes_when_bounds_were_computed(full):
    fig = plots.precision_recall_vs_n(full)
    envelopes = [t for t in fig.data if "envelope" in (t.name or "")]
    assert len(envelopes) == 4
    upper = next(t for t in envelopes if t.name.startswith("Theorems 1-2 upper envelope (bounds re-drawn rows"))
    torch.testing.assert_close(torch.tensor(upper.y, dtype=torch.float64),
                               mean_over_heads(full, "bound_precision_upper").double(), equal_nan=True)


def test_figure_5_draws_the_realised_bound_and_names_the_theorem_envelope_with_its_exceedance():
    """On a real run with the bounds: the drawn bound on the measurement is never exceeded (0 points), and the
    theorem's upper envelope is named as a bound on re-drawn rows with the share of measured rows above it."""
    from tests import tiny_models as tm
    from tl_geometry.capture.hooks import run_with_geometry_hooks

    model = tm.make_model("bridge-llama", dtype=torch.float64)
    result = run_with_geometry_hooks(model, tm.with_bos(tm.random_tokens(2, 16)), diagnostics=["bounds"],
                                     n_grid=[1, 2, 3, 4, 8])
    fig = plots.precision_recall_vs_n(result)
    realised = [t for t in fig.data if (t.name or "").startswith("bound on the measured rows")]
    measured = [t for t in fig.data if t.name == "measured mean"]
    assert len(realised) == 2
    for bound, curve in zip(realised, measured):
        assert all(c <= b + 1e-12 for c, b in zip(curve.y, bound.y) if not math.isnan(c))
    upper = [t for t in fig.data if (t.name or "").startswith("Theorems 1-2 upper envelope")]
    assert len(upper) == 2 and all("measured rows above it:" in t.name for t in upper)


def test_figure_7_names_its_line_styles_in_the_legend_not_the_title(taxonomy):
    fig = plots.role_diagnostics(taxonomy)
    legend = [t for t in fig.data if t.showlegend is not False]
    assert [t.name for t in legend] == [
        "||s(N)|| (top)", "||s(N) without the sink|| (top)", "||s(N) without the last token|| (top)",
        "cos(s(N), v_0) over chance (bottom)", "cos(s(N), v_L) over chance (bottom)",
    ]  # fmt: skip
    assert [t.line.dash for t in legend] == ["solid", "dashdot", "dash", "solid", "dash"]
    for entry in legend:  # an entry toggles the curves it names in every panel
        assert {t.line.dash for t in fig.data if t.legendgroup == entry.legendgroup} == {entry.line.dash}
    assert "solid" not in fig.layout.title.text and "dashed" not in fig.layout.title.text


def _every_figure_against_n(full):
    taxonomy = roles_from_result(full)
    return {
        "figure 5": plots.precision_recall_vs_n(full), "head curves": plots.head_curves(full, 1, 0),
        "figure 6": plots.sink_recall(sink_recall_correlation(full, n_bootstrap=50)),
        "figure 7": plots.role_diagnostics(taxonomy), "figure 11": plots.precision_recall_by_role(taxonomy, full),
        "figure 2": plots.value_norms(full),
    }  # fmt: skip


def test_band_traces_draw_no_markers_on_short_grids(full):
    """plotly draws lines+markers for a trace of fewer than 20 points unless told otherwise."""
    for name, fig in _every_figure_against_n(full).items():
        bands = [t for t in fig.data if t.type == "scatter" and (t.fill or (t.line.width == 0))]
        assert bands or name == "figure 7", name
        assert all(t.mode == "lines" for t in bands), name


def test_n_axes_start_at_n_1(full):
    for name, fig in _every_figure_against_n(full).items():
        for axis in (a for a in fig.layout if a.startswith("xaxis")):
            if fig.layout[axis].title.text == "N (selected keys)" or (name != "figure 2" and fig.layout[axis].type == "log"):
                low, high = fig.layout[axis].range
                assert low == 0 and high >= math.log10(41), (name, axis)


# ---- tl_geometry.plots: every figure, one call from a result ----

def test_the_plots_namespace_draws_each_figure_from_a_result(full):
    import tl_geometry as tg
    from tl_geometry.report.html import render_figures

    names = tg.plots.available(full)
    assert {"value_norms", "sink_recall", "roles_by_layer", "precision_recall_vs_n"} <= set(names)
    assert "selection_picture" not in names  # no picture_heads in this run
    taxonomy = roles_from_result(full)
    same = {  # the namespace's figure against the drawing function given what it derives
        "value_norms": plots.value_norms(full),
        "roles_by_layer": plots.roles_by_layer(taxonomy),
        "precision_recall_by_role": plots.precision_recall_by_role(taxonomy, full),
        "sink_recall": plots.sink_recall(sink_recall_correlation(full)),
        "head_curves": plots.head_curves(full),
    }
    for name, expected in same.items():
        assert getattr(tg.plots, name)(full).to_json() == expected.to_json(), name  # NaN gaps compare equal here
    for name in names:
        assert isinstance(getattr(tg.plots, name)() if name == "toy_selection" else getattr(tg.plots, name)(full),
                          type(same["value_norms"]))
    report = tg.plots.report_figures(full)
    assert list(report) == [figure.key for figure, _ in render_figures(full).figures]


def test_the_plots_namespace_says_what_a_figure_needs(result):
    import tl_geometry as tg

    assert "value_norms" not in tg.plots.available(result)  # the default run has no assumptions diagnostic
    with pytest.raises(GeometryError, match=r"plots.value_norms: this result does not carry the fields of the "
                                            r"'assumptions' diagnostic; analyse with diagnostics='all'"):
        tg.plots.value_norms(result)
    with pytest.raises(GeometryError, match=r"keeps no picture of layer 1, head 2"):
        tg.plots.selection_picture(result, 1, 2)
