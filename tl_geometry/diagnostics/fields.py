"""Field declarations: what a diagnostic returns, its axes, and how it reduces.

Every number a run measures is a *field*, declared once by the diagnostic
that computes it. The declaration is all the rest of the package needs:
the hooks reduce a field over the queries of a sequence as it says, the
accumulators keep the statistics it asks for over documents, the result
lists it, and the report asks for it by its declaration, never by a string
another module must spell the same way.

Leading axes are always ``[layer, head_index]`` on a result (``[batch,
head_index]`` per layer inside the pass); ``axes`` names the trailing ones.
"""

from dataclasses import dataclass
from typing import Literal, get_args

from tl_geometry.errors import GeometryError

Axis = Literal["n", "position", "lag", "control"]
"""Trailing axes: the N grid, a key position counted from the sink, a lag between positions, a random control."""
QueryReduction = Literal["mean", "last", "sequence"]
"""How a field becomes one value per (sequence, head):

- ``"mean"``: computed for every analysed query row, then the nanmean over a
  sequence's analysed queries;
- ``"last"``: defined for each sequence's last analysed query only (e.g. a
  per-position profile of one attention row);
- ``"sequence"``: computed once per sequence and head from the value states,
  not per query.
"""
DocumentReduction = Literal["moments", "mean"]
"""What the accumulators keep over documents, per (layer, head, trailing index):

- ``"moments"``: count, sum, sum of squares, min and max (mean, std, standard
  error and range are exact);
- ``"mean"``: count and sum only, for wide per-position profiles whose spread
  nobody reads (keeps results small).
"""

# A trailing axis that grows with the sequence: accumulators pad it as windows get longer.
GROWING_AXES: tuple[str, ...] = ("position", "lag")


@dataclass(frozen=True)
class FieldSpec:
    """One declared output field.

    Attributes:
        name: the field's name on a result (``result.per_head(name)``).
        doc: one line on what it is (shown in ``result.describe()`` and the report).
        axes: trailing axes after ``[layer, head_index]``, from ``Axis``.
        queries: how per-query values reduce per sequence (``QueryReduction``).
        documents: what is kept over documents (``DocumentReduction``).
        bootstrap: keep Poisson-bootstrap replicates by default, so that
            ``result.ci(name)`` works (other fields only when asked for in
            ``GeometryConfig.bootstrap_fields``).
        resample_queries: the replicates also resample the query rows within
            each document (a two-stage bootstrap: a Poisson weight per
            document, then one per query row), so that a field measured on
            many queries per document gets the spread of both.
    """

    name: str
    doc: str
    axes: tuple[str, ...] = ()
    queries: str = "mean"
    documents: str = "moments"
    bootstrap: bool = False
    resample_queries: bool = False

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise GeometryError(f"FieldSpec.name: expected a Python identifier, got {self.name!r}")
        for axis in self.axes:
            if axis not in get_args(Axis):
                raise GeometryError(f"FieldSpec {self.name!r}: axis {axis!r} is not one of {get_args(Axis)}")
        if self.queries not in get_args(QueryReduction):
            raise GeometryError(
                f"FieldSpec {self.name!r}: queries={self.queries!r} is not one of {get_args(QueryReduction)}"
            )
        if self.resample_queries and self.queries != "mean":
            raise GeometryError(
                f"FieldSpec {self.name!r}: resample_queries needs per-query rows (queries='mean'), got {self.queries!r}"
            )
        if self.documents not in get_args(DocumentReduction):
            raise GeometryError(
                f"FieldSpec {self.name!r}: documents={self.documents!r} is not one of {get_args(DocumentReduction)}"
            )

    @property
    def growing(self) -> bool:
        """Whether the last trailing axis grows with the sequence length (positions, lags)."""
        return bool(self.axes) and self.axes[-1] in GROWING_AXES
