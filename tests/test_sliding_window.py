"""Acceptance test for sliding-window layers: Gemma-3-270M against a float64 reference in plain transformers.

The reference path has no TransformerLens in it: the exported float32 Hugging
Face model, eager attention, cast to float64; value states from a forward hook
on ``v_proj`` (Gemma-3 normalises q and k, never v), attention probabilities from
``output_attentions=True``; P and R by `tests.reference.reference_metrics` over the
keys the last query can see: the last 512 on a local layer, all on a global one.
The package side is `run_with_geometry_hooks` on the TransformerBridge.

Note: transformers' eager attention takes the softmax in float32 even for a
float64 model (``softmax(..., dtype=torch.float32).to(query.dtype)``), so the
reference probabilities carry float32 rounding (~1e-7 relative); values, sums
and distances are float64.
"""

import pytest
import torch

from tests.fixtures import needs_gemma3
from tests.reference import reference_metrics
from tl_geometry import models, run_with_geometry_hooks
from tl_geometry import default_text, text_windows

pytestmark = [
    pytest.mark.slow,
    pytest.mark.model,
    needs_gemma3,
]

CONTEXT = 700  # BOS + 699 text tokens: the last query sees 512 keys on local layers, 700 on global ones
LOCAL_LAYERS = (0, 4)
GLOBAL_LAYERS = (5, 17)
LAYERS = LOCAL_LAYERS + GLOBAL_LAYERS
# 511 and 512 straddle the window's edge; CONTEXT selects every key of a global layer
# (and is beyond a local layer's 512 keys, where the metrics are undefined: NaN).
N_GRID = (1, 2, 4, 8, 64, 256, 511, 512, CONTEXT)


@pytest.fixture(scope="module")
def hf_bundle(gemma3_cache):
    """The exported float32 Hugging Face model and its tokenizer, read by plain transformers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    export = models.export_bundled_model("gemma3-270m", cache_dir=gemma3_cache, progress=False)
    return AutoModelForCausalLM.from_pretrained(export), AutoTokenizer.from_pretrained(export)


@pytest.fixture(scope="module")
def tokens(hf_bundle):
    return text_windows(hf_bundle[1], default_text(), context=CONTEXT, n_windows=1)  # [1, CONTEXT]


@pytest.fixture(scope="module")
def reference(hf_bundle, tokens):
    """Per checked layer: (window, P [head, n], R [head, n], last query's attention row [head, key], visible keys)."""
    hf_model = hf_bundle[0]
    hf_model.set_attn_implementation("eager")  # the attention probabilities are returned only by eager
    hf_model = hf_model.to(torch.float64).eval()
    config = hf_model.config
    assert config.layer_types[LOCAL_LAYERS[0]] == "sliding_attention" and config.sliding_window == 512
    n_heads, n_kv = config.num_attention_heads, config.num_key_value_heads

    values = {}

    def keep_values(layer):
        def hook(module, inputs, output):
            values[layer] = output.reshape(*output.shape[:2], n_kv, config.head_dim)  # [batch, pos, kv_head, d_head]

        return hook

    handles = []
    for layer in LAYERS:
        attention = hf_model.model.layers[layer].self_attn
        assert not hasattr(attention, "v_norm")  # v_proj's output is what attention reads
        handles.append(attention.v_proj.register_forward_hook(keep_values(layer)))
    try:
        with torch.no_grad():
            attentions = hf_model(input_ids=tokens, output_attentions=True).attentions
    finally:
        for handle in handles:
            handle.remove()

    out = {}
    last = CONTEXT - 1
    heads = torch.arange(n_heads)
    for layer in LAYERS:
        window = config.sliding_window if config.layer_types[layer] == "sliding_attention" else None
        alpha = attentions[layer][0, :, last, :]  # [head, key], float64
        assert alpha.dtype == torch.float64
        # Written from the definition (q - W < k <= q), independent of tl_geometry.capture.windows.
        keys = torch.arange(CONTEXT)
        visible = keys <= last
        if window is not None:
            visible &= keys > last - window
        v = values[layer][0][:, heads // (n_heads // n_kv)].transpose(0, 1)  # [head, key, d_head], GQA-aligned
        metrics = reference_metrics(alpha, v, N_GRID, key_mask=visible.expand(n_heads, -1))
        out[layer] = (window, metrics["precision"], metrics["recall"], alpha, visible)
    return out


@pytest.fixture(scope="module")
def package(tokens, gemma3):
    # Every diagnostic on: the whole pipeline must run on windowed layers, not only the metrics.
    # The taxonomy on the analysed (last) query, not its sample of positions, where the sink is still visible.
    return run_with_geometry_hooks(gemma3, tokens, layers=list(LAYERS), n_grid=list(N_GRID), diagnostics="all",
                                   settings={"roles": {"queries": "analysed"}})


def test_the_default_run_reads_the_rows(package):
    """The default capture takes the rows path on the bundled Gemma-3: the float64 eager reference below
    checks the rows its own eager attention builds under SDPA's sliding-window mask."""
    assert (package.config.capture, package.provenance["capture"]) == ("auto", "rows")


def test_the_last_query_of_a_local_layer_has_no_sink(package):
    """700 tokens, window 512: the last query of a local layer cannot see BOS, so its sink quantities and
    the profile fit (whose position 0 is the sink) are NaN; on a global layer they are defined."""
    for index, layer in enumerate(LAYERS):
        local = layer in LOCAL_LAYERS
        for name in ("contribution_sink", "role_attention_sink", "profile_error"):
            assert bool(package.per_head(name)[index].isnan().all()) == local, (layer, name)
        assert not package.per_head("contribution_last")[index].isnan().any(), layer


@pytest.mark.parametrize("layer", LOCAL_LAYERS)
def test_reference_attention_is_zero_outside_the_window(reference, layer):
    """Sanity check of the reference: eager attention of the last query ends 512 keys back."""
    window, _, _, alpha, visible = reference[layer]
    assert window == 512 and int(visible.sum()) == 512
    assert (alpha[:, ~visible] == 0).all()
    torch.testing.assert_close(alpha[:, visible].sum(-1), torch.ones(alpha.shape[0], dtype=torch.float64))


def test_reference_selects_everything_at_the_visible_count(reference):
    """At N = number of visible keys nothing is left out: P = R = 1; beyond it, undefined."""
    for layer, (window, precision, recall, _, visible) in reference.items():
        at = N_GRID.index(int(visible.sum()))
        assert (precision[:, at] == 1).all() and (recall[:, at] == 1).all(), layer
        beyond = [i for i, n in enumerate(N_GRID) if n > int(visible.sum())]
        assert precision[:, beyond].isnan().all() and recall[:, beyond].isnan().all(), layer


@pytest.mark.parametrize(
    "layer", [pytest.param(layer, id=f"local-{layer}") for layer in LOCAL_LAYERS]
    + [pytest.param(layer, id=f"global-{layer}") for layer in GLOBAL_LAYERS],
)
def test_precision_and_recall_match_the_float64_reference(reference, package, layer):
    _, precision, recall, _, _ = reference[layer]
    row = LAYERS.index(layer)
    assert list(package.n_grid.tolist()) == list(N_GRID)
    for name, expected in (("precision", precision), ("recall", recall)):
        got = package.per_head(name)[row].double()  # [head, n]
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5, equal_nan=True, msg=lambda m: f"{name}: {m}")
