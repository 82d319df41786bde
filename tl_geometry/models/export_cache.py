"""The cache of bundled models' float32 exports: made once from the GGUF file, staged beside its place and renamed
into it whole, checked against a marker of every file's size, one export at a time (a lock in the cache's
``locks`` folder), and half-built exports of dead processes removed.
"""

import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from tl_geometry.atomic_io import pid_alive
from tl_geometry.errors import GeometryError
from tl_geometry.models.hf_reading import dequantise_gguf, hf_progress_bars
from tl_geometry.models.names import BUNDLED_MODELS, ModelShape, bundled_gguf_path

CACHE_ENV_VAR = "TL_GEOMETRY_CACHE"

# Bump when the layout of an export changes, so old caches are rebuilt, not misread.
_CACHE_FORMAT = 1
_MARKER_FILE = "tl_geometry_export.json"
_STALE_SECONDS = 24 * 3600  # a half-built export of an old version older than this is abandoned


def model_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """Root directory of tl_geometry's cached model exports.

    Args:
        cache_dir: explicit directory; wins over the environment variable.

    Returns:
        ``cache_dir`` if given, else ``$TL_GEOMETRY_CACHE`` if set, else
        ``platformdirs.user_cache_dir("tl_geometry")``.
    """
    if cache_dir is not None:
        return Path(cache_dir)
    from_env = os.environ.get(CACHE_ENV_VAR)
    if from_env:
        return Path(from_env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("tl_geometry"))


def bundled_model_shape(name: str, *, cache_dir: str | os.PathLike | None = None) -> ModelShape | None:
    """Layers, query heads and context (``n_ctx`` of the bridge `load_model` returns) of a bundled model,
    without loading its weights; None for other names.

    Read from the ``config.json`` of its float32 export, which the cache
    holds after the first load; before that (or where the export cannot be
    read), the shape declared for the pinned package's model. (Reading the
    GGUF header instead took 39 s with the ``gguf`` package, which parses
    the whole vocabulary: longer than the load it would spare.) The command
    line checks ``--layers``, ``--heads`` and ``--context`` against it, so
    that a bad value is refused before the model loads (or is exported)
    instead of after.

    >>> bundled_model_shape("smollm2-135m")  # doctest: +SKIP
    ModelShape(n_layers=30, n_heads=9, n_ctx=8192)
    """
    if name not in BUNDLED_MODELS:
        return None
    cache_root = model_cache_dir(cache_dir)
    try:
        config = json.loads((cache_root / "models" / name / "config.json").read_text())
        config = config.get("text_config", config)  # a multimodal export keeps the language model's apart
        return ModelShape(int(config["num_hidden_layers"]), int(config["num_attention_heads"]),
                          int(config["max_position_embeddings"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return BUNDLED_MODELS[name].shape  # no export yet: the pinned package's model


def export_bundled_model(
    name: str, *, cache_dir: str | os.PathLike | None = None, progress: bool = True
) -> Path:
    """The float32 export of a bundled model, made from its GGUF file unless the cache holds a complete one.

    `load_model` calls this itself. Called alone, it fills the cache without loading the model: rank 0
    of a torchrun run does, then every rank loads at once. Processes that ask at the same time wait
    for the first one's export (a lock in the cache's ``locks`` folder).

    Args:
        name: one of `bundled_model_names`.
        cache_dir: as for `load_model`.
        progress: show the export's progress bar.

    Returns:
        The directory of the export (a Hugging Face model directory).

    Raises:
        GeometryError: ``name`` is not a bundled model, or its package is missing.
    """
    if name not in BUNDLED_MODELS:
        raise GeometryError(
            f"export_bundled_model: {name!r} is not a bundled model; expected one of {list(BUNDLED_MODELS)}"
        )
    from filelock import FileLock

    cache_root = model_cache_dir(cache_dir)
    gguf_path = bundled_gguf_path(name, cache_root)
    export_dir = cache_root / "models" / name
    locks = cache_root / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    # Processes that load the model at once (notebooks, test workers, torchrun ranks) wait for one export
    # instead of each making its own.
    with FileLock(locks / f"{name}.lock"):
        remove_stale_exports(export_dir)
        if not _is_valid_export(export_dir, gguf_path):
            _export_gguf(gguf_path, export_dir, progress=progress)
    return export_dir


def _source_stamp(gguf_path: Path) -> dict[str, Any]:
    """What an export was made from; a different GGUF file invalidates the export."""
    return {"format": _CACHE_FORMAT, "gguf": gguf_path.name, "gguf_size": gguf_path.stat().st_size}


def _is_valid_export(export_dir: Path, gguf_path: Path) -> bool:
    """Whether ``export_dir`` holds a complete export of ``gguf_path``.

    The marker file lists every exported file with its size, so a truncated or
    missing file (for example from a copy interrupted by hand) is detected.
    """
    try:
        marker = json.loads((export_dir / _MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(marker, dict) or marker.get("source") != _source_stamp(gguf_path):
        return False
    files = marker.get("files")
    if not isinstance(files, dict) or not files:
        return False
    for file_name, size in files.items():
        path = export_dir / file_name
        if not path.is_file() or path.stat().st_size != size:
            return False
    return True


def _staging_prefix(export_dir: Path) -> str:
    return f".{export_dir.name}-building-"


def remove_stale_exports(export_dir: Path) -> list[Path]:
    """Remove half-built exports of ``export_dir`` left by processes that no longer run; the ones removed.

    A staging folder is named ``.<name>-building-<pid>-<random>``; a kill -9 (or
    a SIGTERM outside the command, whose handler cleans up itself) leaves one of
    about 300 MB behind.
    """
    removed = []
    prefix = _staging_prefix(export_dir)
    if not export_dir.parent.is_dir():
        return removed
    # tl_geometry <= 0.2 named them ``.<name>-<8 random characters>``, without the pid: removed once a day old.
    unnamed = re.compile(rf"\.{re.escape(export_dir.name)}-[a-z0-9_]{{8}}")
    for path in export_dir.parent.iterdir():
        pid = path.name.removeprefix(prefix).split("-")[0]
        dead = path.name.startswith(prefix) and pid.isdigit() and not pid_alive(int(pid))
        old = unnamed.fullmatch(path.name) is not None and time.time() - path.stat().st_mtime > _STALE_SECONDS
        if path.is_dir() and (dead or old):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _export_gguf(gguf_path: Path, export_dir: Path, *, progress: bool) -> None:
    """Dequantise a GGUF file to float32 and save it as a Hugging Face model directory.

    Written into a temporary sibling directory (named after this process) and renamed
    into place at the end, so an interrupted export never leaves a directory that looks
    complete; one left by a killed process is removed by the next load
    (`remove_stale_exports`).
    """
    from tqdm.auto import tqdm

    export_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{_staging_prefix(export_dir)}{os.getpid()}-", dir=export_dir.parent))
    steps = tqdm(
        total=3,
        desc=f"tl_geometry: one-time float32 export of {gguf_path.name}",
        disable=not progress,
    )
    try:
        with steps, hf_progress_bars(progress):
            hf_model, tokenizer = dequantise_gguf(gguf_path, steps)
            steps.set_postfix_str("writing cache")
            hf_model.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
            _write_marker(staging, gguf_path)
            steps.update()
        _commit_export(staging, export_dir, gguf_path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _write_marker(staging: Path, gguf_path: Path) -> None:
    """Record the source and the size of every exported file (written last)."""
    files = {p.name: p.stat().st_size for p in sorted(staging.iterdir()) if p.is_file()}
    marker = {"source": _source_stamp(gguf_path), "files": files}
    (staging / _MARKER_FILE).write_text(json.dumps(marker, indent=2))


def _commit_export(staging: Path, export_dir: Path, gguf_path: Path) -> None:
    """Move a finished export into place, replacing a broken one."""
    if export_dir.exists():
        shutil.rmtree(export_dir)
    try:
        os.rename(staging, export_dir)
    except OSError:
        # Another process finished the same export first: keep theirs if it is whole.
        if not _is_valid_export(export_dir, gguf_path):
            raise
