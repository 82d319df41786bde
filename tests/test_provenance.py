"""Provenance: what a result records to be reproduced, kept by its files, checked and combined by merge."""

import json

import pytest
import torch

from tests import tiny_models as tm
from tests.fixtures import make_result
from tl_geometry.corpus_input.token_windows import read_corpus
from tl_geometry.errors import GeometryError
from tl_geometry.results.result import GeometryResult
from tl_geometry.runs.corpus_run import analyze_corpus
from tl_geometry.runs.model_provenance import model_provenance, weights_fingerprint

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def model():
    return tm.make_model("bridge-llama")


def test_a_corpus_run_records_model_versions_and_files(tmp_path, model):
    text = " ".join(tm.WORDS * 3)
    (tmp_path / "a.txt").write_text(text)
    (tmp_path / "b.txt").write_text("sun moon")
    result = analyze_corpus(model, read_corpus(model, [tmp_path / "a.txt", tmp_path / "b.txt"], context=9),
                            progress=False, n_grid=[1, 2])
    p = result.provenance
    assert p["model"] == model_provenance(model)
    assert p["model"]["dtype"] == "float64" and p["model"]["device"] == "cpu" and p["model"]["name"] == "tiny-llama"
    assert p["model"]["attention_implementation"]
    assert set(p["versions"]) >= {"tl_geometry", "torch", "transformer-lens", "transformers", "numpy"}
    corpus = p["corpus"]
    assert [s["path"] for s in corpus["sources"]] == [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
    assert corpus["windows"] == result.n_documents == len(text.split()) // 8
    assert corpus["skipped"] == {"documents shorter than the minimum window": 1}
    stem = tmp_path / "out" / "result"
    result.save(stem)
    assert json.loads(stem.with_suffix(".json").read_text())["provenance"] == p
    assert GeometryResult.load(stem).provenance == p


def test_files_without_provenance_still_load(tmp_path):
    result = make_result()
    npz, path = result.save(tmp_path / "r")
    meta = json.loads(path.read_text())
    del meta["provenance"]  # as written before 0.2
    path.write_text(json.dumps(meta))
    assert GeometryResult.load(tmp_path / "r").provenance is None


def test_weights_fingerprint_tells_checkpoints_apart(model):
    assert weights_fingerprint(model) == weights_fingerprint(model)
    assert weights_fingerprint(model) != weights_fingerprint(tm.make_model("bridge-llama", seed=1))


def test_weights_fingerprint_is_its_definition(model):
    """Each parameter's name, shape, dtype and first 4096 bytes, in named_parameters order (a tied one once): the
    reading through accelerate's offload hooks changes nothing for a model on one device."""
    import hashlib

    digest = hashlib.sha256()
    for name, parameter in model.named_parameters():
        data = parameter.detach().reshape(-1).cpu().view(torch.uint8)[:4096]
        digest.update(f"{name}:{list(parameter.shape)}:{parameter.dtype}".encode() + data.numpy().tobytes())
    assert weights_fingerprint(model) == digest.hexdigest()


def _with(result, **model_fields):
    provenance = {"model": {"name": "tiny", "revision": None, "bundled_package": None, "weights_sha256": "aa",
                            "dtype": "float32", "device": "cpu", "attention_implementation": "eager"},
                  "corpus": {"windows": result.n_documents, "documents": 3, "skipped": {"empty documents": 1}}}
    provenance["model"].update(model_fields)
    return GeometryResult(**{**result.__dict__, "provenance": provenance})


def test_merge_refuses_other_weights_or_dtypes_and_combines_the_rest():
    a, b = make_result(seed=0), make_result(seed=1)
    for field, value in (("weights_sha256", "bb"), ("dtype", "bfloat16"), ("revision", "abc123")):
        with pytest.raises(GeometryError, match=f"merge: the results differ in model {field} "):
            GeometryResult.merge(_with(a), _with(b, **{field: value}))
    rows, pattern = _with(a), _with(b, device="cuda", attention_implementation="sdpa")
    rows.provenance["capture"], pattern.provenance["capture"] = "rows", "pattern"
    merged = GeometryResult.merge(rows, pattern)
    assert merged.provenance["capture"] == "pattern, rows"  # the paths the parts took, as the devices
    assert merged.provenance["model"]["device"] == "cpu, cuda"
    assert merged.provenance["model"]["attention_implementation"] == "eager, sdpa"
    assert merged.provenance["corpus"]["windows"] == a.n_documents + b.n_documents
    assert merged.provenance["corpus"]["skipped"] == {"empty documents": 2}
    assert merged.provenance["merged_from"] == 2
    assert GeometryResult.merge(a, b).provenance is None  # nothing recorded, nothing to compare
    assert torch.equal(merged.count("recall"), GeometryResult.merge(a, b).count("recall"))
