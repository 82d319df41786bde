"""The random controls' order cache of the sweeps: a budget per device, and the same results whatever it keeps.

No second device here: the meta device stands for one in the accounting (nothing is computed on it), as in
tests/test_device_map.py; the hook and the sweep run on the CPU.
"""

import pytest
import torch

from tests.tiny_models import make_model, random_tokens, with_bos
from tl_geometry.interventions import topn_attention
from tl_geometry.interventions.control_cache import ControlRankCache
from tl_geometry.interventions.sweep import intervention_sweep
from tl_geometry.interventions.topn_attention import topn_pattern_hook

ORDER_BYTES = 2 * 3 * 5  # an int16 order of 3 x 5 pattern elements
CPU, META = torch.device("cpu"), torch.device("meta")


def _order(device):
    return torch.zeros(3, 5, dtype=torch.int16, device=device)


def test_each_device_has_its_own_budget():
    """Two orders fit per device: two on each of two devices are all kept (a budget over all devices would keep
    two in all), a third on one device is not, and the other device's room is untouched."""
    cache = ControlRankCache(budget_mib=2 * ORDER_BYTES / 2**20)
    assert [cache.keep((layer, 1), _order(device)) for layer, device in enumerate([CPU, META, CPU, META])] == [True] * 4
    assert cache.bytes_on(CPU) == cache.bytes_on(META) == 2 * ORDER_BYTES
    assert not cache.keep((4, 1), _order(CPU))
    assert cache.get((4, 1)) is None and cache.bytes_on(CPU) == 2 * ORDER_BYTES
    assert all(cache.get((layer, 1)).device == device for layer, device in enumerate([CPU, META, CPU, META]))


def test_dropping_a_control_frees_its_devices():
    cache = ControlRankCache(budget_mib=2 * ORDER_BYTES / 2**20)
    cache.keep((0, 1), _order(CPU))
    cache.keep((1, 1), _order(META))
    cache.keep((0, 2), _order(CPU))
    cache.drop_controls_before(2)
    assert len(cache) == 1 and cache.get((0, 2)) is not None
    assert (cache.bytes_on(CPU), cache.bytes_on(META)) == (ORDER_BYTES, 0)
    assert cache.keep((1, 2), _order(CPU)) and cache.bytes_on(CPU) == 2 * ORDER_BYTES


def test_a_zero_budget_keeps_nothing_and_a_key_is_kept_once():
    assert not ControlRankCache(0).keep((0, 1), _order(CPU))
    cache = ControlRankCache(1)
    assert cache.keep((0, 1), _order(CPU)) and not cache.keep((0, 1), _order(CPU))
    assert cache.bytes_on(CPU) == ORDER_BYTES


def test_the_hook_keeps_the_order_where_the_pattern_is_and_reuses_it(monkeypatch):
    ranked = []
    original = topn_attention.topn_ranks
    monkeypatch.setattr(topn_attention, "topn_ranks", lambda *a, **k: ranked.append(1) or original(*a, **k))
    cache = ControlRankCache(1)
    pattern = torch.softmax(torch.randn(1, 2, 5, 5, generator=torch.Generator().manual_seed(0)), -1)
    outputs = [topn_pattern_hook(n, ranking="random", control=1, control_ranks=cache)(pattern) for n in (1, 2, 3)]
    assert len(ranked) == 1 and len(cache) == 1
    assert next(iter(cache._orders.values())).device == pattern.device
    fresh = [topn_pattern_hook(n, ranking="random", control=1)(pattern) for n in (1, 2, 3)]
    for got, want in zip(outputs, fresh, strict=True):
        assert torch.equal(got, want)


@pytest.mark.model
def test_a_budget_for_some_orders_keeps_those_and_ranks_the_rest_every_pass(monkeypatch):
    """With room for one layer's order of a control, that layer is ranked once per control and the other in every
    pass (before, a unit whose orders did not all fit kept none); the sweep's statistics are bit-identical."""
    model = make_model("bridge-llama")
    tokens = with_bos(random_tokens(2, 8, seed=4))
    drawn = []
    original = topn_attention.random_scores

    def counting(shape, **kwargs):
        drawn.append(kwargs["layer"])
        return original(shape, **kwargs)

    monkeypatch.setattr(topn_attention, "random_scores", counting)
    kwargs = dict(n_grid=[1, 2, 4], layers=[0, 1], controls=2, progress=False, n_bootstrap=8, batch_size=2,
                  scope="model")
    rows, heads, pos = tokens.shape[0], model.cfg.n_heads, tokens.shape[1]
    one_order_mib = 2 * rows * heads * pos * pos / 2**20
    partial = intervention_sweep(model, tokens, control_cache_mib=one_order_mib, **kwargs)
    passes = 2 * 3  # modes x N of each control
    assert sorted(drawn) == [0] * 2 + [1] * 2 * passes  # layer 0 fits once per control; layer 1 never fits
    drawn.clear()
    ranked = intervention_sweep(model, tokens, control_cache_mib=0, **kwargs)
    assert sorted(drawn) == [0] * 2 * passes + [1] * 2 * passes
    for name, s in ranked.stats.items():
        for statistic, x in s.stored().arrays().items():
            torch.testing.assert_close(partial.stats[name].stored().arrays()[statistic], x, equal_nan=True, rtol=0, atol=0)
