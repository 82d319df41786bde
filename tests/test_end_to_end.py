"""The real default model, end to end: one 1024-token window of the default text."""

import pytest
import torch

from tl_geometry import default_text, run_with_geometry_hooks, selection_metrics, text_windows
from tl_geometry.capture.hook_names import pattern_hook, value_hook
from tl_geometry.models import transformer_lens_major_version

pytestmark = [pytest.mark.model, pytest.mark.slow]

CHECKED_LAYERS = (0, 14, 29)


@pytest.fixture(scope="module")
def window(smollm2):
    return text_windows(smollm2, default_text(), context=1024, n_windows=1)


@pytest.fixture(scope="module")
def result(smollm2, window):
    # The pattern path: its rows are those run_with_cache sees (the rows path's differ at float32 rounding).
    return run_with_geometry_hooks(smollm2, window, keep_queries=True, capture="pattern")


def test_shapes_and_ranges_on_the_default_model(result):
    n = len(result.n_grid)
    assert result.precision.shape == (30, 9, n) and result.queries["recall"].shape == (1, 30, 9, 1, n)
    assert result.query_positions.tolist() == [[1023]] and (result.n_documents, result.n_tokens) == (1, 1024)
    assert result.n_grid[-1] == 1024  # the last N selects every key of the final query
    assert (result.precision > 0).all() and (result.precision <= 1).all()
    assert (result.recall >= 0).all() and (result.recall <= 1).all()
    assert (result.precision[..., -1] == 1).all() and torch.isinf(result.r_min[..., -1]).all()


def test_hooks_equal_the_engine_on_run_with_cache(smollm2, window, result):
    """The by-hand way on the same window: cache hook_v and hook_pattern, align GQA heads, run the engine."""
    names = {f(layer) for layer in CHECKED_LAYERS for f in (value_hook, pattern_hook)}
    _, cache = smollm2.run_with_cache(window, names_filter=lambda name: name in names)
    group = smollm2.cfg.n_heads // smollm2.cfg.n_key_value_heads
    for layer in CHECKED_LAYERS:
        alpha = cache[pattern_hook(layer)][0, :, -1, :]  # [head, key]: the final query
        values = cache[value_hook(layer)][0].index_select(1, torch.arange(9) // group)  # [key, head, d_head]
        expected = selection_metrics(alpha, values.transpose(0, 1), result.n_grid)
        for name in ("k_in", "k_out"):
            assert torch.equal(result.queries[name][0, layer, :, 0], getattr(expected, name)), (layer, name)
        for name in ("r_max", "r_min", "s_norm", "precision", "recall"):
            torch.testing.assert_close(result.queries[name][0, layer, :, 0], getattr(expected, name), msg=name)
            # One window, one query: the kept mean is that query's value.
            assert torch.equal(result.per_head(name)[layer], result.queries[name][0, layer, :, 0].double()), name


def test_result_round_trips_through_files(result, tmp_path):
    result.save(tmp_path / "result")
    loaded = type(result).load(tmp_path / "result")
    assert loaded.equals(result)


@pytest.mark.tl3
@pytest.mark.skipif(transformer_lens_major_version() >= 4, reason="HookedTransformer needs transformer-lens 3.x")
def test_hooked_transformer_agrees_with_the_bridge(window, result, hooked_smollm2):
    other = run_with_geometry_hooks(hooked_smollm2, window)
    assert torch.equal(other.n_grid, result.n_grid)
    # Activations agree to ~1e-6, so only near-ties may flip a count.
    assert (other.precision - result.precision).abs().mean() < 1e-3
    assert (other.recall - result.recall).abs().mean() < 1e-3
