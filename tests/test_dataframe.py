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
    df = result.to_dataframe(level=0.9)
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
    df = result.to_dataframe(fields=["recall", "rho0"])
    assert list(df.field.unique()) == ["recall", "rho0"]
    assert len(df) == len(LAYERS) * len(HEADS) * (len(GRID) + 1)
    path = result.to_parquet(tmp_path / "stats.parquet", fields="recall")
    back = pd.read_parquet(path)
    pd.testing.assert_frame_equal(back, result.to_dataframe(fields="recall"), check_categorical=False)
    with pytest.raises(GeometryError, match=r"fields: \['nope'\] are not fields of this result"):
        result.to_dataframe(fields=["nope"])


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
    df = make_result().to_dataframe(fields="recall")
    figure = px.line(df[df.layer == LAYERS[0]], x="n", y="mean", color="head", error_y=df[df.layer == LAYERS[0]]["std"])
    assert len(figure.data) == len(HEADS) and np.allclose(sorted(set(figure.data[0].x)), GRID.numpy())
