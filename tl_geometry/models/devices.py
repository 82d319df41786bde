"""Where and in what dtype a model's weights go: devices, dtypes and device maps, checked before anything loads."""

import re
from typing import Any, Literal, get_args

import torch

from tl_geometry.errors import GeometryError

ModelDtype = Literal["float32", "bfloat16", "float16"]
# The placement strategies transformers' ``from_pretrained(device_map=...)`` accepts by name.
DeviceMapStrategy = Literal["auto", "balanced", "balanced_low_0", "sequential"]
DeviceMap = str | dict[str, str | int]


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
