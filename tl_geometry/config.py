"""GeometryConfig: what a model run analyses, validated once.

Fields that depend on the model (layers and heads in range) or on the input
(the default grid's last N, query positions within the sequences) are checked
when the config meets a model, in `tl_geometry.capture.hooks`.
"""

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from tl_geometry._types import Distance, Ranking
from tl_geometry.errors import GeometryError
from tl_geometry.engine.grid import default_n_grid
from tl_geometry.engine.metrics import DEFAULT_MEMORY_BUDGET_MIB
from tl_geometry.engine.selection import resolve_n_grid

GridMode = Literal["default", "all"]
QueryMode = Literal["last", "all"]
# Extra per-layer-head statistics computed in the same hooked pass (see tl_geometry.activations).
Diagnostic = Literal["assumptions", "bounds", "taxonomy"]
# Element types are checked in __post_init__, with a message naming the field.
IntSequence = Sequence | Tensor | np.ndarray

def _literal_error(name: str, value: Any, literal: Any, also: str = "") -> GeometryError:
    allowed = get_args(literal)
    return GeometryError(f"{name}: expected one of {allowed}{also}, got {value!r}")


def _int_tuple(name: str, value: Any, what: str) -> tuple[int, ...]:
    """A sequence of integers as a tuple, or GeometryError naming the field."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, Tensor, np.ndarray, range)):
        raise GeometryError(f"{name}: expected {what}, got {value!r}")
    items = value.tolist() if isinstance(value, (Tensor, np.ndarray)) else list(value)
    if not items:
        raise GeometryError(f"{name}: expected {what}, got an empty sequence")
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, np.integer)):
            raise GeometryError(f"{name}: expected {what}, got the entry {item!r} of type {type(item).__name__}")
    return tuple(int(i) for i in items)


@dataclass(frozen=True)
class GeometryConfig:
    """What `tl_geometry.run_with_geometry_hooks` analyses, and how.

    Attributes:
        n_grid: selection sizes N. ``"default"``: every N from 1 to 16, then
            log-spaced up to the number of visible keys (about 40 values, the
            last one included); ``"all"``: every N from 1 to the number of
            visible keys; or any sequence of positive integers. N larger than
            a query's visible keys gives NaN for that query.
        query_positions: ``"last"`` (the last real token of each sequence),
            ``"all"`` (every real position), or a sequence of positions counted
            from the first real token of each sequence (0 is the BOS/sink).
        layers: layers to analyse (default: all).
        heads: query heads to analyse in every analysed layer (default: all).
        ranking: ``"attention"`` or ``"contribution"`` (see ``selection_metrics``).
        distance: ``"euclidean"`` or ``"cosine"``.
        prepend_bos: prepend BOS when tokenising strings, so that position 0 is
            the sink (the paper's protocol). Token tensors are used as given.
        memory_budget_mib: working memory of one chunk of metric rows.
        diagnostics: extra statistics computed in the same pass, any of
            ``"assumptions"`` (the paper's Assumptions 1-3: value norms,
            cosine decay, attention profile), ``"bounds"`` (the margins and
            envelopes of Theorems 1-2) and ``"taxonomy"`` (the features behind
            the Retriever / Mixer / Reset labels); ``"all"`` for every one.
            Together they add about 35-40 % to the forward pass of one
            1024-token window of SmolLM2-135M (`benchmarks/bench_hooks.py`);
            the bounds grow with the square of the keys, the rest about linearly.

    Example:
        >>> GeometryConfig(n_grid=[1, 2, 4], layers=[0]).n_grid
        (1, 2, 4)
        >>> GeometryConfig(ranking="nearest")
        Traceback (most recent call last):
        ...
        tl_geometry.errors.GeometryError: ranking: expected one of ('attention', 'contribution'), got 'nearest'
    """

    # Annotated with what callers may pass (runtime type checking sees the
    # arguments before __post_init__ validates and normalises them): strings
    # are checked against the Literal types GridMode, QueryMode, Ranking and
    # Distance, sequences become tuples of ints.
    n_grid: str | IntSequence = "default"
    query_positions: str | IntSequence = "last"
    layers: IntSequence | None = None
    heads: IntSequence | None = None
    ranking: str = "attention"
    distance: str = "euclidean"
    prepend_bos: bool = True
    memory_budget_mib: float | int = float(DEFAULT_MEMORY_BUDGET_MIB)
    diagnostics: str | Sequence = ()

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "diagnostics", _diagnostics(self.diagnostics))
        if isinstance(self.n_grid, str):
            if self.n_grid not in get_args(GridMode):
                raise _literal_error("n_grid", self.n_grid, GridMode, " or a sequence of positive integers")
        else:
            grid = _int_tuple("n_grid", self.n_grid, "'default', 'all' or a sequence of positive integers")
            if min(grid) < 1:
                raise GeometryError(
                    f"n_grid: every N must be >= 1 (N counts selected keys), got {min(grid)}; "
                    "drop it or pass e.g. [1, 2, 4, 8]"
                )
            resolve_n_grid(list(grid), 1)
            set_(self, "n_grid", grid)
        if isinstance(self.query_positions, str):
            if self.query_positions not in get_args(QueryMode):
                raise _literal_error(
                    "query_positions", self.query_positions, QueryMode, " or a sequence of positions"
                )
        else:
            positions = _int_tuple("query_positions", self.query_positions, "'last', 'all' or a sequence of positions")
            if min(positions) < 0:
                raise GeometryError(
                    f"query_positions: positions count from the first token (0), got {min(positions)}; "
                    "use 'last' for the final token"
                )
            set_(self, "query_positions", positions)
        for name in ("layers", "heads"):
            value = getattr(self, name)
            if value is not None:
                items = _int_tuple(name, value, "a sequence of non-negative integers or None (all)")
                if min(items) < 0:
                    raise GeometryError(f"{name}: indices must be >= 0, got {min(items)}")
                if len(set(items)) != len(items):
                    raise GeometryError(f"{name}: indices must be distinct, got {items}")
                set_(self, name, items)
        if self.ranking not in get_args(Ranking):
            raise _literal_error("ranking", self.ranking, Ranking)
        if self.distance not in get_args(Distance):
            raise _literal_error("distance", self.distance, Distance)
        if not isinstance(self.prepend_bos, bool):
            raise GeometryError(f"prepend_bos: expected True or False, got {self.prepend_bos!r}")
        budget = self.memory_budget_mib
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not (budget > 0 and math.isfinite(budget)):
            raise GeometryError(f"memory_budget_mib: expected a positive finite number of MiB, got {budget!r}")
        set_(self, "memory_budget_mib", float(budget))

    def with_overrides(self, **overrides: Any) -> "GeometryConfig":
        """A copy with some fields replaced; unknown names raise GeometryError listing the valid ones."""
        valid = [f.name for f in fields(self)]
        unknown = sorted(set(overrides) - set(valid))
        if unknown:
            raise GeometryError(f"unknown config field(s) {unknown}; valid names are {valid}")
        return dataclasses.replace(self, **overrides)

    def resolve_n_grid(self, n_keys: int) -> Int[Tensor, " n"]:
        """The grid for inputs whose longest query sees ``n_keys`` keys."""
        if self.n_grid == "default":
            return default_n_grid(n_keys)
        if self.n_grid == "all":
            return torch.arange(1, n_keys + 1, dtype=torch.int64)
        return torch.tensor(self.n_grid, dtype=torch.int64)

    def to_json(self) -> dict[str, Any]:
        """The fields as JSON-ready values (tuples become lists)."""
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v) for f in fields(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "GeometryConfig":
        """Inverse of `to_json`; unknown keys raise GeometryError."""
        return cls().with_overrides(**data)


def _diagnostics(value: Any) -> tuple[str, ...]:
    """The diagnostics as a tuple in canonical order; ``"all"`` means every one."""
    allowed = get_args(Diagnostic)
    if value == "all":
        return allowed
    if isinstance(value, str):
        value = (value,)  # one name, e.g. diagnostics="taxonomy"
    if not isinstance(value, Sequence):
        raise GeometryError(f"diagnostics: expected 'all' or a sequence of names from {allowed}, got {value!r}")
    unknown = [item for item in value if item not in allowed]
    if unknown:
        raise GeometryError(f"diagnostics: unknown name(s) {unknown}; choose from {allowed} or 'all'")
    return tuple(name for name in allowed if name in value)


def make_config(config: GeometryConfig | None, overrides: dict[str, Any]) -> GeometryConfig:
    """``config`` (default: ``GeometryConfig()``) with ``overrides`` applied."""
    if config is not None and not isinstance(config, GeometryConfig):
        raise GeometryError(f"config: expected a GeometryConfig or None, got {type(config).__name__}")
    return (config or GeometryConfig()).with_overrides(**overrides)
