"""selection_metrics_from_cache against the definitions (tests/reference.py), from a real run_with_cache."""

import pytest
import torch

from tests import tiny_models as tm
from tests.reference import reference_metrics
from tl_geometry import GeometryError, run_with_geometry_hooks, selection_metrics_from_cache

GRID = [1, 2, 3, 5, 8, 13]
KINDS = ["bridge-llama", "compat-llama", "bridge-gpt2"] + (["hooked"] if tm.has_hooked_transformer() else [])


def _reference(cache, layer, head, query, batch=0, real=None):
    """The row from the cache by the paper's definitions: keys up to the query (real ones only), the value head
    h // (n_heads / n_kv_heads) under grouped-query attention."""
    pattern = cache[f"blocks.{layer}.attn.hook_pattern"].double()
    values = cache[f"blocks.{layer}.attn.hook_v"].double()
    n_heads, n_kv = pattern.shape[1], values.shape[2]
    q = query % pattern.shape[2]
    visible = torch.arange(pattern.shape[-1]) <= q
    if real is not None:
        visible &= real[batch].bool()
    alpha = pattern[batch, head, q].masked_fill(~visible, 0.0)
    return reference_metrics(alpha[None], values[batch, :, head // (n_heads // n_kv)][None], GRID, visible[None])


@pytest.mark.parametrize("kind", KINDS)
def test_every_head_and_query_equals_the_definitions(kind):
    model = tm.make_model(kind)
    tokens = tm.with_bos(tm.random_tokens(2, 14))
    _, cache = model.run_with_cache(tokens)
    for layer in range(model.cfg.n_layers):
        for head in range(model.cfg.n_heads):
            for query, batch in ((-1, 0), (6, 1), (1, 0)):
                got = selection_metrics_from_cache(cache, layer, head, query, batch=batch, n_grid=GRID)
                want = _reference(cache, layer, head, query, batch)
                for name in ("precision", "recall", "r_max", "r_min"):
                    torch.testing.assert_close(getattr(got, name).double(), want[name][0], equal_nan=True,
                                               rtol=1e-6, atol=1e-9, msg=f"{kind} {layer}.{head} q{query} {name}")


def test_padded_keys_are_left_out_with_the_attention_mask():
    model = tm.make_model("compat-llama")
    tokens, mask = tm.left_padded([tm.with_bos(tm.random_tokens(1, 12, seed=s))[0][: 13 - 4 * s] for s in (0, 1)])
    _, cache = model.run_with_cache(tokens, attention_mask=mask)
    got = selection_metrics_from_cache(cache, 1, 2, batch=1, attention_mask=mask, n_grid=GRID)
    want = _reference(cache, 1, 2, -1, batch=1, real=mask)
    torch.testing.assert_close(got.precision.double(), want["precision"][0], equal_nan=True)
    assert got.precision[GRID.index(13)].isnan()  # 9 real keys: no top-13 set


def test_it_agrees_with_the_hooks_on_the_last_query():
    model = tm.make_model("bridge-llama")
    tokens = tm.with_bos(tm.random_tokens(1, 20))
    _, cache = model.run_with_cache(tokens)
    result = run_with_geometry_hooks(model, tokens, n_grid=GRID)
    for layer in range(model.cfg.n_layers):
        for head in range(model.cfg.n_heads):
            got = selection_metrics_from_cache(cache, layer, head, n_grid=GRID)
            torch.testing.assert_close(got.recall.double(), result.per_head("recall")[layer, head].double(),
                                       rtol=1e-5, atol=1e-6)


def test_clear_errors():
    model = tm.make_model("bridge-llama")
    tokens = tm.with_bos(tm.random_tokens(1, 8))
    _, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_v"))
    with pytest.raises(GeometryError, match="names_filter=lambda name: name in"):
        selection_metrics_from_cache(cache, 0, 0)
    _, cache = model.run_with_cache(tokens)
    with pytest.raises(GeometryError, match=r"head: expected an integer in \[-4, 3\]"):
        selection_metrics_from_cache(cache, 0, 4)
    with pytest.raises(GeometryError, match="query: expected an integer"):
        selection_metrics_from_cache(cache, 0, 0, query=9)
