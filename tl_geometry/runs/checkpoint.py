"""Checkpoints of a corpus run: its accumulator and how far it got, written atomically, refused if foreign.

A run started again with the same arguments after an interrupt (SIGINT,
SIGTERM or a kill) loads its checkpoint and continues with the next batch.
The result is then exactly that of an uninterrupted run: the accumulator's
float64 statistics are restored bit for bit, the remaining batches are the
same and are added in the same order, and every document's bootstrap weights
depend only on its tokens. A checkpoint records what made it (model, config,
batch size, ranks, a hash of the shard's token ids, the N grid) and is refused,
naming the difference, by a run with other arguments. Under ``torchrun`` each
rank writes its own file (``PATH.rank1-of-4``).
"""

import glob
import hashlib
import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from tl_geometry.atomic_io import atomic_path
from tl_geometry.capture.tokens import PreparedTokens
from tl_geometry.config import recorded_as_now
from tl_geometry.errors import GeometryError
from tl_geometry.results.accumulators import Accumulator
from tl_geometry.runs.distributed import Ranks

FORMAT = "tl_geometry.checkpoint/1"
DEFAULT_CHECKPOINT_EVERY = "5m"
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class CheckpointEvery:
    """When to write a checkpoint: after so many windows, or after so much time (exactly one is set)."""

    windows: int | None = None
    seconds: float | None = None

    @classmethod
    def parse(cls, value: "int | float | str | timedelta | CheckpointEvery") -> "CheckpointEvery":
        """An int (or digits) is a count of windows; ``"90s"``, ``"5m"``, ``"1.5h"`` or a timedelta a duration.

        >>> CheckpointEvery.parse(500), CheckpointEvery.parse("5m")
        (CheckpointEvery(windows=500, seconds=None), CheckpointEvery(windows=None, seconds=300.0))
        """
        if isinstance(value, CheckpointEvery):
            return value
        if isinstance(value, timedelta):
            value = f"{value.total_seconds()}s"
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return cls(windows=value)
        if isinstance(value, str):
            text = value.strip().lower()
            if text.isdigit() and int(text) >= 1:
                return cls(windows=int(text))
            match = re.fullmatch(r"(\d+(?:\.\d*)?)\s*([smh])", text)
            if match and float(match[1]) > 0 and math.isfinite(float(match[1])):
                return cls(seconds=float(match[1]) * _UNITS[match[2]])
        raise GeometryError(
            f"checkpoint_every: expected a number of windows (such as 500) or a duration (such as 90s, 5m, 1h), "
            f"got {value!r}"
        )

    def due(self, windows: int, seconds: float) -> bool:
        """Whether a checkpoint is due after ``windows`` windows and ``seconds`` of work since the last one."""
        return windows >= self.windows if self.windows is not None else seconds >= self.seconds


def shard_fingerprint(batches: Sequence[PreparedTokens]) -> str:
    """SHA-256 of the real token ids of every document of the shard, in order (its identity across runs)."""
    digest = hashlib.sha256()
    for batch in batches:
        for document in batch.documents():
            body = document.detach().cpu().to(torch.int64).numpy().astype("<i8").tobytes()
            digest.update(len(body).to_bytes(8, "little") + body)
    return digest.hexdigest()


def _differences(saved: dict[str, Any], now: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(saved) | set(now)):
        old, new = saved.get(key), now.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            out += _differences(old, new, f"{prefix}{key}.")
        elif old != new:
            out.append(f"{prefix}{key} ({old!r} in the checkpoint, {new!r} now)")
    return out


class Checkpoint:
    """One rank's checkpoint file: load it to resume, save it when due, remove it after the run.

    Args:
        path: the checkpoint file (``.rankR-of-K`` is appended under torchrun).
        every: when to save (see `CheckpointEvery.parse`).
        identity: what the run is (model, config, batch size, shard hash, grid...);
            a checkpoint with another identity is refused.
        ranks: this process's ranks.
        capture_taken: the capture path this run takes (its plan's): a checkpoint written when the config
            recorded the path ``capture="auto"`` took, not the request, resumes in an auto run that takes it again.
    """

    def __init__(self, path: str | Path, every: Any, identity: dict[str, Any], ranks: Ranks,
                 capture_taken: str | None = None) -> None:
        base = Path(path)
        self.suffix = ranks.checkpoint_suffix()
        self.path = base.with_name(base.name + self.suffix)
        self.every = CheckpointEvery.parse(every)
        self.identity = json.loads(json.dumps(identity))  # the plain-JSON form it is compared in
        self.capture_taken = capture_taken
        self._windows_since = 0
        self._last = time.monotonic()

    def resume(self, accumulator: Accumulator) -> tuple[int, int]:
        """Load the checkpoint into ``accumulator`` if there is one: ``(batches, windows)`` already done."""
        self._last = time.monotonic()
        if not self.path.exists():
            self._refuse_other_rank_counts()
            return 0, 0
        try:
            state = torch.load(self.path, weights_only=True, map_location="cpu")
        except Exception as error:  # noqa: BLE001 - any unreadable file gets one clear message
            raise GeometryError(
                f"checkpoint {self.path}: cannot be read ({type(error).__name__}: {str(error)[:200]}); delete it to "
                "start the run over"
            ) from None
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise GeometryError(
                f"checkpoint {self.path}: not a {FORMAT} file; delete it to start the run over, or choose another path"
            )
        differences = _differences(self._as_now(json.loads(state["identity"])), self.identity)
        if differences:
            raise GeometryError(
                f"checkpoint {self.path}: written by a run with different arguments: {'; '.join(differences)}. "
                "Start again with the same arguments to resume, or delete the checkpoint to start over"
            )
        accumulator.load_state_dict(state["accumulator"])
        return int(state["batches_done"]), int(state["windows_done"])

    def _as_now(self, saved: dict[str, Any]) -> dict[str, Any]:
        """A checkpoint's identity as this version records it: a diagnostic's former name as its name now, and the
        capture path an earlier version recorded in the config read as ``"auto"`` where this auto run takes it."""
        config = saved.get("config")
        if not isinstance(config, dict):
            return saved
        config = recorded_as_now(config)
        asked = self.identity.get("config", {}).get("capture")
        if asked == "auto" and config.get("capture") != "auto" and config.get("capture") == self.capture_taken:
            config["capture"] = "auto"  # the same run: auto took, and takes, this path
        return {**saved, "config": config}

    def _refuse_other_rank_counts(self) -> None:
        """A checkpoint of the same path from a run with another number of processes would be silently ignored."""
        base = self.path.name.split(".rank")[0] if self.suffix else self.path.name
        others = sorted(p.name for p in self.path.parent.glob(f"{glob.escape(base)}*")
                        if p.name == base or re.fullmatch(re.escape(base) + r"\.rank\d+-of-\d+", p.name))
        if others:
            raise GeometryError(
                f"checkpoint {self.path}: not found, but {others} in {self.path.parent} were written by a run with "
                f"another number of processes; resume with the number of processes that wrote them, or delete them "
                "to start over"
            )

    def step(self, accumulator: Accumulator, batches_done: int, windows_done: int, new_windows: int) -> bool:
        """Save if due after ``new_windows`` more windows; True if it saved."""
        self._windows_since += new_windows
        if not self.every.due(self._windows_since, time.monotonic() - self._last):
            return False
        self.save(accumulator, batches_done, windows_done)
        return True

    def save(self, accumulator: Accumulator, batches_done: int, windows_done: int) -> None:
        """Write the checkpoint atomically (a reader sees the previous one or this one, never a part)."""
        state = {
            "format": FORMAT,
            "identity": json.dumps(self.identity),
            "batches_done": batches_done,
            "windows_done": windows_done,
            "accumulator": accumulator.state_dict(),
        }
        with atomic_path(self.path) as tmp:
            torch.save(state, tmp)
        self._windows_since = 0
        self._last = time.monotonic()

    def remove(self) -> None:
        """Delete the checkpoint (after a successful run)."""
        self.path.unlink(missing_ok=True)
