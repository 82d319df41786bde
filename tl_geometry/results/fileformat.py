"""The two files of a result (format 2), and reading those of format 1.

``<stem>.npz``: ``n_grid``, the statistics ``<field>/<statistic>`` (see
`tl_geometry.results.storage`), with per-query rows ``queries/<field>``
and ``query_positions``, and with pictures ``pictures/<layer>.<head>/<array>``
(`tl_geometry.results.selection_picture`); no pickle. ``<stem>.json``: format version, model
name, layers, heads, config, versions, documents, tokens, each field's
declaration, trailing shape and replicates, the names of the per-query rows,
each picture's scalars and sizes (``pictures``; files without it have none),
the provenance (model, versions, corpus; see `tl_geometry.results.provenance`),
and the SHA-256 of the ``.npz``. Both are committed as one unit
(`tl_geometry.atomic_io`), and read with every array checked against the
size its JSON announces before it is read.
"""

import dataclasses
import json
import os
import tokenize
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tl_geometry.atomic_io import Unit, commit_unit, committed_path, json_text
from tl_geometry.config import GeometryConfig
from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.errors import GeometryError
from tl_geometry.results import legacy
from tl_geometry.results.selection_picture import ARRAYS as PICTURE_ARRAYS
from tl_geometry.results.selection_picture import SelectionPicture
from tl_geometry.results.storage import (
    MAX_RESULT_BYTES, announced_bytes, read_npz, sha256, stats_arrays, stats_from_arrays,
)

FORMAT_VERSION = 2
MAX_JSON_BYTES = 64 << 20  # metadata is a few kB; per-query runs add a name per field
MAX_GRID = 1 << 20  # N values when no field has an N axis to announce their number
MAX_D_HEAD = 1 << 16  # widest head a picture may announce


def paths(path: str | os.PathLike) -> tuple[Path, Path]:
    """The ``.npz`` and ``.json`` files of a result saved at ``path`` (suffix ignored)."""
    stem = Path(path)
    if stem.suffix in (".npz", ".json"):
        stem = stem.with_suffix("")
    return stem.with_name(stem.name + ".npz"), stem.with_name(stem.name + ".json")


def write(result: Any, path: str | os.PathLike) -> tuple[Path, Path]:
    """Write a GeometryResult's two files as one unit (see `tl_geometry.atomic_io`); returns their paths."""
    npz_path, _ = paths(path)
    with commit_unit(npz_path.parent) as unit:
        return stage(unit, result, path)


def stage(unit: Unit, result: Any, path: str | os.PathLike) -> tuple[Path, Path]:
    """Stage a GeometryResult's two files in a commit (with other files, e.g. its report)."""
    npz_path, json_path = paths(path)
    arrays: dict[str, np.ndarray] = {"n_grid": result.n_grid.cpu().numpy()}
    for s in result.stats.values():
        arrays.update(stats_arrays(s))
    if result.queries is not None:
        arrays.update({f"queries/{name}": t.contiguous().numpy() for name, t in result.queries.items()})
        arrays["query_positions"] = result.query_positions.contiguous().numpy()
    for p in result.pictures:
        arrays.update({f"{_picture_prefix(p.layer, p.head)}{name}": t.contiguous().numpy() for name, t in p.arrays().items()})
    unit.write(npz_path, lambda f: np.savez_compressed(f, **arrays))
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
             "documents": s.spec.documents, "bootstrap": s.spec.bootstrap,
             "resample_queries": s.spec.resample_queries, "trailing": list(s.trailing), "replicates": s.n_replicates,
             **({"rows": int(s.documents.shape[0])} if s.is_rows else {}),
             **({"groups": int(s.group_total.shape[0])} if s.is_grouped else {})}
            for s in result.stats.values()
        ],
        "queries": None if result.queries is None else list(result.queries),
        "provenance": None if result.provenance is None else dict(result.provenance),
        "pictures": [{**p.metadata(), "n_keys": p.n_keys, "d_head": int(p.y.shape[-1])} for p in result.pictures],
        "npz_sha256": sha256(unit.staged[npz_path]),
    }
    text = json_text(meta, indent=2, sort_keys=True)
    unit.write(json_path, lambda f: f.write(text.encode()))
    return npz_path, json_path


def _picture_prefix(layer: int, head: int) -> str:
    return f"pictures/{layer}.{head}/"


def read(path: str | os.PathLike, specs: Mapping[str, FieldSpec] | None) -> dict[str, Any]:
    """The GeometryResult fields a pair of files holds, checked; GeometryError naming the file otherwise."""
    meta, npz_file, npz_path, json_path = open_pair(path, "the result")
    version = meta.get("format_version")
    if version not in (1, FORMAT_VERSION):
        raise GeometryError(
            f"load: {json_path} has format_version {version!r}; this tl_geometry reads 1 and {FORMAT_VERSION}"
        )
    check_checksum(meta, npz_file, npz_path, json_path)
    with malformed_as_error(npz_path, json_path, "the result"):
        limits = None if version == 1 else array_limits(meta)
        arrays = read_npz(npz_file, limits)
        return _fields(meta, arrays, npz_path, specs)


def open_pair(path: str | os.PathLike, what: str) -> tuple[dict[str, Any], Path, Path, Path]:
    """The JSON object of a saved pair, the ``.npz`` to read, and the two paths to name in errors.

    A commit cut short between its renames is read as it will be completed.
    """
    npz_path, json_path = paths(path)
    npz_file, json_file = committed_path(npz_path), committed_path(json_path)
    for p, shown in ((npz_file, npz_path), (json_file, json_path)):
        if not p.is_file():
            raise GeometryError(
                f"load: {shown} does not exist; saving {what} writes both {npz_path.name} and {json_path.name}"
            )
    return read_metadata(json_file, json_path), npz_file, npz_path, json_path


def check_checksum(meta: Mapping[str, Any], npz_file: Path, npz_path: Path, json_path: Path) -> None:
    if meta.get("npz_sha256") != sha256(npz_file):
        raise GeometryError(f"load: {npz_path} does not match {json_path} (checksum differs); save again")


@contextmanager
def malformed_as_error(npz_path: Path, json_path: Path, what: str) -> Iterator[None]:
    """Any malformed content read inside the block becomes a GeometryError naming the files."""
    try:
        yield
    except GeometryError as error:
        if str(error).startswith(("load: ", "cannot read")):
            raise
        raise GeometryError(f"load: {json_path}: {error}") from error
    # numpy reads a damaged array header with ast, then tokenize: SyntaxError and TokenError come from there.
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError, IndexError, SyntaxError,
            tokenize.TokenError) as error:
        raise GeometryError(
            f"load: {json_path} or {npz_path} is malformed ({type(error).__name__}: {error}); save {what} again"
        ) from error


def read_metadata(json_file: Path, json_path: Path) -> dict[str, Any]:
    """The JSON object of a result (``json_file``, shown as ``json_path``), or GeometryError naming the file."""
    size = json_file.stat().st_size
    if size > MAX_JSON_BYTES:
        raise GeometryError(f"load: {json_path} is {size} bytes, more than a result's metadata ever is; not a result")
    try:
        meta = json.loads(json_file.read_bytes().decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
        raise GeometryError(f"load: {json_path} is not valid JSON ({error}); save the result again") from None
    if not isinstance(meta, dict):
        raise GeometryError(f"load: {json_path} holds a JSON {type(meta).__name__}, expected an object")
    return meta


def non_negative_int(value: Any, what: str) -> int:
    """A non-negative integer from the JSON (not a bool, not a float)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise GeometryError(f"{what} is {value!r}, expected a non-negative integer")
    return value


def array_limits(meta: Mapping[str, Any]) -> dict[str, int]:
    """The bytes each array of a format-2 file may hold, from the shapes its JSON announces.

    Checked before any array is read, together with their sum as the arrays are
    broadcast back (at most `MAX_RESULT_BYTES`), so that a small altered file
    cannot unpack to gigabytes.
    """
    layers = len(meta["layers"])
    heads = len(meta["heads"])
    if not isinstance(meta["fields"], list):
        raise GeometryError(f"'fields' is {type(meta['fields']).__name__}, expected a list")
    limits: dict[str, int] = {}
    grid, total = None, 0
    trailing_of = {}
    for entry in meta["fields"]:
        name = str(entry["name"])
        trailing = tuple(non_negative_int(i, f"fields[{name!r}].trailing") for i in entry["trailing"])
        replicates = non_negative_int(entry["replicates"], f"fields[{name!r}].replicates")
        trailing_of[name] = trailing
        if "n" in entry["axes"]:
            grid = trailing[list(entry["axes"]).index("n")]
        cells = announced_bytes((layers, heads, *trailing))
        stats = ["count", "total", "total_sq", "minimum", "maximum"]
        limits.update({f"{name}/{s}": cells for s in stats})
        limits.update({f"{name}/{s}": replicates * cells for s in ("replicate_total", "replicate_count")})
        total += 5 * cells + 2 * replicates * cells
        if "rows" in entry:  # a field kept as rows of documents (files before them have none)
            rows = non_negative_int(entry["rows"], f"fields[{name!r}].rows")
            limits.update({f"{name}/documents": rows * cells, f"{name}/document_weights": rows * replicates * 8})
            total += rows * (cells + replicates * 8)
        if "groups" in entry:  # a profile's groups of documents beside its sums (files before them have none)
            groups = non_negative_int(entry["groups"], f"fields[{name!r}].groups")
            limits.update({f"{name}/group_total": groups * cells, f"{name}/group_count": groups * cells,
                           f"{name}/group_weights": groups * replicates * 8})
            total += groups * (2 * cells + replicates * 8)
    limits["n_grid"] = announced_bytes((grid if grid is not None else MAX_GRID,))
    if meta.get("queries") is not None:
        documents = non_negative_int(meta["n_documents"], "n_documents")
        tokens = non_negative_int(meta["n_tokens"], "n_tokens")
        for name in meta["queries"]:  # at most every token of every document is a query
            limits[f"queries/{name}"] = announced_bytes((documents, layers, heads, tokens, *trailing_of[str(name)]))
        limits["query_positions"] = announced_bytes((documents, tokens))
    for entry in _picture_entries(meta):
        sizes = {"key": non_negative_int(entry["n_keys"], "pictures[...].n_keys"), "n": grid or MAX_GRID,
                 "d_head": non_negative_int(entry["d_head"], "pictures[...].d_head")}
        if sizes["key"] > non_negative_int(meta["n_tokens"], "n_tokens") or sizes["d_head"] > MAX_D_HEAD:
            raise GeometryError(f"a picture announces {sizes['key']} keys of width {sizes['d_head']}, more than the "
                                f"{meta['n_tokens']} tokens analysed or {MAX_D_HEAD} wide; the file was altered")
        prefix = _picture_prefix(entry["layer"], entry["head"])
        for name, (_, axes) in PICTURE_ARRAYS.items():
            limits[prefix + name] = announced_bytes(tuple(sizes[a] for a in axes))
    if total > MAX_RESULT_BYTES:
        raise GeometryError(
            f"announces {total} bytes of statistics ({layers} layers x {heads} heads), more than the "
            f"{MAX_RESULT_BYTES} a result may hold; the file was altered"
        )
    return limits


def _fields(
    meta: dict[str, Any], arrays: dict[str, np.ndarray], npz_path: Path, specs: Mapping[str, FieldSpec] | None
) -> dict[str, Any]:
    """The constructor arguments of a GeometryResult (KeyError, TypeError, ValueError become GeometryError in `read`)."""
    if "n_grid" not in arrays:
        raise GeometryError(f"load: {npz_path} has no array 'n_grid'; save the result again")
    n_grid = torch.from_numpy(arrays["n_grid"].copy())
    if n_grid.ndim != 1 or n_grid.is_floating_point():
        raise GeometryError(f"load: {npz_path}: 'n_grid' is {n_grid.dtype} {list(n_grid.shape)}; expected 1-d integers")
    layers = tuple(non_negative_int(i, "layers[...]") for i in of_json_type(meta["layers"], list, "layers"))
    heads = tuple(non_negative_int(i, "heads[...]") for i in of_json_type(meta["heads"], list, "heads"))
    config = GeometryConfig.from_json(of_json_type(meta["config"], dict, "config"))
    out = {"n_grid": n_grid, "layers": layers, "heads": heads, "config": config,
           "model_name": of_json_type(meta["model_name"], str, "model_name"), "versions": read_versions(meta)}
    provenance = meta.get("provenance")
    if provenance is not None:  # files before 0.2 record none
        out["provenance"] = of_json_type(provenance, dict, "provenance")
    if meta["format_version"] == 1:
        return {**out, **_format_1(arrays, npz_path, n_grid, layers, heads, config, specs)}
    stats = read_stats(meta, arrays, npz_path, layers, heads)
    rows, positions = None, None
    if meta["queries"] is not None:
        names = of_json_type(meta["queries"], list, "queries")
        if not all(isinstance(n, str) for n in names):
            raise GeometryError(f"'queries' is {names!r}, expected field names")
        missing = [k for k in ["query_positions", *(f"queries/{n}" for n in meta["queries"])] if k not in arrays]
        if missing:
            raise GeometryError(f"load: {npz_path} has no array(s) {missing}; save the result again")
        rows = {_field_now(name): torch.from_numpy(arrays[f"queries/{name}"].copy())
                for name in meta["queries"]}
        positions = torch.from_numpy(arrays["query_positions"].copy())
    pictures = []
    for entry in _picture_entries(meta):
        prefix = _picture_prefix(entry["layer"], entry["head"])
        missing = [prefix + name for name in PICTURE_ARRAYS if prefix + name not in arrays]
        if missing:
            raise GeometryError(f"load: {npz_path} has no array(s) {missing}; save the result again")
        tensors = {name: torch.from_numpy(arrays[prefix + name].copy()) for name in PICTURE_ARRAYS}
        pictures.append(SelectionPicture.from_parts(entry, tensors))
    return {**out, "stats": stats, "n_documents": non_negative_int(meta["n_documents"], "n_documents"),
            "n_tokens": non_negative_int(meta["n_tokens"], "n_tokens"), "queries": rows, "query_positions": positions,
            "pictures": tuple(pictures)}


def _picture_entries(meta: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSON entries of the pictures (none in files written before pictures existed), type-checked."""
    entries = of_json_type(meta.get("pictures", []), list, "pictures")
    for entry in entries:
        of_json_type(entry, dict, "pictures[...]")
        for key in ("layer", "head", "n_keys", "d_head"):
            non_negative_int(entry.get(key), f"pictures[...].{key}")
    return entries


def read_stats(
    meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray], npz_path: Path, layers: tuple[int, ...],
    heads: tuple[int, ...],
) -> dict[str, Any]:
    """Every declared field's `FieldStats`: declarations type-checked, arrays checked against their shapes."""
    stats = {}
    for entry in of_json_type(meta["fields"], list, "fields"):
        entry = of_json_type(entry, dict, "fields[...]")
        axes = of_json_type(entry["axes"], list, "fields[...].axes")
        if not all(isinstance(a, str) for a in axes) or not isinstance(entry["bootstrap"], bool):
            raise GeometryError(f"field {entry.get('name')!r}: axes {axes!r} or bootstrap {entry['bootstrap']!r} "
                                "is not a list of names or a bool")
        resample = entry.get("resample_queries", False)  # files before the two-stage bootstrap lack it
        if not isinstance(resample, bool):
            raise GeometryError(f"field {entry.get('name')!r}: resample_queries {resample!r} is not a bool")
        spec = FieldSpec(name=of_json_type(entry["name"], str, "fields[...].name"),
                         doc=of_json_type(entry["doc"], str, "fields[...].doc"), axes=tuple(axes),
                         queries=entry["queries"], documents=entry["documents"], bootstrap=entry["bootstrap"],
                         resample_queries=resample)
        shape = (len(layers), len(heads), *(int(i) for i in entry["trailing"]))
        rows = entry.get("rows")  # files before rows of documents keep sums only
        rows = None if rows is None else non_negative_int(rows, f"fields[{spec.name!r}].rows")
        groups = entry.get("groups")  # files before groups of documents keep none
        groups = None if groups is None else non_negative_int(groups, f"fields[{spec.name!r}].groups")
        read = stats_from_arrays(spec, arrays, shape, int(entry["replicates"]), npz_path, rows, groups)
        now = _field_now(spec.name)  # a field stored under a former name loads under its name now
        stats[now] = read if now == spec.name else dataclasses.replace(read, spec=dataclasses.replace(spec, name=now))
    return stats


def _field_now(name: str) -> str:
    """A stored field's name as it is now (a field renamed since, e.g. ``taxonomy_attention_sink``, by its new name)."""
    from tl_geometry.diagnostics.registry import REGISTRY  # imported late: the registry loads every diagnostic

    return REGISTRY.current_field(name)


def of_json_type(value: Any, kind: type, what: str) -> Any:
    """``value`` if it is a ``kind`` (the JSON type a result writes there), else GeometryError."""
    if not isinstance(value, kind):
        raise GeometryError(f"{what!r} is {value!r}, expected a JSON {kind.__name__}")
    return value


def read_versions(meta: Mapping[str, Any]) -> dict[str, str]:
    """The ``versions`` entry, package names -> version strings, every one checked (the constructors' type
    check samples one item of a mapping), else GeometryError."""
    versions = of_json_type(meta["versions"], dict, "versions")
    if not all(isinstance(v, str) for v in versions.values()):
        raise GeometryError(f"'versions' is {versions!r}, expected package names -> version strings")
    return versions


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
