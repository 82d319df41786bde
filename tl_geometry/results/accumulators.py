"""Accumulator: a run's statistics over documents, added one batch at a time, merged exactly.

Each batch of per-document values is reduced to its `FieldStats` (float64)
and merged into the running ones, so memory depends on the fields, layers,
heads, grid, replicates and the longest sequence seen, never on the number of
documents (the opt-in per-query rows excepted). Two accumulators over
disjoint documents merge into the accumulator of their union: counts
exactly, sums up to float64 rounding, whatever the batching or order.

>>> import torch
>>> from tl_geometry.diagnostics.fields import FieldSpec
>>> acc = Accumulator([FieldSpec("recall", "R(r_min, N)", axes=("n",))], layers=(0,), heads=(0, 1),
...                   n_grid=torch.tensor([1, 2]))
>>> acc.add({"recall": torch.tensor([[[[1.0, 0.5], [1.0, float("nan")]]]])}, torch.zeros(1, 0), n_tokens=9)
>>> acc.n_documents, acc.stats["recall"].count.tolist()
(1, [[[1, 1], [1, 0]]])
"""

from collections.abc import Collection, Mapping, Sequence

from jaxtyping import Float, Int
from torch import Tensor

from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.errors import GeometryError
from tl_geometry.results.queries import QueryRows, check_rows, join_rows
from tl_geometry.results.stats import FieldStats, batch_stats, merge_stats


class Accumulator:
    """Exact, mergeable statistics of declared fields over documents, per layer and head.

    Args:
        specs: the declared fields (one `FieldSpec` each, distinct names).
        layers, heads: the layers and query heads analysed (axes ``layer``, ``head_index``).
        n_grid: the selection sizes N (length of every ``"n"`` axis).
        n_bootstrap: Poisson-bootstrap replicates per document (0: none).
        replicate_fields: names of the fields that keep replicates (ignored when n_bootstrap is 0).
        keep_queries: also keep per-query rows (they grow with the documents).
        axis_sizes: sizes of fixed trailing axes other than ``"n"`` (e.g. ``{"control": 16}``).
    """

    def __init__(
        self,
        specs: Sequence[FieldSpec],
        *,
        layers: Sequence[int],
        heads: Sequence[int],
        n_grid: Int[Tensor, " n"],
        n_bootstrap: int = 0,
        replicate_fields: Collection[str] = (),
        keep_queries: bool = False,
        axis_sizes: Mapping[str, int] | None = None,
    ) -> None:
        names = [spec.name for spec in specs]
        if not names or len(set(names)) != len(names):
            raise GeometryError(f"specs: expected at least one field and distinct names, got {names}")
        unknown = sorted(set(replicate_fields) - set(names))
        if unknown:
            raise GeometryError(f"replicate_fields: {unknown} are not declared fields; choose from {names}")
        if isinstance(n_bootstrap, bool) or not isinstance(n_bootstrap, int) or n_bootstrap < 0:
            raise GeometryError(f"n_bootstrap: expected an integer >= 0 (0: no replicates), got {n_bootstrap!r}")
        self.specs = {spec.name: spec for spec in specs}
        self.layers, self.heads = tuple(int(i) for i in layers), tuple(int(i) for i in heads)
        self.n_grid = n_grid.detach().cpu().long().clone()
        self.n_bootstrap = n_bootstrap
        self.replicate_fields = frozenset(replicate_fields) if n_bootstrap else frozenset()
        self.keep_queries = keep_queries
        self.axis_sizes = dict(axis_sizes or {})
        self.n_documents = 0
        self.n_tokens = 0
        shape = (len(self.layers), len(self.heads))
        self.stats: dict[str, FieldStats] = {
            name: FieldStats.empty(
                spec, (*shape, *self._trailing(spec, ())), n_bootstrap if name in self.replicate_fields else None
            )
            for name, spec in self.specs.items()
        }
        self.queries: QueryRows | None = None

    def _trailing(self, spec: FieldSpec, given: Sequence[int]) -> tuple[int, ...]:
        """Trailing sizes: the grid's for "n", the given ones (0 if none) for growing axes."""
        given = list(given) or [self.axis_sizes.get(axis, 0) for axis in spec.axes]
        return tuple(len(self.n_grid) if axis == "n" else given[i] for i, axis in enumerate(spec.axes))

    def add(
        self,
        values: Mapping[str, Tensor],
        weights: Float[Tensor, "doc replicate"],
        n_tokens: int,
        *,
        queries: Mapping[str, Tensor] | None = None,
        query_positions: Int[Tensor, "doc query"] | None = None,
    ) -> None:
        """Add a batch of documents.

        Args:
            values: every declared field, ``[doc, layer, head_index, *trailing]``
                per document (NaN: undefined there, not counted; +-inf are
                values). Position and lag axes may have any width (the batch's
                longest sequence); narrower ones count as undefined beyond.
            weights: the documents' bootstrap weights, ``[doc, n_bootstrap]``
                (see `tl_geometry.results.bootstrap.document_weights`).
            n_tokens: real tokens in the batch.
            queries, query_positions: per-query rows ``[doc, layer, head_index,
                query, *trailing]`` and their positions ``[doc, query]`` (-1:
                none), only with ``keep_queries=True``.
        """
        n_docs = weights.shape[0]
        if weights.shape[1] != self.n_bootstrap:
            raise GeometryError(
                f"weights: expected [doc, replicate] with {self.n_bootstrap} replicates (n_bootstrap), got "
                f"{list(weights.shape)}"
            )
        if sorted(values) != sorted(self.specs):
            raise GeometryError(
                f"values: expected exactly the declared fields {sorted(self.specs)}, got {sorted(values)}; "
                "a batch must measure every field (NaN where undefined)"
            )
        if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 0:
            raise GeometryError(f"n_tokens: expected the batch's number of real tokens (an int >= 0), got {n_tokens!r}")
        batch = {}
        for name, spec in self.specs.items():
            t = values[name]
            given = t.shape[3:] if t.ndim == 3 + len(spec.axes) else ()
            expected = (n_docs, len(self.layers), len(self.heads), *self._trailing(spec, given))
            if tuple(t.shape) != expected or not t.is_floating_point():
                axes = ", ".join(("doc", "layer", "head_index", *spec.axes))
                raise GeometryError(
                    f"values[{name!r}]: expected a float tensor [{axes}] = {list(expected)} (position and lag "
                    f"axes any width), got {t.dtype} {list(t.shape)}"
                )
            batch[name] = batch_stats(spec, t, weights if name in self.replicate_fields else None)
        rows = self._query_rows(queries, query_positions, n_docs)
        self.stats = {name: merge_stats(self.stats[name], batch[name]) for name in self.specs}
        self.n_documents += n_docs
        self.n_tokens += n_tokens
        if rows is not None:
            self.queries = rows if self.queries is None else join_rows([self.queries, rows])

    def _query_rows(
        self, queries: Mapping[str, Tensor] | None, positions: Tensor | None, n_docs: int
    ) -> QueryRows | None:
        if not self.keep_queries:
            if queries is not None or positions is not None:
                raise GeometryError("queries: this accumulator was made with keep_queries=False; pass keep_queries=True")
            return None
        if queries is None or positions is None:
            raise GeometryError("queries: keep_queries=True needs queries and query_positions with every batch")
        unknown = sorted(set(queries) - set(self.specs))
        if unknown:
            raise GeometryError(f"queries: {unknown} are not declared fields; choose from {sorted(self.specs)}")
        check_rows(queries, positions, n_docs, (len(self.layers), len(self.heads)))
        return {name: t.detach().cpu() for name, t in queries.items()}, positions.detach().cpu().long()

    def merge(self, other: "Accumulator") -> "Accumulator":
        """A new accumulator over the documents of both (neither is changed).

        Raises:
            GeometryError: they differ in fields, layers, heads, grid,
                replicates or keep_queries (the message names which).
        """
        checks = {
            "fields": (list(self.specs.values()), list(other.specs.values())),
            "layers": (self.layers, other.layers),
            "heads": (self.heads, other.heads),
            "n_grid": (self.n_grid.tolist(), other.n_grid.tolist()),
            "n_bootstrap": (self.n_bootstrap, other.n_bootstrap),
            "replicate_fields": (sorted(self.replicate_fields), sorted(other.replicate_fields)),
            "keep_queries": (self.keep_queries, other.keep_queries),
        }
        for what, (mine, theirs) in checks.items():
            if mine != theirs:
                raise GeometryError(
                    f"merge: the accumulators differ in {what} ({mine!r} vs {theirs!r}); only runs with one "
                    "config merge"
                )
        out = object.__new__(Accumulator)
        out.__dict__.update(self.__dict__)
        out.stats = {name: merge_stats(self.stats[name], other.stats[name]) for name in self.specs}
        out.n_documents = self.n_documents + other.n_documents
        out.n_tokens = self.n_tokens + other.n_tokens
        parts = [rows for rows in (self.queries, other.queries) if rows is not None]
        out.queries = join_rows(parts) if parts else None
        return out

    @property
    def nbytes(self) -> int:
        """Memory held by the statistics (per-query rows excluded), in bytes."""
        return sum(t.element_size() * t.numel() for s in self.stats.values() for t in s.arrays().values())

    def stored_stats(self) -> dict[str, FieldStats]:
        """The statistics in the dtypes a result keeps."""
        return {name: s.stored() for name, s in self.stats.items()}
