"""The diagnostics a run can compute, and the one registry that lists them.

A diagnostic is a small component (`Diagnostic`) that declares its name, its
output fields (`FieldSpec`), its settings (a frozen dataclass reachable from
`GeometryConfig.settings`), and the extra memory it needs per row of a
chunk. The hooks, the results and the report ask the registry what exists;
adding a diagnostic means writing one module and adding it to `_BUILT_IN`.

A field name declared twice is an error at registration, never an
overwrite: no diagnostic can silently replace another's field (for example
a second ``recall``).
"""

import dataclasses
import importlib
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from torch import Tensor

from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.engine.context import RowCost, SelectionChunk, SelectionContext
from tl_geometry.errors import GeometryError


@dataclasses.dataclass(frozen=True)
class NoSettings:
    """Settings of a diagnostic that has none."""


class Diagnostic:
    """Base of every diagnostic: declarations as class attributes, computation as two methods.

    Attributes:
        name: what ``GeometryConfig(diagnostics=[...])`` calls it.
        fields: the fields it returns, each declared once.
        Settings: its settings dataclass (frozen, every field with a default).
        cost: extra working memory per row of a chunk (see `tl_geometry.engine.context.RowCost`).
        always: computed on every run (the selection metrics), not only when asked for.
    """

    name: ClassVar[str]
    fields: ClassVar[tuple[FieldSpec, ...]]
    Settings: ClassVar[type] = NoSettings
    cost: ClassVar[RowCost] = RowCost()
    always: ClassVar[bool] = False
    former_names: ClassVar[tuple[str, ...]] = ()
    """Names it had before: a config that says one still means it, with a DeprecationWarning; a file or
    checkpoint that recorded one loads as if it said the name now."""
    former_fields: ClassVar[Mapping[str, FieldSpec]] = {}
    """Field names it stored before -> the field each is now (results and checkpoints written then load and
    merge with new ones)."""

    def check(self, config: Any) -> None:
        """Raise GeometryError if the diagnostic cannot honour ``config`` (e.g. an unsupported distance)."""

    def declared(self, out: dict[str, Tensor], method: str) -> dict[str, Tensor]:
        """``out`` (what `rows` or `sequences` returned), after checking that it declares every field in it."""
        undeclared = set(out).difference(spec.name for spec in self.fields)
        if undeclared:
            raise GeometryError(
                f"diagnostic {self.name!r}: {method} returned {sorted(undeclared)}, which it does not declare; "
                "add a FieldSpec for each to its fields"
            )
        return out

    def rows(self, chunk: SelectionChunk, settings: Any) -> dict[str, Tensor]:
        """Per-row values ``[row, *trailing]`` of the fields declared with ``queries="mean"``."""
        return {}

    def sequences(self, context: SelectionContext, settings: Any) -> dict[str, Tensor]:
        """Per-sequence values ``[batch, head_index, *trailing]`` of the ``"last"`` and ``"sequence"`` fields."""
        return {}


# Modules that define the built-in diagnostics, imported on first use so that
# importing tl_geometry stays cheap. Each defines ``DIAGNOSTIC``.
_BUILT_IN = (
    "tl_geometry.diagnostics.selection",
    "tl_geometry.diagnostics.assumptions",
    "tl_geometry.diagnostics.bounds",
    "tl_geometry.diagnostics.role_features",
    "tl_geometry.diagnostics.chance",
)


class Registry:
    """Diagnostics by name, and every declared field by name."""

    def __init__(self, built_in: bool = True) -> None:
        """``built_in=False``: an empty registry (only what you register), e.g. to try a diagnostic alone."""
        self._diagnostics: dict[str, Diagnostic] = {}
        self._fields: dict[str, tuple[FieldSpec, str]] = {}
        self._loaded = not built_in

    def register(self, diagnostic: Diagnostic) -> Diagnostic:
        """Add a diagnostic; GeometryError if its name or one of its field names is taken."""
        self._load()
        return self._add(diagnostic)

    def unregister(self, name: str) -> Diagnostic:
        """Remove a diagnostic you registered, and its fields (to register it again after an edit, say).

        Raises:
            GeometryError: ``name`` is not registered, or is built in.
        """
        diagnostic = self.get(name)
        if type(diagnostic).__module__ in _BUILT_IN:
            raise GeometryError(f"diagnostic {name!r} is built in; only diagnostics you registered can be removed")
        del self._diagnostics[name]
        for spec in diagnostic.fields:
            del self._fields[spec.name]
        return diagnostic

    def _add(self, diagnostic: Diagnostic) -> Diagnostic:
        if diagnostic.name in self._diagnostics:
            raise GeometryError(f"diagnostic {diagnostic.name!r} is already registered; choose another name")
        names = [spec.name for spec in diagnostic.fields]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise GeometryError(f"diagnostic {diagnostic.name!r} declares the field(s) {repeated} more than once")
        for name in names:
            if name in self._fields:
                owner = self._fields[name][1]
                raise GeometryError(
                    f"diagnostic {diagnostic.name!r} declares the field {name!r}, which diagnostic {owner!r} "
                    "already declares; a field has one owner, rename it"
                )
        if not (dataclasses.is_dataclass(diagnostic.Settings) and diagnostic.Settings.__dataclass_params__.frozen):
            raise GeometryError(f"diagnostic {diagnostic.name!r}: Settings must be a frozen dataclass")
        self._diagnostics[diagnostic.name] = diagnostic
        for spec in diagnostic.fields:
            self._fields[spec.name] = (spec, diagnostic.name)
        return diagnostic

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for module in _BUILT_IN:
            self._add(importlib.import_module(module).DIAGNOSTIC)

    def names(self) -> tuple[str, ...]:
        """Every diagnostic's name, in registration order."""
        self._load()
        return tuple(self._diagnostics)

    def optional_names(self) -> tuple[str, ...]:
        """The names ``GeometryConfig(diagnostics=...)`` accepts (the always-on ones are implied)."""
        return tuple(name for name, d in self._items() if not d.always)

    def get(self, name: str) -> Diagnostic:
        self._load()
        if name not in self._diagnostics:
            raise GeometryError(f"diagnostics: unknown name {name!r}; choose from {self.optional_names()} or 'all'")
        return self._diagnostics[name]

    def current_name(self, name: str) -> str:
        """``name``, or the name now of the diagnostic that was called ``name`` before (`Diagnostic.former_names`)."""
        return next((d.name for _, d in self._items() if name in d.former_names), name)

    def current_field(self, name: str) -> str:
        """``name``, or the name now of the field once stored as ``name`` (`Diagnostic.former_fields`)."""
        return next((d.former_fields[name].name for _, d in self._items() if name in d.former_fields), name)

    def active(self, names: Iterable[str]) -> tuple[Diagnostic, ...]:
        """The always-on diagnostics followed by ``names``, in registration order."""
        wanted = set(names)
        return tuple(d for name, d in self._items() if d.always or name in wanted)

    def field(self, name: str) -> FieldSpec:
        self._load()
        if name not in self._fields:
            raise GeometryError(f"unknown field {name!r}; declared fields are {sorted(self._fields)}")
        return self._fields[name][0]

    def owner(self, name: str) -> str:
        """The diagnostic that declares field ``name``."""
        self.field(name)
        return self._fields[name][1]

    def fields_of(self, diagnostics: Iterable[Diagnostic]) -> Mapping[str, FieldSpec]:
        """Every field the given diagnostics declare, by name."""
        return {spec.name: spec for d in diagnostics for spec in d.fields}

    def _items(self) -> list[tuple[str, Diagnostic]]:
        self._load()
        return list(self._diagnostics.items())


REGISTRY = Registry()
"""The diagnostics of this installation."""
