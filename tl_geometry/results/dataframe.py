"""A result as pandas tables: a summary a person reads, and long tables ready for seaborn or plotly.

`summary_dataframe` (what ``result.to_dataframe()`` gives by default): one
row per layer, head and N, one column per field, ``<field>_ci_low`` /
``<field>_ci_high`` beside the fields with bootstrap replicates. Fields
without an N axis (per-head numbers such as ``rho0``) repeat on each N;
fields over key positions, lags or random controls belong to the long
table. By default, for a `GeometryResult`: Precision, Recall and F_N at a
few N (1, 2, 4, 8 and 16 where the grid has them); for an
`InterventionResult` (one row per scope unit and N, layer or head -1 for the
unit of every layer or head): each mode's dNLL and, with random controls,
their mean dNLL, at every N of the sweep's grid (a sweep's N are chosen, one
forward pass each).

`to_dataframe` (``result.to_dataframe(form="long")``), one row per
(field, layer, head, trailing index) over every field and N by default, with
columns:

- ``field`` (categorical), ``layer``, ``head``: which statistic;
- ``n``, ``position``, ``lag``: the trailing index (float64: the N value of
  the grid, the key position counted from the sink, the lag), NaN for axes
  the field does not have;
- ``mean``, ``std`` (sample, ddof 1; NaN for fields that keep only count
  and sum, and with fewer than two documents), ``count`` (documents where the
  field is defined), ``ci_low`` and ``ci_high`` (percentile bootstrap
  interval at ``level``; NaN for fields without replicates).

`queries_dataframe` gives the per-query rows of a ``keep_queries=True``
run the same way, with ``document`` and ``query_position`` instead of the
statistics and one ``value`` column.

>>> result.to_dataframe()  # doctest: +SKIP
>>> df = result.to_dataframe(fields=["precision"], form="long")  # doctest: +SKIP
>>> px.line(df[df.layer == 3], x="n", y="mean", color="head")  # doctest: +SKIP
"""

from collections.abc import Sequence
from typing import Any, Literal, get_args

import numpy as np
import torch

from tl_geometry.diagnostics.fields import Axis
from tl_geometry.diagnostics.selection import F_SCORE, PRECISION, RECALL
from tl_geometry.errors import GeometryError

# One column per trailing axis a GeometryResult's fields may have ("control" is an intervention sweep's).
AXIS_COLUMNS: tuple[str, ...] = tuple(axis for axis in get_args(Axis) if axis != "control")
STAT_COLUMNS = ("mean", "std", "count", "ci_low", "ci_high")
Form = Literal["summary", "long"]
"""``"summary"``: one row per layer, head and N, a column per field; ``"long"``: one row per statistic."""
SUMMARY_FIELDS = (PRECISION.name, RECALL.name, F_SCORE.name)
SUMMARY_N = (1, 2, 4, 8, 16)
"""The N values of the summary where the grid has them (else its first four)."""


def check_form(form: str) -> None:
    if form not in get_args(Form):
        raise GeometryError(f"form: expected one of {list(get_args(Form))}, got {form!r}; 'summary' gives one row per "
                            "layer, head and N, 'long' one row per statistic of every field")


def chosen_n(result: Any, n: Sequence[int] | int | None, default: Sequence[int] | None = SUMMARY_N) -> list[int]:
    """The N values asked for, each checked against the grid; None: ``default`` on the grid (None: the whole grid)."""
    grid = result.n_grid.tolist()
    if n is None:
        return grid if default is None else ([m for m in default if m in grid] or grid[:4])
    wanted = [n] if isinstance(n, int) else [int(m) for m in n]
    off = [m for m in wanted if m not in grid]
    if off or not wanted:
        raise GeometryError(f"n: {off or wanted} {'is' if len(off) == 1 else 'are'} not on this result's grid; "
                            f"choose N values from {grid}")
    return wanted


def _pandas() -> Any:
    try:
        import pandas
    except ImportError:
        raise GeometryError("to_dataframe needs pandas: pip install pandas") from None
    return pandas


def _chosen(result: Any, fields: Sequence[str] | str | None) -> list[str]:
    if fields is None:
        return list(result.fields)
    names = [fields] if isinstance(fields, str) else list(fields)
    unknown = [name for name in names if name not in result.stats]
    if unknown:
        raise GeometryError(f"fields: {unknown} are not fields of this result; it has {sorted(result.stats)}")
    return names


def _index_columns(result: Any, axes: tuple[str, ...], shape: tuple[int, ...],
                   axis_columns: tuple[str, ...] = AXIS_COLUMNS) -> dict[str, np.ndarray]:
    """layer, head and the axis columns for every element of a ``[layer, head_index, *trailing]`` array (C order)."""
    grids = np.indices(shape).reshape(len(shape), -1)
    out = {"layer": np.asarray(result.layers, dtype=np.int64)[grids[0]],
           "head": np.asarray(result.heads, dtype=np.int64)[grids[1]]}
    labels = {"n": result.n_grid.numpy().astype(np.float64)}
    for column in axis_columns:
        if column in axes:
            index = grids[2 + axes.index(column)]
            out[column] = labels[column][index] if column in labels else index.astype(np.float64)
        else:
            out[column] = np.full(grids.shape[1], np.nan)
    return out


def _flat(t: torch.Tensor, dtype: Any = np.float64) -> np.ndarray:
    return t.detach().cpu().numpy().reshape(-1).astype(dtype)


def to_dataframe(result: Any, fields: Sequence[str] | str | None = None, level: float = 0.95,
                 axis_columns: tuple[str, ...] = AXIS_COLUMNS, n: Sequence[int] | int | None = None) -> Any:
    """The long table of a result's statistics (see the module docs for the columns).

    Args:
        result: a GeometryResult or an InterventionResult.
        fields: the fields to include (default: all).
        level: coverage of the bootstrap interval.
        axis_columns: the trailing-axis columns (an intervention sweep's are
            ``("n", "control")``: the random control's index).
        n: the N values kept for fields with an N axis (default: every N of the grid).

    Returns:
        A ``pandas.DataFrame``.
    """
    pd = _pandas()
    kept = None if n is None else chosen_n(result, n)
    frames = []
    for name in _chosen(result, fields):
        spec = result.spec(name)
        mean = result.per_head(name)
        columns = _index_columns(result, spec.axes, tuple(mean.shape), axis_columns)
        columns["mean"] = _flat(mean)
        columns["std"] = _flat(result.std(name)) if spec.documents == "moments" else np.full(mean.numel(), np.nan)
        columns["count"] = _flat(result.count(name), np.int64)
        if result.has_replicates(name):
            low, high = result.ci(name, level=level)
            columns["ci_low"], columns["ci_high"] = _flat(low), _flat(high)
        else:
            columns["ci_low"] = columns["ci_high"] = np.full(mean.numel(), np.nan)
        frame = pd.DataFrame({"field": name, **columns})
        frames.append(frame if kept is None or "n" not in spec.axes else frame[frame["n"].isin(kept)])
    table = _joined(pd, frames, ["field", "layer", "head", *axis_columns, *STAT_COLUMNS])
    return table if kept is None else table.reset_index(drop=True)


def summary_dataframe(result: Any, fields: Sequence[str] | str | None = None, n: Sequence[int] | int | None = None,
                      level: float = 0.95, *, default_fields: Sequence[str] = SUMMARY_FIELDS,
                      default_n: Sequence[int] | None = SUMMARY_N) -> Any:
    """One row per layer, head and N, one column per field (see the module docs).

    Args:
        result: a GeometryResult or an InterventionResult.
        fields: fields with an N axis or none (default: those of ``default_fields`` the result has).
        n: the N values (default: those of ``default_n`` on the grid; None: the whole grid).
        level: coverage of the bootstrap intervals.
        default_fields: the fields shown when ``fields`` is None (a GeometryResult's: Precision, Recall and F_N).
        default_n: the N shown when ``n`` is None (a GeometryResult's: 1, 2, 4, 8 and 16 where the grid has them).

    Returns:
        A ``pandas.DataFrame`` with columns ``layer``, ``head``, ``n``, then each
        field's mean and, where it has replicates, ``<field>_ci_low`` and ``<field>_ci_high``.

    Raises:
        GeometryError: an unknown field, a field over positions or lags, an N off the grid.
    """
    pd = _pandas()
    names = [name for name in default_fields if name in result.stats] if fields is None else _chosen(result, fields)
    wide = [name for name in names if result.spec(name).axes not in ((), ("n",))]
    if wide:
        raise GeometryError(f"fields: {wide} have axes {[result.spec(name).axes for name in wide]}, which a row per "
                            "layer, head and N cannot hold; use to_dataframe(fields, form='long')")
    ns = chosen_n(result, n, default_n)
    grid = result.n_grid.tolist()
    at = torch.tensor([grid.index(m) for m in ns])
    shape = (len(result.layers), len(result.heads), len(ns))

    def per_n(t: torch.Tensor, spec_axes: tuple[str, ...]) -> np.ndarray:
        """``[layer, head_index(, n)]`` -> one value per row (a per-head number repeats on each N)."""
        return _flat(t.index_select(-1, at) if spec_axes else t[..., None].expand(shape))

    index = np.indices(shape).reshape(3, -1)
    columns: dict[str, np.ndarray] = {"layer": np.asarray(result.layers, dtype=np.int64)[index[0]],
                                      "head": np.asarray(result.heads, dtype=np.int64)[index[1]],
                                      "n": np.asarray(ns, dtype=np.int64)[index[2]]}
    for name in names:
        axes = result.spec(name).axes
        columns[name] = per_n(result.per_head(name), axes)
        if result.has_replicates(name):
            low, high = result.ci(name, level=level)
            columns[f"{name}_ci_low"], columns[f"{name}_ci_high"] = per_n(low, axes), per_n(high, axes)
    return pd.DataFrame(columns)


def queries_dataframe(result: Any, fields: Sequence[str] | str | None = None) -> Any:
    """The per-query rows of a ``keep_queries=True`` run as a long table, one ``value`` per row.

    Columns: ``field``, ``document``, ``query_position`` (counted from the
    document's first real token), ``layer``, ``head``, ``n``, ``position``,
    ``lag``, ``value``. Padding (queries a document does not have) is left out.

    Raises:
        GeometryError: the run kept no per-query rows.
    """
    pd = _pandas()
    if result.queries is None:
        raise GeometryError("queries_dataframe: this result kept no per-query rows; analyse with keep_queries=True")
    names = [name for name in _chosen(result, fields) if name in result.queries]
    positions = result.query_positions.numpy()
    frames = []
    for name in names:
        rows = result.queries[name]  # [doc, layer, head_index, query, *trailing]
        axes = result.spec(name).axes
        # Put the document and query axes in front, then index like a [layer, head_index, *trailing] array.
        moved = rows.movedim(3, 1)  # [doc, query, layer, head_index, *trailing]
        doc, query = moved.shape[:2]
        inner = tuple(moved.shape[2:])
        columns = _index_columns(result, axes, inner)
        per = int(np.prod(inner))
        frame = {
            "field": name,
            "document": np.repeat(np.arange(doc, dtype=np.int64), query * per),
            "query_position": np.repeat(positions.reshape(-1), per),
            **{key: np.tile(value, doc * query) for key, value in columns.items()},
            "value": _flat(moved),
        }
        frame_df = pd.DataFrame(frame)
        frames.append(frame_df[frame_df["query_position"] >= 0])
    return _joined(pd, frames, ["field", "document", "query_position", "layer", "head", *AXIS_COLUMNS, "value"])


def _joined(pd: Any, frames: list[Any], order: list[str]) -> Any:
    if not frames:
        return pd.DataFrame({column: [] for column in order})
    table = pd.concat(frames, ignore_index=True)[order]
    table["field"] = table["field"].astype("category")
    return table
