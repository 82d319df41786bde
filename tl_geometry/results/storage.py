"""Arrays of a result file: plain ``.npz`` entries, squeezed where constant, read back with checks.

Statistics are stored by ``<field>/<statistic>`` (see `FieldStats`). An
array that is the same along the layer and/or head axis (typically a count:
whether a field is defined depends on the document, not the head) is stored
with size 1 there and broadcast back on load; the comparison is bitwise, so
the round trip is exact. A field kept as rows of documents is stored as
``<field>/documents`` and ``<field>/document_weights`` (`ROWS`), float32
where that loses nothing (model values are float32), float64 otherwise; a
profile's groups of documents beside its sums as ``<field>/group_total``,
``group_count`` and ``group_weights`` (`GROUPS`), narrowed the same way;
replicate sums as float16 where that loses nothing (those of two-stage
fields are rounded to it, `tl_geometry.results.stats.half_rounded`).
Entries are deflated (``np.savez_compressed``): counts, NaN past a short
sequence's keys and constant bounds take next to nothing.
"""

import hashlib
import math
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.errors import GeometryError
from tl_geometry.results.stats import GROUPS, ROWS, FieldStats, storage_dtype

_REPLICATE_STATS = ("replicate_total", "replicate_count")
# An archive may unpack to at most this many times its packed bytes, plus this allowance: deflate packs an
# array of NaN or zeros up to ~1000 to 1, so the bound is on the whole file, not on each array.
MAX_PACKING = 64
PACKING_ALLOWANCE = 256 << 20
# Most bytes the arrays of one result may hold in memory once broadcast back: the default report run
# holds ~32 MB (its file is the same size); a file announcing more than this was altered.
MAX_RESULT_BYTES = 4 << 30
_NPY_HEADER = 4096  # an .npy header is at most this long


def _layer_head_axes(statistic: str) -> tuple[int, ...]:
    if statistic in (ROWS[1], GROUPS[2]):
        return ()  # document and group weights have no layer or head axis
    return (1, 2) if statistic in (*_REPLICATE_STATS, ROWS[0], *GROUPS[:2]) else (0, 1)


def narrowed(t: Tensor, to: torch.dtype = torch.float32) -> Tensor:
    """``t`` in the narrower float dtype ``to`` where that loses no bit (NaN and inf included), else unchanged."""
    if not t.is_floating_point() or t.element_size() <= torch.empty(0, dtype=to).element_size():
        return t
    small = t.to(to)
    return small if torch.equal(_bits(small.to(t.dtype)), _bits(t)) else t


def _bits(t: Tensor) -> Tensor:
    """The tensor as integers of its width, so that equality is bitwise (NaN equal to itself, -0 != 0)."""
    if not t.is_floating_point():
        return t
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])


def squeezed(t: Tensor, axes: tuple[int, ...]) -> Tensor:
    """``t`` with each of ``axes`` cut to size 1 where every slice along it equals the first."""
    for axis in axes:
        if t.shape[axis] > 1:
            first = t.narrow(axis, 0, 1)
            if torch.equal(_bits(t), _bits(first).expand_as(t)):
                t = first
    return t


def stats_arrays(stats: FieldStats) -> dict[str, np.ndarray]:
    """The ``<field>/<statistic>`` arrays of one field, squeezed along layer and head where constant (rows
    narrowed to float32 where lossless)."""
    return {
        f"{stats.spec.name}/{statistic}": squeezed(_narrowed(statistic, t), _layer_head_axes(statistic)).contiguous().numpy()
        for statistic, t in stats.arrays().items()
    }


def _narrowed(statistic: str, t: Tensor) -> Tensor:
    """Rows and groups as float32, replicate sums as float16, where that loses nothing (see `half_rounded`)."""
    if statistic in (*ROWS, *GROUPS):
        return narrowed(t)
    return narrowed(t, torch.float16) if statistic == "replicate_total" else t


def stats_from_arrays(
    spec: FieldSpec, arrays: Mapping[str, np.ndarray], shape: tuple[int, ...], n_replicates: int, file: Path,
    n_rows: int | None = None, n_groups: int | None = None,
) -> FieldStats:
    """Rebuild one field's statistics (``shape`` = ``[layer, head_index, *trailing]``), checking every array;
    ``n_rows``: the field was kept as that many rows of documents (None: as sums); ``n_groups``: its sums keep
    that many groups of documents beside them (None: none)."""
    if n_rows is not None:
        wanted = list(ROWS)
    else:
        wanted = ["count", "total"] + (["total_sq", "minimum", "maximum"] if spec.documents == "moments" else [])
        wanted += list(GROUPS) if n_groups is not None else list(_REPLICATE_STATS) if n_replicates else []
    out = {}
    for statistic in wanted:
        key = f"{spec.name}/{statistic}"
        if key not in arrays:
            raise GeometryError(f"load: {file} has no array {key!r} (field {spec.name!r} keeps {wanted}); save again")
        a = arrays[key]
        full = {"documents": (n_rows, *shape), "document_weights": (n_rows, n_replicates),
                "group_total": (n_groups, *shape), "group_count": (n_groups, *shape),
                "group_weights": (n_groups, n_replicates)}.get(
            statistic, (n_replicates, *shape) if statistic in _REPLICATE_STATS else shape)
        if statistic == GROUPS[1]:
            kept = [torch.int64]
        elif statistic in (*ROWS, *GROUPS):
            kept = [torch.float32, torch.float64]
        else:
            kept = [torch.float16] * (statistic == "replicate_total") + [storage_dtype(spec, statistic)]
        dtypes = [torch.empty(0, dtype=d).numpy().dtype for d in kept]
        fits = a.ndim == len(full) and all(
            got == want or (got == 1 and axis in _layer_head_axes(statistic))
            for axis, (got, want) in enumerate(zip(a.shape, full))
        )
        if not fits or a.dtype not in dtypes:
            raise GeometryError(
                f"load: {file}: array {key!r} is {a.dtype} {list(a.shape)}; expected {' or '.join(map(str, kept))} "
                f"{list(full)} (layer and head axes may be 1); the file is damaged or was not written by tl_geometry"
            )
        out[statistic] = torch.from_numpy(a.copy()).expand(full).contiguous()
        if statistic in (*ROWS, GROUPS[2]):
            out[statistic] = out[statistic].double()
        elif statistic == GROUPS[0]:
            out[statistic] = out[statistic].to(storage_dtype(spec, "total"))
        elif statistic == "replicate_total":
            out[statistic] = out[statistic].to(storage_dtype(spec, statistic))
    if n_rows is not None:
        return FieldStats.of_documents(spec, out["documents"], out["document_weights"]).stored()
    return FieldStats(spec=spec, **out)


def announced_bytes(shape: tuple[int, ...], itemsize: int = 8) -> int:
    """Bytes of an array of ``shape`` (a file's JSON announces shapes; arrays are checked against them)."""
    return math.prod(shape) * itemsize


def _header(member: Any) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype from an ``.npy`` header, without reading the data."""
    version = np.lib.format.read_magic(member)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = read(member)
    return tuple(shape), dtype


def read_npz(path: Path, limits: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` (no pickle), each checked against its size limit before it is read.

    Args:
        path: the file.
        limits: array name -> most bytes it may hold; only these arrays are read (None: every array,
            together at most `MAX_RESULT_BYTES`).

    Raises:
        GeometryError: naming the file and the problem (not a zip, truncated, damaged, an array larger
            than announced or holding Python objects).
    """
    try:
        with zipfile.ZipFile(path) as archive:
            out, total, unpacked, packed = {}, 0, 0, 0
            for info in archive.infolist():
                name = info.filename.removesuffix(".npy")
                with archive.open(info) as member:
                    shape, dtype = _header(member)
                if dtype.hasobject:
                    raise GeometryError(
                        f"cannot read {path} as an .npz without pickle (array {name!r} holds Python objects); "
                        "tl_geometry never writes those: the file was not written by it"
                    )
                if limits is not None and name not in limits:
                    raise GeometryError(
                        f"load: {path}: array {name!r} is not announced by the result's JSON; the file was altered"
                    )
                limit = MAX_RESULT_BYTES if limits is None else limits[name]
                unpacked, packed = unpacked + info.file_size, packed + info.compress_size
                if info.file_size > limit + _NPY_HEADER or unpacked > MAX_PACKING * packed + PACKING_ALLOWANCE:
                    raise GeometryError(
                        f"load: {path}: array {name!r} unpacks to {info.file_size} bytes from "
                        f"{info.compress_size}, more than its {limit} announced; the file was altered"
                    )
                size = announced_bytes(shape, dtype.itemsize)
                total += size
                if size > info.file_size:
                    raise GeometryError(
                        f"load: {path}: array {name!r} announces {dtype} {list(shape)} ({size} bytes) but holds "
                        f"{info.file_size}; the file is truncated or was altered"
                    )
                if size > limit or total > MAX_RESULT_BYTES:
                    raise GeometryError(
                        f"load: {path}: array {name!r} is {dtype} {list(shape)} ({size} bytes), more than the "
                        f"{min(limit, MAX_RESULT_BYTES)} its metadata allows; the file was altered"
                    )
                with archive.open(info) as member:
                    out[name] = np.lib.format.read_array(member, allow_pickle=False)
            return out
    except GeometryError as error:
        if str(error).startswith(("load: ", "cannot read")):
            raise
        raise GeometryError(f"load: {path}: {error}") from None
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error,
            NotImplementedError, RuntimeError, KeyError, OverflowError, TypeError) as error:
        raise GeometryError(
            f"load: cannot read {path} as an .npz without pickle ({type(error).__name__}: {error}); "
            "the file is truncated or damaged: save the result again"
        ) from None


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
