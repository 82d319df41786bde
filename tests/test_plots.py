"""Figures: the traces, axes and data ranges they show."""

import pytest
import torch

from tests import tiny_models as tm
from tl_geometry import GeometryError, run_with_geometry_hooks
from tl_geometry import plots
from tl_geometry.summaries import mean_over_heads


@pytest.fixture(scope="module")
def result():
    model = tm.make_model("bridge-llama")
    return run_with_geometry_hooks(model, tm.with_bos(tm.random_tokens(3, 30)), n_grid=[1, 2, 4, 8, 31])


def test_heatmap_shows_the_metric_at_n_with_regimes_on_hover(result):
    regimes = [["mixer"] * len(result.heads) for _ in result.layers]
    fig = plots.metric_heatmap(result, "recall", n=2, regimes=regimes)
    heat = fig.data[0]
    assert torch.allclose(torch.tensor(heat.z), result.recall[..., 1].float(), equal_nan=True)
    assert list(heat.y) == list(result.layers) and list(heat.x) == list(result.heads)
    assert "regime: mixer" in heat.customdata[0][0]
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
