"""Exact sufficient statistics of one field over documents, and their merge.

Per (layer, head_index, trailing index) a field keeps, over the documents
where it is defined (not NaN):

- ``count`` (int64) and ``total`` (sum);
- for ``documents="moments"`` fields also ``total_sq`` (sum of squares),
  ``minimum`` and ``maximum`` (NaN where no document counted);
- for fields that keep bootstrap replicates, per replicate b the weighted sum
  ``replicate_total[b] = sum_d w[d, b] x_d`` and weighted count
  ``replicate_count[b] = sum_d w[d, b] [x_d defined]``.

+inf and -inf are real values (a radius r_min = +inf where everything is
selected): they make the sums infinite, and both together NaN, as in
``torch.nanmean``. Merging is elementwise addition (fmin / fmax for the
range), so it is exact for the counts and associative and commutative up to
float64 rounding; trailing position and lag axes grow to the wider of the
two, the new entries not counted.

Documents as rows. While a field has seen few documents, their values
themselves, ``documents`` ``[document, layer, head_index, *trailing]``, with
their bootstrap weights ``document_weights`` ``[document, replicate]``, are
smaller than the sums, and hold everything: the statistics above are
computed from them (in one canonical order of the rows, so that merging is
exact and commutative), and the replicate sums only when asked for. A field
keeps its rows up to `rows_limit` documents (about as many as it keeps
replicates), then turns them into sums once (`FieldStats.summed`). Only
accumulators made with ``document_rows=True`` keep rows.

Groups of documents. A position or lag profile with replicates keeps its
rows for at most `GROWING_ROWS` documents; past that (a replicate sum per
position would be as large as the profile times the replicates) it keeps,
besides its sums, `GROWING_ROWS` groups of documents (`GROUPS`): per group
the sum of its documents' values ``group_total`` and how many defined each
cell ``group_count`` ``[group, layer, head_index, *trailing]``, and the
group's bootstrap weights ``group_weights`` ``[group, replicate]``. A
document's group is read from its own weights (`document_group`: a hash of
them, which a document's tokens and the run's seed fix), not from where it
came in a batch or a process: the statistics never see a corpus index, and
an index counted per process or per chunk would put one document in
different groups in a one-pass run and in a merge of its parts. So groups
merge by adding their sums, as one pass would have filled them, up to
float64 rounding. A group's weights are those of its document whose weights
hash lowest (NaN: no document yet); they are Poisson(1) and independent
across groups, so a replicate resamples groups (`FieldStats.replicate_means`:
the weighted mean of the group sums). Groups are filled at random sizes (a
hash, not a round robin), some empty at first: the effective sample of a
bootstrap over groups is the groups that hold a document (`FieldStats.n_units`).

Accumulators hold float64 everywhere; a result holds the storage dtypes of
`STORAGE_DTYPES` (what its files hold, so a save / load round trip is exact).
"""

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tl_geometry.diagnostics.fields import GROWING_AXES, FieldSpec
from tl_geometry.errors import GeometryError

# Statistic name -> its dtype on a result and in files. Sums of "moments"
# fields stay float64 (their variance subtracts two of them); the rest need
# less: ranges of float32 values are exact in float32, and a replicate only
# feeds a percentile. Replicate counts are integer sums of weights, exact in
# float32 up to 2**24.
STORAGE_DTYPES: dict[str, torch.dtype] = {
    "count": torch.int64,
    "total": torch.float64,  # float32 for documents="mean" fields, see `storage_dtype`
    "total_sq": torch.float64,
    "minimum": torch.float32,
    "maximum": torch.float32,
    "replicate_total": torch.float32,
    "replicate_count": torch.float32,
}
# What each statistic holds where nothing was counted: padding of growing axes.
_EMPTY = {"count": 0, "total": 0.0, "total_sq": 0.0, "minimum": math.nan, "maximum": math.nan,
          "replicate_total": 0.0, "replicate_count": 0.0, "group_total": 0.0, "group_count": 0}
_MOMENTS = ("total_sq", "minimum", "maximum")
# The sums `merge_stats` adds in float64 and rounds to the dtype kept.
_FLOAT_SUMS = ("total", "total_sq", "replicate_total", "replicate_count", "group_total")
_REPLICATES = ("replicate_total", "replicate_count")
ROWS = ("documents", "document_weights")
"""The two arrays of a field kept as rows of documents."""
GROUPS = ("group_total", "group_count", "group_weights")
"""The three arrays of a profile's groups of documents, kept beside its sums past `GROWING_ROWS` documents."""
# Bytes per (layer, head, trailing) cell of the sums besides the replicates, in float32 rows: total and
# total_sq (float64) and the range (float32) of a "moments" field; the float32 total of a "mean" one.
_SUM_ROWS = {"moments": 6, "mean": 1}


# A position or lag profile's replicates would be n_replicates times the profile: past this many documents
# it keeps as many groups of documents instead of their rows (see the module docstring), not replicate sums.
GROWING_ROWS = 32


def document_group(weights: Float[Tensor, " replicate"]) -> tuple[int, bytes]:
    """The group (of `GROWING_ROWS`) a document with bootstrap weights ``weights`` falls in, and the hash it is
    read from (SHA-256 of the float64 weights, little-endian): the group's weights are those of its document of
    the lowest hash.

    >>> w = torch.tensor([1.0, 0.0, 2.0])
    >>> document_group(w) == document_group(w.clone()) and 0 <= document_group(w)[0] < GROWING_ROWS
    True
    """
    digest = hashlib.sha256(weights.detach().to("cpu", torch.float64).numpy().astype("<f8").tobytes()).digest()
    return int.from_bytes(digest[:8], "little") % GROWING_ROWS, digest


HALF_REPLICATES = 65504.0
"""The replicate sums of a two-stage field (``resample_queries``, e.g. the role features, whose query samples
cannot be kept as rows) are rounded to float16's precision (relative 2**-11; a replicate mean moves by at most
5e-4 of its size) when every one is below this, float16's largest, so that files hold them in half the bytes."""


def half_rounded(t: Tensor) -> Tensor:
    """``t`` rounded to the nearest float16, in its own dtype, if every finite value fits float16; else ``t``."""
    finite = t[t.isfinite()]
    if len(finite) and float(finite.abs().max()) >= HALF_REPLICATES:
        return t
    return t.half().to(t.dtype)


def rows_limit(spec: FieldSpec, n_replicates: int) -> int:
    """The most documents a field keeps as rows: while the rows are no larger than the sums they replace
    (for a position or lag profile with replicates, `GROWING_ROWS`)."""
    if spec.growing and n_replicates:
        return GROWING_ROWS
    return n_replicates + _SUM_ROWS[spec.documents]


def storage_dtype(spec: FieldSpec, statistic: str) -> torch.dtype:
    """The dtype a result keeps ``statistic`` of field ``spec`` in."""
    if statistic == "total" and spec.documents == "mean":
        return torch.float32  # wide per-position profiles whose spread nobody reads
    return STORAGE_DTYPES[statistic]


@dataclass(frozen=True)
class FieldStats:
    """The statistics of one field over documents, each ``[layer, head_index, *trailing]``.

    Attributes:
        spec: the field's declaration.
        count: documents where the field is defined.
        total: sum over those documents.
        total_sq, minimum, maximum: sum of squares and range (``documents="moments"`` only, else None).
        replicate_total, replicate_count: Poisson-bootstrap weighted sums and
            counts, ``[replicate, layer, head_index, *trailing]`` (None without
            replicates, and for rows, which compute them when asked).
        documents, document_weights: for a field kept as rows (see the module
            docstring), each document's value ``[document, layer, head_index,
            *trailing]`` and bootstrap weights ``[document, replicate]``
            (float64); the statistics above are computed from them. None for sums.
        group_total, group_count, group_weights: for a profile past its rows,
            its groups of documents (see the module docstring): per group the
            sum of its documents' values (float64; on a result in the total's
            dtype) and how many defined each cell ``[group, layer, head_index,
            *trailing]``, and its weights ``[group, replicate]`` (NaN for a
            group without documents). None otherwise.
    """

    spec: FieldSpec
    count: Int[Tensor, "layer head_index *trailing"]
    total: Float[Tensor, "layer head_index *trailing"]
    total_sq: Float[Tensor, "layer head_index *trailing"] | None = None
    minimum: Float[Tensor, "layer head_index *trailing"] | None = None
    maximum: Float[Tensor, "layer head_index *trailing"] | None = None
    replicate_total: Float[Tensor, "replicate layer head_index *trailing"] | None = None
    replicate_count: Float[Tensor, "replicate layer head_index *trailing"] | None = None
    documents: Float[Tensor, "document layer head_index *trailing"] | None = None
    document_weights: Float[Tensor, "document replicate"] | None = None
    group_total: Float[Tensor, "group layer head_index *trailing"] | None = None
    group_count: Int[Tensor, "group layer head_index *trailing"] | None = None
    group_weights: Float[Tensor, "group replicate"] | None = None

    def __post_init__(self) -> None:
        name = self.spec.name
        grouped = [g for g in GROUPS if getattr(self, g) is not None]
        if grouped and (grouped != list(GROUPS) or self.documents is not None or self.replicate_total is not None
                        or not self.spec.growing):
            raise GeometryError(
                f"field {name!r}: groups of documents ({', '.join(GROUPS)}) come all together, for a position or "
                f"lag profile kept as sums without replicate sums; got {grouped} (rows: {self.documents is not None}, "
                f"replicate sums: {self.replicate_total is not None}, axes {self.spec.axes})"
            )
        if grouped:
            t, c, w = self.group_total, self.group_count, self.group_weights
            if t.shape[1:] != self.count.shape or c.shape != t.shape or w.ndim != 2 or w.shape[0] != t.shape[0] \
                    or not (t.is_floating_point() and w.is_floating_point()) or c.is_floating_point():
                raise GeometryError(
                    f"field {name!r}: groups {t.dtype} {list(t.shape)}, counts {c.dtype} {list(c.shape)} and weights "
                    f"{w.dtype} {list(w.shape)} do not fit statistics {list(self.count.shape)}; expected float and "
                    f"integer [group, *{list(self.count.shape)}] and float [group, replicate]"
                )
        if (self.documents is None) != (self.document_weights is None):
            raise GeometryError(f"field {name!r}: documents and document_weights come together, got only one")
        if self.documents is not None:
            d, w = self.documents, self.document_weights
            if self.replicate_total is not None or d.shape[1:] != self.count.shape or w.ndim != 2 \
                    or w.shape[0] != d.shape[0] or not (d.is_floating_point() and w.is_floating_point()):
                raise GeometryError(
                    f"field {name!r}: rows {d.dtype} {list(d.shape)} and weights {w.dtype} {list(w.shape)} do not "
                    f"fit statistics {list(self.count.shape)}; expected float [document, *{list(self.count.shape)}] "
                    "and [document, replicate], and no replicate sums"
                )
        if self.count.ndim != 2 + len(self.spec.axes):
            raise GeometryError(
                f"field {name!r}: expected statistics [layer, head_index, {', '.join(self.spec.axes)}] "
                f"({2 + len(self.spec.axes)} axes), got shape {list(self.count.shape)}"
            )
        moments = [s for s in _MOMENTS if getattr(self, s) is not None]
        wanted = list(_MOMENTS) if self.spec.documents == "moments" else []
        if moments != wanted:
            raise GeometryError(
                f"field {name!r}: documents={self.spec.documents!r} keeps {wanted or 'no'} extra statistics, "
                f"got {moments}"
            )
        if (self.replicate_total is None) != (self.replicate_count is None):
            raise GeometryError(f"field {name!r}: replicate_total and replicate_count come together, got only one")
        for statistic, t in self.sums().items():
            expected = self.count.shape if statistic not in _REPLICATES else self.replicate_total.shape
            if t.shape != expected or (statistic == "count") == t.is_floating_point():
                raise GeometryError(
                    f"field {name!r}: {statistic} has shape {list(t.shape)} and dtype {t.dtype}; expected "
                    f"shape {list(expected)} and {'an integer' if statistic == 'count' else 'a float'} dtype"
                )

    @classmethod
    def empty(cls, spec: FieldSpec, shape: tuple[int, ...], n_replicates: int | None,
              rows: bool = False) -> "FieldStats":
        """Statistics of no documents, ``shape`` = ``[layer, head_index, *trailing]`` (float64); as rows with ``rows``."""
        if rows:
            return cls.of_documents(spec, torch.zeros(0, *shape, dtype=torch.float64),
                                    torch.zeros(0, n_replicates or 0, dtype=torch.float64))
        wanted = ["count", "total", *(_MOMENTS if spec.documents == "moments" else ())]
        wanted += list(_REPLICATES) if n_replicates is not None else []
        out = {}
        for statistic in wanted:
            size = (n_replicates, *shape) if statistic in _REPLICATES else shape
            dtype = torch.int64 if statistic == "count" else torch.float64
            out[statistic] = torch.full(size, _EMPTY[statistic], dtype=dtype)
        return cls(spec=spec, **out)

    @classmethod
    def of_documents(cls, spec: FieldSpec, documents: Tensor, weights: Tensor) -> "FieldStats":
        """A field kept as rows: each document's values ``[document, layer, head_index, *trailing]`` and its
        bootstrap weights ``[document, replicate]``; the statistics computed from them (float64), the rows put
        in their canonical order (by their bytes), so that the order documents came in does not matter."""
        x = documents.detach().to("cpu", torch.float64)
        w = weights.detach().to("cpu", torch.float64)
        if x.shape[0] > 1:
            order = sorted(range(x.shape[0]), key=lambda i: (w[i].numpy().tobytes(), x[i].numpy().tobytes()))
            index = torch.tensor(order, dtype=torch.long)
            x, w = x[index], w[index]
        sums = batch_stats(spec, x, None)
        return replace(sums, documents=x, document_weights=w)

    @classmethod
    def from_arrays(cls, spec: FieldSpec, arrays: Mapping[str, Tensor]) -> "FieldStats":
        """The statistics `arrays` returned (rows or sums)."""
        if ROWS[0] in arrays:
            return cls.of_documents(spec, arrays[ROWS[0]], arrays[ROWS[1]])
        return cls(spec=spec, **arrays)  # sums, and groups where it keeps them

    @property
    def is_rows(self) -> bool:
        """Whether the field is kept as rows of documents (see the module docstring)."""
        return self.documents is not None

    def sums(self) -> dict[str, Tensor]:
        """The sums it holds or computed from its rows, by name (those that are None left out; no replicates
        for rows)."""
        return {f.name: t for f in fields(self)
                if f.name not in ("spec", *ROWS, *GROUPS) and (t := getattr(self, f.name)) is not None}

    def arrays(self) -> dict[str, Tensor]:
        """What it keeps, by name: its rows, or else its sums (those that are None left out) and its groups."""
        if self.is_rows:
            return {"documents": self.documents, "document_weights": self.document_weights}
        if self.is_grouped:
            return {**self.sums(), **{g: getattr(self, g) for g in GROUPS}}
        return self.sums()

    @property
    def is_grouped(self) -> bool:
        """Whether the field keeps groups of documents beside its sums (see the module docstring)."""
        return self.group_total is not None

    @property
    def n_units(self) -> int:
        """What a bootstrap replicate resamples: documents (rows, or sums), or the groups that hold one."""
        if self.is_grouped:
            return int((~self.group_weights.isnan().any(1)).sum())
        return int(self.documents.shape[0]) if self.is_rows else int(self.count.max()) if self.count.numel() else 0

    def document_groups(self) -> tuple[Tensor, Tensor, Tensor] | None:
        """Groups of documents a replicate can resample: ``(total, count, weights)`` as the ``group_*``
        arrays (float64, int64, float64; weights 0 for a group without documents): the field's groups, or for
        rows each document a group of its own (its value, 0 where undefined, and 1 where defined); None for
        sums."""
        if self.is_grouped:
            return self.group_total.double(), self.group_count, self.group_weights.double().nan_to_num(0.0)
        if self.is_rows:
            defined = ~self.documents.isnan()
            return torch.where(defined, self.documents, 0.0), defined.long(), self.document_weights.double()
        return None

    def ungrouped(self) -> "FieldStats":
        """The same sums without their groups of documents (what a profile past its rows kept before groups)."""
        return replace(self, **dict.fromkeys(GROUPS)) if self.is_grouped else self

    def grouped(self) -> "FieldStats":
        """Rows as sums with the documents folded into `GROWING_ROWS` groups (see the module docstring)."""
        x, w = self.documents, self.document_weights
        keys = [document_group(w[d]) for d in range(x.shape[0])]
        index = torch.tensor([group for group, _ in keys], dtype=torch.long)
        defined = ~x.isnan()
        shape = (GROWING_ROWS, *x.shape[1:])
        total = torch.zeros(shape, dtype=torch.float64).index_add_(0, index, torch.where(defined, x, 0.0))
        count = torch.zeros(shape, dtype=torch.int64).index_add_(0, index, defined.long())
        weights = torch.full((GROWING_ROWS, w.shape[1]), math.nan, dtype=torch.float64)
        lowest: dict[int, bytes] = {}
        for d, (group, digest) in enumerate(keys):
            if group not in lowest or digest < lowest[group]:
                lowest[group] = digest
                weights[group] = w[d]
        out = replace(self, documents=None, document_weights=None)
        return replace(out, group_total=total, group_count=count, group_weights=weights)

    def summed(self) -> "FieldStats":
        """The same statistics as sums (replicate sums computed from the rows, float64 as the others are
        in an accumulator, the kept dtypes on a result); a position or lag profile with replicates keeps its
        documents in groups instead (`grouped`, see `GROWING_ROWS`)."""
        if not self.is_rows:
            return self
        if self.n_replicates and self.spec.growing:
            return self.grouped()
        stored = self._is_stored()
        out = replace(self, documents=None, document_weights=None)
        if self.n_replicates and not self.spec.growing:
            total, count = weighted_sums(self.documents, self.document_weights)
            dtype = STORAGE_DTYPES["replicate_total"] if stored else torch.float64
            total = total.to(dtype)
            if stored and self.spec.resample_queries:
                total = half_rounded(total)
            out = replace(out, replicate_total=total, replicate_count=count.to(dtype))
        return out

    def _is_stored(self) -> bool:
        """Whether it holds a result's dtypes (`stored`) rather than an accumulator's float64."""
        probe = "total" if self.spec.documents == "mean" else "minimum"
        return getattr(self, probe).dtype == storage_dtype(self.spec, probe)

    @property
    def trailing(self) -> tuple[int, ...]:
        """Sizes of the trailing axes."""
        return tuple(self.count.shape[2:])

    def counted_nothing(self) -> bool:
        """No document was counted anywhere (and no replicate weight): the identity of `merge_stats`."""
        if self.is_rows:
            return self.documents.shape[0] == 0
        return not bool(self.count.any()) and (self.replicate_count is None or not bool(self.replicate_count.any()))

    @property
    def n_replicates(self) -> int:
        """Bootstrap replicates kept (0 without)."""
        if self.is_rows:
            return self.document_weights.shape[1]
        if self.is_grouped:
            return self.group_weights.shape[1]
        return 0 if self.replicate_total is None else self.replicate_total.shape[0]

    def widened(self, trailing: tuple[int, ...]) -> "FieldStats":
        """The same statistics with growing axes padded to ``trailing``, the new entries not counted."""
        if trailing == self.trailing:
            return self
        pads = [(axis, size - old) for axis, (size, old) in enumerate(zip(trailing, self.trailing))]
        for axis, extra in pads:
            if extra < 0 or (extra and self.spec.axes[axis] not in GROWING_AXES):
                raise GeometryError(
                    f"field {self.spec.name!r}: cannot widen trailing shape {list(self.trailing)} to {list(trailing)}; "
                    f"only {GROWING_AXES} axes grow (axes are {self.spec.axes})"
                )
        if self.is_rows:
            pad = torch.full((self.documents.shape[0], *self.count.shape[:2], *trailing), math.nan, dtype=torch.float64)
            pad[tuple(slice(0, n) for n in self.documents.shape)] = self.documents
            return FieldStats.of_documents(self.spec, pad, self.document_weights).cast_like(self)
        out = {}
        for statistic, t in self.arrays().items():
            if statistic == GROUPS[2]:
                continue  # weights have no trailing axes
            shape = list(t.shape)
            shape[t.ndim - len(trailing):] = trailing
            padded = torch.full(shape, _EMPTY[statistic], dtype=t.dtype)
            padded[tuple(slice(0, n) for n in t.shape)] = t
            out[statistic] = padded
        return replace(self, **out)

    def stored(self) -> "FieldStats":
        """These statistics in the dtypes a result keeps (`storage_dtype`; rows stay float64); the replicate
        sums of a two-stage field rounded to float16's precision where they fit (`HALF_REPLICATES`); the sums of
        groups of documents in the total's dtype."""
        out = {s: t.to(storage_dtype(self.spec, s)) for s, t in self.sums().items()}
        if self.spec.resample_queries and "replicate_total" in out:
            out["replicate_total"] = half_rounded(out["replicate_total"])
        if self.is_grouped:  # the groups' sums as the field's total is kept (float32 for a profile of means)
            out["group_total"] = self.group_total.to(storage_dtype(self.spec, "total"))
        return replace(self, **out)

    def cast_like(self, other: "FieldStats") -> "FieldStats":
        """These statistics in the dtypes of ``other``'s (rows stay float64)."""
        theirs = other.sums()
        return replace(self, **{s: t.to(theirs[s].dtype) for s, t in self.sums().items() if s in theirs})

    # ---- statistics over documents, float64 ----

    def mean(self) -> Float[Tensor, "layer head_index *trailing"]:
        """Mean over documents; NaN where none counted (0 / 0), +-inf kept as in ``torch.nanmean``."""
        return self.total.double() / self.count.double()

    def std(self) -> Float[Tensor, "layer head_index *trailing"]:
        """Sample standard deviation over documents (ddof = 1); NaN with fewer than 2 or an infinite value."""
        if self.total_sq is None:
            raise GeometryError(f"field {self.spec.name!r}: documents='mean' keeps no sum of squares, so no std")
        n = self.count.double()
        total = self.total.double()
        spread = self.total_sq - total * total / n
        # sum x^2 - (sum x)^2 / n cancels: its rounding error is a few ulps of sum x^2, so a spread
        # below that is zero (otherwise a constant field got a std of ~1e-8 that depended on the batching).
        noise = 64 * torch.finfo(torch.float64).eps * self.total_sq.abs()
        spread = torch.where(spread.abs() <= noise, 0.0, spread)
        return (spread / (n - 1)).clamp_min(0.0).sqrt().masked_fill(n < 2, math.nan)

    def replicate_means(self, replicates: slice = slice(None)) -> Float[Tensor, "replicate layer head_index *trailing"]:
        """Weighted mean of every bootstrap replicate (or of a slice of them, to bound the memory of a wide
        profile's); NaN where a replicate gave no document weight."""
        if self.is_rows:
            total, count = weighted_sums(self.documents, self.document_weights[:, replicates])
            return total / count
        if self.is_grouped:  # the groups resampled: the weighted sum of their sums over that of their counts
            total, count, weights = self.document_groups()
            w = weights[:, replicates].T
            return (w @ total.flatten(1)).reshape(w.shape[0], *total.shape[1:]) / \
                (w @ count.flatten(1).double()).reshape(w.shape[0], *total.shape[1:])
        return self.replicate_total[replicates].double() / self.replicate_count[replicates].double()


def weighted_sums(
    values: Float[Tensor, "doc *cell"], weights: Float[Tensor, "doc replicate"]
) -> tuple[Float[Tensor, "replicate *cell"], Float[Tensor, "replicate *cell"]]:
    """Per replicate b, ``sum_d w[d, b] x_d`` and ``sum_d w[d, b] [x_d defined]`` (float64; NaN: undefined)."""
    x = values.detach().to("cpu", torch.float64)
    w = weights.detach().to("cpu", torch.float64).T  # [replicate, doc]
    shape = (w.shape[0], *x.shape[1:])
    defined = ~x.isnan()
    zeroed = torch.where(defined, x, 0.0)
    # A zero weight times an infinite value would give NaN: weight the finite part, add the infinities after.
    infinite = x.isinf()
    finite = torch.where(infinite, 0.0, zeroed) if infinite.any() else zeroed
    total = (w @ finite.flatten(1)).reshape(shape)
    if infinite.any():
        above = (w @ (x == math.inf).flatten(1).double()).reshape(shape) > 0
        below = (w @ (x == -math.inf).flatten(1).double()).reshape(shape) > 0
        total = total + torch.where(above, math.inf, 0.0) + torch.where(below, -math.inf, 0.0)
    return total, (w @ defined.flatten(1).double()).reshape(shape)


def batch_stats(
    spec: FieldSpec,
    values: Float[Tensor, "doc layer head_index *trailing"],
    weights: Float[Tensor, "doc replicate"] | None,
    within: Float[Tensor, "doc replicate layer head_index *trailing"] | None = None,
    rows: bool = False,
) -> FieldStats:
    """The float64 statistics of one batch of per-document values (NaN: not defined for that document).

    ``within`` (with ``weights``): each document's own value per replicate (a
    two-stage bootstrap that also resamples inside the document); replicate b
    then sums w[d, b] within[d, b] instead of w[d, b] values[d].

    ``rows``: keep the documents as rows (`FieldStats.of_documents`) where
    they can be: up to `rows_limit` of them, and with ``within`` only where
    each document's replicate value is its own value or undefined (one query
    row per document), its weight then counted only where it is defined;
    past `rows_limit`, a profile with replicates in groups (`FieldStats.grouped`).
    """
    if rows:
        n_replicates = 0 if weights is None else weights.shape[1]
        kept = _row_weights(values, weights, within)
        if kept is not None and values.shape[0] <= rows_limit(spec, n_replicates):
            return FieldStats.of_documents(spec, values, kept)
        if kept is not None and n_replicates and spec.growing:
            return FieldStats.of_documents(spec, values, kept).grouped()
    x = values.detach().to("cpu", torch.float64)
    if x.shape[0] == 0:  # amin / amax refuse empty axes
        return FieldStats.empty(spec, tuple(x.shape[1:]), None if weights is None else weights.shape[1])
    defined = ~x.isnan()
    zeroed = torch.where(defined, x, 0.0)
    count = defined.sum(0)
    out: dict[str, Tensor] = {"count": count, "total": zeroed.sum(0)}
    if spec.documents == "moments":
        out["total_sq"] = (zeroed * zeroed).sum(0)
        nothing = count == 0
        out["minimum"] = torch.where(defined, x, math.inf).amin(0).masked_fill(nothing, math.nan)
        out["maximum"] = torch.where(defined, x, -math.inf).amax(0).masked_fill(nothing, math.nan)
    if weights is not None and within is not None:
        w = weights.detach().to("cpu", torch.float64)  # [doc, replicate]
        r = within.detach().to("cpu", torch.float64)
        w = w.reshape(*w.shape, *([1] * (r.ndim - 2)))
        r_defined = ~r.isnan()
        out["replicate_total"] = (w * torch.where(r_defined, r, 0.0)).sum(0)
        out["replicate_count"] = (w * r_defined).sum(0)
    elif weights is not None:
        out["replicate_total"], out["replicate_count"] = weighted_sums(x, weights)
    return FieldStats(spec=spec, **out)


def _row_weights(values: Tensor, weights: Tensor | None, within: Tensor | None) -> Tensor | None:
    """The weights that make rows of ``values`` give the replicates `batch_stats` would: ``weights`` (a
    ``[doc, 0]`` tensor without), or with ``within`` the weight of each replicate whose value of a document
    is the document's own (0 where it is undefined); None where ``within`` is anything else."""
    if weights is None:
        return torch.zeros(values.shape[0], 0, dtype=torch.float64)
    w = weights.detach().to("cpu", torch.float64)
    if within is None:
        return w
    x = values.detach().to("cpu", torch.float64).unsqueeze(1).flatten(2)  # [doc, 1, cell]
    r = within.detach().to("cpu", torch.float64).flatten(2)  # [doc, replicate, cell]
    undefined = r.isnan().all(-1)
    own = ((r == x) | (r.isnan() & x.isnan())).all(-1)
    if not bool((undefined | own).all()):
        return None
    return torch.where(undefined & ~x.isnan().all(-1), 0.0, w)


def merge_stats(a: FieldStats, b: FieldStats, _rounded: bool = True, *, into: bool = False) -> FieldStats:
    """Statistics of the union of the documents of ``a`` and ``b`` (in ``a``'s dtypes).

    Sums are added in float64 and rounded once to the dtype kept; counts are
    exact; growing axes are padded to the wider of the two.

    ``into``: write the union into ``a``'s sums, ranges and groups where they
    already have its shape and are kept in float64 (an accumulator's), rather
    than into new tensors, bit for bit the same numbers. ``a``'s tensors then
    change: only for statistics that the caller alone holds (`Accumulator`).
    Rows of documents are never written into.
    """
    if a.spec != b.spec:
        raise GeometryError(f"merge: field {a.spec.name!r} is declared differently: {a.spec} vs {b.spec}")
    if a.n_replicates != b.n_replicates and a.spec.growing and 0 in (a.n_replicates, b.n_replicates):
        # a profile past GROWING_ROWS documents saved before groups: no replicates
        return merge_stats(a.summed().ungrouped(), b.summed().ungrouped(), into=into)
    if a.n_replicates != b.n_replicates:
        raise GeometryError(
            f"merge: field {a.spec.name!r} has {a.n_replicates} vs {b.n_replicates} bootstrap replicates; "
            "analyse both with the same n_bootstrap and bootstrap fields"
        )
    if a.count.shape[:2] != b.count.shape[:2]:
        raise GeometryError(
            f"merge: field {a.spec.name!r} covers [layer, head_index] = {list(a.count.shape[:2])} vs "
            f"{list(b.count.shape[:2])}"
        )
    if len(a.trailing) != len(b.trailing):
        raise GeometryError(f"merge: field {a.spec.name!r} has trailing shapes {list(a.trailing)} vs {list(b.trailing)}")
    trailing = tuple(max(p, q) for p, q in zip(a.trailing, b.trailing))
    if a.is_rows and b.is_rows:
        a, b = a.widened(trailing), b.widened(trailing)
        joined = FieldStats.of_documents(a.spec, torch.cat([a.documents, b.documents]),
                                         torch.cat([a.document_weights, b.document_weights])).cast_like(a)
        if joined.documents.shape[0] <= rows_limit(a.spec, a.n_replicates):
            return joined
        return joined.summed()
    if a.is_rows or b.is_rows:  # one side already sums: so is the union
        return merge_stats(a.summed(), b.summed().cast_like(a.summed()) if a.is_rows else b.summed(), into=into)
    if a.is_grouped != b.is_grouped and not (a.counted_nothing() or b.counted_nothing()):
        # groups beside replicate sums (an accumulator without rows): neither resamples the union
        bare = {s: None for s in (*_REPLICATES, *GROUPS)}
        return merge_stats(replace(a, **bare), replace(b, **bare), into=into)
    # The union with nothing is the other side: spares a pass over the replicate sums on a run's first batch.
    if b.counted_nothing():
        return a.widened(trailing)
    if a.counted_nothing():
        b = b.widened(trailing)
        return replace(b, **{s: t.to(getattr(a, s).dtype) for s, t in b.arrays().items()})
    if _rounded and a._is_stored() and a.spec.resample_queries:  # a result's: as `stored` rounds them
        return merge_stats(a, b, _rounded=False, into=into).stored()
    a, b = a.widened(trailing), b.widened(trailing)
    left, right = a.arrays(), b.arrays()
    out = {}
    for statistic, t in left.items():
        u = right[statistic]
        # Written into t where asked: a float64 sum rounds as (t.double() + u.double()) would; counts, ranges
        # and weights are the same in any dtype.
        written = t if into and (statistic not in _FLOAT_SUMS or t.dtype == torch.float64) else None
        if statistic == "minimum":
            out[statistic] = torch.fmin(t, u.to(t.dtype), out=written)  # fmin: NaN (nothing counted) loses
        elif statistic == "maximum":
            out[statistic] = torch.fmax(t, u.to(t.dtype), out=written)
        elif statistic in ("count", "group_count"):
            out[statistic] = t + u if written is None else written.add_(u)
        elif statistic == "group_weights":
            out[statistic] = _lowest_weights(t, u, into=written is not None)
        elif written is not None:
            out[statistic] = written.add_(u.double())
        else:
            out[statistic] = (t.double() + u.double()).to(t.dtype)
    return FieldStats(spec=a.spec, **out)


def _lowest_weights(a: Float[Tensor, "group replicate"], b: Float[Tensor, "group replicate"],
                    into: bool = False) -> Tensor:
    """Per group, the weights of ``a`` or ``b`` whose hash (`document_group`) is lower (NaN: no document);
    written into ``a`` with ``into``."""
    out = a if into else a.clone()
    for g in range(a.shape[0]):
        if not b[g].isnan().any() and (a[g].isnan().any() or document_group(b[g])[1] < document_group(a[g])[1]):
            out[g] = b[g]
    return out


def same_values(a: Tensor, b: Tensor) -> bool:
    """Equal dtype, shape and values, NaN equal to NaN (the bitwise sense in which saved results round-trip)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0, math.inf, -math.inf),
                                                             b.nan_to_num(0.0, math.inf, -math.inf))
