"""Sliding-window attention: visible_keys against its definition, attention_windows against configs and models.

The model tests check the semantics against the models themselves: on every layer
the attention pattern is zero exactly on the keys `visible_keys` hides, with and
without left padding.
"""

from types import SimpleNamespace

import pytest
import torch
import transformers

from tests import tiny_models as tm
from tests.fixtures import needs_gemma3
from tl_geometry import models
from tl_geometry.capture.hook_names import pattern_hook
from tl_geometry.capture.windows import attention_windows, visible_keys
from tl_geometry.errors import GeometryError
from tl_geometry import default_text, text_windows

needs_hooked = [pytest.mark.tl3, pytest.mark.skipif(not tm.has_hooked_transformer(), reason="needs transformer-lens 3.x")]
GEMMA_WINDOW = 512
GEMMA_WINDOWS = ((GEMMA_WINDOW,) * 5 + (None,)) * 3  # Gemma-3-270M: 18 layers, every 6th global


def visible_by_definition(query_index, real, window) -> torch.Tensor:
    """The definition, one (query, key) pair at a time: k <= q, k real, q - window < k."""
    batch, n_queries = query_index.shape
    n_keys = real.shape[1]
    out = torch.zeros(batch, n_queries, n_keys, dtype=torch.bool)
    for b in range(batch):
        for i in range(n_queries):
            q = int(query_index[b, i])
            for k in range(n_keys):
                out[b, i, k] = k <= q and bool(real[b, k]) and (window is None or k > q - window)
    return out


def padded_real(lengths: list[int], width: int, side: str) -> torch.Tensor:
    """``[batch, width]`` real-token masks of the given lengths, padded on one side."""
    real = torch.zeros(len(lengths), width, dtype=torch.bool)
    for row, length in enumerate(lengths):
        if side == "right":
            real[row, :length] = True
        else:
            real[row, width - length :] = True
    return real


# ---------------------------------------------------------------- visible_keys, no model


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("window", [None, 1, 2, 3, 5, 9, 100])
def test_visible_keys_equals_the_definition(side, window):
    real = padded_real([9, 6, 1, 4], width=9, side=side)
    every_position = torch.arange(9).expand(4, -1)
    assert torch.equal(visible_keys(every_position, real, window), visible_by_definition(every_position, real, window))
    gen = torch.Generator().manual_seed(0)
    some_queries = torch.randint(0, 9, (4, 3), generator=gen)
    assert torch.equal(visible_keys(some_queries, real, window), visible_by_definition(some_queries, real, window))


def test_visible_keys_counts():
    """A query sees min(window, real keys up to it) keys, however the row is padded."""
    for side in ("left", "right"):
        real = padded_real([20], width=24, side=side)
        first = int(real.int().argmax())
        last = first + 19
        for window, expected in ((None, 20), (1, 1), (7, 7), (20, 20), (512, 20)):
            assert int(visible_keys(torch.tensor([[last]]), real, window).sum()) == expected
        # Left padding: a window counted from row index 0 would be too short by the pads; it is not.
        assert visible_keys(torch.tensor([[last]]), real, 7)[0, 0].nonzero().flatten().tolist() == list(
            range(last - 6, last + 1)
        )


@pytest.mark.parametrize("window", [0, -3, True])
def test_visible_keys_refuses_bad_windows(window):
    with pytest.raises(GeometryError, match=r"window: expected a positive integer or None"):
        visible_keys(torch.tensor([[0]]), torch.ones(1, 3, dtype=torch.bool), window)


@pytest.mark.parametrize("query", [-1, 3])
def test_visible_keys_refuses_queries_outside_the_row(query):
    with pytest.raises(GeometryError, match=r"query_index: positions must lie in the row, 0\.\.2"):
        visible_keys(torch.tensor([[query]]), torch.ones(1, 3, dtype=torch.bool), 2)


# ---------------------------------------------------------------- attention_windows from configs, no model


def fake_bridge(hf_config, n_layers: int) -> SimpleNamespace:
    """What attention_windows reads of a bridge: cfg.n_layers and the wrapped model's config."""
    return SimpleNamespace(cfg=SimpleNamespace(n_layers=n_layers), original_model=SimpleNamespace(config=hf_config))


def fake_hooked(n_layers: int, **cfg) -> SimpleNamespace:
    return SimpleNamespace(cfg=SimpleNamespace(n_layers=n_layers, **cfg))


def test_windows_from_gemma3_layer_types():
    config = transformers.Gemma3TextConfig(num_hidden_layers=8, sliding_window=64)
    assert attention_windows(fake_bridge(config, 8)) == (64, 64, 64, 64, 64, None, 64, 64)


def test_windows_from_a_multimodal_config_read_its_text_config():
    text = transformers.Gemma3TextConfig(num_hidden_layers=6, sliding_window=32)
    config = transformers.Gemma3Config(text_config=text.to_dict())
    assert attention_windows(fake_bridge(config, 6)) == (32,) * 5 + (None,)


def test_windows_from_a_heterogeneous_config():
    """transformers >= 5.15 refuses per-layer fields on the global config: read layer by layer."""
    config = transformers.Gemma3TextConfig(num_hidden_layers=6, sliding_window=64)
    if not hasattr(config, "is_heterogeneous"):
        pytest.skip("heterogeneous configs need transformers >= 5.15")
    config.per_layer_config = {0: {"sliding_window": 128}}
    assert attention_windows(fake_bridge(config, 6)) == (128, 64, 64, 64, 64, None)


def test_windows_from_mistral_and_qwen2():
    for window in (7, None):
        mistral = transformers.MistralConfig(num_hidden_layers=3, sliding_window=window)
        assert attention_windows(fake_bridge(mistral, 3)) == (window,) * 3
    off = transformers.Qwen2Config(num_hidden_layers=4, sliding_window=16, use_sliding_window=False)
    assert attention_windows(fake_bridge(off, 4)) == (None,) * 4
    upper = transformers.Qwen2Config(
        num_hidden_layers=4, sliding_window=16, use_sliding_window=True, max_window_layers=2
    )
    assert attention_windows(fake_bridge(upper, 4)) == (None, None, 16, 16)


def test_windows_from_legacy_pattern_and_gpt_neo_configs():
    legacy = SimpleNamespace(sliding_window=8, sliding_window_pattern=3)  # no layer_types (older transformers)
    assert attention_windows(fake_bridge(legacy, 6)) == (8, 8, None, 8, 8, None)
    neo = transformers.GPTNeoConfig(num_layers=4, attention_types=[[["global", "local"], 2]], window_size=5)
    assert attention_windows(fake_bridge(neo, 4)) == (None, 5, None, 5)


def test_windows_from_hooked_transformer_cfg():
    assert attention_windows(fake_hooked(3)) == (None,) * 3
    local = fake_hooked(3, use_local_attn=True, attn_types=["local", "global", "local"], window_size=4)
    assert attention_windows(local) == (4, None, 4)


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (SimpleNamespace(), r"model: expected a TransformerLens model with cfg\.n_layers"),
        (
            fake_bridge(SimpleNamespace(layer_types=["full_attention", "chunked_attention"], sliding_window=4), 2),
            r"layer 1 has attention type 'chunked_attention'",
        ),
        (
            fake_bridge(SimpleNamespace(layer_types=["sliding_attention"], sliding_window=4), 2),
            r"lists 1 layer_types for 2 layers",
        ),
        (
            fake_bridge(SimpleNamespace(layer_types=["sliding_attention"], sliding_window=None), 1),
            r"layer 0's Hugging Face config asks for a sliding window but its size is None",
        ),
        (fake_hooked(2, use_local_attn=True, attn_types=["local", "local"], window_size=None), r"its size is None"),
        (fake_hooked(2, use_local_attn=True, attn_types=["local"], window_size=4), r"does not cover 2 layers"),
        (
            fake_hooked(1, use_local_attn=True, attn_types=["sliding"], window_size=4),
            r"cfg\.attn_types\[0\] is 'sliding'",
        ),
    ],
)
def test_attention_windows_errors(model, message):
    with pytest.raises(GeometryError, match=message):
        attention_windows(model)


# ---------------------------------------------------------------- tiny models: windows as the model applies them


def tiny_local_hooked():
    """A HookedTransformer with a window of 3 on layer 0 and global attention on layer 1 (transformer-lens 3.x)."""
    import warnings

    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=2, d_model=32, n_ctx=64, d_head=8, n_heads=4, n_key_value_heads=2, d_vocab=tm.VOCAB_SIZE,
        act_fn="gelu", positional_embedding_type="rotary", normalization_type="LN", default_prepend_bos=True,
        use_local_attn=True, attn_types=["local", "global"], window_size=3, seed=0, model_name="tiny-local",
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.x deprecates HookedTransformer
        return HookedTransformer(cfg, tokenizer=tm.tiny_tokenizer()).eval()


def check_pattern_support(model, tokens, real, windows) -> None:
    """On real query rows the pattern is zero exactly off `visible_keys` (and, in tiny models, positive on it)."""
    kwargs = {} if bool(real.all()) else {"attention_mask": real.long()}
    names = {pattern_hook(layer) for layer in range(len(windows))}
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names, **kwargs)
    positions = torch.arange(tokens.shape[1]).expand(tokens.shape[0], -1)
    for layer, window in enumerate(windows):
        pattern = cache[pattern_hook(layer)]  # [batch, head, query, key]
        visible = visible_keys(positions, real, window)[:, None].expand_as(pattern)
        rows = real[:, None, :, None].expand_as(pattern)
        assert (pattern[~visible & rows] == 0).all(), (layer, window)
        # Random small weights give near-uniform attention: every visible key gets weight.
        assert (pattern[visible & rows] > 0).all(), (layer, window)


TINY_WINDOW_KINDS = [
    pytest.param("hooked", marks=needs_hooked),
    "bridge-gemma3",
    "compat-gemma3",
    "bridge-mistral",
    "compat-mistral",
]


def make_window_model(kind: str):
    if kind == "hooked":
        return tiny_local_hooked()
    mode, arch = kind.split("-")
    return tm.tiny_window_bridge(arch, compat=mode == "compat")


@pytest.mark.model
@pytest.mark.parametrize("kind", TINY_WINDOW_KINDS)
def test_tiny_window_models_mask_exactly_the_hidden_keys(kind):
    model = make_window_model(kind)
    windows = attention_windows(model)
    expected = {"hooked": (3, None), "gemma3": (4, None, 4), "mistral": (3, 3)}[kind.split("-")[-1]]
    assert windows == expected
    tokens = tm.with_bos(tm.random_tokens(2, 11))  # 12 positions, well past every window
    check_pattern_support(model, tokens, torch.ones(tokens.shape, dtype=torch.bool), windows)
    tokens[1, :3] = tm.PAD_ID  # left padding: three pads, then BOS and the text
    tokens[1, 3] = tm.BOS_ID
    real = padded_real([12, 9], width=12, side="left")
    check_pattern_support(model, tokens, real, windows)


@pytest.mark.model
@pytest.mark.parametrize(
    "kind", [pytest.param("hooked", marks=needs_hooked), *(kind for kind in tm.KINDS if kind != "hooked")]
)
def test_tiny_test_models_are_global(kind):
    assert attention_windows(tm.make_model(kind)) == (None,) * tm.N_LAYERS


# ---------------------------------------------------------------- Gemma-3-270M


@pytest.fixture(scope="module", params=[True, False], ids=["compat", "no-compat"])
def gemma(request, gemma3_cache):
    if request.param:
        return request.getfixturevalue("gemma3")  # the one loaded for every test in compatibility mode
    return models.load_model("gemma3-270m", cache_dir=gemma3_cache, progress=False, compatibility_mode=False)


@needs_gemma3
@pytest.mark.slow
@pytest.mark.model
def test_gemma_windows_match_its_hugging_face_config(gemma):
    windows = attention_windows(gemma)
    assert windows == GEMMA_WINDOWS
    hf_model = gemma.original_model
    config = hf_model.config
    assert config.sliding_window == GEMMA_WINDOW
    assert windows == tuple(config.sliding_window if t == "sliding_attention" else None for t in config.layer_types)
    # and the window each Hugging Face attention module was built with
    assert windows == tuple(layer.self_attn.sliding_window for layer in hf_model.model.layers)


@needs_gemma3
@pytest.mark.slow
@pytest.mark.model
@pytest.mark.parametrize("padding", [0, 37], ids=["unpadded", "left-padded"])
def test_gemma_pattern_is_zero_exactly_off_the_visible_keys(gemma, padding):
    """Local layers hide the keys more than 511 back; the pre-softmax scores show the edge exactly.

    The pattern alone could be zero inside the window by underflow, so the
    boundary is pinned on ``hook_attn_scores``: masked entries carry the mask
    value (-inf or the dtype's minimum), every visible one a finite score.
    """
    length = 700
    tokens = text_windows(gemma, default_text(), context=length, n_windows=1)  # BOS + 699 text tokens
    real = torch.ones(tokens.shape, dtype=torch.bool)
    if padding:
        shifted = torch.full_like(tokens, gemma.tokenizer.pad_token_id)
        shifted[:, padding:] = tokens[:, : length - padding]
        tokens, real = torch.cat([tokens, shifted]), torch.cat([real, padded_real([length - padding], length, "left")])
    layers = (0, 4, 5, 6, 11, 16, 17)  # local and global, first and last
    names = {f"blocks.{layer}.attn.{hook}" for layer in layers for hook in ("hook_pattern", "hook_attn_scores")}
    kwargs = {"attention_mask": real.long()} if padding else {}
    with torch.no_grad():
        _, cache = gemma.run_with_cache(tokens, names_filter=lambda n: n in names, **kwargs)
    positions = torch.arange(length).expand(tokens.shape[0], -1)
    windows = attention_windows(gemma)
    for layer in layers:
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"]
        scores = cache[f"blocks.{layer}.attn.hook_attn_scores"]
        visible = visible_keys(positions, real, windows[layer])[:, None].expand_as(pattern)
        rows = real[:, None, :, None].expand_as(pattern)
        if windows[layer] is not None:  # not vacuous: some causal real keys are outside the window
            causal = visible_keys(positions, real, None)[:, None].expand_as(pattern)
            assert (causal & ~visible & rows).any()
        assert (pattern[~visible & rows] == 0).all(), layer
        masked = scores < torch.finfo(scores.dtype).min / 2  # -inf or the dtype's minimum
        assert torch.equal(masked[rows], ~visible[rows]), layer
        sums = (pattern * visible).sum(-1)[real[:, None, :].expand_as(pattern[..., 0])]
        torch.testing.assert_close(sums, torch.ones_like(sums))


@pytest.mark.model
@pytest.mark.parametrize("kind", TINY_WINDOW_KINDS)
def test_the_hooks_drop_the_sink_where_the_window_has_passed_it(kind):
    """End to end: on a windowed layer, queries that cannot see BOS have no sink (sink quantities NaN),
    queries that can see it have one, and N = the window selects every visible key (P = R = 1)."""
    from tl_geometry import run_with_geometry_hooks

    model = make_window_model(kind)
    windows = attention_windows(model)
    tokens = tm.with_bos(tm.random_tokens(1, 11))  # 12 positions
    grid = [1, 2, 3, 4]  # reaches every window (3 or 4)
    result = run_with_geometry_hooks(
        model, tokens, query_positions="all", diagnostics=["roles", "assumptions"], keep_queries=True, n_grid=grid,
        settings={"roles": {"queries": "analysed"}},
    )
    for layer, window in enumerate(windows):
        sink_term = result.queries["contribution_sink"][0, layer]  # [head, query]
        for q in range(1, 12):  # query 0 sees one key: nothing to tell apart
            sees_bos = window is None or q < window
            assert bool(sink_term[:, q].isnan().all()) != sees_bos, (layer, window, q)
            if window is not None and q >= window - 1:  # the query sees exactly `window` keys
                for name in ("precision", "recall"):
                    assert (result.queries[name][0, layer, :, q, grid.index(window)] == 1).all(), (layer, q, name)
        profile_defined = not bool(result.per_head("profile_error")[layer].isnan().all())
        assert profile_defined == (window is None), (layer, window)  # its position 0 is the sink
