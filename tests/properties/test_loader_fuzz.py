"""Fuzzing the result loader: truncated, bit-flipped and re-checksummed files, and altered JSON, either load or
raise GeometryError naming the file; never another exception, never gigabytes of memory."""

import hashlib
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tl_geometry.errors import GeometryError
from tl_geometry.results.result import GeometryResult
from tests.test_result import make_result

_FOLDER = Path(tempfile.mkdtemp(prefix="tl-geometry-fuzz-"))
make_result(n_docs=4, keep_queries=True).save(_FOLDER / "good")
NPZ = (_FOLDER / "good.npz").read_bytes()
META = json.loads((_FOLDER / "good.json").read_text())
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def write(npz: bytes, meta: dict | bytes, checksum: bool = True) -> Path:
    folder = Path(tempfile.mkdtemp(dir=_FOLDER))
    (folder / "r.npz").write_bytes(npz)
    if isinstance(meta, dict):
        meta = {**meta, "npz_sha256": hashlib.sha256(npz).hexdigest()} if checksum else meta
        meta = json.dumps(meta).encode()
    (folder / "r.json").write_bytes(meta)
    return folder / "r"


def load_or_refuse(stem: Path) -> GeometryResult | None:
    try:
        return GeometryResult.load(stem)
    except GeometryError as error:
        assert str(stem.parent) in str(error)  # the message names the file
        return None


@FUZZ
@given(st.integers(0, len(NPZ) - 1))
def test_truncated_npz_with_a_recomputed_checksum(length):
    assert load_or_refuse(write(NPZ[:length], META)) is None


@FUZZ
@given(st.lists(st.tuples(st.integers(0, len(NPZ) - 1), st.integers(0, 7)), min_size=1, max_size=4))
def test_bit_flipped_npz_with_a_recomputed_checksum(flips):
    data = bytearray(NPZ)
    for at, bit in flips:
        data[at] ^= 1 << bit
    load_or_refuse(write(bytes(data), META))


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


@FUZZ
@given(st.sampled_from(sorted(META)), JSON_VALUES, st.booleans())
@example(key="n_documents", value=1, drop=False)  # arrays that each read well but disagree with the count
def test_altered_or_missing_json_keys(key, value, drop):
    meta = {k: v for k, v in META.items() if k != key} if drop else {**META, key: value}
    load_or_refuse(write(NPZ, meta))


@FUZZ
@given(st.integers(0, len(META["fields"]) - 1), st.sampled_from(["trailing", "replicates", "axes", "name"]),
       JSON_VALUES)
def test_altered_field_declarations(index, key, value):
    fields = [dict(f) for f in META["fields"]]
    fields[index][key] = value
    load_or_refuse(write(NPZ, {**META, "fields": fields}))


@FUZZ
@given(st.binary(max_size=200) | st.integers(0, len(json.dumps(META)) - 1).map(lambda n: json.dumps(META).encode()[:n]))
def test_damaged_json_bytes(data):
    assert load_or_refuse(write(NPZ, data)) is None
