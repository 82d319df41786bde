"""GeometryConfig: what a model run analyses, validated once.

Fields that depend on the model (layers and heads in range) or on the input
(the default grid's last N, query positions within the sequences) are checked
when the config meets a model, in the run's plan (`tl_geometry.capture.plan`).
"""

import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

import numpy as np
from jaxtyping import Int
from torch import Tensor

from tl_geometry._types import Distance, Ranking
from tl_geometry.errors import GeometryError
from tl_geometry.engine.grid import grid_of
from tl_geometry.engine.metrics import DEFAULT_MEMORY_BUDGET_MIB
from tl_geometry.engine.inputs import check_mib, resolve_n_grid

GridMode = Literal["default", "all"]
QueryMode = Literal["last", "all"]
Capture = Literal["auto", "pattern", "rows"]
DEFAULT_BOOTSTRAP = 200
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


def resolve_indices(name: str, chosen: Sequence[int] | None, size: int, cfg_field: str) -> tuple[int, ...]:
    """Layer or head indices as Python and TransformerLens read them: negative ones count from the end.

    ``None`` is every index; ``-1`` is the last (``size - 1``). GeometryError
    for an index outside ``-size..size-1``, and for two that name one index
    (``[-1, size - 1]``).

    >>> resolve_indices("layers", [0, -1], 30, "n_layers")
    (0, 29)
    """
    if chosen is None:
        return tuple(range(size))
    bad = [i for i in chosen if not -size <= i < size]
    if bad:
        raise GeometryError(
            f"{name}: {bad} out of range; the model has {size} {name} (cfg.{cfg_field}), use indices 0..{size - 1} "
            f"(or -{size}..-1, counted from the end)"
        )
    resolved = tuple(i % size for i in chosen)
    if len(set(resolved)) != len(resolved):
        raise GeometryError(f"{name}: {list(chosen)} name the same index twice on a model with {size} {name} "
                            f"(they read as {list(resolved)}); name each once")
    return resolved


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
            from the first real token of each sequence (0 is the BOS/sink);
            negative positions count from each sequence's end (-1 is its last token).
        layers: layers to analyse (default: all); negative ones count from
            the end, as in Python and TransformerLens (-1 is the last layer).
        heads: query heads to analyse in every analysed layer (default: all);
            negative ones count from the end likewise.
        ranking: ``"attention"`` or ``"contribution"`` (see ``selection_metrics``).
        distance: ``"euclidean"`` or ``"cosine"``.
        prepend_bos: prepend BOS when tokenising strings, so that position 0 is
            the sink (the paper's protocol). Token tensors are used as given.
        memory_budget_mib: working memory of one chunk of metric rows, and of
            the rows path's kept layers; per device where a device map splits
            the model (each layer is analysed on its own device).
        diagnostics: extra statistics computed in the same pass, any of the
            registered diagnostics (``tl_geometry.diagnostics.registry.REGISTRY``):
            ``"assumptions"`` (the paper's Assumptions 1-3: value norms,
            cosine decay, attention profile), ``"bounds"`` (the margins and
            envelopes of Theorems 1-2), ``"roles"`` (the features behind
            the Retriever / Mixer / Reset labels) and ``"chance"`` (what random
            top-N sets score, and the excess of P and R over it); ``"all"``
            for every one, ``"none"`` for none (as ``--diagnostics none``).
            The bounds grow with the square of the keys, the rest about
            linearly; `benchmarks/bench_hooks.py` measures their cost.
        settings: each diagnostic's settings, by diagnostic name: a mapping
            of field values (``{"bounds": {"kappa": 500.0, "variant": "paper"}}``,
            ``{"chance": {"n_controls": 16, "seed": 0}}``) or an instance
            of the diagnostic's ``Settings`` dataclass. Unnamed diagnostics
            use their defaults.
        n_bootstrap: B, the Poisson-bootstrap replicates kept per document
            for confidence intervals over documents (0: none).
        bootstrap_fields: the fields that keep replicates (``result.ci``);
            None: those their diagnostic declares (Recall and rho_0, whose intervals
            the report shows).
        seed: mixed into every document's bootstrap weights.
        keep_queries: also keep every analysed query's values
            (``result.queries``), for circuit work on a few prompts; these
            grow with the documents, everything else does not.
        picture_heads: heads, as ``(layer, head)`` pairs, whose selection is
            kept as a picture (`GeometryResult.picture`): the last analysed
            query of one document (the smallest document hash), with its
            y_i, top-N order, s(N) and both balls for every N. One row per
            head however many documents; default none. The report draws them
            next to the toy Figure 1.
        capture: how the attention rows are obtained. ``"rows"`` runs the
            model's fast attention and builds only the analysed query rows
            with the model's own eager attention code
            (`tl_geometry.capture.rows`; a TransformerBridge whose attention
            goes through Hugging Face's attention interface); ``"pattern"``
            reads ``hook_pattern``, so the model builds every query's pattern
            (eager attention). ``"auto"`` (default) takes the rows where the
            model supports them and no hook is attached to it (a hook on
            ``hook_v`` or ``hook_pattern`` would not fire on the rows path),
            else the pattern, with a warning saying why, given once per
            run (at the line that started it; Python's default warnings
            filter then shows each reason once per calling line). The config
            keeps what was asked; the run's plan decides the path and the
            result records it (``result.provenance["capture"]``).
            Interventions always use the pattern.

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
    settings: Any = ()
    n_bootstrap: int = DEFAULT_BOOTSTRAP
    bootstrap_fields: Sequence | None = None
    seed: int = 0
    keep_queries: bool = False
    picture_heads: Sequence = ()
    capture: str = "auto"

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "diagnostics", _diagnostics(self.diagnostics))
        set_(self, "settings", _settings(self.settings))
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
            set_(self, "query_positions", positions)
        for name in ("layers", "heads"):
            value = getattr(self, name)
            if value is not None:
                # Negative indices count from the end, resolved against the model (capture.plan).
                items = _int_tuple(name, value, "a sequence of integers or None (all)")
                if len(set(items)) != len(items):
                    raise GeometryError(f"{name}: indices must be distinct, got {items}")
                set_(self, name, items)
        if self.ranking not in get_args(Ranking):
            raise _literal_error("ranking", self.ranking, Ranking)
        if self.distance not in get_args(Distance):
            raise _literal_error("distance", self.distance, Distance)
        if not isinstance(self.prepend_bos, bool):
            raise GeometryError(f"prepend_bos: expected True or False, got {self.prepend_bos!r}")
        set_(self, "memory_budget_mib", check_mib(self.memory_budget_mib, "memory_budget_mib"))
        for name in ("n_bootstrap", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise GeometryError(f"{name}: expected an integer >= 0, got {value!r}")
        if self.bootstrap_fields is not None:
            if isinstance(self.bootstrap_fields, str) or not isinstance(self.bootstrap_fields, Sequence):
                raise GeometryError(f"bootstrap_fields: expected a sequence of field names or None, got {self.bootstrap_fields!r}")
            set_(self, "bootstrap_fields", tuple(sorted(set(self.bootstrap_fields))))
        if not isinstance(self.keep_queries, bool):
            raise GeometryError(f"keep_queries: expected True or False, got {self.keep_queries!r}")
        set_(self, "picture_heads", _picture_heads(self.picture_heads))
        if self.capture not in get_args(Capture):
            raise _literal_error("capture", self.capture, Capture)
        from tl_geometry.diagnostics.registry import REGISTRY

        # The one check of the diagnostics (the always-on ones too) against the config: the config is frozen.
        for diagnostic in REGISTRY.active(self.diagnostics):
            diagnostic.check(self)  # e.g. the bounds need the Euclidean distance

    def settings_for(self, diagnostic: str) -> Any:
        """The settings of a diagnostic: those given in ``settings``, else its defaults."""
        from tl_geometry.diagnostics.registry import REGISTRY

        return dict(self.settings).get(diagnostic) or REGISTRY.get(diagnostic).Settings()

    def resolve_bootstrap_fields(self, specs: Any) -> frozenset[str]:
        """The fields among ``specs`` (name -> FieldSpec) that keep bootstrap replicates.

        Raises:
            GeometryError: a name in ``bootstrap_fields`` that the run does not compute.
        """
        if self.bootstrap_fields is None:
            return frozenset(name for name, spec in specs.items() if spec.bootstrap)
        unknown = sorted(set(self.bootstrap_fields) - set(specs))
        if unknown:
            raise GeometryError(
                f"bootstrap_fields: {unknown} are not computed by this run; its fields are {sorted(specs)}"
            )
        return frozenset(self.bootstrap_fields)

    def with_overrides(self, **overrides: Any) -> "GeometryConfig":
        """A copy with some fields replaced; unknown names raise GeometryError listing the valid ones."""
        valid = [f.name for f in fields(self)]
        unknown = sorted(set(overrides) - set(valid))
        if unknown:
            raise GeometryError(f"unknown config field(s) {unknown}; valid names are {valid}")
        return dataclasses.replace(self, **overrides)

    def resolve_n_grid(self, n_keys: int) -> Int[Tensor, " n"]:
        """Deprecated: the grid for inputs whose longest query sees ``n_keys`` keys (`tl_geometry.engine.grid.grid_of`).

        A run decides its grid once, in its plan (`tl_geometry.capture.plan.RunPlan.with_grid`).
        """
        warnings.warn("GeometryConfig.resolve_n_grid is deprecated; a run's grid is its plan's "
                      "(tl_geometry.capture.plan), and the rule is tl_geometry.engine.grid.grid_of(config.n_grid, "
                      "n_keys)", DeprecationWarning, stacklevel=2)
        return grid_of(self.n_grid, n_keys)  # type: ignore[arg-type]

    def to_json(self) -> dict[str, Any]:
        """The fields as JSON-ready values (tuples become lists, settings dicts of their fields)."""
        out = {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v) for f in fields(self)}
        out["settings"] = {name: dataclasses.asdict(value) for name, value in self.settings}
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "GeometryConfig":
        """Inverse of `to_json`; unknown keys raise GeometryError. A diagnostic's former name reads as its name now."""
        return cls().with_overrides(**recorded_as_now(data))


def recorded_as_now(data: Mapping[str, Any]) -> dict[str, Any]:
    """A config as `GeometryConfig.to_json` recorded it, each diagnostic's former name (``"taxonomy"``) as it is now.

    No warning: a saved result or checkpoint is read as it was written, and its reader cannot change it.
    """
    from tl_geometry.diagnostics.registry import REGISTRY

    out = dict(data)
    if isinstance(out.get("diagnostics"), list):
        out["diagnostics"] = [REGISTRY.current_name(n) if isinstance(n, str) else n for n in out["diagnostics"]]
    if isinstance(out.get("settings"), dict):
        out["settings"] = {REGISTRY.current_name(k) if isinstance(k, str) else k: v for k, v in out["settings"].items()}
    return out


def _current(name: Any, where: str) -> Any:
    """A diagnostic's name as it is now; a former name (``"taxonomy"``) with a DeprecationWarning naming the new one."""
    from tl_geometry.diagnostics.registry import REGISTRY

    current = REGISTRY.current_name(name) if isinstance(name, str) else name
    if current != name:
        warnings.warn(f"{where}: the diagnostic {name!r} is now called {current!r}; {name!r} is deprecated",
                      DeprecationWarning, stacklevel=5)  # past this module's frames and the dataclass's __init__
    return current


def _picture_heads(value: Any) -> tuple[tuple[int, int], ...]:
    """``(layer, head)`` pairs, distinct and sorted; GeometryError naming the bad entry."""
    example = "e.g. [(18, 6)] for layer 18, head 6"
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, Tensor, np.ndarray)):
        raise GeometryError(f"picture_heads: expected a sequence of (layer, head) pairs, {example}; got {value!r}")
    pairs = []
    for item in value.tolist() if isinstance(value, (Tensor, np.ndarray)) else value:
        ok = isinstance(item, (Sequence, Tensor, np.ndarray)) and not isinstance(item, (str, bytes)) and len(item) == 2
        entries = list(item.tolist() if isinstance(item, (Tensor, np.ndarray)) else item) if ok else []
        if not ok or any(isinstance(i, bool) or not isinstance(i, (int, np.integer)) or i < 0 for i in entries):
            raise GeometryError(
                f"picture_heads: the entry {item!r} is not a (layer, head) pair of non-negative integers; {example}"
            )
        pairs.append((int(entries[0]), int(entries[1])))
    if len(set(pairs)) != len(pairs):
        raise GeometryError(f"picture_heads: {pairs} names a head twice; name each (layer, head) once")
    return tuple(sorted(pairs))


def _diagnostics(value: Any) -> tuple[str, ...]:
    """The diagnostics as a tuple in registration order; ``"all"`` means every one, ``"none"`` none (as on the CLI)."""
    from tl_geometry.diagnostics.registry import REGISTRY

    allowed = REGISTRY.optional_names()
    if value == "all":
        return allowed
    if value == "none":
        return ()
    if isinstance(value, str):
        value = (value,)  # one name, e.g. diagnostics="roles"
    if not isinstance(value, Sequence):
        raise GeometryError(f"diagnostics: expected 'all', 'none' or a sequence of names from {allowed}, got {value!r}")
    value = [_current(item, "diagnostics") for item in value]
    unknown = [item for item in value if item not in allowed]
    if unknown:
        raise GeometryError(f"diagnostics: unknown name(s) {unknown}; choose from {allowed}, 'all' or 'none'")
    return tuple(name for name in allowed if name in value)


def _settings(value: Any) -> tuple[tuple[str, Any], ...]:
    """Diagnostic settings as a sorted tuple of (name, Settings instance): hashable and comparable."""
    from tl_geometry.diagnostics.registry import REGISTRY

    if isinstance(value, tuple) and all(isinstance(item, tuple) and len(item) == 2 for item in value):
        value = dict(value)
    if not isinstance(value, Mapping):
        raise GeometryError(
            f"settings: expected a mapping of diagnostic name -> settings, e.g. {{'bounds': {{'kappa': 500.0}}}}, "
            f"got {value!r}"
        )
    out = []
    for name, given in value.items():
        name = _current(name, "settings")
        settings_type = REGISTRY.get(name).Settings
        if isinstance(given, settings_type):
            out.append((name, given))
            continue
        if not isinstance(given, Mapping):
            raise GeometryError(f"settings[{name!r}]: expected a mapping or a {settings_type.__name__}, got {given!r}")
        known = [f.name for f in fields(settings_type)]
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise GeometryError(f"settings[{name!r}]: unknown field(s) {unknown}; {settings_type.__name__} has {known}")
        out.append((name, settings_type(**given)))
    return tuple(sorted(out, key=lambda item: item[0]))


def make_config(config: GeometryConfig | None, overrides: dict[str, Any]) -> GeometryConfig:
    """``config`` (default: ``GeometryConfig()``) with ``overrides`` applied."""
    if config is not None and not isinstance(config, GeometryConfig):
        raise GeometryError(f"config: expected a GeometryConfig or None, got {type(config).__name__}")
    base = config or GeometryConfig()
    return base.with_overrides(**overrides) if overrides else base  # made and checked once, not again
