"""Fuzzing the loaders of results and intervention sweeps: truncated, bit-flipped and re-checksummed files, and
altered JSON, either load or raise GeometryError naming the file; never another exception, never gigabytes of
memory."""

import functools
import hashlib
import io
import json
import re
import tempfile
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import tiny_models as tm
from tl_geometry.errors import GeometryError
from tl_geometry.interventions.sweep import intervention_sweep
from tl_geometry.results.intervention_result import InterventionResult
from tl_geometry.results.result import GeometryResult
from tests.fixtures import make_result

# Removed when the process ends (the examples write thousands of small files).
_TEMPORARY = tempfile.TemporaryDirectory(prefix="tl-geometry-fuzz-")
_FOLDER = Path(_TEMPORARY.name)
make_result(n_docs=4, keep_queries=True).save(_FOLDER / "good")
NPZ = (_FOLDER / "good.npz").read_bytes()
META = json.loads((_FOLDER / "good.json").read_text())


@functools.cache
def sweep_files() -> tuple[bytes, dict]:
    """An intervention sweep's saved files, built on first use (not when pytest collects this module)."""
    intervention_sweep(
        tm.make_model("bridge-llama"), tm.with_bos(tm.random_tokens(2, 8, seed=1)), [1, 3], scope="head",
        layers=[0], heads=[0, 1], controls=2, n_bootstrap=4, progress=False,
    ).save(_FOLDER / "sweep")
    return (_FOLDER / "sweep.npz").read_bytes(), json.loads((_FOLDER / "sweep.json").read_text())


FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def write(npz: bytes, meta: dict | bytes, checksum: bool = True) -> Path:
    folder = Path(tempfile.mkdtemp(dir=_FOLDER))
    (folder / "r.npz").write_bytes(npz)
    if isinstance(meta, dict):
        meta = {**meta, "npz_sha256": hashlib.sha256(npz).hexdigest()} if checksum else meta
        meta = json.dumps(meta).encode()
    (folder / "r.json").write_bytes(meta)
    return folder / "r"


def load_or_refuse(stem: Path, kind: type = GeometryResult) -> GeometryResult | InterventionResult | None:
    try:
        return kind.load(stem)
    except GeometryError as error:
        assert str(stem.parent) in str(error)  # the message names the file
        return None


def refused_or_sound(stem: Path, kind: type = GeometryResult) -> None:
    """Damaged files are refused with an error naming them; what still loads is a sound result of its kind:
    it saves and loads back equal to itself."""
    loaded = load_or_refuse(stem, kind)
    if loaded is None:
        return
    assert isinstance(loaded, kind)
    again = stem.parent / "again"
    loaded.save(again)
    assert kind.load(again).equals(loaded)


# Every attack runs on a result's files and on an intervention sweep's.
KINDS = pytest.mark.parametrize("kind", ["result", "sweep"])


def saved(kind: str) -> tuple[type, bytes, dict]:
    """The loader and the saved files of ``kind``."""
    return (GeometryResult, NPZ, META) if kind == "result" else (InterventionResult, *sweep_files())


@KINDS
@FUZZ
@given(data=st.data())
def test_truncated_npz_with_a_recomputed_checksum(kind, data):
    loader, npz, meta = saved(kind)
    length = data.draw(st.integers(0, len(npz) - 1))
    assert load_or_refuse(write(npz[:length], meta), loader) is None


@KINDS
@FUZZ
@given(data=st.data())
def test_bit_flipped_npz_with_a_recomputed_checksum(kind, data):
    loader, npz, meta = saved(kind)
    flipped = bytearray(npz)
    for at, bit in data.draw(st.lists(st.tuples(st.integers(0, len(npz) - 1), st.integers(0, 7)), min_size=1,
                                      max_size=4)):
        flipped[at] ^= 1 << bit
    refused_or_sound(write(bytes(flipped), meta), loader)


def stored(npz: bytes) -> bytes:
    """The same archive with its members stored rather than deflated, so that their .npy headers can be edited."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(npz)) as packed, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as plain:
        for info in packed.infolist():
            plain.writestr(info.filename, packed.read(info))
    return out.getvalue()


@KINDS
def test_an_array_header_that_no_longer_parses_is_refused(kind):
    """A flip that turns a comma of an array's shape into "(": numpy's header parser then fails in tokenize."""
    loader, npz, meta = saved(kind)
    npz = stored(npz)
    at = re.search(rb"'shape': \(\d+, \d+, \d+(,) \d+\)", npz).start(1)  # (50, 2, 3, 4) -> (50, 2, 3( 4)
    flipped = bytearray(npz)
    flipped[at] ^= ord(",") ^ ord("(")
    assert load_or_refuse(write(bytes(flipped), meta), loader) is None


@FUZZ
@given(st.integers(0, len(NPZ) - 1), st.integers(0, 7))
def test_bit_flipped_npz_without_a_new_checksum_is_refused(at, bit):
    data = bytearray(NPZ)
    data[at] ^= 1 << bit
    with pytest.raises(GeometryError, match="checksum differs"):
        GeometryResult.load(write(bytes(data), META, checksum=False))


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


@KINDS
@FUZZ
@given(data=st.data(), value=JSON_VALUES, drop=st.booleans())
def test_altered_or_missing_json_keys(kind, data, value, drop):
    loader, npz, meta = saved(kind)
    key = data.draw(st.sampled_from(sorted(meta)))
    altered = {k: v for k, v in meta.items() if k != key} if drop else {**meta, key: value}
    refused_or_sound(write(npz, altered), loader)


@KINDS
def test_a_version_that_is_not_a_string_is_refused_wherever_it_stands(kind):
    # Found by the fuzzing above: the constructors' type check samples one item of a mapping, so every
    # version must be read (a sweep once loaded with one, then failed to load its own save).
    loader, npz, meta = saved(kind)
    versions = {**{f"package-{i}": "1.0" for i in range(100)}, "broken": None}
    for _ in range(3):
        assert load_or_refuse(write(npz, {**meta, "versions": versions}), loader) is None


def test_a_document_count_that_disagrees_with_the_arrays():
    # Arrays that each read well but disagree with the count.
    assert load_or_refuse(write(NPZ, {**META, "n_documents": 1})) is None


@KINDS
@FUZZ
@given(data=st.data(), key=st.sampled_from(["trailing", "replicates", "axes", "name"]), value=JSON_VALUES)
def test_altered_field_declarations(kind, data, key, value):
    loader, npz, meta = saved(kind)
    fields = [dict(f) for f in meta["fields"]]
    fields[data.draw(st.integers(0, len(fields) - 1))][key] = value
    refused_or_sound(write(npz, {**meta, "fields": fields}), loader)


@FUZZ
@given(st.binary(max_size=200) | st.integers(0, len(json.dumps(META)) - 1).map(lambda n: json.dumps(META).encode()[:n]))
def test_damaged_json_bytes(data):
    assert load_or_refuse(write(NPZ, data)) is None


def test_a_sweep_announcing_small_arrays_cannot_unpack_large_ones():
    """Fields whose JSON announces one N while their arrays hold two: refused before the arrays are read."""
    sweep_npz, sweep_meta = sweep_files()
    fields = [dict(f) for f in sweep_meta["fields"]]
    for f in fields:
        if "n" in f["axes"]:
            f["trailing"] = [1 if a == "n" else t for a, t in zip(f["axes"], f["trailing"])]
    with pytest.raises(GeometryError, match="more than the|unpacks to|announces"):
        InterventionResult.load(write(sweep_npz, {**sweep_meta, "fields": fields}))


def test_a_sweep_round_trips_and_a_result_is_not_a_sweep():
    assert load_or_refuse(write(*sweep_files()), InterventionResult) is not None
    with pytest.raises(GeometryError, match="is not an intervention sweep"):
        InterventionResult.load(write(NPZ, META))
