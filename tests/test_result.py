"""GeometryResult: derived per-head means, exact save/load round trip, extensibility."""

import json
import math

import numpy as np
import pytest
import torch

from tl_geometry.config import GeometryConfig
from tl_geometry.errors import GeometryError
from tl_geometry.results.result import REQUIRED_FIELDS, GeometryResult, result_from_parts


def make_result(n_seq=3, n_layers=2, n_heads=4, n=5, seed=0, extra=None):
    gen = torch.Generator().manual_seed(seed)
    per_sequence = {name: torch.rand(n_seq, n_layers, n_heads, n, generator=gen) for name in REQUIRED_FIELDS}
    per_sequence["r_min"][..., -1] = math.inf
    per_sequence["precision"][0, 0, 0, 2] = math.nan
    per_sequence["recall"][:, 1, 1, 3] = math.nan
    per_sequence["s_norm"] = per_sequence["s_norm"].double()
    per_sequence.update(extra or {})
    return result_from_parts(
        per_sequence,
        n_grid=torch.arange(1, n + 1),
        layers=tuple(range(n_layers)),
        heads=tuple(range(n_heads)),
        sequence_lengths=torch.tensor([7, 5, 9][:n_seq]),
        config=GeometryConfig(n_grid=list(range(1, n + 1)), layers=[0, 1]),
        model_name="tiny",
    )


def test_per_head_is_the_nanmean_over_sequences():
    r = make_result()
    assert r.precision.shape == (2, 4, 5)
    assert r.precision[0, 0, 2] == r.per_sequence["precision"][1:, 0, 0, 2].mean()
    assert r.recall[1, 1, 3].isnan()  # no sequence has it
    assert torch.isinf(r.r_min[..., -1]).all()
    with pytest.raises(AttributeError):
        r.not_a_field
    with pytest.raises(GeometryError, match="unknown field 'nope'"):
        r.per_head("nope")


def test_save_load_round_trip_is_exact(tmp_path):
    r = make_result(extra={"value_norm_cv": torch.rand(3, 2, 4)})
    npz, sidecar = r.save(tmp_path / "sub" / "run")
    assert npz.name == "run.npz" and sidecar.name == "run.json"
    assert sorted(p.name for p in npz.parent.iterdir()) == ["run.json", "run.npz"]  # no temp files left
    loaded = GeometryResult.load(tmp_path / "sub" / "run.npz")
    assert loaded.equals(r) and r.equals(loaded)
    for name, t in r.per_sequence.items():
        u = loaded.per_sequence[name]
        assert u.dtype == t.dtype and torch.equal(u.isnan(), t.isnan()) and torch.equal(u.nan_to_num(0.0), t.nan_to_num(0.0))
    assert loaded.config == r.config and loaded.versions == r.versions
    assert set(r.versions) == {"tl_geometry", "torch", "transformer_lens"}
    assert not make_result(seed=1).equals(loaded)
    with np.load(npz, allow_pickle=False) as data:  # plain arrays by field name
        assert "per_sequence/precision" in data.files and "per_sequence/value_norm_cv" in data.files


def test_load_detects_a_mismatched_pair_and_missing_files(tmp_path):
    make_result().save(tmp_path / "a")
    make_result(seed=1).save(tmp_path / "b")
    (tmp_path / "a.json").write_text((tmp_path / "b.json").read_text())
    with pytest.raises(GeometryError, match="does not match .*checksum differs"):
        GeometryResult.load(tmp_path / "a")
    with pytest.raises(GeometryError, match="c.npz does not exist"):
        GeometryResult.load(tmp_path / "c")
    meta = json.loads((tmp_path / "b.json").read_text())
    meta["format_version"] = 99
    (tmp_path / "b.json").write_text(json.dumps(meta))
    with pytest.raises(GeometryError, match="format_version 99"):
        GeometryResult.load(tmp_path / "b")


def test_missing_required_field_and_bad_shapes():
    r = make_result()
    fields = dict(r.per_sequence)
    del fields["recall"]
    with pytest.raises(GeometryError, match=r"missing the required field\(s\) \['recall'\]"):
        GeometryResult(**{**r.__dict__, "per_sequence": fields})
    with pytest.raises(GeometryError, match=r"expected leading shape \[sequence, layer, head_index\] = \[3, 2, 4\]"):
        GeometryResult(**{**r.__dict__, "per_sequence": {**r.per_sequence, "extra": torch.zeros(3, 2)}})


def test_concatenate():
    a, b = make_result(n_seq=2), make_result(n_seq=1, seed=3)
    both = GeometryResult.concatenate([a, b])
    assert both.n_sequences == 3
    assert torch.equal(both.per_sequence["f_score"], torch.cat([a.per_sequence["f_score"], b.per_sequence["f_score"]]))
    with pytest.raises(GeometryError, match="differ in heads"):
        GeometryResult.concatenate([a, make_result(n_heads=2)])
