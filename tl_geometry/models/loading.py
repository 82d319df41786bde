"""`load_model`: a model ready for analysis, whole on one device or split by a device map."""

import contextlib
import importlib.metadata
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, get_args

import torch

from tl_geometry.errors import GeometryError, first_line
from tl_geometry.models.builders import (
    bridge_from_hf,
    cast_weights,
    hooked_from_hf,
    load_by_name,
    ready_for_analysis,
    transformer_lens_major_version,
)
from tl_geometry.models.devices import DeviceMap, check_device, check_device_map, model_dtype
from tl_geometry.models.export_cache import export_bundled_model
from tl_geometry.models.hf_reading import dtype_kwarg, load_export
from tl_geometry.models.names import BUNDLED_MODELS, DEFAULT_MODEL, check_model_name

ModelKind = Literal["bridge", "hooked"]


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
    if name in BUNDLED_MODELS:
        hf_model, tokenizer = load_export(export_bundled_model(name, cache_dir=cache_dir, progress=progress))
        hf_model = hf_model.to(device)
        if kind == "bridge":
            model = bridge_from_hf(name, hf_model, tokenizer, device, compatibility_mode)
        else:
            model = hooked_from_hf(name, hf_model, tokenizer, device)
        model = cast_weights(model, weights)
    else:
        model = load_by_name(name, kind=kind, device=device, compatibility_mode=compatibility_mode, dtype=weights)
    return ready_for_analysis(model, name, weights)


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
        if name in BUNDLED_MODELS:
            export_dir = export_bundled_model(name, cache_dir=cache_dir, progress=progress)
            # The bridge takes a pre-loaded model as it is placed: accelerate dispatches it here, in its dtype.
            with _placement_errors(name):
                hf_model, tokenizer = load_export(export_dir, **dtype_kwarg(weights), device_map=device_map,
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
    return ready_for_analysis(bridge, name, weights)


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
        reason = first_line(error)
        raise GeometryError(
            f"load_model({name!r}, device_map=...): the model could not be placed or loaded "
            f"({type(error).__name__}: {reason}); check that every key of the map names a module of the model "
            "(such as 'model.layers.0') and that together they cover all of it"
        ) from None
