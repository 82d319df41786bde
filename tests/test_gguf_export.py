"""The GGUF reading behind the bundled models' one-time float32 export (independent of TransformerLens, so run
in the 4.x half only)."""

import pytest

from tl_geometry.models.hf_reading import gguf_read_once
from tl_geometry.models.names import bundled_gguf_path


def test_the_exports_gguf_reader_reads_what_gguf_reads(tmp_path):
    """The export's reader (parsed once, plain views of the file's map) holds the fields and the tensor bytes
    of gguf's own reader."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    path = bundled_gguf_path("smollm2-135m", tmp_path)
    plain = gguf.GGUFReader(path)
    with gguf_read_once():
        ours = gguf.GGUFReader(path)
        assert gguf.GGUFReader(path) is ours  # parsed once
    assert type(ours.data) is np.ndarray and type(plain.data) is np.memmap
    assert list(ours.fields) == list(plain.fields) and len(plain.fields) > 20
    for name, field in plain.fields.items():
        assert [bytes(p) for p in ours.fields[name].parts] == [bytes(p) for p in field.parts], name
        assert ours.fields[name].data == field.data and ours.fields[name].types == field.types, name
    assert [t.name for t in ours.tensors] == [t.name for t in plain.tensors] and len(plain.tensors) > 100
    for a, b in zip(ours.tensors, plain.tensors):
        assert np.array_equal(a.data, b.data) and a.tensor_type == b.tensor_type, a.name
