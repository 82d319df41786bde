"""What reproduces a result, as plain JSON: the package versions, and what two results' provenances must share.

A run records the model's identity (`tl_geometry.runs.model_provenance`), the
package versions, the corpus and the capture path its plan took (``"capture"``,
with ``"capture_reason"`` where ``capture="auto"`` fell back to the pattern) on
its result (``result.provenance``), saved
in its JSON file; merging results checks the identity here and combines the
rest.
"""

import functools
import importlib.metadata
from collections.abc import Sequence
from typing import Any

from tl_geometry._version import __version__

_PACKAGES = ("tl_geometry", "torch", "transformer-lens", "transformers", "numpy", "datasets", "pyarrow", "pandas")
# What two results must share to merge; the rest (device, attention kernel, the checkpoint's local path) may
# differ between machines.
IDENTITY_KEYS = ("name", "revision", "bundled_package", "weights_sha256", "dtype")


STAMPED = ("tl_geometry", "torch", "transformer-lens")
"""The versions every result file carries (``result.versions``); provenance records all of ``_PACKAGES``."""


def package_versions(names: Sequence[str] = _PACKAGES) -> dict[str, str]:
    """Versions of the packages a run depends on, by distribution name ("not installed" where missing).

    >>> package_versions(["tl_geometry"])
    {'tl_geometry': '0.1.0'}
    """
    return {name: _version_of(name) for name in names}


# Read once per process: the modules imported are those of the first reading (about 4 ms a package).
@functools.cache
def _version_of(name: str) -> str:
    if name == "tl_geometry":  # this source's own version, installed or not
        return __version__
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


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
    """The provenance of a merge: one model (devices, attention kernels and capture paths of every part listed),
    corpora summed."""
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
    paths = sorted({str(p["capture"]) for p in known if "capture" in p})  # the capture paths the parts took
    if paths:
        out["capture"] = ", ".join(paths)
    out["merged_from"] = len(provenances)
    return out
