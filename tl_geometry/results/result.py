"""GeometryResult: statistics over documents per layer and head, mergeable, saved without pickle.

Storage: for every declared field (`FieldSpec`), exact sufficient statistics
over the documents analysed (`FieldStats`: count and sum; sum of squares,
minimum and maximum for ``documents="moments"`` fields; Poisson-bootstrap
weighted sums and counts for fields that keep replicates), each
``[layer, head_index, *trailing]``. Memory and files do not grow with the
number of documents; the optional per-query rows (``keep_queries=True``) are
the one exception (the optional pictures, ``picture_heads``, keep one query
row per head, however many documents). Results over disjoint documents merge exactly
(`GeometryResult.merge`): a corpus analysed in one batch, many batches, or
two halves merged later gives the same result (counts equal, sums up to
rounding).

File format (``format_version`` 2): ``<stem>.npz`` holds ``n_grid``, one
array per statistic, ``<field>/<statistic>`` (``count`` int64, ``total``
and ``total_sq`` float64, ``total`` float32 for ``documents="mean"``
fields, ``minimum``, ``maximum`` and the replicate arrays float32; or, for a
field kept as rows of documents, ``<field>/documents`` and
``<field>/document_weights``), stored
with size 1 on the layer and/or head axis where constant along it, and, with
per-query rows, ``queries/<field>`` and ``query_positions``, and with
pictures ``pictures/<layer>.<head>/<array>``; written with
``allow_pickle=False``. ``<stem>.json`` holds the field declarations and
trailing shapes, the config, model name, layers, heads, documents, tokens,
package versions and the SHA-256 of the ``.npz``. Files of format 1 (per-sequence
arrays, from before results kept statistics) load too, converted as `tl_geometry.results.legacy`
describes.

Size: a run of few documents keeps each field's per-document values (rows,
see `tl_geometry.results.stats`) rather than the sums, up to about as many
documents as replicates, and the ``.npz`` is deflated, with rows in float32
where lossless; past that a field's file size no longer grows with the
documents. `benchmarks/bench_sizes.py` prints the sizes of a one-prompt
result and of the two-window report's, beside the layout before.
"""

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tl_geometry.config import GeometryConfig
from tl_geometry.diagnostics.assumptions import PROFILE_FIT
from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.diagnostics.profile_fit import ProfileFit
from tl_geometry.engine.metrics import METRIC_NAMES
from tl_geometry.errors import GeometryError
from tl_geometry.results import fileformat, provenance
from tl_geometry.results.accumulators import Accumulator
from tl_geometry.results.display import Summary, head_name, names, plural, ranges, short_list
from tl_geometry.results.selection_picture import SelectionPicture, pick
from tl_geometry.results.provenance import STAMPED, package_versions
from tl_geometry.results.queries import check_rows, join_rows
from tl_geometry.results.stats import FieldStats, same_values
from tl_geometry.results.table import FieldName, StatisticsTable, check_level, field_name, percentile_ci
# The selection metrics (every model run measures them), by name.
REQUIRED_FIELDS: tuple[str, ...] = METRIC_NAMES  # every result holds the selection metrics
STATS = ("mean", "std", "sem", "count", "min", "max")
"""What `GeometryResult.sel` can return for a field."""




@dataclass(frozen=True, repr=False)  # repr: a summary (StatisticsTable.__repr__), not every tensor
class GeometryResult(StatisticsTable):
    """Statistics of every field over the documents analysed, per layer and head.

    Attributes:
        n_grid: the selection sizes N, ``[n]``.
        layers: the layers analysed (axis ``layer`` of every tensor).
        heads: the query heads analysed (axis ``head_index``).
        stats: field name -> its `FieldStats` (declaration included).
        n_documents: documents analysed.
        n_tokens: real tokens in them.
        config: the GeometryConfig of the run.
        model_name: ``model.cfg.model_name``.
        versions: package versions (tl_geometry, torch, transformer_lens).
        queries: per-query rows by field, ``[doc, layer, head_index, query,
            *trailing]`` (None unless the run kept them).
        query_positions: the rows' positions, ``[doc, query]``, -1 where a
            document has fewer queries (None with ``queries``).
        provenance: what reproduces the result, JSON-ready (None if not
            recorded): ``model`` (name, checkpoint, revision or bundled
            package, weights fingerprint, dtype, device kind, attention
            implementation), ``versions`` of every package involved,
            ``corpus`` (files and their SHA-256, windows used and skipped);
            see `tl_geometry.results.provenance`.
        pictures: one `SelectionPicture` per head of ``config.picture_heads``
            (sorted by layer and head; ``result.picture(layer, head)``).

    Per-layer-head means: ``result.per_head(name)`` or ``result.precision``
    (any field name works as an attribute), ``[layer, head_index, ...]``;
    ``std``, ``sem``, ``count``, ``min``, ``max``, ``ci`` and ``sel`` give
    the rest.

    Example (two documents, layer 5, heads 0 and 2, N in {1, 4}):
        >>> from tl_geometry.results.accumulators import Accumulator
        >>> acc = Accumulator([FieldSpec("recall", "R(r_min, N)", axes=("n",))], layers=(5,), heads=(0, 2),
        ...                   n_grid=torch.tensor([1, 4]))
        >>> recall = torch.tensor([[[[1.0, 0.5], [1.0, 0.25]]], [[[0.0, 0.5], [1.0, 0.75]]]])
        >>> acc.add({"recall": recall}, torch.zeros(2, 0), n_tokens=20)
        >>> result = GeometryResult.from_accumulator(acc, config=GeometryConfig(), model_name="toy")
        >>> result.sel("recall", layer=5, head=2, n=4).item(), result.recall.shape
        (0.5, torch.Size([1, 2, 2]))
    """

    config: GeometryConfig
    model_name: str
    versions: Mapping[str, str]
    queries: Mapping[str, Tensor] | None = None
    query_positions: Int[Tensor, "doc query"] | None = None
    provenance: Mapping[str, Any] | None = None
    pictures: tuple[SelectionPicture, ...] = ()

    def __post_init__(self) -> None:
        shape = (len(self.layers), len(self.heads))
        replicates = set()
        for name, s in self.stats.items():
            if s.spec.name != name:
                raise GeometryError(f"stats[{name!r}]: holds the statistics of field {s.spec.name!r}")
            if tuple(s.count.shape[:2]) != shape:
                raise GeometryError(
                    f"stats[{name!r}]: expected leading shape [layer, head_index] = {list(shape)}, "
                    f"got {list(s.count.shape)}"
                )
            for axis, size in zip(s.spec.axes, s.trailing):
                if axis == "n" and size != len(self.n_grid):
                    raise GeometryError(
                        f"stats[{name!r}]: its n axis has {size} entries, the grid has {len(self.n_grid)}"
                    )
            if s.n_replicates:
                replicates.add(s.n_replicates)
        if len(replicates) > 1:
            raise GeometryError(f"stats: fields keep different numbers of bootstrap replicates {sorted(replicates)}")
        if (self.queries is None) != (self.query_positions is None):
            raise GeometryError("queries and query_positions come together; got only one")
        if self.queries is not None:
            unknown = sorted(set(self.queries) - set(self.stats))
            if unknown:
                raise GeometryError(f"queries: {unknown} are not fields of this result {list(self.stats)}")
            check_rows(self.queries, self.query_positions, self.n_documents, shape)
        self._check_pictures()

    def _check_pictures(self) -> None:
        if not isinstance(self.pictures, tuple) or not all(isinstance(p, SelectionPicture) for p in self.pictures):
            raise GeometryError("pictures: expected a tuple of SelectionPicture")
        keys = [(p.layer, p.head) for p in self.pictures]
        if keys != sorted(set(keys)):
            raise GeometryError(f"pictures: expected at most one per head, sorted by layer and head; got {keys}")
        for p in self.pictures:
            if p.layer not in self.layers or p.head not in self.heads:
                raise GeometryError(f"pictures: layer {p.layer}, head {p.head} is not among the analysed layers "
                                    f"{list(self.layers)} and heads {list(self.heads)}")
            if not torch.equal(p.n_grid, self.n_grid):
                raise GeometryError(f"pictures: the picture of layer {p.layer}, head {p.head} has the grid "
                                    f"{p.n_grid.tolist()}, the result {self.n_grid.tolist()}")
            if (p.distance, p.ranking) != (self.config.distance, self.config.ranking):
                raise GeometryError(f"pictures: the picture of layer {p.layer}, head {p.head} was measured with "
                                    f"{p.distance} / {p.ranking}, the result with {self.config.distance} / "
                                    f"{self.config.ranking}")

    def picture(self, layer: int, head: int) -> SelectionPicture:
        """The kept selection picture of one head (draw it with `tl_geometry.report.paper_figures.selection_picture`).

        Raises:
            GeometryError: the run kept no picture of this head (the message
                names the option that keeps one).
        """
        for p in self.pictures:
            if (p.layer, p.head) == (layer, head):
                return p
        kept = [(p.layer, p.head) for p in self.pictures]
        raise GeometryError(
            f"picture: this result keeps no picture of layer {layer}, head {head} (it keeps {kept}); analyse with "
            f"picture_heads=[({layer}, {head})] (tl-geometry --picture {layer}.{head})"
        )

    # ---- fields and their statistics ----

    @property
    def capture_taken(self) -> str:
        """The capture path the run took, ``"rows"`` or ``"pattern"``: what its provenance records (the run's plan
        resolved ``capture="auto"``); for a result saved before the provenance recorded it, the config's
        ``capture``, which then held the path taken. ``"auto"`` where neither says (a result built by hand)."""
        return str((self.provenance or {}).get("capture", self.config.capture))

    @property
    def n_sequences(self) -> int:
        """Documents (sequences, windows) analysed: `n_documents` under the name the report prints."""
        return self.n_documents

    def sem(self, name: FieldName) -> Float[Tensor, "layer head_index *rest"]:
        """Standard error of the mean over documents, std / sqrt(count)."""
        s = self._moments(name, "sem")
        return s.std() / s.count.double().sqrt()

    def min(self, name: FieldName) -> Float[Tensor, "layer head_index *rest"]:
        """Smallest per-document value (NaN where none)."""
        return self._moments(name, "min").minimum.double()

    def max(self, name: FieldName) -> Float[Tensor, "layer head_index *rest"]:
        """Largest per-document value (NaN where none)."""
        return self._moments(name, "max").maximum.double()

    def replicates(self, name: FieldName) -> Float[Tensor, "replicate layer head_index *rest"]:
        """The Poisson-bootstrap replicate means of field ``name``, ``[replicate, layer, head_index, ...]``.

        Replicate b's mean is ``sum_d w[d, b] x_d / sum_d w[d, b] 1{x_d defined}``
        (NaN where its weights leave no document).
        """
        return self._replicate_means(
            name, f"analyse with GeometryConfig.bootstrap_fields including {field_name(name)!r} (and n_bootstrap > 0)"
        )

    def ci(self, name: FieldName, level: float = 0.95) -> tuple[Tensor, Tensor]:
        """Percentile bootstrap interval of the mean of field ``name`` over documents.

        Args:
            name: a field that kept replicates.
            level: coverage in (0, 1).

        Returns:
            ``(low, high)``, each ``[layer, head_index, ...]``: the
            ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles (linear
            interpolation) of the replicate means, NaN replicates left out.
        """
        check_level(level)
        return percentile_ci(self.replicates(name), level)

    def sel(
        self,
        name: FieldName | None = None,
        *,
        layer: int | Sequence[int] | None = None,
        head: int | Sequence[int] | None = None,
        n: int | Sequence[int] | None = None,
        stat: str = "mean",
    ) -> Tensor | dict[str, Tensor]:
        """A statistic indexed by real layer numbers, head numbers and N values (not positions on the axes).

        Args:
            name: a field, by name or by declaration (``selection.PRECISION``);
                None for a dict of every field that has ``stat``
                (``std``, ``sem``, ``min`` and ``max`` need ``documents="moments"``).
            layer: a layer number (drops the axis), a list of them (keeps it), or None (all).
            head: a head number, a list of them, or None, likewise.
            n: an N value of the grid, a list of them, or None, likewise;
                fields without an N axis ignore it.
            stat: one of `STATS`.

        Returns:
            The selected tensor (or a dict of them by field name).

        Example: ``result.sel("precision", layer=18, head=6, n=4)`` is 0-d;
        ``result.sel("recall", layer=[0, 1], n=[1, 2])`` is ``[2, head_index, 2]``.
        """
        if stat not in STATS:
            raise GeometryError(f"stat: expected one of {STATS}, got {stat!r}")
        if name is None:
            names = [f for f in self.stats if stat in ("mean", "count") or self.stats[f].spec.documents == "moments"]
            return {f: self.sel(f, layer=layer, head=head, n=n, stat=stat) for f in names}
        getter = {"mean": self.per_head, "std": self.std, "sem": self.sem, "count": self.count,
                  "min": self.min, "max": self.max}[stat]
        return self._select(getter(name), self.spec(name).axes, layer, head, n)

    def describe(self) -> str:
        """One line per field: name, trailing axes, what is kept over documents, and its doc."""
        lines = [f"{self.model_name}: {plural(self.n_documents, 'document')}, {plural(self.n_tokens, 'token')}, "
                 f"{plural(len(self.layers), 'layer')} x {plural(len(self.heads), 'head')}, {len(self.n_grid)} N"]
        for name, s in self.stats.items():
            axes = ", ".join(("layer", "head_index", *s.spec.axes))
            extra = f", {s.n_replicates} replicates" if s.n_replicates else ""
            lines.append(f"  {name} [{axes}] {s.spec.documents}{extra}: {s.spec.doc}")
        return "\n".join(lines)

    def _summary(self) -> Summary:
        c = self.config
        queries = c.query_positions if isinstance(c.query_positions, str) else list(c.query_positions)
        sample = f"{plural(self.n_documents, 'document')}, {plural(self.n_tokens, 'token')}; query rows: {queries!r}"
        if self.queries is not None:
            sample += f" ({int((self.query_positions >= 0).sum())} kept per query, result.queries_dataframe())"
        kept = [name for name, s in self.stats.items() if s.n_replicates]
        layer, head, n = self.layers[0], self.heads[0], int(self.n_grid[min(3, len(self.n_grid) - 1)])
        taken = f" (took {self.capture_taken!r})" if self.capture_taken != c.capture else ""
        rows = [
            ("model", self.model_name),
            ("sample", sample),
            ("heads", f"{plural(len(self.layers), 'layer')} x {plural(len(self.heads), 'head')} "
                      f"(layers {ranges(self.layers)}; heads {ranges(self.heads)})"),
            ("N grid", f"{plural(len(self.n_grid), 'value')}: {short_list(self.n_grid.tolist())}"),
            ("measured", f"distance={c.distance!r}, ranking={c.ranking!r}, capture={c.capture!r}{taken}, "
                         f"diagnostics={list(c.diagnostics)}"),
            ("fields", f"{len(self.stats)}: " + names(list(self.stats), more="result.describe()")),
            ("bootstrap", f"{self.n_bootstrap} replicates of {names(kept, 4)} (result.ci)" if kept else
                          "none (n_bootstrap=0: no intervals)"),
        ]
        if self.pictures:
            rows.append(("pictures", ", ".join(head_name(p.layer, p.head) for p in self.pictures) + " (result.picture)"))
        rows += [
            ("read", f"result.sel('precision', layer={layer}, head={head}, n={n}); result.precision is "
                     "[layer, head, n]; result.to_dataframe()" + (f"; result.ci({kept[0]!r})" if kept else "")),
            ("next", "tl_geometry.claims(result); tl_geometry.classify_heads(result) (with diagnostics=['roles']); "
                     "result.save(path)"),
        ]
        return Summary(f"GeometryResult of {self.model_name}", tuple(rows))

    @property
    def profile_fit(self) -> ProfileFit:
        """The four-phase attention-profile fit (Assumption 3), each parameter ``[layer, head_index]``.

        Each parameter is the mean over documents of the per-document fits;
        the ``has_*`` flags become the fraction of documents with that phase.
        Needs a run with ``diagnostics=["assumptions"]``.
        """
        if any(spec.name not in self.stats for spec in PROFILE_FIT):
            raise GeometryError(
                "profile_fit: this result has no attention-profile fit; run run_with_geometry_hooks(..., "
                "diagnostics=['assumptions'])"
            )
        return ProfileFit(*(self.per_head(spec) for spec in PROFILE_FIT))  # PROFILE_FIT is in ProfileFit's order

    def __getattr__(self, name: str) -> Tensor:
        # Only called when normal lookup fails: gives result.precision etc.
        if name.startswith("_") or name not in self.__dict__.get("stats", {}):
            raise AttributeError(name)
        return self.per_head(name)

    # ---- tables (see `tl_geometry.results.dataframe`) ----

    def to_dataframe(self, fields: Sequence[str] | str | None = None, n: Sequence[int] | int | None = None, *,
                     form: str = "summary", level: float = 0.95) -> Any:
        """A pandas table of the statistics: by default a summary a person reads, ``form="long"`` every statistic.

        ``form="summary"``: one row per layer, head and N, at a few N (1, 2, 4,
        8, 16 where the grid has them), one column per field (default
        Precision, Recall, F_N) with ``<field>_ci_low`` / ``_ci_high`` where the
        field has bootstrap replicates. ``form="long"``: one row per statistic,
        columns field, layer, head, n, position, lag, mean, std, count, ci_low,
        ci_high, every field and N by default (axes a field does not have are
        NaN; ``n`` holds N values, not grid indices). See
        `tl_geometry.results.dataframe`.

        Args:
            fields: the fields (summary: default P, R and F_N; long: default all).
            n: the N values (summary: default a few; long: default every N).
            form: ``"summary"`` or ``"long"`` (`tl_geometry.results.dataframe.Form`; a ``str`` here, so that
                another value gets the GeometryError naming both).
            level: coverage of the bootstrap intervals.

        >>> result.to_dataframe()  # doctest: +SKIP
        >>> result.to_dataframe(["recall", "rho0"], n=[1, 4])  # doctest: +SKIP
        >>> df = result.to_dataframe(form="long")  # doctest: +SKIP
        >>> df[(df.field == "recall") & (df.n == 4)].pivot(index="layer", columns="head", values="mean")  # doctest: +SKIP
        """
        from tl_geometry.results.dataframe import check_form, summary_dataframe, to_dataframe

        check_form(form)
        if form == "summary":
            return summary_dataframe(self, fields, n, level)
        return to_dataframe(self, fields, level, n=n)

    def to_parquet(self, path: str | os.PathLike, fields: Sequence[str] | str | None = None,
                   level: float = 0.95) -> Path:
        """Write ``to_dataframe(form="long")`` (every statistic) as a Parquet file (atomically); returns its path."""
        from tl_geometry.atomic_io import atomic_path

        table = self.to_dataframe(fields, form="long", level=level)
        with atomic_path(path) as tmp:
            table.to_parquet(tmp, index=False)
        return Path(path)

    def queries_dataframe(self, fields: Sequence[str] | str | None = None) -> Any:
        """The per-query rows of a ``keep_queries=True`` run as a long table (document, query_position, ..., value)."""
        from tl_geometry.results.dataframe import queries_dataframe

        return queries_dataframe(self, fields)

    # ---- building and merging ----

    @classmethod
    def from_accumulator(
        cls, acc: Accumulator, *, config: GeometryConfig, model_name: str, provenance: Mapping[str, Any] | None = None
    ) -> "GeometryResult":
        """The result of an accumulator's documents, stamped with the current package versions."""
        rows, positions = acc.queries if acc.queries is not None else (None, None)
        if acc.keep_queries and rows is None:
            rows = {}
            positions = torch.zeros(0, 0, dtype=torch.int64)
        return cls(
            n_grid=acc.n_grid.clone(),
            layers=acc.layers,
            heads=acc.heads,
            stats=acc.stored_stats(),
            n_documents=acc.n_documents,
            n_tokens=acc.n_tokens,
            config=config,
            model_name=model_name,
            versions=package_versions(STAMPED),
            queries=rows,
            query_positions=positions,
            provenance=provenance,
            pictures=tuple(pick(acc.pictures.values()).values()),
        )

    def merge(self, *others: "GeometryResult | Sequence[GeometryResult]") -> "GeometryResult":
        """One result over the documents of several (disjoint) ones.

        Call as ``GeometryResult.merge(a, b)``, ``GeometryResult.merge([r1,
        r2, ...])`` or ``a.merge(b)``. Exact: counts add, sums add in
        float64, ranges combine; position and lag axes grow to the widest;
        per-query rows are concatenated along documents; pictures keep, per
        head, the one of the smallest document hash (so the order of the parts
        does not matter), and ``config.picture_heads`` becomes the union
        (the only config field that may differ). The capture path: parts
        that asked alike merge (two ``capture="auto"`` runs, whatever path
        each took: the merged provenance lists them); parts that asked
        differently merge when they all took one path (`capture_taken`): an
        ``"auto"`` run that took the rows and a ``capture="rows"`` one, or a
        file saved when the config recorded the path taken; the merged config
        then names that path. Versions that differ are all recorded
        (``"2.1, 2.2"``).

        Raises:
            GeometryError: the results differ in model_name, config, layers,
                heads, n_grid, fields or replicates, or asked for different
                capture paths and took different ones, or their provenance
                names different weights, checkpoints or dtypes (the message
                names which).
        """
        parts = _flatten(self, others)
        first = parts[0]
        asked, taken = sorted({p.config.capture for p in parts}), sorted({p.capture_taken for p in parts})
        if len(asked) > 1 and len(taken) > 1:
            raise GeometryError(f"merge: the results differ in capture path taken ({', '.join(map(repr, taken))}) "
                                f"and asked ({', '.join(map(repr, asked))}); only results that took one path, or "
                                "that asked alike (capture='auto'), merge")
        for other in parts[1:]:
            checks = {
                "model_name": (first.model_name, other.model_name),
                # The capture path is checked above, over all the parts.
                "config": tuple(replace(r.config, picture_heads=(), capture="auto") for r in (first, other)),
                "per-query rows": tuple("kept" if r.queries is not None else "not kept" for r in (first, other)),
            }
            checks.update({f"declaration of {name!r}": (first.spec(name), other.spec(name))
                           for name in first.fields if name in other.stats})
            differs = provenance.merge_check(first.provenance, other.provenance)
            if differs is not None:
                checks[differs[0]] = differs[1:]
            first._check_mergeable(other, checks, "merge", "only results of one model and config merge")
        versions = {
            key: ", ".join(sorted({p.versions.get(key, "unknown") for p in parts}))
            for key in sorted({k for p in parts for k in p.versions})
        }
        rows, positions = None, None
        if first.queries is not None:
            rows, positions = join_rows([(dict(p.queries), p.query_positions) for p in parts])
        picture_heads = sorted({pair for p in parts for pair in p.config.picture_heads})
        capture = asked[0] if len(asked) == 1 else taken[0]  # the one request, or the one path taken
        return replace(
            first,
            config=replace(first.config, picture_heads=picture_heads, capture=capture),
            pictures=tuple(pick(*(p.pictures for p in parts)).values()),
            **first._merged_stats(parts[1:]),
            versions=versions,
            queries=rows,
            query_positions=positions,
            provenance=provenance.merged([p.provenance for p in parts]),
        )

    concatenate = merge  # sequences concatenated are documents merged

    # ---- files (format 2, see `tl_geometry.results.fileformat`) ----

    paths = staticmethod(fileformat.paths)

    def save(self, path: str | os.PathLike) -> tuple[Path, Path]:
        """Write ``<path>.npz`` and ``<path>.json`` as one unit.

        Both files are staged beside their targets and renamed into place
        together under the folder's lock, so an interrupt or a full disk
        leaves the previous result loadable and a concurrent writer to the
        same folder is refused (see `tl_geometry.atomic_io`).

        Returns:
            The two paths written.

        Raises:
            GeometryError: another run is writing to the same folder.
        """
        return fileformat.write(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike, *, specs: Mapping[str, FieldSpec] | None = None) -> "GeometryResult":
        """Read a result written by `save` (exact round trip, NaN and inf included), or a format-1 file.

        Args:
            path: the stem, or either file.
            specs: for format-1 files only, declarations of their fields by
                name (others: the registered ones, else
                `tl_geometry.results.legacy.default_spec`).

        Raises:
            GeometryError: a file is missing, damaged, larger than its JSON
                announces or does not match the other (the message names the
                file and the problem).
        """
        fields = fileformat.read(path, specs)
        try:
            return cls(**fields)
        except GeometryError as error:  # parts that read well one by one but do not fit together
            json_path = fileformat.paths(path)[1]
            raise GeometryError(f"load: {json_path} does not describe its arrays: {error}") from None

    def equals(self, other: "GeometryResult") -> bool:
        """Exact equality: metadata, declarations, every statistic bit for bit (NaN equal to NaN), dtypes.

        The provenance (where and on what machine it was computed) is not compared.
        """
        if not isinstance(other, GeometryResult) or not self._same_statistics(other):
            return False
        if (self.config, self.model_name, dict(self.versions)) != (other.config, other.model_name, dict(other.versions)):
            return False
        if (self.queries is None) != (other.queries is None):
            return False
        pairs = []
        if self.queries is not None:
            if list(self.queries) != list(other.queries):
                return False
            pairs += [(self.query_positions, other.query_positions)]
            pairs += [(t, other.queries[k]) for k, t in self.queries.items()]
        if len(self.pictures) != len(other.pictures) or not all(a.equals(b) for a, b in zip(self.pictures, other.pictures)):
            return False
        return all(same_values(a, b) for a, b in pairs)


def _flatten(first: Any, others: tuple[Any, ...]) -> list[GeometryResult]:
    parts: list[Any] = []
    for item in (first, *others):
        parts.extend(item if isinstance(item, (list, tuple)) else [item])
    if not parts:
        raise GeometryError("merge: expected at least one GeometryResult, got none")
    for i, p in enumerate(parts):
        if not isinstance(p, GeometryResult):
            raise GeometryError(f"merge: item {i} is a {type(p).__name__}, expected a GeometryResult")
    return parts
