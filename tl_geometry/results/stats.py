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

Accumulators hold float64 everywhere; a result holds the storage dtypes of
`STORAGE_DTYPES` (what its files hold, so a save / load round trip is exact).
"""

import math
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
          "replicate_total": 0.0, "replicate_count": 0.0}
_MOMENTS = ("total_sq", "minimum", "maximum")
_REPLICATES = ("replicate_total", "replicate_count")


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
            counts, ``[replicate, layer, head_index, *trailing]`` (None without replicates).
    """

    spec: FieldSpec
    count: Int[Tensor, "layer head_index *trailing"]
    total: Float[Tensor, "layer head_index *trailing"]
    total_sq: Float[Tensor, "layer head_index *trailing"] | None = None
    minimum: Float[Tensor, "layer head_index *trailing"] | None = None
    maximum: Float[Tensor, "layer head_index *trailing"] | None = None
    replicate_total: Float[Tensor, "replicate layer head_index *trailing"] | None = None
    replicate_count: Float[Tensor, "replicate layer head_index *trailing"] | None = None

    def __post_init__(self) -> None:
        name = self.spec.name
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
        for statistic, t in self.arrays().items():
            expected = self.count.shape if statistic not in _REPLICATES else self.replicate_total.shape
            if t.shape != expected or (statistic == "count") == t.is_floating_point():
                raise GeometryError(
                    f"field {name!r}: {statistic} has shape {list(t.shape)} and dtype {t.dtype}; expected "
                    f"shape {list(expected)} and {'an integer' if statistic == 'count' else 'a float'} dtype"
                )

    @classmethod
    def empty(cls, spec: FieldSpec, shape: tuple[int, ...], n_replicates: int | None) -> "FieldStats":
        """Statistics of no documents, ``shape`` = ``[layer, head_index, *trailing]`` (float64)."""
        wanted = ["count", "total", *(_MOMENTS if spec.documents == "moments" else ())]
        wanted += list(_REPLICATES) if n_replicates is not None else []
        out = {}
        for statistic in wanted:
            size = (n_replicates, *shape) if statistic in _REPLICATES else shape
            dtype = torch.int64 if statistic == "count" else torch.float64
            out[statistic] = torch.full(size, _EMPTY[statistic], dtype=dtype)
        return cls(spec=spec, **out)

    def arrays(self) -> dict[str, Tensor]:
        """The statistics it holds, by name (those that are None left out)."""
        return {f.name: t for f in fields(self) if f.name != "spec" and (t := getattr(self, f.name)) is not None}

    @property
    def trailing(self) -> tuple[int, ...]:
        """Sizes of the trailing axes."""
        return tuple(self.count.shape[2:])

    def counted_nothing(self) -> bool:
        """No document was counted anywhere (and no replicate weight): the identity of `merge_stats`."""
        return not bool(self.count.any()) and (self.replicate_count is None or not bool(self.replicate_count.any()))

    @property
    def n_replicates(self) -> int:
        """Bootstrap replicates kept (0 without)."""
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
        out = {}
        for statistic, t in self.arrays().items():
            shape = list(t.shape)
            shape[t.ndim - len(trailing):] = trailing
            padded = torch.full(shape, _EMPTY[statistic], dtype=t.dtype)
            padded[tuple(slice(0, n) for n in t.shape)] = t
            out[statistic] = padded
        return replace(self, **out)

    def stored(self) -> "FieldStats":
        """These statistics in the dtypes a result keeps (`storage_dtype`)."""
        return replace(self, **{s: t.to(storage_dtype(self.spec, s)) for s, t in self.arrays().items()})

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

    def replicate_means(self) -> Float[Tensor, "replicate layer head_index *trailing"]:
        """Weighted mean of every bootstrap replicate; NaN where a replicate gave no document weight."""
        return self.replicate_total.double() / self.replicate_count.double()


def batch_stats(
    spec: FieldSpec,
    values: Float[Tensor, "doc layer head_index *trailing"],
    weights: Float[Tensor, "doc replicate"] | None,
    within: Float[Tensor, "doc replicate layer head_index *trailing"] | None = None,
) -> FieldStats:
    """The float64 statistics of one batch of per-document values (NaN: not defined for that document).

    ``within`` (with ``weights``): each document's own value per replicate (a
    two-stage bootstrap that also resamples inside the document); replicate b
    then sums w[d, b] within[d, b] instead of w[d, b] values[d].
    """
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
        w = weights.detach().to("cpu", torch.float64).T  # [replicate, doc]
        shape = (w.shape[0], *x.shape[1:])
        # A zero weight times an infinite value would give NaN: weight the finite part, add the infinities after.
        infinite = x.isinf()
        finite = torch.where(infinite, 0.0, zeroed) if infinite.any() else zeroed
        total = (w @ finite.flatten(1)).reshape(shape)
        if infinite.any():
            above = (w @ (x == math.inf).flatten(1).double()).reshape(shape) > 0
            below = (w @ (x == -math.inf).flatten(1).double()).reshape(shape) > 0
            total = total + torch.where(above, math.inf, 0.0) + torch.where(below, -math.inf, 0.0)
        out["replicate_total"] = total
        out["replicate_count"] = (w @ defined.flatten(1).double()).reshape(shape)
    return FieldStats(spec=spec, **out)


def merge_stats(a: FieldStats, b: FieldStats) -> FieldStats:
    """Statistics of the union of the documents of ``a`` and ``b`` (in ``a``'s dtypes).

    Sums are added in float64 and rounded once to the dtype kept; counts are
    exact; growing axes are padded to the wider of the two.
    """
    if a.spec != b.spec:
        raise GeometryError(f"merge: field {a.spec.name!r} is declared differently: {a.spec} vs {b.spec}")
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
    # The union with nothing is the other side: spares a pass over the replicate sums on a run's first batch.
    if b.counted_nothing():
        return a.widened(trailing)
    if a.counted_nothing():
        b = b.widened(trailing)
        return replace(b, **{s: t.to(getattr(a, s).dtype) for s, t in b.arrays().items()})
    a, b = a.widened(trailing), b.widened(trailing)
    left, right = a.arrays(), b.arrays()
    out = {}
    for statistic, t in left.items():
        u = right[statistic]
        if statistic == "minimum":
            out[statistic] = torch.fmin(t, u.to(t.dtype))  # fmin: NaN (nothing counted) loses
        elif statistic == "maximum":
            out[statistic] = torch.fmax(t, u.to(t.dtype))
        elif statistic == "count":
            out[statistic] = t + u
        else:
            out[statistic] = (t.double() + u.double()).to(t.dtype)
    return FieldStats(spec=a.spec, **out)


def same_values(a: Tensor, b: Tensor) -> bool:
    """Equal dtype, shape and values, NaN equal to NaN (the bitwise sense in which saved results round-trip)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0, math.inf, -math.inf),
                                                             b.nan_to_num(0.0, math.inf, -math.inf))
