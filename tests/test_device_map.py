"""Sharded and offloaded models: ``load_model(device_map=...)``; maps that cannot work are refused before loading.

The real-model tests offload decoder layers to the CPU and to disk through accelerate (the only split this
machine can make: it has no GPU) and compare every field of every diagnostic, on both capture paths, with the
same model loaded whole.
"""

import gc
import json
import math

import pytest
import torch

from tests import tiny_models as tm
from tests.fixtures import assert_equal_runs, assert_same_rows, assert_same_stats, forbid_loading, inject, needs_gemma3
from tl_geometry import models
from tl_geometry.capture.hooks import gathered, run_with_geometry_hooks
from tl_geometry.capture.layer_analysis import LayerAnalysis, kept_bytes, kept_groups
from tl_geometry.capture.plan import plan_run
from tl_geometry.capture.tokens import prepare_tokens
from tl_geometry.config import GeometryConfig
from tl_geometry.errors import GeometryError
from tl_geometry.models import check_device_map, load_model, transformer_lens_major_version
from tl_geometry.runs.model_provenance import weights_fingerprint

NO_CUDA = not torch.cuda.is_available()
NEEDS_TL4 = pytest.mark.skipif(transformer_lens_major_version() < 4, reason="device_map needs transformer-lens 4.x")
TEXTS = ["The cat sat on the mat.", "Paris is the capital of"]


@pytest.mark.parametrize("strategy", ["auto", "balanced", "balanced_low_0", "sequential"])
def test_strategies_pass(strategy):
    assert check_device_map(strategy) == strategy


@pytest.mark.parametrize(
    "device_map, message",
    [
        ("fast", r"device_map: 'fast' is not a placement strategy; expected one of \('auto', 'balanced'"),
        ({}, r"device_map: expected one of .* or a non-empty dict from module names to devices, got \{\}"),
        (["cpu"], r"device_map: expected one of .* got \['cpu'\]"),
        ({0: "cpu"}, r"device_map: keys are module names such as 'model.layers.0', got 0"),
        ({"model": "meta"}, r"device_map\['model'\]: 'meta' is not a place a map can put a module; use a CUDA index"),
        ({"model": "mps"}, r"device_map\['model'\]: 'mps' is not a place .*use device= instead"),
        ({"model": True}, r"device_map\['model'\]: True is not a place"),
        ({"model": 1.5}, r"device_map\['model'\]: 1.5 is not a place"),
        ({"model.layers.0": "cpu", "model.layers.1": 0},
         r"device_map: \['model.layers.0'\] go to CPU/disk and \['model.layers.1'\] to GPUs; TransformerLens 4 refuses"),
    ],
)
def test_bad_maps_are_refused(device_map, message):
    with pytest.raises(GeometryError, match=message):
        check_device_map(device_map)


@pytest.mark.skipif(not NO_CUDA, reason="this machine has CUDA")
@pytest.mark.parametrize("target, shown", [(0, "cuda:0"), ("cuda", "cuda"), ("cuda:1", "cuda:1")])
def test_a_map_onto_missing_gpus_is_refused(target, shown):
    with pytest.raises(GeometryError, match=f"device: '{shown}' asked for, but torch sees no CUDA device"):
        check_device_map({"": target})


def _nothing_loads(monkeypatch):
    forbid_loading(monkeypatch, "load_model read the model before refusing the map")


def test_refusals_come_before_anything_loads(monkeypatch):
    _nothing_loads(monkeypatch)
    inject(monkeypatch, "transformer_lens_major", lambda: 4)  # the map is checked on 3.x too
    with pytest.raises(GeometryError, match=r"device='cpu' and device_map: pass one"):
        load_model(device="cpu", device_map="auto")
    with pytest.raises(GeometryError, match=r"'fast' is not a placement strategy"):
        load_model(device_map="fast")
    with pytest.raises(GeometryError, match=r"unknown name 'smollm2-135'"):
        load_model("smollm2-135", device_map="auto")


@pytest.mark.parametrize("kind, major", [("hooked", 3), ("bridge", 3), ("hooked", 4)])
def test_device_map_needs_a_bridge_on_transformer_lens_4(monkeypatch, kind, major):
    _nothing_loads(monkeypatch)
    inject(monkeypatch, "transformer_lens_major", lambda: major)
    with pytest.raises(GeometryError, match=rf"device_map needs a TransformerBridge on transformer-lens 4.x "
                                            rf"\(kind='{kind}'.*HookedTransformer and 3.x's bridge hold the model"):
        load_model(kind=kind, device_map="auto")


def test_kept_rows_are_analysed_per_device_and_window():
    """A model split across devices keeps each block's rows where it ran: layers are folded into one batch only
    with layers of the same device and window (meta stands for a second device: nothing is computed on it)."""
    kept = {layer: (torch.empty(1, 2, 1, 3, device=device), torch.empty(1, 3, 1, 2, device=device))
            for layer, device in enumerate(["cpu", "cpu", "meta", "meta", "cpu"])}
    windows = (None, 4, None, None, None)
    assert sorted(kept_groups(kept, windows, pictured=set())) == [[0, 4], [1], [2, 3]]
    assert sorted(kept_groups(kept, windows, pictured={4})) == [[0], [1], [2, 3], [4]]


def test_kept_bytes_count_one_device():
    kept = {0: (torch.empty(2, 3, dtype=torch.float32), torch.empty(5, dtype=torch.bfloat16)),
            1: (torch.empty(7, device="meta", dtype=torch.float64), torch.empty(1, device="meta")),
            2: (torch.empty(4, dtype=torch.float64), torch.empty(3, dtype=torch.float16))}
    assert kept_bytes(kept, torch.device("cpu")) == 6 * 4 + 5 * 2 + 4 * 8 + 3 * 2
    assert kept_bytes(kept, torch.device("meta")) == 7 * 8 + 1 * 4


def test_the_rows_budget_holds_per_device(monkeypatch):
    """The rows path keeps a device's rows until that device's rows and values reach memory_budget_mib, then
    analyses that device's layers alone: with layers alternating between two devices (meta stands for the
    second), each device folds two layers per batch, not one layer per device as a budget counted over all
    devices would. The last analysis after the pass takes what is left."""
    model = tm.tiny_bridge("llama", n_layers=5)
    config = GeometryConfig(n_grid=[1, 2], capture="rows")
    prepared = prepare_tokens(model, torch.tensor([[tm.BOS_ID, 5, 6, 7, 8, 9]]), config)
    n_keys, n_queries = prepared.n_keys, prepared.query_index.shape[1]
    shapes = ((1, tm.N_HEADS, n_queries, n_keys), (1, n_keys, tm.N_KV_HEADS, tm.D_MODEL // tm.N_HEADS))
    layer_bytes = 4 * sum(math.prod(shape) for shape in shapes)
    plan = plan_run(model, config.with_overrides(memory_budget_mib=2 * layer_bytes / 2**20), [prepared])
    state = LayerAnalysis(prepared=prepared, plan=plan, heads=torch.tensor(plan.heads))
    analysed = []
    monkeypatch.setattr(state, "analyse_layers", lambda layers, rows, *args: analysed.append((layers, rows.device.type)))
    devices = ["cpu", "meta", "cpu", "meta", "cpu"]
    for layer, device in enumerate(devices):
        state.rows_hook(layer, torch.empty(shapes[0], device=device), torch.empty(shapes[1], device=device))
    assert analysed == [((0, 2), "cpu"), ((1, 3), "meta")]
    state.analyse_kept()
    assert analysed[2:] == [((4,), "cpu")] and not state.kept_rows


def test_gathered_stacks_on_the_cpu():
    per_layer = [torch.full((2, 3), float(layer)) for layer in range(4)]
    for dim in (0, 1):
        out = gathered(per_layer, dim)
        assert out.device == torch.device("cpu")
        assert torch.equal(out, torch.stack(per_layer, dim=dim))


# ---- the bundled models with offloaded layers, field by field against the whole model ----


def _offloading_map(model) -> dict[str, str]:
    """Embedding, final norm and head on the CPU; the decoder layers alternately offloaded to the CPU and to disk."""
    hf = model.original_model
    base = hf.base_model_prefix  # "model"
    device_map = {name: "cpu" for name, _ in hf.named_children() if name != base}
    for name, _ in getattr(hf, base).named_children():
        if name != "layers":
            device_map[f"{base}.{name}"] = "cpu"
    for layer in range(model.cfg.n_layers):
        device_map[f"{base}.layers.{layer}"] = "disk" if layer % 2 else "cpu"
    return device_map


def _weights_on_meta(model) -> bool:
    """Whether accelerate really offloaded weights (they then wait on the meta device between forward passes)."""
    return any(p.device.type == "meta" for p in model.original_model.parameters())


# Layers analysed: some offloaded to disk (odd), some to the CPU (even); Gemma-3's local (0, 4) and global (5) ones.
LAYERS = {"smollm2-135m": [0, 1, 29], "gemma3-270m": [0, 4, 5]}


@pytest.mark.slow
@pytest.mark.model
@NEEDS_TL4
@pytest.mark.parametrize("name", ["smollm2-135m", pytest.param("gemma3-270m", marks=needs_gemma3)])
def test_offloaded_layers_give_the_whole_models_result(name, request):
    """Every field of every diagnostic, on both capture paths, equal to the whole model's (`assert_equal_runs`:
    counts exactly, every float to 1e-6 relative; both models run the same float32 arithmetic on the same weights,
    only where the weights wait between passes differs)."""
    cache_dir = request.getfixturevalue("gemma3_cache") if name == "gemma3-270m" else None
    whole = load_model(name, cache_dir=cache_dir, progress=False, compatibility_mode=False)
    device_map = _offloading_map(whole)
    # What load_model does with an offloaded map (TransformerLens 4 processes no offloaded weights), on the whole.
    whole.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    split = load_model(name, cache_dir=cache_dir, progress=False, device_map=device_map)
    assert _weights_on_meta(split) and not _weights_on_meta(whole)
    assert set(split.original_model.hf_device_map.values()) == {"cpu", "disk"}
    assert split.cfg.n_devices == 2
    config = GeometryConfig(diagnostics="all", n_grid=[1, 2, 4], n_bootstrap=4, layers=LAYERS[name],
                            keep_queries=True)
    for capture in ("rows", "pattern"):
        mine = run_with_geometry_hooks(split, TEXTS, config=config, capture=capture)
        theirs = run_with_geometry_hooks(whole, TEXTS, config=config, capture=capture)
        assert mine.config.capture == theirs.config.capture == capture
        assert_equal_runs(mine, theirs)
    assert not [name for name, point in split.hook_dict.items() if point._forward_hooks]
    # The provenance reads the offloaded weights through accelerate, as the forward pass does.
    assert weights_fingerprint(split) == weights_fingerprint(whole)
    del split
    gc.collect()


# ---- interventions, sweeps, ablations and the published measures with offloaded layers ----


def _tiny_split_and_whole(tmp_path, arch: str):
    """A tiny model saved and read back twice: whole, and with its layers offloaded by accelerate through the same
    map as the bundled models'; both bridges in compatibility mode without weight processing (what load_model
    gives an offloaded model), float64."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoModelForCausalLM

    tm.tiny_arch_model(arch).save_pretrained(tmp_path / "model")

    def boot(**placement):
        hf_model = AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.float64, **placement)
        bridge = TransformerBridge.boot_transformers(f"tiny-{arch}", hf_model=hf_model, tokenizer=tm.tiny_tokenizer(),
                                                     dtype=torch.float64)
        bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
        return bridge.eval()

    whole = boot()
    split = boot(device_map=_offloading_map(whole), offload_folder=tmp_path / "offload")
    assert _weights_on_meta(split) and not _weights_on_meta(whole)
    assert set(split.original_model.hf_device_map.values()) == {"cpu", "disk"}
    return split, whole


@pytest.mark.model
@NEEDS_TL4
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_interventions_with_offloaded_layers_equal_the_whole_model(tmp_path, arch):
    """intervention_sweep (every scope's code: the model at once, and layer by layer from the clean residual, which
    skips the offloaded blocks below; a random control; the contribution ranking) and effective_set_size: every
    statistic equal, bit for bit, to the whole model's (the same float64 arithmetic on the same weights)."""
    from tl_geometry.interventions import effective_set_size, intervention_sweep

    split, whole = _tiny_split_and_whole(tmp_path, arch)
    texts = ["the cat sat on the mat and ran", "a dog", "one two three four five six seven eight nine ten house"]
    for scope, ranking in (("model", "contribution"), ("layer", "attention")):
        sweep = {"scope": scope, "ranking": ranking, "controls": 1, "n_bootstrap": 4, "progress": False}
        assert_same_stats(intervention_sweep(split, texts, [1, 2, 4], **sweep),
                          intervention_sweep(whole, texts, [1, 2, 4], **sweep))
    search = {"scope": "layer", "layers": [0, 1], "n_bootstrap": 4, "progress": False}
    mine, theirs = effective_set_size(split, texts, **search), effective_set_size(whole, texts, **search)
    for name in ("n_star", "low", "high", "replicates"):
        torch.testing.assert_close(getattr(mine, name), getattr(theirs, name), rtol=0, atol=0, equal_nan=True)
    assert not [name for name, point in split.hook_dict.items() if point._forward_hooks]


@pytest.mark.model
@NEEDS_TL4
def test_roles_ablations_and_published_measures_with_offloaded_layers_equal_the_whole_model(tmp_path):
    """classify_heads, ablate_roles (zero and mean, the repeated-token task, the detectors) and published_measures
    on an offloaded tiny Llama: equal to the whole model's."""
    from tl_geometry import classify_heads
    from tl_geometry.interventions import ablate_roles, published_measures

    split, whole = _tiny_split_and_whole(tmp_path, "llama")
    tokens = tm.with_bos(tm.random_tokens(6, 12, seed=3))
    config = GeometryConfig(n_grid=[1, 2, 4], n_bootstrap=8)
    mine, theirs = classify_heads(split, tokens[:4], config), classify_heads(whole, tokens[:4], config)
    assert torch.equal(mine.labels, theirs.labels)
    torch.testing.assert_close(mine.probabilities, theirs.probabilities, rtol=0, atol=0, equal_nan=True)
    ablation = {"tokens": tokens[:4], "mean_tokens": tokens[4:], "n_random": 2, "repeated_prompts": 2, "period": 4,
                "detector_threshold": 0.05, "n_bootstrap": 20, "progress": False}
    assert_same_rows(ablate_roles(split, mine, **ablation).table(), ablate_roles(whole, theirs, **ablation).table())
    for space in ("z", "result"):
        found = published_measures(split, tokens, space=space, progress=False)
        expected = published_measures(whole, tokens, space=space, progress=False)
        for name in ("first_token_score", "sink_indicator_rate", "output_norm", "norm_ratio"):
            torch.testing.assert_close(getattr(found, name), getattr(expected, name), rtol=0, atol=0, msg=name)


@pytest.mark.slow
@pytest.mark.model
@NEEDS_TL4
def test_a_map_naming_no_module_of_the_model_is_refused(smollm2):
    device_map = {**_offloading_map(smollm2), "model.layer.3": "disk"}
    with pytest.raises(GeometryError, match=r"load_model\('smollm2-135m', device_map=...\): the model could not be "
                                            r"placed or loaded \(.*\); check that every key of the map names a module"):
        load_model(progress=False, device_map=device_map)


@pytest.mark.slow
@pytest.mark.model
@NEEDS_TL4
def test_a_map_that_leaves_a_module_out_is_refused(smollm2):
    device_map = _offloading_map(smollm2)
    del device_map["model.layers.7"]
    with pytest.raises(GeometryError, match=r"load_model\('smollm2-135m', device_map=...\): the model could not be "
                                            r"placed or loaded \(.*model.layers.7"):
        load_model(progress=False, device_map=device_map)


# ---- the command line: --device-map ----


def test_device_map_option(tmp_path):
    from tl_geometry.cli import build_parser

    parse = build_parser().parse_args
    assert parse(["analyze", "--device-map", "auto"]).device_map == "auto"
    assert parse(["analyze"]).device_map is None
    explicit = {"model.embed_tokens": "cpu", "model.layers.0": "disk", "model.norm": "cpu"}
    assert parse(["analyze", "--device-map", json.dumps(explicit)]).device_map == explicit
    (tmp_path / "map.json").write_text(json.dumps(explicit))
    assert parse(["analyze", "--device-map", str(tmp_path / "map.json")]).device_map == explicit


@pytest.mark.parametrize(
    "given, message",
    [
        ("fast", "argument --device-map: device_map: 'fast' is not a placement strategy"),
        ('{"model": "meta"}', "argument --device-map: device_map['model']: 'meta' is not a place"),
        ('{"model": ', "argument --device-map: Expecting value"),
        ('["cpu"]', "argument --device-map: device_map: '[\"cpu\"]' is not a placement strategy"),
        ("missing.json", "argument --device-map: 'missing.json': no such file; pass a JSON file of the map"),
    ],
)
def test_bad_device_maps_are_usage_errors(given, message, capsys):
    from tl_geometry.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["analyze", "--device-map", given])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_device_map_reaches_load_model_instead_of_the_device(monkeypatch, tmp_path, capsys):
    from tl_geometry.cli import main

    calls = []

    def load(name, **options):
        calls.append(options)
        raise GeometryError("stop here")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(models, "load_model", load)
    assert main(["analyze", "--quiet", "--device-map", "balanced"]) == 1
    assert [(c.get("device_map"), "device" in c) for c in calls] == [("balanced", False)]
    assert main(["analyze", "--quiet"]) == 1
    assert [(c.get("device_map"), c.get("device")) for c in calls[1:]] == [(None, "cpu")]
    assert "stop here" in capsys.readouterr().err
