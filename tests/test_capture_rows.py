"""The rows capture path (``capture="rows"``) against the pattern path, on tiny random bridges and SmolLM2.

The pattern path reads the whole pattern at ``hook_pattern``; the rows path
runs the model's fast attention and rebuilds only the analysed query rows
with the model's own eager attention. Both feed the same layer analysis, so
every field of every diagnostic must agree to float tolerance (the rows
path's output comes from SDPA, whose rounding differs from the bridge's
float32-softmax attention at ~1e-7 relative, and later layers inherit that).
"""

import pytest
import torch

from tests import tiny_models as tm
from tests.fixtures import DIFFERENCES_OF_SQUARES, ROLE_DIFFERENCES, cli_config, needs_gemma3
from tl_geometry import GeometryConfig, GeometryError, GeometryResult, run_with_geometry_hooks
from tl_geometry.capture.rows import ROWS_ATTENTION, additive_rows_mask
from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.diagnostics.registry import REGISTRY, Diagnostic

pytestmark = pytest.mark.model

TEXTS = ["the cat sat on the mat and ran", "a dog", "one two three four five six seven eight nine ten house", "big red sun"]
GRID = [1, 2, 3, 5, 8]


def tiny_arch_bridge(arch: str, *, compat: bool = True):
    """A TransformerBridge over a tiny random Hugging Face model of one architecture, float64, built offline."""
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(f"tiny-{arch}", hf_model=tm.tiny_arch_model(arch),
                                                 tokenizer=tm.tiny_tokenizer(), dtype=torch.float64)
    if compat:
        bridge.enable_compatibility_mode(disable_warnings=True)
    return bridge.eval()


def assert_close_results(a: GeometryResult, b: GeometryResult, rtol: float = 1e-5) -> None:
    """Every field: the same defined counts, means to ``rtol`` (absolute 1e-5 for differences of squares)."""
    assert set(a.fields) == set(b.fields)
    assert a.n_documents == b.n_documents
    for name in a.fields:
        assert torch.equal(a.count(name), b.count(name)), name
        atol = 1e-5 if name in DIFFERENCES_OF_SQUARES or name in ROLE_DIFFERENCES else 1e-7
        # The bounds divide by those margins, which carry ~1e-7 absolute: ~1e-5 relative where a margin is ~1e-2.
        scale = 10.0 if name.startswith("bound_") else 1.0
        torch.testing.assert_close(a.per_head(name), b.per_head(name), rtol=rtol * scale, atol=atol, equal_nan=True,
                                   msg=name)


def _padded(model, side: str, pad_id: int = tm.PAD_ID) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [model.to_tokens(t, prepend_bos=True)[0] for t in TEXTS]
    width = max(len(r) for r in rows)
    tokens = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(tokens)
    for i, r in enumerate(rows):
        span = slice(width - len(r), width) if side == "left" else slice(0, len(r))
        tokens[i, span], mask[i, span] = r, 1
    return tokens, mask


def _both(model, tokens, mask, **overrides):
    config = GeometryConfig(**{"diagnostics": "all", "n_grid": GRID, "n_bootstrap": 4, **overrides, "capture": "pattern"})
    pattern = run_with_geometry_hooks(model, tokens, attention_mask=mask, config=config)
    rows = run_with_geometry_hooks(model, tokens, attention_mask=mask, config=config.with_overrides(capture="rows"))
    assert (pattern.config.capture, rows.config.capture) == ("pattern", "rows")
    return pattern, rows


# TransformerLens 3.9's bridge leaves the attention output projection of a float64 Qwen2 or GPT-J in float32:
# those tiny models cannot run a forward pass there at all, whatever the capture path.
TL3_FLOAT64_BROKEN = pytest.mark.skipif(tm.tl_major_version() < 4, reason="TransformerLens 3.x cannot run this "
                                        "float64 bridge (its attention output projection stays float32)")
SUPPORTED = ["gpt2", "neox", "llama", "mistral", pytest.param("qwen2", marks=TL3_FLOAT64_BROKEN),
             "gemma2", "gemma3"]


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("arch", SUPPORTED)
def test_rows_equal_pattern_on_every_field(arch, side):
    """Every field of every diagnostic, last query and a set of query positions, with left or right padding."""
    model = tiny_arch_bridge(arch)
    tokens, mask = _padded(model, side)
    for queries in ("last", [-1, -3, 1]):
        pattern, rows = _both(model, tokens, mask, query_positions=queries)
        assert_close_results(pattern, rows)


@pytest.mark.parametrize("budget", [1e-3, 512.0])
def test_rows_fold_layers_within_the_memory_budget(budget):
    """The rows path analyses its kept layers together, one sliding window at a time (Gemma-3's layers 0 and 2
    share one), once they fill the memory budget and after the pass: with a budget that analyses each layer on
    its own and one that keeps them all, every field, the per-query rows and the pictures (of a layer analysed
    on its own) equal the pattern path's."""
    model = tiny_arch_bridge("gemma3")
    tokens, mask = _padded(model, "left")
    pattern, rows = _both(model, tokens, mask, query_positions=[-1, -3, 1], keep_queries=True,
                          picture_heads=[(1, 0), (1, 3)], memory_budget_mib=budget)
    assert_close_results(pattern, rows)
    assert set(pattern.queries) == set(rows.queries)
    assert torch.equal(pattern.query_positions, rows.query_positions)
    for name in pattern.queries:
        torch.testing.assert_close(pattern.queries[name], rows.queries[name], rtol=1e-5, atol=1e-5, equal_nan=True,
                                   msg=name)
    assert [(p.layer, p.head) for p in pattern.pictures] == [(1, 0), (1, 3)]
    for a, b in zip(pattern.pictures, rows.pictures, strict=True):
        assert (a.layer, a.head, a.document, a.query_position) == (b.layer, b.head, b.document, b.query_position)
        torch.testing.assert_close(a.precision, b.precision, equal_nan=True)
        torch.testing.assert_close(a.alpha, b.alpha)


class _SequenceBatches(Diagnostic):
    """A per-sequence diagnostic that notes the batch of every context it is handed (the layer's mean value norm)."""

    name = "sequence_batches"
    fields = (FieldSpec("sequence_batches_norm", "mean value norm of the sequence's analysed heads", queries="sequence"),)
    batches: list[int] = []

    def sequences(self, context, settings):
        self.batches.append(context.shape[0])
        norms = torch.linalg.vector_norm(context.values.float(), dim=-1).mean(1)  # [batch, head_index]
        return {"sequence_batches_norm": norms}


def test_folded_layers_run_the_per_sequence_diagnostics_one_layer_at_a_time():
    """With a budget that folds every layer into one batch, the per-sequence diagnostics still see one layer's
    sequences at a time, as on the pattern path: their working memory does not grow with the fold (it did: the
    profile fit of every folded layer filled the budget). Mutant caught: ``sequences`` on the folded context."""
    model = tiny_arch_bridge("llama")
    tokens, mask = _padded(model, "right")
    REGISTRY.register(_SequenceBatches())
    try:
        _SequenceBatches.batches = []
        pattern, rows = _both(model, tokens, mask, diagnostics=["sequence_batches", "assumptions"],
                              memory_budget_mib=512.0)
        assert _SequenceBatches.batches == [len(TEXTS)] * (2 * model.cfg.n_layers)  # one call per layer and path
        assert_close_results(pattern, rows)
    finally:
        REGISTRY.unregister("sequence_batches")


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_rows_equal_pattern_without_compatibility_mode(arch):
    """A raw bridge (no weight processing); right padding, as raw bridges over rotary models turn left pads NaN."""
    model = tiny_arch_bridge(arch, compat=False)
    tokens, mask = _padded(model, "right")
    pattern, rows = _both(model, tokens, mask, query_positions="all")
    assert_close_results(pattern, rows)


@pytest.mark.parametrize("arch", ["bloom", pytest.param("gptj", marks=TL3_FLOAT64_BROKEN)])
def test_models_outside_the_attention_interface_name_the_pattern_path(arch):
    """Bloom (ALiBi in its own code) and GPT-J compute attention without the interface: a clear error."""
    model = tiny_arch_bridge(arch)
    tokens, mask = _padded(model, "right")
    try:
        run_with_geometry_hooks(model, tokens, attention_mask=mask, n_grid=GRID, capture="rows")
    except GeometryError as error:
        assert 'capture="pattern"' in str(error)
    else:  # the architecture goes through the interface after all: then it must agree
        pattern, rows = _both(model, tokens, mask)
        assert_close_results(pattern, rows)


def test_model_is_left_as_it_was():
    """After a rows run (and after one that failed) the bridge is unchanged: attention, its forward, its output."""
    model = tiny_arch_bridge("llama")
    tokens, mask = _padded(model, "left")
    before = model(tokens, attention_mask=mask)
    assert not before.isnan().any()
    implementation = model.original_model.config._attn_implementation
    run_with_geometry_hooks(model, tokens, attention_mask=mask, n_grid=GRID, capture="rows")
    with pytest.raises(GeometryError):
        run_with_geometry_hooks(model, tokens, attention_mask=mask, n_grid=GRID, capture="rows", layers=[7])
    assert model.original_model.config._attn_implementation == implementation != ROWS_ATTENTION
    for module in model.modules():
        assert "forward" not in module.__dict__
    torch.testing.assert_close(model(tokens, attention_mask=mask), before, rtol=0, atol=0)


def test_rows_path_skips_the_full_pattern():
    """The rows pass never fires hook_pattern (the bridge's eager re-implementation does not run)."""
    model = tiny_arch_bridge("llama")
    fired = []
    model.blocks[0].attn.hook_pattern.add_hook(lambda t, hook: fired.append(t.shape))
    try:
        run_with_geometry_hooks(model, "the cat sat", n_grid=GRID, capture="rows")
        assert fired == []
        run_with_geometry_hooks(model, "the cat sat", n_grid=GRID, capture="pattern")
        assert fired
    finally:
        model.reset_hooks()


def test_capture_option_is_validated():
    with pytest.raises(GeometryError, match="capture: expected one of \\('auto', 'pattern', 'rows'\\)"):
        GeometryConfig(capture="fast")
    assert GeometryConfig().capture == "auto"


@pytest.mark.skipif(not tm.has_hooked_transformer(), reason="HookedTransformer needs transformer-lens 3.x")
def test_hooked_transformer_names_the_pattern_path():
    model = tm.make_model("hooked")
    with pytest.raises(GeometryError, match='capture="pattern"'):
        run_with_geometry_hooks(model, "the cat sat", n_grid=GRID, capture="rows")


def reference_rows_mask(mask: torch.Tensor | None, query_index: torch.Tensor, n_keys: int) -> torch.Tensor:
    """Written out element by element: 0 where the query may attend, the dtype's minimum elsewhere."""
    n_batch, n_queries = query_index.shape
    out = torch.empty(n_batch, 1, n_queries, n_keys, dtype=torch.float32)
    low = torch.finfo(torch.float32).min
    for b in range(n_batch):
        for q in range(n_queries):
            position = int(query_index[b, q])
            for k in range(n_keys):
                allowed = k <= position if mask is None else bool(mask[b if mask.shape[0] > 1 else 0, 0, position, k])
                out[b, 0, q, k] = 0.0 if allowed else low
    return out


@pytest.mark.parametrize("with_mask", [False, True])
def test_additive_rows_mask_against_reference(with_mask):
    gen = torch.Generator().manual_seed(1)
    mask = torch.rand(3, 1, 6, 6, generator=gen) > 0.4 if with_mask else None
    query_index = torch.tensor([[5, 2], [0, 3], [4, 4]])
    torch.testing.assert_close(additive_rows_mask(mask, query_index, 6, torch.float32),
                               reference_rows_mask(mask, query_index, 6), rtol=0, atol=0)


# Layers of each bundled model: first, middle and last (Gemma-3: local layers 0 and 4, global layers 5 and 17).
BUNDLED_LAYERS = {"smollm2": [0, 14, 29], "gemma3": [0, 4, 5, 17]}


@pytest.mark.slow
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("bundled", ["smollm2", pytest.param("gemma3", marks=needs_gemma3)])
def test_rows_equal_pattern_on_the_bundled_models(bundled, side, request):
    """Each bundled model in float32: every field, left- and right-padded texts, last query and all queries."""
    model = request.getfixturevalue(bundled)
    tokens, mask = _padded(model, side, model.tokenizer.pad_token_id or 0)
    for queries in ("last", "all"):
        pattern, rows = _both(model, tokens, mask, query_positions=queries, layers=BUNDLED_LAYERS[bundled])
        assert_close_results(pattern, rows, rtol=2e-3)


# ---- capture="auto": the rows where the model can take them ----


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_auto_takes_the_rows_on_a_bridge_and_equals_the_pattern(arch):
    """The default on a bridge is the rows path (the result records it), with the pattern path's every field."""
    model = tiny_arch_bridge(arch)
    tokens, mask = _padded(model, "left")
    config = GeometryConfig(diagnostics="all", n_grid=GRID, n_bootstrap=4)
    auto = run_with_geometry_hooks(model, tokens, attention_mask=mask, config=config)
    pattern = run_with_geometry_hooks(model, tokens, attention_mask=mask, config=config.with_overrides(capture="pattern"))
    assert auto.config.capture == "auto" and auto.provenance["capture"] == "rows"  # what was asked; what was done
    assert "capture_reason" not in auto.provenance
    assert_close_results(pattern, auto)


def test_auto_takes_the_pattern_where_a_hook_is_attached():
    """A hook on the model would not fire on the rows path: auto reads the pattern instead (the hook's edit is
    in the result) and says why once per run; Python's default filter shows it once per calling line."""
    import warnings

    model = tiny_arch_bridge("llama")
    halved = []

    def halve(pattern, hook):
        halved.append(hook.name)
        return pattern / 2

    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", halve)]), warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("default")
        results = [run_with_geometry_hooks(model, "the cat sat on the mat", n_grid=GRID, layers=[0]) for _ in range(2)]
        warnings.simplefilter("always")
        results.append(run_with_geometry_hooks(model, "the cat sat on the mat", n_grid=GRID, layers=[0]))
    assert len(halved) == 3
    for result in results:
        assert (result.config.capture, result.provenance["capture"]) == ("auto", "pattern")
        assert "hooks are attached" in result.provenance["capture_reason"]
    said = [w for w in said if 'capture="auto"' in str(w.message)]
    assert len(said) == 2 and all("hooks are attached" in str(w.message) for w in said)  # once per line, then per run
    assert all(w.filename == __file__ for w in said)  # said at the line that started the run
    plain = run_with_geometry_hooks(model, "the cat sat on the mat", n_grid=GRID, layers=[0])
    assert plain.provenance["capture"] == "rows"


@pytest.mark.parametrize("arch", ["bloom", pytest.param("gptj", marks=TL3_FLOAT64_BROKEN)])
def test_auto_takes_the_pattern_where_attention_is_the_models_own_code(arch):
    model = tiny_arch_bridge(arch)
    with pytest.warns(UserWarning, match="computes its attention in its own code"):
        result = run_with_geometry_hooks(model, "the cat sat", n_grid=GRID)
    assert (result.config.capture, result.provenance["capture"]) == ("auto", "pattern")


@pytest.mark.skipif(not tm.has_hooked_transformer(), reason="HookedTransformer needs transformer-lens 3.x")
def test_auto_takes_the_pattern_on_a_hooked_transformer():
    with pytest.warns(UserWarning, match="wraps no Hugging Face model"):
        result = run_with_geometry_hooks(tm.make_model("hooked"), "the cat sat", n_grid=GRID)
    assert (result.config.capture, result.provenance["capture"]) == ("auto", "pattern")


@pytest.mark.parametrize(("args", "expected"), [(("--capture", "rows"), "rows"), ((), "auto")])
def test_cli_capture_option_reaches_the_config(args, expected):

    assert cli_config(*args).capture == expected
