"""The two files of a result (format 2), and reading those of format 1.

``<stem>.npz``: ``n_grid``, the statistics ``<field>/<statistic>`` (see
`tl_geometry.results.storage`), and with per-query rows ``queries/<field>``
and ``query_positions``; no pickle. ``<stem>.json``: format version, model
name, layers, heads, config, versions, documents, tokens, each field's
declaration, trailing shape and replicates, the names of the per-query rows,
the provenance (model, versions, corpus; see `tl_geometry.results.provenance`),
and the SHA-256 of the ``.npz``. Both are written atomically.
"""

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tl_geometry.config import GeometryConfig
from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.errors import GeometryError
from tl_geometry.results import legacy
from tl_geometry.results.storage import atomic_write, read_npz, sha256, stats_arrays, stats_from_arrays

FORMAT_VERSION = 2


def paths(path: str | os.PathLike) -> tuple[Path, Path]:
    """The ``.npz`` and ``.json`` files of a result saved at ``path`` (suffix ignored)."""
    stem = Path(path)
    if stem.suffix in (".npz", ".json"):
        stem = stem.with_suffix("")
    return stem.with_name(stem.name + ".npz"), stem.with_name(stem.name + ".json")


def write(result: Any, path: str | os.PathLike) -> tuple[Path, Path]:
    """Write a GeometryResult's two files atomically; returns their paths."""
    npz_path, json_path = paths(path)
    arrays: dict[str, np.ndarray] = {"n_grid": result.n_grid.cpu().numpy()}
    for s in result.stats.values():
        arrays.update(stats_arrays(s))
    if result.queries is not None:
        arrays.update({f"queries/{name}": t.contiguous().numpy() for name, t in result.queries.items()})
        arrays["query_positions"] = result.query_positions.contiguous().numpy()
    atomic_write(npz_path, lambda f: np.savez(f, **arrays))
    meta = {
        "format_version": FORMAT_VERSION,
        "model_name": result.model_name,
        "layers": list(result.layers),
        "heads": list(result.heads),
        "config": result.config.to_json(),
        "versions": dict(result.versions),
        "n_documents": result.n_documents,
        "n_tokens": result.n_tokens,
        "fields": [
            {"name": s.spec.name, "doc": s.spec.doc, "axes": list(s.spec.axes), "queries": s.spec.queries,
             "documents": s.spec.documents, "bootstrap": s.spec.bootstrap, "trailing": list(s.trailing),
             "replicates": s.n_replicates}
            for s in result.stats.values()
        ],
        "queries": None if result.queries is None else list(result.queries),
        "provenance": None if result.provenance is None else dict(result.provenance),
        "npz_sha256": sha256(npz_path),
    }
    text = json.dumps(meta, indent=2, sort_keys=True)
    atomic_write(json_path, lambda f: f.write(text.encode()))
    return npz_path, json_path


def read(path: str | os.PathLike, specs: Mapping[str, FieldSpec] | None) -> dict[str, Any]:
    """The GeometryResult fields a pair of files holds, checked; GeometryError naming the file otherwise."""
    npz_path, json_path = paths(path)
    for p in (npz_path, json_path):
        if not p.exists():
            raise GeometryError(f"load: {p} does not exist; save writes both {npz_path.name} and {json_path.name}")
    try:
        meta = json.loads(json_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise GeometryError(f"load: {json_path} is not valid JSON ({error}); save the result again") from None
    if not isinstance(meta, dict):
        raise GeometryError(f"load: {json_path} holds a JSON {type(meta).__name__}, expected an object")
    version = meta.get("format_version")
    if version not in (1, FORMAT_VERSION):
        raise GeometryError(
            f"load: {json_path} has format_version {version!r}; this tl_geometry reads 1 and {FORMAT_VERSION}"
        )
    if meta.get("npz_sha256") != sha256(npz_path):
        raise GeometryError(f"load: {npz_path} does not match {json_path} (checksum differs); save again")
    arrays = read_npz(npz_path)
    try:
        return _fields(meta, arrays, npz_path, specs)
    except GeometryError as error:
        if str(error).startswith("load: "):
            raise
        raise GeometryError(f"load: {json_path}: {error}") from error
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise GeometryError(
            f"load: {json_path} or {npz_path} is malformed ({type(error).__name__}: {error}); save the result again"
        ) from error


def _fields(
    meta: dict[str, Any], arrays: dict[str, np.ndarray], npz_path: Path, specs: Mapping[str, FieldSpec] | None
) -> dict[str, Any]:
    """The constructor arguments of a GeometryResult (KeyError, TypeError, ValueError become GeometryError in `read`)."""
    if "n_grid" not in arrays:
        raise GeometryError(f"load: {npz_path} has no array 'n_grid'; save the result again")
    n_grid = torch.from_numpy(arrays["n_grid"].copy())
    if n_grid.ndim != 1 or n_grid.is_floating_point():
        raise GeometryError(f"load: {npz_path}: 'n_grid' is {n_grid.dtype} {list(n_grid.shape)}; expected 1-d integers")
    layers, heads = tuple(int(i) for i in meta["layers"]), tuple(int(i) for i in meta["heads"])
    config = GeometryConfig.from_json(meta["config"])
    out = {"n_grid": n_grid, "layers": layers, "heads": heads, "config": config,
           "model_name": str(meta["model_name"]), "versions": dict(meta["versions"])}
    if isinstance(meta.get("provenance"), dict):  # files before 0.2 record none
        out["provenance"] = meta["provenance"]
    if meta["format_version"] == 1:
        return {**out, **_format_1(arrays, npz_path, n_grid, layers, heads, config, specs)}
    stats = {}
    for entry in meta["fields"]:
        spec = FieldSpec(name=entry["name"], doc=entry["doc"], axes=tuple(entry["axes"]), queries=entry["queries"],
                         documents=entry["documents"], bootstrap=bool(entry["bootstrap"]))
        shape = (len(layers), len(heads), *(int(i) for i in entry["trailing"]))
        stats[spec.name] = stats_from_arrays(spec, arrays, shape, int(entry["replicates"]), npz_path)
    rows, positions = None, None
    if meta["queries"] is not None:
        missing = [k for k in ["query_positions", *(f"queries/{n}" for n in meta["queries"])] if k not in arrays]
        if missing:
            raise GeometryError(f"load: {npz_path} has no array(s) {missing}; save the result again")
        rows = {name: torch.from_numpy(arrays[f"queries/{name}"].copy()) for name in meta["queries"]}
        positions = torch.from_numpy(arrays["query_positions"].copy())
    return {**out, "stats": stats, "n_documents": int(meta["n_documents"]), "n_tokens": int(meta["n_tokens"]),
            "queries": rows, "query_positions": positions}


def _format_1(
    arrays: dict[str, np.ndarray], npz_path: Path, n_grid: torch.Tensor, layers: tuple[int, ...],
    heads: tuple[int, ...], config: GeometryConfig, specs: Mapping[str, FieldSpec] | None,
) -> dict[str, Any]:
    """Statistics of a format-1 file's per-sequence arrays (see `tl_geometry.results.legacy`)."""
    if "sequence_lengths" not in arrays:
        raise GeometryError(f"load: {npz_path} (format 1) has no array 'sequence_lengths'")
    per_sequence = {k.removeprefix("per_sequence/"): torch.from_numpy(v.copy())
                    for k, v in arrays.items() if k.startswith("per_sequence/")}
    acc = legacy.accumulate_sequences(
        per_sequence, n_grid=n_grid, layers=layers, heads=heads,
        sequence_lengths=torch.from_numpy(arrays["sequence_lengths"].copy()), specs=specs,
        n_bootstrap=getattr(config, "n_bootstrap", legacy.V1_BOOTSTRAP), seed=getattr(config, "seed", legacy.V1_SEED),
    )
    return {"stats": acc.stored_stats(), "n_documents": acc.n_documents, "n_tokens": acc.n_tokens}
