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


# ---------------------------------------------------------------- an intervention sweep's table

SWEEP_GRID = [1, 3, 8, 32]  # 3 and 32: not among the N a GeometryResult's summary shows
SWEEP_LAYERS, SWEEP_HEADS = (0, 2), (-1,)  # a layer-scope sweep: one unit per layer, every head at once
MODES = ("renormalise", "delete")


def sweep_of(documents: dict[str, np.ndarray], weights: np.ndarray, n_controls: int):
    """An InterventionResult holding these per-document values ``[document, layer, head_index, *trailing]``."""
    import torch

    from tl_geometry.results.intervention_result import InterventionResult, sweep_specs
    from tl_geometry.results.stats import FieldStats

    specs = {spec.name: spec for spec in sweep_specs(MODES, n_controls)}
    w = torch.from_numpy(weights)
    stats = {name: FieldStats.of_documents(spec, torch.from_numpy(documents[name]), w if spec.bootstrap else w[:, :0])
             for name, spec in specs.items()}
    return InterventionResult(
        n_grid=torch.tensor(SWEEP_GRID), layers=SWEEP_LAYERS, heads=SWEEP_HEADS, stats=stats,
        n_documents=weights.shape[0], n_tokens=64 * weights.shape[0], scope="layer", modes=MODES, ranking="attention",
        n_controls=n_controls, intervened_layers=SWEEP_LAYERS, intervened_heads=None, seed=0, model_name="made-up",
        versions={},
    )


def made_documents(rng: np.random.Generator, n_docs: int, n_controls: int) -> dict[str, np.ndarray]:
    """Per-document values of every field of a sweep, a few missing (NaN) as where a window is too short."""
    units = (n_docs, len(SWEEP_LAYERS), len(SWEEP_HEADS))
    out = {"nll_clean": rng.uniform(2, 5, units)}
    for mode in MODES:
        out[f"dnll_{mode}"] = rng.normal(0.5, 1, (*units, len(SWEEP_GRID)))
        out[f"dnll_{mode}"][0, 1, 0, 3] = np.nan
        controls = rng.normal(1.0, 1, (*units, len(SWEEP_GRID), n_controls))
        out[f"dnll_{mode}_random"] = controls
        out[f"dnll_{mode}_random_mean"] = controls.mean(-1)
    return out


def reference_mean_and_interval(values: np.ndarray, weights: np.ndarray, level: float):
    """From the definitions: the mean over the documents where a value is defined, and the percentile interval of
    the bootstrap replicates' weighted means (replicate b: sum_d w[d, b] x_d / sum_d w[d, b] over defined x_d)."""
    defined = ~np.isnan(values)
    mean = np.where(defined, values, 0).sum(0) / defined.sum(0)
    replicate_means = np.stack([
        (weights[:, b].reshape(-1, *[1] * (values.ndim - 1)) * np.where(defined, values, 0)).sum(0)
        / (weights[:, b].reshape(-1, *[1] * (values.ndim - 1)) * defined).sum(0)
        for b in range(weights.shape[1])
    ])
    tail = (1 - level) / 2
    return mean, np.nanquantile(replicate_means, tail, axis=0), np.nanquantile(replicate_means, 1 - tail, axis=0)


@pytest.mark.parametrize("n_controls", [3, 0])
def test_a_sweep_reads_as_a_table_per_unit_and_n(n_controls):
    """The default table of a sweep: a row per scope unit and N of the grid, each mode's dNLL and its controls' mean
    with intervals; checked against means and percentiles computed here from the per-document values.

    Mutants caught: the long table by default; N values as grid indices; a mode's columns swapped; the control
    mean left out (or shown without controls); the interval of another level; a unit's rows under another unit.
    """
    rng = np.random.default_rng(3)
    n_docs, n_replicates, level = 9, 40, 0.8
    documents = made_documents(rng, n_docs, max(n_controls, 1))
    weights = rng.poisson(1.0, (n_docs, n_replicates)).astype(np.float64)
    sweep = sweep_of(documents, weights, n_controls)
    df = sweep.to_dataframe(level=level)
    shown = [f"dnll_{mode}{suffix}" for mode in MODES for suffix in ("", "_random_mean")[: 2 if n_controls else 1]]
    assert list(df.columns) == ["layer", "head", "n"] + [c for name in shown for c in (name, f"{name}_ci_low",
                                                                                        f"{name}_ci_high")]
    assert len(df) == len(SWEEP_LAYERS) * len(SWEEP_HEADS) * len(SWEEP_GRID)
    assert sorted(set(zip(df.layer, df["head"], df.n))) == sorted(
        (layer, head, n) for layer in SWEEP_LAYERS for head in SWEEP_HEADS for n in SWEEP_GRID)
    for name in shown:
        mean, low, high = reference_mean_and_interval(documents[name], weights, level)
        for row in df.itertuples():
            index = (SWEEP_LAYERS.index(row.layer), SWEEP_HEADS.index(row.head), SWEEP_GRID.index(row.n))
            assert getattr(row, name) == pytest.approx(mean[index], rel=1e-12), (name, index)
            assert getattr(row, f"{name}_ci_low") == pytest.approx(low[index], rel=1e-9), (name, index)
            assert getattr(row, f"{name}_ci_high") == pytest.approx(high[index], rel=1e-9), (name, index)
    assert df.dnll_delete.notna().all()  # a document without a value leaves the mean of the others


def test_a_sweep_table_at_chosen_fields_and_n_and_the_long_form():
    rng = np.random.default_rng(4)
    documents = made_documents(rng, 5, 2)
    weights = rng.poisson(1.0, (5, 16)).astype(np.float64)
    sweep = sweep_of(documents, weights, 2)
    chosen = sweep.to_dataframe(["dnll_delete", "nll_clean"], n=[8, 1])
    assert list(chosen.columns) == ["layer", "head", "n", "dnll_delete", "dnll_delete_ci_low", "dnll_delete_ci_high",
                                    "nll_clean", "nll_clean_ci_low", "nll_clean_ci_high"]
    assert list(chosen.n.unique()) == [8, 1]
    clean = np.nanmean(documents["nll_clean"], axis=0)
    for row in chosen.itertuples():  # a per-unit number repeats on each N
        assert row.nll_clean == pytest.approx(clean[SWEEP_LAYERS.index(row.layer), 0], rel=1e-12)
    long = sweep.to_dataframe(form="long")
    assert list(long.columns) == ["field", "layer", "head", "n", "control", "mean", "std", "count", "ci_low", "ci_high"]
    assert len(long) == sum(s.count.numel() for s in sweep.stats.values())
    some = sweep.to_dataframe(form="long", n=3)
    assert set(some[some.field == "dnll_delete"].n) == {3.0} and (some.field == "nll_clean").sum() == 2
    with pytest.raises(GeometryError, match=r"fields: \['dnll_delete_random'\] have axes \[\('n', 'control'\)\].*"
                                            r"form='long'"):
        sweep.to_dataframe("dnll_delete_random")
    with pytest.raises(GeometryError, match=r"n: \[4\] is not on this result's grid; choose N values from \[1, 3, 8, 32\]"):
        sweep.to_dataframe(n=4)
    with pytest.raises(GeometryError, match=r"form: expected one of \['summary', 'long'\], got 'wide'"):
        sweep.to_dataframe(form="wide")
