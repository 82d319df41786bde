"""GeometryResult: statistics against float64 references from the raw per-document values, sel, ci,
merge, exact files (format 2), format-1 files, malformed files, and a file size flat in documents."""

import hashlib
import json
import math
import struct
import time
import warnings
import zipfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.fixtures import B, CONFIG, GRID, HEADS, LAYERS, SPECS, accumulate, corpus, make_result, pad_stack
from tl_geometry.config import GeometryConfig
from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.diagnostics.registry import REGISTRY
from tl_geometry.errors import GeometryError
from tl_geometry.results.accumulators import Accumulator
from tl_geometry.results.bootstrap import document_weights
from tl_geometry.results.result import GeometryResult


@contextmanager
def quiet():
    """numpy's all-NaN warnings off: NaN where nothing is defined is the expected answer."""
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def raw(values, name):
    """The per-document values of one field as float64 numpy, NaN-padded to the widest document."""
    return pad_stack([v[name].double() for v in values]).numpy()


def test_statistics_match_a_float64_reference():
    tokens, values = corpus(9)
    r = GeometryResult.from_accumulator(accumulate(tokens, values, (2, 5)), config=CONFIG, model_name="tiny")
    assert r.n_documents == r.n_sequences == 9 and r.n_tokens == sum(len(t) for t in tokens)
    assert r.fields == tuple(s.name for s in SPECS) and r.spec("recall") == SPECS[1]
    with quiet():
        for name in ("precision", "recall", "r_min", "rho0", "cosine_by_lag"):
            x = raw(values, name)
            count = (~np.isnan(x)).sum(0)
            np.testing.assert_array_equal(r.count(name).numpy(), count)
            np.testing.assert_allclose(r.per_head(name).numpy(), np.nanmean(x, 0), rtol=1e-12)
            std = np.where(count >= 2, np.nanstd(x, 0, ddof=1), np.nan)
            np.testing.assert_allclose(r.std(name).numpy(), std, rtol=1e-7, atol=1e-12)
            np.testing.assert_allclose(r.sem(name).numpy(), std / np.sqrt(count), rtol=1e-7, atol=1e-12)
            np.testing.assert_array_equal(r.min(name).numpy(), np.nanmin(x, 0).astype(np.float32))
            np.testing.assert_array_equal(r.max(name).numpy(), np.nanmax(x, 0).astype(np.float32))
        x = raw(values, "attention_profile")
        np.testing.assert_allclose(r.attention_profile.numpy(), np.nanmean(x, 0), rtol=1e-6)  # float32 sums
    assert torch.isinf(r.r_min[..., 1]).all()  # +inf kept, as torch.nanmean
    assert r.precision[..., -1].isnan().all()  # N = 8 exceeds every document
    torch.testing.assert_close(r.precision, r.per_head("precision"), rtol=0, atol=0, equal_nan=True)
    with pytest.raises(AttributeError):
        r.not_a_field
    with pytest.raises(GeometryError, match="unknown field 'nope'; this result has"):
        r.per_head("nope")
    with pytest.raises(GeometryError, match="std: field 'attention_profile' is declared with documents='mean'"):
        r.std("attention_profile")
    with pytest.raises(GeometryError, match="max: field 'attention_profile' is declared with documents='mean'"):
        r.max("attention_profile")


def test_replicates_and_ci_match_a_reference():
    tokens, values = corpus(8, seed=2)
    r = GeometryResult.from_accumulator(accumulate(tokens, values, (4,)), config=CONFIG, model_name="tiny")
    w = document_weights(tokens, B, seed=0).numpy()  # [doc, replicate]
    for name in ("recall", "rho0"):
        x = raw(values, name)
        defined = ~np.isnan(x)
        flat_x, flat_d = np.nan_to_num(x).reshape(len(x), -1), defined.reshape(len(x), -1)
        with np.errstate(invalid="ignore"):
            means = ((w.T @ flat_x) / (w.T @ flat_d)).reshape(B, *x.shape[1:])
        np.testing.assert_allclose(r.replicates(name).numpy(), means, rtol=1e-6)
        low, high = r.ci(name, level=0.9)
        with quiet():
            ref_low, ref_high = np.nanquantile(means, [0.05, 0.95], axis=0)
        np.testing.assert_allclose(low.numpy(), ref_low, rtol=1e-5)
        np.testing.assert_allclose(high.numpy(), ref_high, rtol=1e-5)
    assert r.n_bootstrap == B
    with pytest.raises(GeometryError, match=r"field 'precision' kept no bootstrap replicates; analyse with "
                                            r"GeometryConfig.bootstrap_fields including 'precision'"):
        r.ci("precision")
    with pytest.raises(GeometryError, match=r"level: expected a coverage in \(0, 1\)"):
        r.ci("recall", level=95.0)


def test_sel_uses_real_layer_head_and_n_labels():
    r = make_result()
    assert r.sel("precision", layer=7, head=6, n=4).shape == ()
    assert r.sel("precision", layer=7, head=6, n=4) == r.precision[1, 2, 2]
    torch.testing.assert_close(r.sel("recall", layer=[3, 7], n=[1, 4]), r.recall[:, :, [0, 2]], equal_nan=True)
    torch.testing.assert_close(r.sel("recall", head=[6, 1]), r.recall[:, [2, 0]], equal_nan=True)
    assert r.sel("rho0", layer=3, head=4, n=2) == r.rho0[0, 1]  # no N axis: n ignored
    assert r.sel("attention_profile", layer=3).shape == r.attention_profile.shape[1:]
    assert torch.equal(r.sel("rho0", layer=7, stat="count"), r.count("rho0")[1])
    torch.testing.assert_close(r.sel("r_min", n=2, stat="std"), r.std("r_min")[..., 1], equal_nan=True)
    every = r.sel(layer=3, head=1, n=1)
    assert set(every) == set(r.fields) and every["precision"].shape == ()
    assert "attention_profile" not in r.sel(stat="max")  # a "mean"-only field has no range
    with pytest.raises(GeometryError, match=r"layer: 5 is not one of this result's layers \[3, 7\]"):
        r.sel("precision", layer=5)
    with pytest.raises(GeometryError, match=r"head: 2 is not one of this result's heads \[1, 4, 6\]"):
        r.sel("precision", head=[1, 2])
    with pytest.raises(GeometryError, match=r"n: 3 is not one of this result's ns \[1, 2, 4, 8\]"):
        r.sel("precision", n=3)
    with pytest.raises(GeometryError, match="stat: expected one of"):
        r.sel("precision", stat="median")


def test_save_load_round_trip_is_exact(tmp_path):
    r = make_result(keep_queries=True)
    npz, sidecar = r.save(tmp_path / "sub" / "run")
    assert npz.name == "run.npz" and sidecar.name == "run.json"
    assert sorted(p.name for p in npz.parent.iterdir()) == ["run.json", "run.npz"]  # no temp files left
    loaded = GeometryResult.load(tmp_path / "sub" / "run.npz")
    assert loaded.equals(r) and r.equals(loaded)
    for name in r.fields:
        for statistic, t in r.stats[name].arrays().items():
            u = loaded.stats[name].arrays()[statistic]
            assert u.dtype == t.dtype and torch.equal(t.isnan(), u.isnan())
            assert torch.equal(t.nan_to_num(0.0, math.inf, -math.inf), u.nan_to_num(0.0, math.inf, -math.inf))
    assert torch.isinf(loaded.r_min).any() and loaded.precision.isnan().any()
    assert loaded.queries["precision"].shape == (7, 2, 3, 2, 4) and loaded.query_positions.shape == (7, 2)
    assert loaded.config == r.config and loaded.versions == r.versions and loaded.spec("rho0") == SPECS[3]
    assert set(r.versions) == {"tl_geometry", "torch", "transformer-lens"}
    assert not make_result(seed=1).equals(loaded)
    with np.load(npz, allow_pickle=False) as data:  # plain arrays by field and statistic
        assert data["recall/total"].dtype == np.float64 and data["attention_profile/total"].dtype == np.float32
        assert data["recall/replicate_total"].shape == (B, 2, 3, 4)
        assert data["precision/count"].shape == (1, 1, 4)  # defined or not depends on the document only
        assert data["rho0/count"].shape == (1, 3)  # document 0 lacks head 1 in every layer
        assert data["recall/replicate_count"].shape == (B, 1, 1, 4)
    assert loaded.count("precision").shape == (2, 3, 4)


def test_merge_equals_one_pass_and_refuses_other_runs(tmp_path):
    tokens, values = corpus(9, seed=4)
    one = GeometryResult.from_accumulator(accumulate(tokens, values), config=CONFIG, model_name="tiny")
    parts = [GeometryResult.from_accumulator(accumulate(tokens[lo:hi], values[lo:hi], splits), config=CONFIG,
                                             model_name="tiny")
             for (lo, hi), splits in (((0, 2), ()), ((2, 6), (1,)), ((6, 9), ()))]
    for i, p in enumerate(parts):
        p.save(tmp_path / str(i))
    loaded = [GeometryResult.load(tmp_path / str(i)) for i in range(3)]
    for merged in (GeometryResult.merge(loaded), GeometryResult.merge(*loaded), loaded[0].merge(loaded[1:]),
                   loaded[2].merge(loaded[0]).merge(loaded[1])):
        assert merged.n_documents == 9 and merged.n_tokens == one.n_tokens
        for name in one.fields:
            for statistic, t in one.stats[name].arrays().items():
                u = merged.stats[name].arrays()[statistic]
                if statistic == "count":
                    assert torch.equal(u, t)
                else:
                    # float32 statistics are rounded once per part: the error scales with the sums' magnitude.
                    scale = 0 if t.dtype == torch.float64 else 1e-6 * t.nan_to_num(0, 0, 0).abs().max().item()
                    torch.testing.assert_close(u, t, rtol=1e-6, atol=scale, equal_nan=True)
    assert GeometryResult.concatenate(parts).n_sequences == 9  # merge and n_documents by their other names
    a = parts[0]
    tokens2, values2 = corpus(3, seed=5)
    other_specs = GeometryResult.from_accumulator(
        Accumulator(SPECS[:2], layers=LAYERS, heads=HEADS, n_grid=GRID), config=CONFIG, model_name="tiny")
    for other, what in [
        (GeometryResult.from_accumulator(accumulate(tokens2, values2), config=CONFIG, model_name="other"), "model_name"),
        (GeometryResult.from_accumulator(accumulate(tokens2, values2), config=CONFIG.with_overrides(ranking="contribution"),
                                         model_name="tiny"), "config"),
        (other_specs, r"fields \(\['attention_profile', 'cosine_by_lag', 'precision'"),
        (make_result(keep_queries=True), r"per-query rows \('not kept' vs 'kept'\)"),
        (bare(layers=(3, 8)), r"layers \(\(3, 7\) vs \(3, 8\)\)"),
        (bare(heads=(1, 4)), r"heads \(\(1, 4, 6\) vs \(1, 4\)\)"),
        (bare(grid=torch.tensor([1, 2, 4, 16])), r"n_grid \(\[1, 2, 4, 8\] vs \[1, 2, 4, 16\]\)"),
    ]:
        with pytest.raises(GeometryError, match=f"merge: the results differ in {what}"):
            GeometryResult.merge(a, other)
    with pytest.raises(GeometryError, match="merge: item 1 is a str"):
        GeometryResult.merge([a, "b"])


def bare(layers=LAYERS, heads=HEADS, grid=GRID):
    """A result of no documents (same config, model and fields as make_result)."""
    acc = Accumulator(SPECS, layers=layers, heads=heads, n_grid=grid, n_bootstrap=B, replicate_fields=["recall", "rho0"])
    return GeometryResult.from_accumulator(acc, config=CONFIG, model_name="tiny")


def v1_arrays(n_seq=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    per_sequence = {name: torch.rand(n_seq, 2, 3, 4, generator=gen)
                    for name in ("precision", "recall", "f_rmax", "f_rmin", "f_score", "r_min", "r_max", "k_out", "k_in")}
    per_sequence["s_norm"] = torch.rand(n_seq, 2, 3, 4, generator=gen).double()
    per_sequence["r_min"][..., -1] = math.inf
    per_sequence["precision"][0, 0, 0, 2] = math.nan
    per_sequence["recall"][:, 1, 1, 3] = math.nan
    per_sequence["value_norm_cv"] = torch.rand(n_seq, 2, 3, generator=gen)
    per_sequence["attention_profile"] = torch.rand(n_seq, 2, 3, 6, generator=gen)
    per_sequence["cosine_by_lag"] = torch.rand(n_seq, 2, 3, 5, generator=gen)
    per_sequence["mystery"] = torch.rand(n_seq, 2, 3, 4, generator=gen)  # as wide as the grid, but not a metric
    return per_sequence


def write_v1(stem, per_sequence, lengths):
    """A file pair exactly as tl_geometry 0.1 wrote it (format_version 1)."""
    arrays = {"per_sequence/" + k: v.numpy() for k, v in per_sequence.items()}
    arrays["n_grid"] = np.arange(1, 5)
    arrays["sequence_lengths"] = np.array(lengths)
    np.savez(f"{stem}.npz", **arrays)
    meta = {
        "format_version": 1, "model_name": "tiny", "layers": [0, 1], "heads": [0, 1, 2],
        "config": GeometryConfig(n_grid=[1, 2, 3, 4], layers=[0, 1]).to_json(),
        "versions": {"tl_geometry": "0.1.0", "torch": "2.1", "transformer_lens": "3.9"},
        "fields": sorted(per_sequence), "dtypes": {k: str(v.dtype).removeprefix("torch.") for k, v in per_sequence.items()},
        "npz_sha256": hashlib.sha256(open(f"{stem}.npz", "rb").read()).hexdigest(),
    }
    with open(f"{stem}.json", "w") as f:
        json.dump(meta, f)


def test_format_1_files_load_as_statistics(tmp_path):
    per_sequence = v1_arrays()
    write_v1(tmp_path / "old", per_sequence, [7, 5, 9, 6])
    r = GeometryResult.load(tmp_path / "old")
    assert r.n_documents == 4 and r.n_tokens == 27 and r.versions["tl_geometry"] == "0.1.0"
    assert r.layers == (0, 1) and r.heads == (0, 1, 2) and r.n_grid.tolist() == [1, 2, 3, 4]
    axes = {name: r.spec(name).axes for name in r.fields}
    assert axes["precision"] == axes["s_norm"] == ("n",) and axes["value_norm_cv"] == ()
    assert axes["attention_profile"] == axes["mystery"] == ("position",) and axes["cosine_by_lag"] == ("lag",)
    assert r.spec("recall") == REGISTRY.field("recall")  # the installed declaration where one fits
    assert r.spec("mystery").documents == "moments" and r.spec("mystery").doc.endswith("(converted from a format-1 result)")
    with quiet():
        for name, t in per_sequence.items():
            x = t.double().numpy()
            exact = r.spec(name).documents == "moments"  # float64 sums; "mean" fields keep float32 ones
            np.testing.assert_allclose(r.per_head(name).numpy(), np.nanmean(x, 0), rtol=1e-12 if exact else 1e-6)
            if exact:
                np.testing.assert_allclose(r.std(name).numpy(), np.nanstd(x, 0, ddof=1), rtol=1e-7)
    assert r.recall[1, 1, 3].isnan() and torch.isinf(r.r_min[..., -1]).all()
    assert r.replicates("recall").shape == (200, 2, 3, 4)  # weights from the sequence index (no tokens in 0.1)
    low, high = r.ci("recall")
    assert ((low <= high) | low.isnan()).all()
    declared = GeometryResult.load(tmp_path / "old.json", specs={"mystery": FieldSpec("mystery", "m", axes=("n",))})
    assert declared.spec("mystery").axes == ("n",)
    GeometryResult.load(tmp_path / "old").save(tmp_path / "new")  # converted results save in format 2
    assert json.loads((tmp_path / "new.json").read_text())["format_version"] == 2


def rewrite_npz(stem, arrays):
    """Replace a saved .npz and record its new checksum, so that only the content is wrong."""
    np.savez(f"{stem}.npz", **arrays)
    meta = json.loads(open(f"{stem}.json").read())
    meta["npz_sha256"] = hashlib.sha256(open(f"{stem}.npz", "rb").read()).hexdigest()
    with open(f"{stem}.json", "w") as f:
        json.dump(meta, f)


def test_malformed_files_are_refused_with_the_file_named(tmp_path):
    make_result().save(tmp_path / "a")
    make_result(seed=1).save(tmp_path / "b")
    (tmp_path / "a.json").write_text((tmp_path / "b.json").read_text())
    with pytest.raises(GeometryError, match=r"a.npz does not match .*a.json \(checksum differs\)"):
        GeometryResult.load(tmp_path / "a")
    with pytest.raises(GeometryError, match="c.npz does not exist"):
        GeometryResult.load(tmp_path / "c")
    good = dict(np.load(tmp_path / "b.npz"))
    meta = json.loads((tmp_path / "b.json").read_text())

    def broken(change_meta=None, **arrays):
        stem = tmp_path / "x"
        with open(f"{stem}.json", "w") as f:
            json.dump({**meta, **(change_meta or {})}, f)
        rewrite_npz(stem, {**good, **arrays})
        return stem

    with pytest.raises(GeometryError, match=r"x.npz: array 'recall/total' is float64 \[2, 3\]; expected torch.float64 \[2, 3, 4\]"):
        GeometryResult.load(broken(**{"recall/total": np.zeros((2, 3))}))
    with pytest.raises(GeometryError, match=r"array 'recall/total_sq' is float32 .*expected torch.float64"):
        GeometryResult.load(broken(**{"recall/total_sq": good["recall/total_sq"].astype(np.float32)}))
    stem = broken()
    rewrite_npz(stem, {k: v for k, v in good.items() if k != "rho0/maximum"})
    with pytest.raises(GeometryError, match=r"x.npz has no array 'rho0/maximum'"):
        GeometryResult.load(stem)
    with pytest.raises(GeometryError, match=r"cannot read .*x.npz as an .npz without pickle"):
        GeometryResult.load(broken(**{"extra": np.array([{"a": 1}], dtype=object)}))
    with pytest.raises(GeometryError, match=r"x.json or .*x.npz is malformed \(KeyError: 'n_documents'\)"):
        GeometryResult.load(_without(broken(), "n_documents"))
    with pytest.raises(GeometryError, match=r"x.json: .*ranking: expected one of"):
        GeometryResult.load(broken({"config": {**meta["config"], "ranking": "nearest"}}))
    with pytest.raises(GeometryError, match="format_version 99; this tl_geometry reads 1 and 2"):
        GeometryResult.load(broken({"format_version": 99}))
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(GeometryError, match=r"x.json is not valid JSON"):
        GeometryResult.load(tmp_path / "x")


def _without(stem, key):
    meta = json.loads(open(f"{stem}.json").read())
    del meta[key]
    with open(f"{stem}.json", "w") as f:
        json.dump(meta, f)
    return stem


# The default report run: 30 layers x 9 heads, 40 N, per-position fields 1024 wide; ~10 metric, ~20 bound
# and 5 taxonomy-curve fields on the grid (moments), 5 per-position/lag fields ("mean"), 25 scalars;
# B = 200 replicates for 2 metric fields and 1 scalar.
REPORT_SPECS = (
    [FieldSpec(f"metric{i}", "m", axes=("n",), bootstrap=i < 2) for i in range(10)]
    + [FieldSpec(f"bound{i}", "b", axes=("n",)) for i in range(20)]
    + [FieldSpec(f"curve{i}", "c", axes=("n",)) for i in range(5)]
    + [FieldSpec(f"profile{i}", "p", axes=("position",), documents="mean") for i in range(5)]
    + [FieldSpec(f"scalar{i}", "s", bootstrap=i == 0) for i in range(25)]
)


def expected_bytes(specs, layers, heads, n, width, b):
    """Bytes of the statistics as documented: counts squeezed to [1, 1, ...] (the document decides what is
    defined), sums and sums of squares float64, ranges float32, "mean" sums float32, replicates float32
    with squeezed weighted counts."""
    total, arrays = 0, 1  # n_grid
    for s in specs:
        arrays += 2 + 3 * (s.documents == "moments") + 2 * s.bootstrap
        trailing = n if s.axes == ("n",) else width if s.axes else 1
        cells = layers * heads * trailing
        total += 8 * trailing  # count
        total += (8 + 8 + 4 + 4) * cells if s.documents == "moments" else 4 * cells
        if s.bootstrap:
            total += 4 * b * cells + 4 * b * trailing
    return total, arrays


def test_file_size_is_flat_in_documents(tmp_path):
    layers, heads, n, width, b = 30, 9, 40, 1024, 200
    acc = Accumulator(REPORT_SPECS, layers=range(layers), heads=range(heads), n_grid=torch.arange(1, n + 1),
                      n_bootstrap=b, replicate_fields=[s.name for s in REPORT_SPECS if s.bootstrap])
    gen = torch.Generator().manual_seed(0)
    values = {s.name: torch.rand(16, layers, heads, *({"n": (n,), "position": (width,)}[s.axes[0]] if s.axes else ()),
                                 generator=gen)
              for s in REPORT_SPECS}
    started = time.perf_counter()
    acc.add(values, torch.poisson(torch.ones(16, b), generator=gen), n_tokens=16 * width)
    memory = acc.nbytes
    sizes = {}
    for docs in (16, 256):
        result = GeometryResult.from_accumulator(acc, config=GeometryConfig(), model_name="synthetic")
        assert result.n_documents == docs
        npz, _ = result.save(tmp_path / str(docs))
        sizes[docs] = npz.stat().st_size
        for _ in range(4):  # 16 -> 256 documents; merging is what a longer run does, batch by batch
            acc = acc.merge(acc)
    assert acc.nbytes == memory
    predicted, arrays = expected_bytes(REPORT_SPECS, layers, heads, n, width, b)
    # npz adds zip headers and a .npy header per array (< 400 bytes each); deflate only takes away.
    assert all(size <= predicted + 400 * arrays for size in sizes.values())
    assert time.perf_counter() - started < 120


def test_small_result_file_size_is_flat(tmp_path):
    small = {}
    for docs in (16, 256):
        tokens, values = corpus(docs, seed=docs)
        values = [{**v, "attention_profile": v["attention_profile"][..., :3], "cosine_by_lag": v["cosine_by_lag"][..., :2]}
                  for v in values]  # same widths, so that only the number of documents differs
        npz, _ = GeometryResult.from_accumulator(accumulate(tokens, values, (docs // 2,)), config=CONFIG,
                                                 model_name="tiny").save(tmp_path / str(docs))
        with zipfile.ZipFile(npz) as archive:  # the arrays' bytes (deflate packs the two a little differently)
            small[docs] = sum(info.file_size for info in archive.infolist())
    assert small[16] == small[256]


def announce_size(path, member, size):
    """Write ``size`` as ``member``'s uncompressed size in a zip's local and central headers (a crafted file)."""
    data = bytearray(path.read_bytes())
    found = 0
    # (signature, offset of the uncompressed size, of the name's length, of the name) in each kind of header
    for signature, size_at, length_at, name_at in ((b"PK\x03\x04", 22, 26, 30), (b"PK\x01\x02", 24, 28, 46)):
        at = data.find(signature)
        while at >= 0:
            length = struct.unpack_from("<H", data, at + length_at)[0]
            if data[at + name_at : at + name_at + length] == member.encode():
                struct.pack_into("<I", data, at + size_at, size)
                found += 1
            at = data.find(signature, at + 4)
    assert found == 2, f"{member}: expected one local and one central header, found {found}"
    path.write_bytes(bytes(data))


def test_crafted_files_cannot_unpack_to_gigabytes(tmp_path):
    """A small npz whose arrays (or whose JSON's shapes) announce gigabytes is refused before anything is read."""
    make_result().save(tmp_path / "b")
    good = dict(np.load(tmp_path / "b.npz"))
    meta = json.loads((tmp_path / "b.json").read_text())
    # A zip whose headers announce 1.92 GB for one array (as 1.92 GB of compressed zeros would, in a couple
    # of MB): refused from the zip directory, in well under a second.
    bomb = tmp_path / "bomb"
    np.savez_compressed(f"{bomb}.npz", **good)
    announce_size(tmp_path / "bomb.npz", "recall/total.npy", 2 * 3 * 4 * 10**7 * 8 + 128)
    meta["npz_sha256"] = hashlib.sha256(open(f"{bomb}.npz", "rb").read()).hexdigest()
    (tmp_path / "bomb.json").write_text(json.dumps(meta))
    assert (tmp_path / "bomb.npz").stat().st_size < 5 * 10**6
    start = time.perf_counter()
    with pytest.raises(GeometryError, match=r"bomb.npz: array 'recall/total' unpacks to 1920000\d+ bytes .*altered"):
        GeometryResult.load(bomb)
    assert time.perf_counter() - start < 1
    # Squeezed arrays broadcast to the shapes the JSON announces: a million layers would expand to terabytes.
    rewrite_npz(tmp_path / "b", good)
    meta = json.loads((tmp_path / "b.json").read_text())
    huge = {**meta, "layers": list(range(10**6))}
    (tmp_path / "b.json").write_text(json.dumps(huge))
    with pytest.raises(GeometryError, match=r"b.json: announces \d+ bytes of statistics \(1000000 layers x 3 heads\)"):
        GeometryResult.load(tmp_path / "b")
    # An array whose header announces more than the JSON allows (small enough to pass the zip's own sizes).
    (tmp_path / "b.json").write_text(json.dumps(meta))
    rewrite_npz(tmp_path / "b", {**good, "recall/total": np.zeros((2, 3, 80))})
    with pytest.raises(GeometryError, match=r"array 'recall/total' is float64 \[2, 3, 80\] \(3840 bytes\), more than "
                                            r"the 192 its metadata allows"):
        GeometryResult.load(tmp_path / "b")
    # An array not announced by the JSON.
    rewrite_npz(tmp_path / "b", {**good, "extra": np.zeros(3)})
    with pytest.raises(GeometryError, match=r"array 'extra' is not announced by the result's JSON"):
        GeometryResult.load(tmp_path / "b")


OLD_SPECS = [FieldSpec("precision", "P", axes=("n",), bootstrap=True), FieldSpec("recall", "R", axes=("n",), bootstrap=True),
             FieldSpec("rho0", "rho_0", queries="sequence", bootstrap=True),
             FieldSpec("value_norm_by_position", "norms", axes=("position",), queries="sequence", documents="mean")]


def _small_old_result(rows: bool) -> GeometryResult:
    """The result of tests/data/result_before_rows.*, which this builder wrote (as sums, uncompressed) with the
    version before rows of documents; ``rows``: as this version keeps a run's few documents."""
    gen = torch.Generator().manual_seed(44)
    tokens = [torch.randint(0, 100, (k,), generator=gen) for k in (5, 7, 6)]
    acc = Accumulator(OLD_SPECS, layers=(0, 1), heads=(0, 1, 2), n_grid=torch.tensor([1, 2, 4]), n_bootstrap=8,
                      replicate_fields=["precision", "recall", "rho0"], document_rows=rows)
    for t in tokens:
        values = {"precision": torch.rand(1, 2, 3, 3, generator=gen), "recall": torch.rand(1, 2, 3, 3, generator=gen),
                  "rho0": torch.rand(1, 2, 3, generator=gen) * 2 - 1,
                  "value_norm_by_position": torch.rand(1, 2, 3, len(t), generator=gen) + 1}
        values["precision"][..., -1] = float("nan") if len(t) < 6 else 1.0
        acc.add(values, document_weights([t], 8, seed=0), n_tokens=len(t))
    return GeometryResult.from_accumulator(acc, config=GeometryConfig(), model_name="synthetic")


def test_a_result_saved_before_rows_loads_exactly_and_merges_with_rows():
    old = GeometryResult.load(Path(__file__).parent / "data" / "result_before_rows")
    assert not any(s.is_rows for s in old.stats.values())
    assert old.equals(_small_old_result(rows=False))  # bit for bit what that version held
    rows = _small_old_result(rows=True)
    assert all(s.is_rows for name, s in rows.stats.items() if name != "value_norm_by_position")
    for name in old.fields:  # the same documents as rows: the same statistics, the replicates to float32 rounding
        torch.testing.assert_close(rows.per_head(name), old.per_head(name), rtol=1e-12, atol=0, equal_nan=True)
        assert torch.equal(rows.count(name), old.count(name))
        if old.has_replicates(name):
            torch.testing.assert_close(rows.replicates(name), old.replicates(name), rtol=1e-6, atol=1e-7,
                                       equal_nan=True)
    both = GeometryResult.merge(old, rows)
    assert both.n_documents == 6 and torch.equal(both.count("precision"), 2 * old.count("precision"))
    torch.testing.assert_close(both.per_head("recall"), old.per_head("recall"), rtol=1e-12, atol=0)
