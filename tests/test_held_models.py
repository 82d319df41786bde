"""Models users already hold: a plain transformers causal LM and an nnsight model, against the bridge path.

Each input kind is wrapped into a TransformerBridge over a shell of the
model that shares its weights, without TransformerLens's weight processing.
So against a bridge booted on a copy of the same model (no processing) every
field is equal exactly, and against the processed bridge `load_model` returns
(the zoo's ``tiny_arch_bridge``, the bundled models) every count is equal and
every mean to the rounding of the folded weights (`assert_close_results`).
The user's model must come back exactly as it was: the same parameter
objects and data, config, attention implementation, modules, mode, no hooks.
"""

import copy
import importlib.util
import warnings

import pytest
import torch

from tests import tiny_models as tm
from tests.fixtures import assert_equal_runs, assert_same_rows, assert_same_stats, needs_gemma3
from tests.test_capture_rows import BUNDLED_LAYERS, GRID, SUPPORTED, TEXTS, assert_close_results, tiny_arch_bridge
from tl_geometry import GeometryConfig, GeometryError, analyze_corpus, run_with_geometry_hooks
from tl_geometry.capture.held_models import as_hookable, shell_copy, wrap_held_model

pytestmark = pytest.mark.model

EXACT = {"rtol": 0.0, "atol": 0.0}
needs_nnsight = pytest.mark.skipif(importlib.util.find_spec("nnsight") is None,
                                   reason="nnsight is not installed (pip install tl_geometry[nnsight])")


def config(**overrides) -> GeometryConfig:
    return GeometryConfig(diagnostics="all", n_grid=GRID, n_bootstrap=4, **overrides)


def raw_bridge(hf_model):
    """The bridge path on a copy of the model, without weight processing: what the wrapping must equal exactly."""
    from transformer_lens.model_bridge import TransformerBridge

    return TransformerBridge.boot_transformers("tiny", hf_model=copy.deepcopy(hf_model),
                                               tokenizer=tm.tiny_tokenizer(), dtype=torch.float64).eval()


def language_model(hf_model, tokenizer):
    import nnsight

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nnsight 0.8 calls LanguageModel deprecated, but it is what users hold
        return nnsight.LanguageModel(hf_model, tokenizer=tokenizer)


def left_padded_texts(tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [torch.tensor([tm.BOS_ID, *tokenizer(text, add_special_tokens=False)["input_ids"]]) for text in TEXTS]
    return tm.left_padded(rows)


class Snapshot:
    """Everything of a model a wrapping could change, read from the model itself."""

    def __init__(self, model: torch.nn.Module):
        self.parameters = {name: (p, p.detach().clone()) for name, p in model.named_parameters()}
        self.buffers = {name: (b, b.detach().clone()) for name, b in model.named_buffers()}
        self.config = model.config.to_dict()
        self.attention = model.config._attn_implementation
        self.modules = [(name, module, type(module)) for name, module in model.named_modules()]
        self.modes = [module.training for module in model.modules()]
        self.requires_grad = [p.requires_grad for p in model.parameters()]

    def assert_same(self, model: torch.nn.Module) -> None:
        for kept, now in ((self.parameters, dict(model.named_parameters())), (self.buffers, dict(model.named_buffers()))):
            assert set(kept) == set(now)
            for name, (tensor, data) in kept.items():
                assert now[name] is tensor and torch.equal(now[name], data), name
        assert model.config.to_dict() == self.config and model.config._attn_implementation == self.attention
        assert [(n, m, type(m)) for n, m in model.named_modules()] == self.modules
        assert [module.training for module in model.modules()] == self.modes
        assert [p.requires_grad for p in model.parameters()] == self.requires_grad
        assert sum(tm.hook_counts(model).values()) == 0
        assert not [name for name, module in model.named_modules() if "forward" in module.__dict__]


# ---- the zoo: tiny random models of several families ----


@pytest.mark.parametrize("arch", SUPPORTED)
def test_transformers_model_equals_the_bridge_path(arch):
    """Left-padded tokens: every field equal to the unprocessed bridge's exactly, to the processed one's to
    rounding; the model as it was after the run and after a refused one."""
    hf_model = tm.tiny_arch_model(arch)
    before = Snapshot(hf_model)
    tokens, mask = left_padded_texts(tm.tiny_tokenizer())
    held = run_with_geometry_hooks(hf_model, tokens, attention_mask=mask, tokenizer=tm.tiny_tokenizer(),
                                   config=config())
    with pytest.raises(GeometryError, match="layers"):
        run_with_geometry_hooks(hf_model, tokens, attention_mask=mask, tokenizer=tm.tiny_tokenizer(), layers=[7])
    before.assert_same(hf_model)
    assert_equal_runs(held, run_with_geometry_hooks(raw_bridge(hf_model), tokens, attention_mask=mask,
                                                    config=config()), padding=EXACT)
    assert_close_results(run_with_geometry_hooks(tiny_arch_bridge(arch), tokens, attention_mask=mask,
                                                 config=config()), held)


@needs_nnsight
@pytest.mark.parametrize("arch", SUPPORTED)
def test_nnsight_model_equals_the_bridge_path(arch):
    """Texts through the nnsight model's tokenizer: equal to the bridge's; the nnsight model traces as before
    afterwards and its module is as it was."""
    hf_model = tm.tiny_arch_model(arch)
    model = language_model(hf_model, tm.tiny_tokenizer())
    with torch.no_grad(), model.trace("the cat sat"):
        traced = model.lm_head.output.save()
    before = Snapshot(hf_model)
    forwards = {name: module.__dict__.get("forward") for name, module in hf_model.named_modules()}
    reference = raw_bridge(hf_model)
    assert_equal_runs(run_with_geometry_hooks(model, TEXTS, config=config()),
                      run_with_geometry_hooks(reference, TEXTS, config=config()), padding=EXACT)
    # nnsight keeps its own forward on every module (inert outside a trace): those must be its own still.
    assert {name: module.__dict__.get("forward") for name, module in hf_model.named_modules()} == forwards
    with torch.no_grad(), model.trace("the cat sat"):
        again = model.lm_head.output.save()
    torch.testing.assert_close(again, traced, **EXACT)
    for module in hf_model.modules():
        module.__dict__.pop("forward", None)  # what the snapshot checks beyond nnsight's own
    before.assert_same(hf_model)


@pytest.mark.parametrize("kind", ["transformers", pytest.param("nnsight", marks=needs_nnsight)])
def test_analyze_corpus_wraps_once_and_equals_the_bridge(kind, monkeypatch):
    """A corpus of several batches through a held model: wrapped once, equal to the bridge's exactly."""
    from tl_geometry.runs import corpus_run as corpus_module

    hf_model = tm.tiny_arch_model("llama")
    model = hf_model if kind == "transformers" else language_model(hf_model, tm.tiny_tokenizer())
    wrapped = []

    def counting(model, tokenizer=None):
        wrapped.append(model)
        return as_hookable(model, tokenizer)

    monkeypatch.setattr(corpus_module, "as_hookable", counting)
    tokenizer = tm.tiny_tokenizer() if kind == "transformers" else None
    held = analyze_corpus(model, TEXTS, config(), batch_size=1, progress=False, tokenizer=tokenizer)
    assert wrapped == [model]
    assert held.n_documents == len(TEXTS)
    assert_equal_runs(held, analyze_corpus(raw_bridge(hf_model), TEXTS, config(), batch_size=1, progress=False),
                      padding=EXACT)


def test_the_shell_shares_every_weight():
    """No parameter or buffer is copied: the bridge runs on the model's own storage (TransformerLens 3.9 adds a
    zero bias to Gemma's unembedding, on the shell: a vector, not a copy of a weight)."""
    hf_model = tm.tiny_arch_model("gemma3")
    bridge = wrap_held_model(hf_model, tm.tiny_tokenizer())
    assert bridge.original_model is not hf_model
    held = {p.data_ptr(): p for p in (*bridge.original_model.parameters(), *bridge.original_model.buffers())}
    assert {p.data_ptr() for p in hf_model.parameters()} <= set(held)
    own = {t.data_ptr() for t in (*hf_model.parameters(), *hf_model.buffers())}
    assert all(p.ndim == 1 for pointer, p in held.items() if pointer not in own)
    layer = torch.nn.Linear(3, 2)
    shell = shell_copy(layer)
    assert shell is not layer and shell.weight is layer.weight and shell.bias is layer.bias


def test_a_model_in_training_mode_is_analysed_in_eval_mode_and_stays_in_training():
    """Dropout on (GPT-2's): the analysis runs without it (equal to the eval-mode model's), and the user's model
    keeps training mode."""
    hf_model = tm.tiny_arch_model("gpt2")
    for module in hf_model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.5
    evaluated = run_with_geometry_hooks(hf_model, TEXTS, tokenizer=tm.tiny_tokenizer(), config=config())
    hf_model.train()
    before = Snapshot(hf_model)
    training = run_with_geometry_hooks(hf_model, TEXTS, tokenizer=tm.tiny_tokenizer(), config=config())
    before.assert_same(hf_model)
    assert all(module.training for module in hf_model.modules())
    assert_equal_runs(training, evaluated, padding=EXACT)


def test_the_tokenizer_is_found_beside_the_model_and_the_users_is_left_alone(tmp_path):
    """No tokenizer given: the one saved with the model; a given one is not changed (TransformerLens sets
    padding and special tokens on the tokenizer it gets)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tm.tiny_arch_model("llama").save_pretrained(tmp_path)
    tm.tiny_tokenizer().save_pretrained(tmp_path)
    hf_model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64)
    found = run_with_geometry_hooks(hf_model, TEXTS, config=config())
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    tokenizer.padding_side, tokenizer.pad_token = "left", None
    settings = (copy.deepcopy(tokenizer.init_kwargs), tokenizer.padding_side, tokenizer.special_tokens_map, len(tokenizer))
    given = run_with_geometry_hooks(hf_model, TEXTS, config=config(), tokenizer=tokenizer)
    assert (tokenizer.init_kwargs, tokenizer.padding_side, tokenizer.special_tokens_map, len(tokenizer)) == settings
    assert_equal_runs(found, given, padding=EXACT)


def test_no_tokenizer_for_text_is_named():
    hf_model = tm.tiny_arch_model("llama")  # built from a config: nothing saved beside it
    with pytest.raises(GeometryError, match=r"tokenizer: none given and none found for .*; pass it"):
        run_with_geometry_hooks(hf_model, TEXTS, n_grid=GRID)


def test_a_tokenizer_with_a_transformerlens_model_is_refused():
    with pytest.raises(GeometryError, match="tokenizer: only for a transformers or nnsight model"):
        run_with_geometry_hooks(tiny_arch_bridge("llama"), TEXTS, n_grid=GRID, tokenizer=tm.tiny_tokenizer())


def test_meta_weights_are_refused():
    import transformers

    with torch.device("meta"):
        hf_model = transformers.AutoModelForCausalLM.from_config(tm.tiny_arch_model("llama").config)
    with pytest.raises(GeometryError, match="weights on the meta device .*load them first"):
        run_with_geometry_hooks(hf_model, TEXTS, n_grid=GRID, tokenizer=tm.tiny_tokenizer())


def test_a_model_a_bridge_already_wraps_is_refused():
    bridge = tiny_arch_bridge("llama", compat=False)
    with pytest.raises(GeometryError, match="already wrapped by a TransformerBridge .*pass that bridge instead"):
        run_with_geometry_hooks(bridge.original_model, TEXTS, n_grid=GRID, tokenizer=tm.tiny_tokenizer())


@needs_nnsight
def test_a_lazy_nnsight_model_is_dispatched_and_equals_the_bridge(tmp_path):
    """An nnsight model of a local folder, not yet loaded (nnsight loads it on its first trace): loaded here."""
    import nnsight

    hf_model = tm.tiny_arch_model("llama")
    hf_model.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = nnsight.LanguageModel(str(tmp_path), tokenizer=tm.tiny_tokenizer(), dtype=torch.float64)
    assert not model.dispatched
    result = run_with_geometry_hooks(model, TEXTS, config=config())
    assert model.dispatched
    assert_equal_runs(result, run_with_geometry_hooks(raw_bridge(hf_model), TEXTS, config=config()), padding=EXACT)


# ---- the bundled models ----


@pytest.fixture(scope="module")
def bundled_hf(request):
    """A bundled model's float32 export read by plain transformers, with its tokenizer, as a user would hold them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tl_geometry import models

    cache = request.getfixturevalue("gemma3_cache") if request.param == "gemma3" else None
    name = {"smollm2": "smollm2-135m", "gemma3": "gemma3-270m"}[request.param]
    export = models.export_bundled_model(name, cache_dir=cache, progress=False)
    return request.param, AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32).eval(), \
        AutoTokenizer.from_pretrained(export)


@pytest.mark.slow
@needs_nnsight
@pytest.mark.parametrize("bundled_hf", ["smollm2", pytest.param("gemma3", marks=needs_gemma3)], indirect=True)
def test_bundled_models_held_equal_the_bridge_path(bundled_hf, request):
    """Both input kinds on each bundled model: every field equal to `load_model`'s bridge, and the two kinds
    equal each other exactly.

    Against the bridge, counts are exact and means agree to 2e-3 relative (as for the rows path) or 1e-5
    absolute: the bridge folds the norms into its float32 weights, which rounds the values ~1e-6 apart, and
    shares and projections near 0 (an output share at a lag) keep that absolute noise."""
    bundled, hf_model, tokenizer = bundled_hf
    before = Snapshot(hf_model)
    run = config(layers=BUNDLED_LAYERS[bundled][:2])
    bridge = run_with_geometry_hooks(request.getfixturevalue(bundled), TEXTS[:2], config=run)
    held = run_with_geometry_hooks(hf_model, TEXTS[:2], config=run, tokenizer=tokenizer)
    through_nnsight = run_with_geometry_hooks(language_model(hf_model, tokenizer), TEXTS[:2], config=run)
    assert set(bridge.fields) == set(held.fields) and bridge.n_documents == held.n_documents
    for name in bridge.fields:
        assert torch.equal(bridge.count(name), held.count(name)), name
        torch.testing.assert_close(held.per_head(name), bridge.per_head(name), rtol=2e-3, atol=1e-5, equal_nan=True)
    assert_equal_runs(held, through_nnsight, padding=EXACT)
    for name, module in hf_model.named_modules():
        module.__dict__.pop("forward", None)  # nnsight's own, inert outside a trace
    before.assert_same(hf_model)


# ---- the other entry points: head roles, interventions, ablations, published measures ----


def compat_bridge(hf_model):
    """The bridge path the editing entry points take on a copy of the model: compatibility mode without
    weight processing, so that pattern and z edits reach the logits."""
    bridge = raw_bridge(hf_model)
    bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    return bridge


def held_as(kind: str, hf_model):
    """The model as the user holds it, and the tokenizer argument that goes with it."""
    if kind == "transformers":
        return hf_model, {"tokenizer": tm.tiny_tokenizer()}
    return language_model(hf_model, tm.tiny_tokenizer()), {}


@pytest.mark.parametrize("kind", ["transformers", pytest.param("nnsight", marks=needs_nnsight)])
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_interventions_of_a_held_model_equal_the_bridge_path(arch, kind):
    """intervention_sweep (layer scope: passes started from the clean residual; a random control) and
    effective_set_size on a held model: every statistic equal to the bridge's; the model as it was."""
    from tl_geometry.interventions import effective_set_size, intervention_sweep

    hf_model = tm.tiny_arch_model(arch)
    model, tokenizer = held_as(kind, hf_model)
    before = Snapshot(hf_model)
    reference = compat_bridge(hf_model)
    sweep = {"scope": "layer", "controls": 1, "n_bootstrap": 4, "progress": False}
    assert_same_stats(intervention_sweep(model, TEXTS, [1, 2, 4], **sweep, **tokenizer),
                      intervention_sweep(reference, TEXTS, [1, 2, 4], **sweep))
    search = {"scope": "model", "n_bootstrap": 4, "progress": False}
    mine = effective_set_size(model, TEXTS, **search, **tokenizer)
    theirs = effective_set_size(reference, TEXTS, **search)
    for name in ("n_star", "low", "high", "replicates"):
        torch.testing.assert_close(getattr(mine, name), getattr(theirs, name), rtol=0, atol=0, equal_nan=True)
    for module in hf_model.modules():
        module.__dict__.pop("forward", None)  # nnsight's own, inert outside a trace
    before.assert_same(hf_model)


@pytest.mark.parametrize("kind", ["transformers", pytest.param("nnsight", marks=needs_nnsight)])
def test_roles_ablations_and_published_measures_of_a_held_model_equal_the_bridge_path(kind):
    """classify_heads, ablate_roles and published_measures on a held model: equal to the bridge's; the model
    as it was."""
    from tl_geometry import classify_heads
    from tl_geometry.interventions import ablate_roles, published_measures

    hf_model = tm.tiny_arch_model("llama")
    model, tokenizer = held_as(kind, hf_model)
    before = Snapshot(hf_model)
    reference = compat_bridge(hf_model)
    tokens = tm.with_bos(tm.random_tokens(6, 12, seed=3))
    mine = classify_heads(model, tokens[:4], config(), **tokenizer)
    theirs = classify_heads(raw_bridge(hf_model), tokens[:4], config())
    assert torch.equal(mine.labels, theirs.labels)
    torch.testing.assert_close(mine.probabilities, theirs.probabilities, rtol=0, atol=0, equal_nan=True)
    ablation = {"tokens": tokens[:4], "mean_tokens": tokens[4:], "n_random": 2, "repeated_prompts": 2, "period": 4,
                "detector_threshold": 0.05, "n_bootstrap": 20, "progress": False}
    assert_same_rows(ablate_roles(model, mine, **ablation, **tokenizer).table(),
                     ablate_roles(reference, theirs, **ablation).table())
    for space in ("z", "result"):
        found = published_measures(model, tokens, space=space, progress=False, **tokenizer)
        expected = published_measures(reference, tokens, space=space, progress=False)
        for name in ("first_token_score", "sink_indicator_rate", "output_norm", "norm_ratio"):
            torch.testing.assert_close(getattr(found, name), getattr(expected, name), rtol=0, atol=0, msg=name)
    for module in hf_model.modules():
        module.__dict__.pop("forward", None)
    before.assert_same(hf_model)


def test_a_tokenizer_with_a_result_is_refused():
    hf_model = tm.tiny_arch_model("llama")
    result = run_with_geometry_hooks(hf_model, TEXTS, config=config(), tokenizer=tm.tiny_tokenizer())
    with pytest.raises(GeometryError, match="tokens/config/tokenizer: only used with a model"):
        from tl_geometry import classify_heads

        classify_heads(result, tokenizer=tm.tiny_tokenizer())
