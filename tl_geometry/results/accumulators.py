"""Accumulator: a run's statistics over documents, added one batch at a time, merged exactly.

Each batch of per-document values is reduced to its `FieldStats` (float64)
and merged into the running ones, written into their tensors where the
accumulator alone holds them (never into what it handed to a result, a
merge or a state), so memory depends on the fields, layers, heads, grid,
replicates and the longest sequence seen, never on the number of documents
(the opt-in per-query rows excepted; the opt-in pictures keep one row per
head, see `tl_geometry.results.selection_picture`), and a steady add leaves
no new tensor behind. Two accumulators over
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

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.errors import GeometryError
from tl_geometry.results.selection_picture import SelectionPicture, pick
from tl_geometry.results.queries import QueryRows, check_rows, join_rows
from tl_geometry.results.stats import FieldStats, batch_stats, merge_stats

# Version of `Accumulator.state_dict`; a checkpoint of another version is refused.
STATE_VERSION = 1


class Accumulator:
    """Exact, mergeable statistics of declared fields over documents, per layer and head.

    Args:
        specs: the declared fields (one `FieldSpec` each, distinct names).
        layers: the layers analysed (axis ``layer``).
        heads: the query heads analysed (axis ``head_index``).
        n_grid: the selection sizes N (length of every ``"n"`` axis).
        n_bootstrap: Poisson-bootstrap replicates per document (0: none).
        replicate_fields: names of the fields that keep replicates (ignored when n_bootstrap is 0).
        keep_queries: also keep per-query rows (they grow with the documents).
        axis_sizes: sizes of fixed trailing axes other than ``"n"`` (e.g. ``{"control": 16}``).
        picture_heads: the ``(layer, head)`` pairs whose pictures the run keeps
            (`tl_geometry.results.selection_picture`); processes gather pictures only when
            there are some.
        document_rows: keep each field's documents as rows while they are
            fewer than its sums are large (`tl_geometry.results.stats`): a run
            of a few documents then holds their values, replicates computed
            from them when asked for.
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
        picture_heads: Sequence[tuple[int, int]] = (),
        document_rows: bool = False,
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
        self.document_rows = document_rows
        self.n_documents = 0
        self.n_tokens = 0
        shape = (len(self.layers), len(self.heads))
        self.stats: dict[str, FieldStats] = {
            name: FieldStats.empty(
                spec, (*shape, *self._trailing(spec, ())), n_bootstrap if name in self.replicate_fields else None,
                rows=document_rows,
            )
            for name, spec in self.specs.items()
        }
        # The fields whose statistics this accumulator made itself and has handed to no one (a result, a merge):
        # an add writes a batch into them in place, so that a steady add leaves no new tensor behind but its
        # batch's; any other field's next add merges into new tensors, which it then owns.
        self._own: set[str] = set(self.specs)
        self.queries: QueryRows | None = None
        self.picture_heads = tuple(picture_heads)
        self.pictures: dict[tuple[int, int], SelectionPicture] = {}

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
        pictures: Sequence[SelectionPicture] = (),
        resampled: Mapping[str, Tensor] | None = None,
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
            queries: per-query rows ``[doc, layer, head_index, query,
                *trailing]``, only with ``keep_queries=True``.
            query_positions: their positions ``[doc, query]`` (-1: none),
                only with ``keep_queries=True``.
            pictures: the batch's pictures (at most one per head); each head
                keeps the one of the smallest document hash seen so far.
            resampled: for fields declared with ``resample_queries`` that keep
                replicates, each document's query-resampled means per
                replicate, ``[doc, replicate, layer, head_index, *trailing]``
                (the second stage of the bootstrap); replicate b adds
                w[d, b] times its own mean b instead of the document's mean.
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
            within = self._resampled(name, resampled, t)
            batch[name] = batch_stats(spec, t, weights if name in self.replicate_fields else None, within,
                                      rows=self.document_rows)
        rows = self._query_rows(queries, query_positions, n_docs)
        # One field at a time, each replacing its old statistics before the next is merged: a merge into new
        # tensors then holds one field twice, not the whole accumulator (replicate sums of every field, old and
        # new, at once).
        for name in self.specs:
            old = self.stats[name]
            self.stats[name] = merge_stats(old, batch[name], into=name in self._own)
            if not _shared(self.stats[name], old):
                self._own.add(name)
        self._share_weights()
        self.n_documents += n_docs
        self.n_tokens += n_tokens
        if rows is not None:
            self.queries = rows if self.queries is None else join_rows([self.queries, rows])
        self.pictures = pick(self.pictures.values(), pictures)

    def _share_weights(self) -> None:
        """Fields kept as rows whose documents carry the same bootstrap weights hold one tensor of them (each
        join of rows makes its own: [document, replicate] float64 per field). Rows are never written into."""
        distinct: list[Tensor] = []
        for name, s in self.stats.items():
            if not s.is_rows or not s.n_replicates:
                continue
            w = s.document_weights
            same = next((d for d in distinct if d.shape == w.shape and torch.equal(d, w)), None)
            if same is None:
                distinct.append(w)
            elif same is not w:
                self.stats[name] = replace(s, document_weights=same)

    def _resampled(self, name: str, resampled: Mapping[str, Tensor] | None, values: Tensor) -> Tensor | None:
        """The query-resampled replicate means of field ``name``, checked; None for the other fields."""
        wanted = self.specs[name].resample_queries and name in self.replicate_fields
        given = resampled is not None and name in resampled
        if wanted != given:
            raise GeometryError(
                f"resampled: field {name!r} {'needs' if wanted else 'takes no'} query-resampled replicate means "
                f"(declared resample_queries={self.specs[name].resample_queries}, keeps replicates: "
                f"{name in self.replicate_fields})"
            )
        if not given:
            return None
        t = resampled[name]  # type: ignore[index]
        expected = (values.shape[0], self.n_bootstrap, *values.shape[1:])
        if tuple(t.shape) != expected:
            raise GeometryError(f"resampled[{name!r}]: expected [doc, replicate, layer, head_index, ...] = {list(expected)}, got {list(t.shape)}")
        return t

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
        out._own = self._handed(out.stats, other)
        out.n_documents = self.n_documents + other.n_documents
        out.n_tokens = self.n_tokens + other.n_tokens
        parts = [rows for rows in (self.queries, other.queries) if rows is not None]
        out.queries = join_rows(parts) if parts else None
        out.picture_heads = tuple(sorted(set(self.picture_heads) | set(other.picture_heads)))
        out.pictures = pick(self.pictures.values(), other.pictures.values())
        return out

    @property
    def nbytes(self) -> int:
        """Memory held by the statistics (per-query rows excluded), in bytes: every tensor a field holds (a field
        kept as rows holds the sums computed from them beside the rows), a tensor held by several fields (the
        weights of their rows) once."""
        held = {(t.data_ptr(), t.dtype, t.numel()): t.element_size() * t.numel()
                for s in self.stats.values() for t in vars(s).values() if isinstance(t, Tensor)}
        return sum(held.values())

    def stored_stats(self) -> dict[str, FieldStats]:
        """The statistics in the dtypes a result keeps (sharing the tensors already in those dtypes: later adds
        merge those fields into new tensors, so the result never changes)."""
        stored = {name: s.stored() for name, s in self.stats.items()}
        self._handed(stored)
        return stored

    def _handed(self, stats: Mapping[str, FieldStats], *others: "Accumulator") -> set[str]:
        """``stats`` made from this accumulator's (and ``others``') leave the field of any tensor they share with
        one of them to be written into no more; the fields of ``stats`` that share nothing, which their holder
        may write into."""
        alone = set()
        for name, s in stats.items():
            shared = False
            for acc in (self, *others):
                if _shared(s, acc.stats[name]):
                    acc._own.discard(name)
                    shared = True
            if not shared:
                alone.add(name)
        return alone

    # ---- state: checkpoints and cross-process reduction ----

    def layout(self) -> dict[str, Any]:
        """What two accumulators must share to be merged or restored into one another (plain values)."""
        return {
            "fields": [[spec.name, spec.documents, list(spec.axes)] for spec in self.specs.values()],
            "layers": list(self.layers),
            "heads": list(self.heads),
            "n_grid": self.n_grid.tolist(),
            "n_bootstrap": self.n_bootstrap,
            "replicate_fields": sorted(self.replicate_fields),
            "keep_queries": self.keep_queries,
        }

    def state_dict(self) -> dict[str, Any]:
        """Everything the accumulator holds, as plain values and CPU tensors (loadable with ``weights_only=True``).

        >>> from tl_geometry.diagnostics.fields import FieldSpec
        >>> acc = Accumulator([FieldSpec("recall", "R", axes=("n",))], layers=(0,), heads=(0,), n_grid=torch.tensor([1]))
        >>> acc.add({"recall": torch.tensor([[[[0.5]]]])}, torch.zeros(1, 0), n_tokens=3)
        >>> copy = Accumulator([FieldSpec("recall", "R", axes=("n",))], layers=(0,), heads=(0,), n_grid=torch.tensor([1]))
        >>> copy.load_state_dict(acc.state_dict())
        >>> copy.n_documents, copy.stats["recall"].total.tolist()
        (1, [[[0.5]]])
        """
        queries = None
        if self.queries is not None:
            values, positions = self.queries
            queries = {"values": {name: t.clone() for name, t in values.items()}, "positions": positions.clone()}
        return {
            "version": STATE_VERSION,
            "layout": self.layout(),
            "n_documents": self.n_documents,
            "n_tokens": self.n_tokens,
            "stats": {name: {k: t.clone() for k, t in s.arrays().items()} for name, s in self.stats.items()},
            "queries": queries,
            "pictures": [{**p.metadata(), **{k: t.clone() for k, t in p.arrays().items()}} for p in self.pictures.values()],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replace the statistics by those of `state_dict` of an accumulator with the same layout.

        Raises:
            GeometryError: another state version, or a layout that differs (the message names what).
        """
        if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION:
            found = state.get("version") if isinstance(state, Mapping) else type(state).__name__
            raise GeometryError(
                f"accumulator state: expected version {STATE_VERSION}, got {found!r}; it was written by another "
                "tl_geometry version, start the run again"
            )
        state = _fields_as_now(state)
        mine, theirs = self.layout(), state["layout"]
        for key, value in mine.items():
            if theirs.get(key) != value:
                raise GeometryError(
                    f"accumulator state: differs in {key} ({theirs.get(key)!r} saved vs {value!r} now); it belongs "
                    "to a run with another config or model"
                )
        self.stats = {name: FieldStats.from_arrays(spec, state["stats"][name]) for name, spec in self.specs.items()}
        self._own = set()  # the state's tensors are its holder's
        self.n_documents, self.n_tokens = int(state["n_documents"]), int(state["n_tokens"])
        queries = state["queries"]
        self.queries = None if queries is None else (dict(queries["values"]), queries["positions"])
        self.pictures = pick(SelectionPicture.from_parts(p, p) for p in state.get("pictures", ()))

    def reduced(
        self,
        all_reduce: Callable[[Tensor, str], Tensor],
        gather_queries: Callable[[Any], list[Any]] | None = None,
    ) -> "Accumulator":
        """The accumulator of the documents of every process, from collective operations (this one unchanged).

        Growing axes are first widened to the widest any process saw; then
        counts, sums and replicate sums are added, minima and maxima combined
        (a statistic with no document anywhere stays NaN), and per-query rows
        gathered. The collectives are injected so that this stays free of
        ``torch.distributed`` (see `tl_geometry.runs.distributed`).

        Args:
            all_reduce: ``all_reduce(tensor, op)`` with op ``"sum"``, ``"min"`` or
                ``"max"``: the elementwise reduction over processes, a new tensor.
            gather_queries: ``gather(obj)``: the list of every process's object,
                in rank order (needed only with per-query rows or pictures).
        """
        names = list(self.specs)
        # Rows cannot be added across processes: every process turns its rows into sums first, and where every
        # process keeps a field as rows or groups of documents they are also gathered and joined (`merge_stats`),
        # as one process would have kept them (a profile's replicates live only in its rows or groups).
        held = torch.tensor([s.is_rows or s.is_grouped for s in self.stats.values()] or [False], dtype=torch.int64)
        everywhere = all_reduce(held, "min").tolist() if gather_queries is not None else [0] * len(held)
        as_rows = [name for name, flag in zip(names, everywhere) if flag]
        summed = {name: s.summed().ungrouped() for name, s in self.stats.items()}
        widths = torch.tensor([n for name in names for n in summed[name].trailing] or [0], dtype=torch.int64)
        widths = all_reduce(widths, "max").tolist()
        stats, at = {}, 0
        for name in names:
            size = len(summed[name].trailing)
            stats[name] = summed[name].widened(tuple(int(n) for n in widths[at : at + size]))
            at += size
        # One collective per kind of reduction: pack every statistic of every field into one flat tensor.
        kinds = {"count": "sum", "minimum": "min", "maximum": "max"}
        packed: dict[str, list[tuple[str, str, Tensor]]] = {"sum": [], "min": [], "max": []}
        for name in names:
            for statistic, t in stats[name].arrays().items():
                packed[kinds.get(statistic, "sum")].append((name, statistic, t))
        counts = torch.cat([t.flatten() for _, s, t in packed["sum"] if s == "count"]
                           + [torch.tensor([self.n_documents, self.n_tokens], dtype=torch.int64)])
        sums = [(n, s, t) for n, s, t in packed["sum"] if s != "count"]
        out: dict[str, dict[str, Tensor]] = {name: {} for name in names}

        def unpack(flat: Tensor, entries: list[tuple[str, str, Tensor]]) -> None:
            at = 0
            for name, statistic, t in entries:
                out[name][statistic] = flat[at : at + t.numel()].reshape(t.shape).to(t.dtype)
                at += t.numel()

        reduced_counts = all_reduce(counts, "sum")
        unpack(reduced_counts, [e for e in packed["sum"] if e[1] == "count"])
        if sums:
            unpack(all_reduce(torch.cat([t.double().flatten() for _, _, t in sums]), "sum"), sums)
        for op, fill in (("min", math.inf), ("max", -math.inf)):
            if packed[op]:  # NaN (nothing counted here) must lose, so it travels as the neutral element
                flat = torch.cat([t.double().flatten().nan_to_num(nan=fill, posinf=math.inf, neginf=-math.inf)
                                  for _, _, t in packed[op]])
                unpack(all_reduce(flat, op), packed[op])
        for name in names:
            for statistic in ("minimum", "maximum"):
                if statistic in out[name]:
                    out[name][statistic] = out[name][statistic].masked_fill(out[name]["count"] == 0, math.nan)
        result = object.__new__(Accumulator)
        result.__dict__.update(self.__dict__)
        result.stats = {name: FieldStats(spec=self.specs[name], **out[name]) for name in names}
        if as_rows:
            parts = gather_queries({name: self.stats[name].arrays() for name in as_rows})
            for name in as_rows:
                joined = [FieldStats.from_arrays(self.specs[name], part[name]) for part in parts]
                merged = joined[0]
                for other in joined[1:]:
                    merged = merge_stats(merged, other)
                result.stats[name] = merged
        result._own = self._handed(result.stats)
        result.n_documents, result.n_tokens = (int(x) for x in reduced_counts[-2:].tolist())
        result.queries = self.queries
        if self.keep_queries:
            if gather_queries is None:
                raise GeometryError("reduced: keep_queries=True needs gather_queries to collect the per-query rows")
            parts = [p for p in gather_queries(self.queries) if p is not None]
            result.queries = interleave_rows(parts) if parts else None
        if self.picture_heads:  # every process has the same config, so all or none take part
            if gather_queries is None:
                raise GeometryError("reduced: picture_heads needs gather_queries to collect the pictures")
            gathered = gather_queries([{**p.metadata(), **p.arrays()} for p in self.pictures.values()])
            result.pictures = pick(SelectionPicture.from_parts(p, p) for part in gathered for p in part)
        return result


def _storages(s: FieldStats) -> set[int]:
    """The addresses of the storages a field's statistics hold (empty tensors hold none)."""
    return {t.untyped_storage().data_ptr() for t in vars(s).values() if isinstance(t, Tensor) and t.numel()}


def _shared(a: FieldStats, b: FieldStats) -> bool:
    """Whether two fields' statistics share memory (compared while both are alive, so an address is one tensor's
    storage)."""
    return bool(_storages(a) & _storages(b))


def interleave_rows(parts: Sequence[QueryRows]) -> QueryRows:
    """Per-query rows of round-robin shards back in corpus order.

    Part r holds documents r, r + K, r + 2K, ... of the corpus (K processes;
    processes left without documents come last and send nothing), so document
    j of part r comes before document j of part r + 1 and after every
    document j - 1.
    """
    rows, positions = join_rows(parts)
    keys = [(j, rank) for rank, (_, p) in enumerate(parts) for j in range(p.shape[0])]
    index = torch.tensor(sorted(range(len(keys)), key=keys.__getitem__), dtype=torch.long)
    return {name: t[index] for name, t in rows.items()}, positions[index]


def _fields_as_now(state: Mapping[str, Any]) -> dict[str, Any]:
    """A `Accumulator.state_dict` with each field stored under a former name (`Diagnostic.former_fields`) renamed to
    its name now, so that a checkpoint written before a field was renamed resumes."""
    from tl_geometry.diagnostics.registry import REGISTRY  # imported late: the registry loads every diagnostic

    now = REGISTRY.current_field
    layout = dict(state["layout"])
    layout["fields"] = [[now(name), *rest] for name, *rest in layout["fields"]]
    layout["replicate_fields"] = sorted(now(name) for name in layout["replicate_fields"])
    queries = state["queries"]
    if queries is not None:
        queries = {**queries, "values": {now(name): t for name, t in queries["values"].items()}}
    return {**state, "layout": layout, "stats": {now(name): s for name, s in state["stats"].items()}, "queries": queries}
