"""GeometryResult: the per-layer-head output of a model run, saved without pickle.

Storage: every tensor is kept per sequence, by field name, in ``per_sequence``
(shape ``[sequence, layer, head_index, ...]``; the selection metrics are
``[sequence, layer, head_index, n]``, each the nanmean over that sequence's
queries). The per-layer-head values are derived from it (nanmean over
sequences), never stored twice.

File format (``format_version`` 1): ``<stem>.npz`` holds one array per field
(``per_sequence/<name>``, plus ``n_grid`` and ``sequence_lengths``), written
with ``allow_pickle=False``; ``<stem>.json`` holds the config, model name,
layers, heads, package versions and the SHA-256 of the ``.npz``. Later fields
are added as more ``per_sequence/<name>`` arrays: ``load`` keeps every array it
finds and requires only ``REQUIRED_FIELDS``.
"""

import dataclasses
import hashlib
import importlib.metadata
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from tl_geometry.config import GeometryConfig
from tl_geometry.errors import GeometryError
from tl_geometry.engine.metrics import SelectionMetrics
from tl_geometry.results.files import atomic_path
from tl_geometry.diagnostics.profile_fit import ProfileFit

FORMAT_VERSION = 1
# Fields every result has: those of SelectionMetrics, per sequence.
REQUIRED_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(SelectionMetrics) if f.name != "n_grid")
_PREFIX = "per_sequence/"


def package_versions() -> dict[str, str]:
    """Versions of tl_geometry, torch and transformer-lens."""
    from tl_geometry import __version__

    try:
        tl_version = importlib.metadata.version("transformer-lens")
    except importlib.metadata.PackageNotFoundError:
        tl_version = "unknown"
    return {"tl_geometry": __version__, "torch": torch.__version__, "transformer_lens": tl_version}


@dataclass(frozen=True)
class GeometryResult:
    """Selection metrics per layer and head, with the per-sequence values behind them.

    Attributes:
        n_grid: the selection sizes N, ``[n]``.
        layers: the layers analysed (axis ``layer`` of every tensor).
        heads: the query heads analysed (axis ``head_index``).
        per_sequence: field name -> ``[sequence, layer, head_index, ...]``;
            the selection metrics are ``[sequence, layer, head_index, n]``,
            each the nanmean over that sequence's queries (queries for which
            N exceeds the visible keys are NaN and skipped).
        sequence_lengths: real (unpadded) tokens of each sequence, ``[sequence]``.
        config: the GeometryConfig of the run.
        model_name: ``model.cfg.model_name``.
        versions: package versions (tl_geometry, torch, transformer_lens).

    Per-layer-head values: ``result.per_head(name)`` or ``result.precision``
    (any field name works as an attribute) is ``[layer, head_index, n]``, the
    nanmean over sequences (NaN only where no sequence has that N).
    """

    n_grid: Int[Tensor, " n"]
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    per_sequence: Mapping[str, Tensor]
    sequence_lengths: Int[Tensor, " sequence"]
    config: GeometryConfig
    model_name: str
    versions: Mapping[str, str]

    def __post_init__(self) -> None:
        missing = [name for name in REQUIRED_FIELDS if name not in self.per_sequence]
        if missing:
            raise GeometryError(f"per_sequence: missing the required field(s) {missing}")
        expected = (len(self.sequence_lengths), len(self.layers), len(self.heads))
        for name, tensor in self.per_sequence.items():
            if tuple(tensor.shape[:3]) != expected:
                raise GeometryError(
                    f"per_sequence[{name!r}]: expected leading shape [sequence, layer, head_index] = "
                    f"{list(expected)}, got {list(tensor.shape)}"
                )
        for name in REQUIRED_FIELDS:
            if self.per_sequence[name].shape[3:] != self.n_grid.shape:
                raise GeometryError(
                    f"per_sequence[{name!r}]: expected a last axis of len(n_grid) = {len(self.n_grid)}, "
                    f"got {list(self.per_sequence[name].shape)}"
                )

    @property
    def n_sequences(self) -> int:
        """Number of sequences analysed."""
        return len(self.sequence_lengths)

    def per_head(self, name: str) -> Float[Tensor, "layer head_index *rest"]:
        """Field ``name`` averaged over sequences (nanmean), ``[layer, head_index, ...]``."""
        if name not in self.per_sequence:
            raise GeometryError(f"unknown field {name!r}; this result has {sorted(self.per_sequence)}")
        # torch.nanmean keeps +inf (r_min where every key is selected) and gives NaN for all-NaN slices.
        return torch.nanmean(self.per_sequence[name], dim=0)

    @property
    def profile_fit(self) -> ProfileFit:
        """The four-phase attention-profile fit (Assumption 3), each parameter ``[layer, head_index]``.

        Each parameter is the nanmean over sequences of the per-sequence fits;
        the ``has_*`` flags become the fraction of sequences with that phase.
        Needs a run with ``diagnostics=["assumptions"]``.
        """
        names = [f.name for f in dataclasses.fields(ProfileFit)]
        missing = [name for name in names if "profile_" + name not in self.per_sequence]
        if missing:
            raise GeometryError(
                "profile_fit: this result has no attention-profile fit; run run_with_geometry_hooks(..., "
                "diagnostics=['assumptions'])"
            )
        return ProfileFit(**{name: self.per_head("profile_" + name) for name in names})

    @property
    def sink_recall_corr(self) -> Float[Tensor, " n"]:
        """Pearson corr(R(r_min, N), rho_0) across heads for every N (Figure 6), ``[n]``.

        Pairs are the per-head means over sequences; see
        `tl_geometry.analysis.sink.sink_recall_correlation` for the Spearman value,
        other pairings and bootstrap bounds. Needs ``diagnostics=["assumptions"]``.
        """
        from tl_geometry.analysis.sink import sink_recall_correlation

        return sink_recall_correlation(self, n_bootstrap=1).pearson

    def __getattr__(self, name: str) -> Tensor:
        # Only called when normal lookup fails: gives result.precision etc.
        if name.startswith("_") or name not in self.__dict__.get("per_sequence", {}):
            raise AttributeError(name)
        return self.per_head(name)

    @staticmethod
    def concatenate(parts: Sequence["GeometryResult"]) -> "GeometryResult":
        """One result over the sequences of several runs with the same grid, layers, heads and config."""
        if not parts:
            raise GeometryError("concatenate: expected at least one GeometryResult, got none")
        first = parts[0]
        for other in parts[1:]:
            for attr in ("layers", "heads", "config", "model_name"):
                if getattr(first, attr) != getattr(other, attr):
                    raise GeometryError(
                        f"concatenate: the results differ in {attr} "
                        f"({getattr(first, attr)!r} vs {getattr(other, attr)!r}); run them with one config"
                    )
            if not torch.equal(first.n_grid, other.n_grid) or set(first.per_sequence) != set(other.per_sequence):
                raise GeometryError("concatenate: the results have different n_grid or fields; run them with one config")
        joined = {k: _join_sequences([p.per_sequence[k] for p in parts]) for k in first.per_sequence}
        lengths = torch.cat([p.sequence_lengths for p in parts])
        return dataclasses.replace(first, per_sequence=joined, sequence_lengths=lengths)

    # ---- files ----

    @staticmethod
    def paths(path: str | os.PathLike) -> tuple[Path, Path]:
        """The ``.npz`` and ``.json`` files of a result saved at ``path`` (suffix ignored)."""
        stem = Path(path)
        if stem.suffix in (".npz", ".json"):
            stem = stem.with_suffix("")
        return stem.with_name(stem.name + ".npz"), stem.with_name(stem.name + ".json")

    def save(self, path: str | os.PathLike) -> tuple[Path, Path]:
        """Write ``<path>.npz`` and ``<path>.json`` atomically (temp file, then os.replace).

        Returns:
            The two paths written.
        """
        npz_path, json_path = self.paths(path)
        npz_path.parent.mkdir(parents=True, exist_ok=True)
        arrays = {_PREFIX + k: v.detach().cpu().numpy() for k, v in self.per_sequence.items()}
        arrays["n_grid"] = self.n_grid.cpu().numpy()
        arrays["sequence_lengths"] = self.sequence_lengths.cpu().numpy()
        _atomic_write(npz_path, lambda f: np.savez(f, **arrays))
        meta = {
            "format_version": FORMAT_VERSION,
            "model_name": self.model_name,
            "layers": list(self.layers),
            "heads": list(self.heads),
            "config": self.config.to_json(),
            "versions": dict(self.versions),
            "fields": sorted(self.per_sequence),
            "dtypes": {k: str(v.dtype).removeprefix("torch.") for k, v in self.per_sequence.items()},
            "npz_sha256": _sha256(npz_path),
        }
        text = json.dumps(meta, indent=2, sort_keys=True)
        _atomic_write(json_path, lambda f: f.write(text.encode()))
        return npz_path, json_path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "GeometryResult":
        """Read a result written by `save`; exact round trip (NaN and inf included)."""
        npz_path, json_path = cls.paths(path)
        for p in (npz_path, json_path):
            if not p.exists():
                raise GeometryError(f"load: {p} does not exist; save writes both {npz_path.name} and {json_path.name}")
        meta = json.loads(json_path.read_text())
        if meta.get("format_version") != FORMAT_VERSION:
            raise GeometryError(
                f"load: {json_path} has format_version {meta.get('format_version')!r}, "
                f"this tl_geometry reads {FORMAT_VERSION}"
            )
        if meta.get("npz_sha256") != _sha256(npz_path):
            raise GeometryError(f"load: {npz_path} does not match {json_path} (checksum differs); save again")
        with np.load(npz_path, allow_pickle=False) as data:
            arrays = {k: torch.from_numpy(data[k].copy()) for k in data.files}
        per_sequence = {k.removeprefix(_PREFIX): v for k, v in arrays.items() if k.startswith(_PREFIX)}
        return cls(
            n_grid=arrays["n_grid"],
            layers=tuple(meta["layers"]),
            heads=tuple(meta["heads"]),
            per_sequence=per_sequence,
            sequence_lengths=arrays["sequence_lengths"],
            config=GeometryConfig.from_json(meta["config"]),
            model_name=meta["model_name"],
            versions=meta["versions"],
        )

    def equals(self, other: "GeometryResult") -> bool:
        """Exact equality, NaN equal to NaN, dtypes included."""
        if not isinstance(other, GeometryResult) or set(self.per_sequence) != set(other.per_sequence):
            return False
        same_meta = (self.layers, self.heads, self.config, self.model_name, dict(self.versions)) == (
            other.layers, other.heads, other.config, other.model_name, dict(other.versions)
        )
        tensors = [(self.n_grid, other.n_grid), (self.sequence_lengths, other.sequence_lengths)]
        tensors += [(v, other.per_sequence[k]) for k, v in self.per_sequence.items()]
        return same_meta and all(
            a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.isnan(), b.isnan())
            and torch.equal(torch.nan_to_num(a, nan=0.0) if a.is_floating_point() else a,
                            torch.nan_to_num(b, nan=0.0) if b.is_floating_point() else b)
            for a, b in tensors
        )


def _join_sequences(tensors: list[Tensor]) -> Tensor:
    """Concatenate along sequences; per-position and per-lag fields are as wide as each
    run's longest sequence, so narrower ones are padded with NaN (undefined there)."""
    width = max(t.shape[-1] for t in tensors)
    padded = [torch.nn.functional.pad(t, (0, width - t.shape[-1]), value=math.nan) for t in tensors]
    return torch.cat(padded)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _atomic_write(path: Path, write: Any) -> None:
    """Write through a temporary file in the same directory, then rename it into place."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def result_from_parts(
    per_sequence: Mapping[str, Tensor],
    *,
    n_grid: Int[Tensor, " n"],
    layers: tuple[int, ...],
    heads: tuple[int, ...],
    sequence_lengths: Int[Tensor, " sequence"],
    config: GeometryConfig,
    model_name: str,
) -> GeometryResult:
    """A GeometryResult stamped with the current package versions."""
    return GeometryResult(
        n_grid=n_grid,
        layers=layers,
        heads=heads,
        per_sequence=dict(per_sequence),
        sequence_lengths=sequence_lengths,
        config=config,
        model_name=model_name,
        versions=package_versions(),
    )
