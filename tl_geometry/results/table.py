"""The statistics table every result kind is: field statistics over documents, per layer and head.

A `GeometryResult` (the selection metrics and diagnostics of a run) and an
`InterventionResult` (the dNLL of a top-N sweep) are both a table of
`FieldStats` on ``[layer, head_index, *trailing]`` with an N grid, plus what
is theirs. Reading a field, its bootstrap replicates and their interval,
selecting by real labels, merging the statistics of disjoint documents and
comparing them bit for bit are written here once.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from jaxtyping import Float, Int
from torch import Tensor

from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.errors import GeometryError
from tl_geometry.results.display import Summary
from tl_geometry.results.select import nanquantile, take
from tl_geometry.results.stats import FieldStats, merge_stats, same_values


FieldName = str | FieldSpec
"""A field as a reader names it: its declaration (e.g. ``tl_geometry.diagnostics.selection.PRECISION``) or its name."""


def field_name(field: FieldName) -> str:
    """The name of a field given by name or by declaration."""
    return field.name if isinstance(field, FieldSpec) else field


def check_level(level: float) -> None:
    if not 0 < level < 1:
        raise GeometryError(f"level: expected a coverage in (0, 1), e.g. 0.95, got {level}")


def percentile_ci(replicates: Float[Tensor, "replicate *rest"], level: float) -> tuple[Tensor, Tensor]:
    """The ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of replicate means (linear interpolation,
    NaN replicates left out); the caller checks ``level`` first (`check_level`)."""
    tail = (1 - level) / 2
    return nanquantile(replicates, tail), nanquantile(replicates, 1 - tail)


@dataclass(frozen=True)
class StatisticsTable:
    """What every result kind shares: its grid, labels, field statistics, documents and tokens (the first
    fields of every result kind, which adds its own after them)."""

    n_grid: Int[Tensor, " n"]
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    stats: Mapping[str, FieldStats]
    n_documents: int
    n_tokens: int
    kind: ClassVar[str] = "result"  # how messages name the table

    def _summary(self) -> Summary:
        raise NotImplementedError  # each result kind says what a reader needs first

    def __repr__(self) -> str:
        # A summary, not every tensor (the dataclass default printed ~180,000 characters for one prompt).
        return self._summary().text()

    def _repr_html_(self) -> str:
        return self._summary().html()

    @property
    def fields(self) -> tuple[str, ...]:
        """Names of the fields held, in declaration order."""
        return tuple(self.stats)

    @property
    def n_bootstrap(self) -> int:
        """Bootstrap replicates kept (0 if no field keeps any)."""
        return max((s.n_replicates for s in self.stats.values()), default=0)

    def _stats(self, name: FieldName) -> FieldStats:
        name = field_name(name)
        if name not in self.stats:
            raise GeometryError(f"unknown field {name!r}; this {self.kind} has {sorted(self.stats)}")
        return self.stats[name]

    # ---- one way to read a field of every result kind: its declaration, mean, count, spread, replicates ----

    def spec(self, name: FieldName) -> FieldSpec:
        """The declaration of field ``name``."""
        return self._stats(name).spec

    def _moments(self, name: FieldName, what: str) -> FieldStats:
        s = self._stats(name)
        if s.spec.documents != "moments":
            raise GeometryError(
                f"{what}: field {s.spec.name!r} is declared with documents={s.spec.documents!r} (count and sum only), so "
                "its spread over documents was not kept; only its mean and count are available"
            )
        return s

    def per_head(self, name: FieldName) -> Float[Tensor, "layer head_index *rest"]:
        """Mean of field ``name`` over documents, ``[layer, head_index, ...]`` (float64).

        NaN where no document defined it; +inf kept (as ``torch.nanmean`` does).
        """
        return self._stats(name).mean()

    def count(self, name: FieldName) -> Int[Tensor, "layer head_index *rest"]:
        """Documents where field ``name`` is defined, ``[layer, head_index, ...]``."""
        return self._stats(name).count.clone()

    def std(self, name: FieldName) -> Float[Tensor, "layer head_index *rest"]:
        """Sample standard deviation over documents (ddof = 1); NaN with fewer than 2 documents."""
        return self._moments(name, "std").std()

    def has_replicates(self, name: FieldName) -> bool:
        """Whether field ``name`` kept bootstrap replicates (so that `ci` and `replicates` work)."""
        return bool(self._stats(name).n_replicates)

    def _replicate_means(self, name: FieldName, how_to_keep: str) -> Float[Tensor, "replicate layer head_index *rest"]:
        s = self._stats(name)
        if not s.n_replicates:
            raise GeometryError(f"replicates: field {s.spec.name!r} kept no bootstrap replicates; {how_to_keep}")
        return s.replicate_means()

    def _select(self, t: Tensor, axes: Sequence[str], layer: Any, head: Any, n: Any) -> Tensor:
        """``t`` ``[layer, head_index, *axes]`` at real layer numbers, head numbers and N values."""
        if "n" in axes:  # innermost first, so the positions of the outer axes do not move
            t = take(t, 2 + list(axes).index("n"), "n", tuple(self.n_grid.tolist()), n)
        t = take(t, 1, "head", self.heads, head)
        return take(t, 0, "layer", self.layers, layer)

    def _check_mergeable(self, other: "StatisticsTable", checks: Mapping[str, tuple[Any, Any]], verb: str,
                         advice: str) -> None:
        """Refuse ``other`` if its grid, labels, fields or any of ``checks`` differ, naming what."""
        common = {
            "layers": (self.layers, other.layers),
            "heads": (self.heads, other.heads),
            "n_grid": (self.n_grid.tolist(), other.n_grid.tolist()),
            "fields": (sorted(self.fields), sorted(other.fields)),
        }
        for what, (mine, theirs) in {**checks, **common}.items():
            if mine != theirs:
                raise GeometryError(f"{verb}: the {self.kind}s differ in {what} ({mine!r} vs {theirs!r}); {advice}")

    def _merged_stats(self, others: Sequence["StatisticsTable"]) -> dict[str, Any]:
        """The statistics, documents and tokens of this table and ``others`` (disjoint documents) together."""
        stats = dict(self.stats)
        for other in others:
            stats = {name: merge_stats(stats[name], other.stats[name]) for name in stats}
        return {"stats": stats, "n_documents": self.n_documents + sum(o.n_documents for o in others),
                "n_tokens": self.n_tokens + sum(o.n_tokens for o in others)}

    def _same_statistics(self, other: "StatisticsTable") -> bool:
        """Grid, labels, documents, declarations and every statistic equal bit for bit (NaN equal to NaN)."""
        if (self.layers, self.heads, self.n_documents, self.n_tokens, self.fields) != (
            other.layers, other.heads, other.n_documents, other.n_tokens, other.fields
        ):
            return False
        pairs = [(self.n_grid, other.n_grid)]
        for name, s in self.stats.items():
            t = other.stats[name]
            if s.spec != t.spec or list(s.arrays()) != list(t.arrays()):
                return False
            pairs += [(s.arrays()[k], t.arrays()[k]) for k in s.arrays()]
        return all(same_values(a, b) for a, b in pairs)
