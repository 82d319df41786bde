"""Arrays of a result file: plain ``.npz`` entries, squeezed where constant, read back with checks.

Statistics are stored by ``<field>/<statistic>`` (see `FieldStats`). An
array that is the same along the layer and/or head axis (typically a count:
whether a field is defined depends on the document, not the head) is stored
with size 1 there and broadcast back on load; the comparison is bitwise, so
the round trip is exact.
"""

import hashlib
import os
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.errors import GeometryError
from tl_geometry.results.files import atomic_path
from tl_geometry.results.stats import FieldStats, storage_dtype

_REPLICATE_STATS = ("replicate_total", "replicate_count")


def _layer_head_axes(statistic: str) -> tuple[int, int]:
    return (1, 2) if statistic in _REPLICATE_STATS else (0, 1)


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
    """The ``<field>/<statistic>`` arrays of one field, squeezed along layer and head where constant."""
    return {
        f"{stats.spec.name}/{statistic}": squeezed(t, _layer_head_axes(statistic)).contiguous().numpy()
        for statistic, t in stats.arrays().items()
    }


def stats_from_arrays(
    spec: FieldSpec, arrays: Mapping[str, np.ndarray], shape: tuple[int, ...], n_replicates: int, file: Path
) -> FieldStats:
    """Rebuild one field's statistics (``shape`` = ``[layer, head_index, *trailing]``), checking every array."""
    wanted = ["count", "total"] + (["total_sq", "minimum", "maximum"] if spec.documents == "moments" else [])
    wanted += list(_REPLICATE_STATS) if n_replicates else []
    out = {}
    for statistic in wanted:
        key = f"{spec.name}/{statistic}"
        if key not in arrays:
            raise GeometryError(f"load: {file} has no array {key!r} (field {spec.name!r} keeps {wanted}); save again")
        a = arrays[key]
        full = (n_replicates, *shape) if statistic in _REPLICATE_STATS else shape
        dtype = storage_dtype(spec, statistic)
        fits = a.ndim == len(full) and all(
            got == want or (got == 1 and axis in _layer_head_axes(statistic))
            for axis, (got, want) in enumerate(zip(a.shape, full))
        )
        if not fits or a.dtype != torch.empty(0, dtype=dtype).numpy().dtype:
            raise GeometryError(
                f"load: {file}: array {key!r} is {a.dtype} {list(a.shape)}; expected {dtype} {list(full)} "
                "(layer and head axes may be 1); the file is damaged or was not written by tl_geometry"
            )
        out[statistic] = torch.from_numpy(a.copy()).expand(full).contiguous()
    return FieldStats(spec=spec, **out)


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` (no pickle), or GeometryError naming the file."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as error:
        raise GeometryError(f"load: cannot read {path} as an .npz without pickle ({error}); save the result again")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def atomic_write(path: Path, write: Any) -> None:
    """Write through a temporary file in the same directory, then rename it into place."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
