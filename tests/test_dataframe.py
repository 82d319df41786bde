"""GeometryResult.to_dataframe / to_parquet / queries_dataframe against per_head, std, count, ci and the rows."""

import math

import numpy as np
import pandas as pd
import pytest

from tests.fixtures import GRID, HEADS, LAYERS, make_result
from tl_geometry.errors import GeometryError

COLUMNS = ["field", "layer", "head", "n", "position", "lag", "mean", "std", "count", "ci_low", "ci_high"]


def same(a, b) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def test_every_row_is_the_statistic_it_names():
    result = make_result(n_docs=7)
    df = result.to_dataframe(form="long", level=0.9)
    assert list(df.columns) == COLUMNS
    assert set(df.field.cat.categories) == set(result.fields)
    for name in result.fields:
        spec = result.spec(name)
        rows = df[df.field == name]
        mean = result.per_head(name)
        assert len(rows) == mean.numel()
        std = result.std(name) if spec.documents == "moments" else None
        low, high = result.ci(name, 0.9) if result.has_replicates(name) else (None, None)
        for row in rows.itertuples():
            i, j = LAYERS.index(row.layer), HEADS.index(row.head)
            if spec.axes == ("n",):
                index = (i, j, GRID.tolist().index(int(row.n)))  # n holds N values, not grid indices
                assert math.isnan(row.position) and math.isnan(row.lag)
            elif spec.axes == ("position",):
                index = (i, j, int(row.position))
                assert math.isnan(row.n) and math.isnan(row.lag)
            elif spec.axes == ("lag",):
                index = (i, j, int(row.lag))
            else:
                index = (i, j)
                assert math.isnan(row.n) and math.isnan(row.position) and math.isnan(row.lag)
            assert same(row.mean, mean[index].item()), (name, index)
            assert row.count == result.count(name)[index].item()
            assert same(row.std, std[index].item() if std is not None else math.nan), (name, index)
            assert same(row.ci_low, low[index].item() if low is not None else math.nan)
            assert same(row.ci_high, high[index].item() if high is not None else math.nan)
    # Where each kind sits: the spread only for "moments" fields, intervals only with replicates.
    assert df[df.field == "attention_profile"]["std"].isna().all()
    assert df[df.field == "recall"]["ci_low"].notna().any() and df[df.field == "precision"]["ci_low"].isna().all()


def test_choosing_fields_and_parquet_round_trip(tmp_path):
    result = make_result()
    df = result.to_dataframe(fields=["recall", "rho0"], form="long")
    assert list(df.field.unique()) == ["recall", "rho0"]
    assert len(df) == len(LAYERS) * len(HEADS) * (len(GRID) + 1)
    path = result.to_parquet(tmp_path / "stats.parquet", fields="recall")
    back = pd.read_parquet(path)
    pd.testing.assert_frame_equal(back, result.to_dataframe(fields="recall", form="long"), check_categorical=False)
    for form in ("summary", "long"):
        with pytest.raises(GeometryError, match=r"fields: \['nope'\] are not fields of this result"):
            result.to_dataframe(fields=["nope"], form=form)


def test_per_query_rows_as_a_table():
    result = make_result(n_docs=4, keep_queries=True)
    q = result.queries_dataframe()
    assert list(q.columns) == ["field", "document", "query_position", "layer", "head", "n", "position", "lag", "value"]
    rows = result.queries["precision"]  # [doc, layer, head_index, query, n]
    positions = result.query_positions
    assert len(q) == int((positions >= 0).sum()) * len(LAYERS) * len(HEADS) * len(GRID)
    for row in q.sample(60, random_state=0).itertuples():
        query = positions[row.document].tolist().index(row.query_position)
        value = rows[row.document, LAYERS.index(row.layer), HEADS.index(row.head), query,
                     GRID.tolist().index(int(row.n))].item()
        assert same(row.value, value)
    with pytest.raises(GeometryError, match="kept no per-query rows; analyse with keep_queries=True"):
        make_result().queries_dataframe()


def test_plotting_libraries_take_it_as_is():
    px = pytest.importorskip("plotly.express")
    df = make_result().to_dataframe(fields="recall", form="long")
    figure = px.line(df[df.layer == LAYERS[0]], x="n", y="mean", color="head", error_y=df[df.layer == LAYERS[0]]["std"])
    assert len(figure.data) == len(HEADS) and np.allclose(sorted(set(figure.data[0].x)), GRID.numpy())


def test_the_default_table_is_a_summary_per_head_at_a_few_n():
    """One row per (layer, head, N) at the N of 1, 2, 4, 8, 16 on the grid; a column per field, intervals beside.

    Mutants caught: rows in another order than their labels; the interval of another level; a per-head field not
    repeated on each N; all N kept.
    """
    result = make_result(n_docs=6)
    grid = GRID.tolist()
    df = result.to_dataframe(level=0.8)
    shown = [n for n in (1, 2, 4, 8, 16) if n in grid]
    assert len(df) == len(LAYERS) * len(HEADS) * len(shown) < len(result.to_dataframe(form="long"))
    fields = [name for name in ("precision", "recall", "f_score") if name in result.fields]
    expected_columns = ["layer", "head", "n"]
    for name in fields:
        expected_columns += [name] + ([f"{name}_ci_low", f"{name}_ci_high"] if result.has_replicates(name) else [])
    assert list(df.columns) == expected_columns
    for row in df.itertuples():
        i, j, k = LAYERS.index(row.layer), HEADS.index(row.head), grid.index(row.n)
        for name in fields:
            assert same(getattr(row, name), result.per_head(name)[i, j, k].item())
        if result.has_replicates("recall"):
            low, high = result.ci("recall", 0.8)
            assert same(row.recall_ci_low, low[i, j, k].item()) and same(row.recall_ci_high, high[i, j, k].item())
    chosen = result.to_dataframe(["recall", "rho0"], n=[grid[-1], grid[0]])
    assert list(chosen.n.unique()) == [grid[-1], grid[0]]
    for row in chosen.itertuples():
        i, j = LAYERS.index(row.layer), HEADS.index(row.head)
        assert same(row.rho0, result.per_head("rho0")[i, j].item())
        assert same(row.recall, result.per_head("recall")[i, j, grid.index(row.n)].item())


def test_the_long_table_at_chosen_n_and_bad_requests():
    result = make_result()
    grid = GRID.tolist()
    full = result.to_dataframe(["recall", "rho0", "attention_profile"], form="long")
    some = result.to_dataframe(["recall", "rho0", "attention_profile"], n=grid[1], form="long")
    keep = (full.field != "recall") | (full.n == grid[1])
    pd.testing.assert_frame_equal(some, full[keep].reset_index(drop=True))
    with pytest.raises(GeometryError, match=r"n: \[3\] is not on this result's grid; choose N values from"):
        result.to_dataframe(n=[1, 3])
    with pytest.raises(GeometryError, match=r"fields: \['attention_profile'\] have axes \[\('position',\)\].*form='long'"):
        result.to_dataframe("attention_profile")
    with pytest.raises(GeometryError, match=r"form: expected one of \['summary', 'long'\], got 'wide'"):
        result.to_dataframe(form="wide")
