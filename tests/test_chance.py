"""Chance baselines (tl_geometry.diagnostics.chance) against a slow reference written from the definitions.

The reference scores each random ranking one row, one control and one N at a
time: its first N keys form the set, s(N) is their sum of y_i, and P, R follow
the paper's definitions (closed r_max ball, open r_min ball). Only the random
rankings themselves are taken from the package (they are the randomness).
"""

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests import test_metrics as metrics_tests
from tests import tiny_models as tm
from tests.mutants import Mutant, assert_caught, replace_attribute
from tl_geometry import GeometryError, run_with_geometry_hooks, selection_metrics
from tl_geometry.diagnostics.chance import DIAGNOSTIC, ChanceSettings, control_orders
from tl_geometry.engine.context import SelectionChunk, rows_context


def _chunks(alpha, values, mask, grid, distance="euclidean", budget=128.0):
    context = rows_context(
        alpha, values, mask, torch.tensor(grid), ranking="attention", distance=distance,
        memory_budget_mib=budget, costs=(DIAGNOSTIC.cost,),
    )  # fmt: skip
    return context.chunks()


def chance_rows(alpha, values, mask, grid, settings=ChanceSettings(), **kw):
    """The chance diagnostic's fields for independent rows, and the key order of each control ``[row, control, key]``."""
    parts, keys = {}, []
    for chunk in _chunks(alpha, values, mask, grid, **kw):
        for name, t in DIAGNOSTIC.rows(chunk, settings).items():
            parts.setdefault(name, []).append(t.clone())
        places = control_orders(chunk, settings.n_controls, settings.seed)
        keys.append(torch.gather(chunk.order.unsqueeze(1).expand_as(places), 2, places))
    return {name: torch.cat(ts) for name, ts in parts.items()}, torch.cat(keys)


def reference_score(alpha, values, visible, chosen, n, distance="euclidean"):
    """P(r_max, N), R(r_min, N) of the set ``chosen`` (N keys) around its own s = sum of alpha_i v_i."""
    y = {i: alpha[i].double() * values[i].double() for i in visible}
    s = sum((y[i] for i in chosen), torch.zeros(values.shape[-1], dtype=torch.float64))

    def dist(i):
        if distance == "euclidean":
            return float((s - y[i]).norm())
        return 1 - float(s @ y[i]) / (float(s.norm()) * float(y[i].norm()) + 1e-12)

    outside = [j for j in visible if j not in chosen]
    r_max = max(dist(i) for i in chosen)
    r_min = min((dist(j) for j in outside), default=math.inf)
    k_out = sum(dist(j) <= r_max for j in outside)
    k_in = sum(dist(i) < r_min for i in chosen)
    return n / (n + k_out), k_in / n


def random_rows(seed, rows=4, keys=11, d=5):
    gen = torch.Generator().manual_seed(seed)
    alpha = torch.softmax(3 * torch.randn(rows, keys, generator=gen, dtype=torch.float64), -1)
    values = torch.randn(rows, keys, d, generator=gen, dtype=torch.float64)
    mask = torch.ones(rows, keys, dtype=torch.bool)
    mask[1, 7:] = False
    mask[2, 0] = False  # a query that cannot see key 0
    return alpha, values, mask


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
@pytest.mark.parametrize("seed", [0, 1])
def test_controls_match_the_reference(seed, distance):
    alpha, values, mask = random_rows(seed)
    grid = [1, 2, 3, 5, 8, 11, 12]
    settings = ChanceSettings(n_controls=5, seed=seed)
    got, keys = chance_rows(alpha, values, mask, grid, settings, distance=distance)
    metrics = selection_metrics(alpha, values, grid, key_mask=mask, distance=distance, check_sums=False)
    for r in range(alpha.shape[0]):
        visible = [i for i in range(alpha.shape[-1]) if mask[r, i]]
        for col, n in enumerate(grid):
            if n > len(visible):
                assert all(math.isnan(float(t[r, col])) for t in got.values())
                continue
            scores = [reference_score(alpha[r], values[r], visible, keys[r, c, :n].tolist(), n, distance) for c in range(5)]
            p = sum(x[0] for x in scores) / 5
            rr = sum(x[1] for x in scores) / 5
            assert float(got["chance_precision"][r, col]) == pytest.approx(p, abs=1e-12)
            assert float(got["chance_recall"][r, col]) == pytest.approx(rr, abs=1e-12)
            assert float(got["chance_precision_floor"][r, col]) == pytest.approx(n / len(visible), abs=1e-15)
            assert float(got["excess_precision"][r, col]) == pytest.approx(float(metrics.precision[r, col]) - p, abs=1e-12)
            assert float(got["excess_recall"][r, col]) == pytest.approx(float(metrics.recall[r, col]) - rr, abs=1e-12)


def test_tied_keys_follow_the_closed_and_open_balls():
    """Keys in identical pairs (same alpha, same value): a control that splits a pair puts a tie on a ball's edge."""
    gen = torch.Generator().manual_seed(11)
    base_alpha = torch.softmax(torch.randn(3, 6, generator=gen, dtype=torch.float64), -1)
    alpha = base_alpha.repeat_interleave(2, dim=-1) / 2
    values = torch.randn(3, 6, 4, generator=gen, dtype=torch.float64).repeat_interleave(2, dim=1)
    mask = torch.ones(3, 12, dtype=torch.bool)
    grid = [1, 2, 3, 4, 5, 7, 12]
    settings = ChanceSettings(n_controls=8)
    got, keys = chance_rows(alpha, values, mask, grid, settings)
    for r in range(3):
        for col, n in enumerate(grid):
            scores = [reference_score(alpha[r], values[r], list(range(12)), keys[r, c, :n].tolist(), n) for c in range(8)]
            assert float(got["chance_precision"][r, col]) == pytest.approx(sum(x[0] for x in scores) / 8, abs=1e-12)
            assert float(got["chance_recall"][r, col]) == pytest.approx(sum(x[1] for x in scores) / 8, abs=1e-12)


def test_controls_are_nested_permutations_of_the_visible_keys():
    alpha, values, mask = random_rows(3)
    _, keys = chance_rows(alpha, values, mask, [1, 4], ChanceSettings(n_controls=16))
    for r in range(alpha.shape[0]):
        visible = mask[r].nonzero().flatten().tolist()
        for c in range(16):
            assert sorted(keys[r, c, : len(visible)].tolist()) == visible  # hidden keys come last, never chosen
    # Different controls (and rows) rank differently.
    assert len({tuple(keys[0, c].tolist()) for c in range(16)}) > 8


def test_controls_do_not_depend_on_chunking_and_follow_the_seed():
    alpha, values, mask = random_rows(5, rows=6)
    grid = [1, 2, 4, 8]
    one, _ = chance_rows(alpha, values, mask, grid, budget=128.0)
    many, _ = chance_rows(alpha, values, mask, grid, budget=1e-4)  # one row per chunk
    for name in one:
        torch.testing.assert_close(one[name], many[name], equal_nan=True, rtol=0, atol=0)
    other, _ = chance_rows(alpha, values, mask, grid, ChanceSettings(seed=7))
    assert not torch.equal(other["chance_recall"].nan_to_num(), one["chance_recall"].nan_to_num())


def test_precision_never_falls_below_the_floor():
    for seed in range(5):
        alpha, values, mask = random_rows(seed)
        got, _ = chance_rows(alpha, values, mask, list(range(1, 12)))
        metrics = selection_metrics(alpha, values, list(range(1, 12)), key_mask=mask, check_sums=False)
        ok = ~torch.isnan(metrics.precision)
        assert (metrics.precision[ok] >= got["chance_precision_floor"][ok] - 1e-12).all()
        assert (got["chance_precision"][ok] >= got["chance_precision_floor"][ok] - 1e-12).all()


def test_bad_settings_name_the_field():
    with pytest.raises(GeometryError, match=r"settings\['chance'\].n_controls: expected a positive integer"):
        ChanceSettings(n_controls=0)
    with pytest.raises(GeometryError, match=r"settings\['chance'\].seed: expected an integer in \[0, 2\^32\)"):
        ChanceSettings(seed=-1)


@pytest.mark.model
def test_chance_fields_on_a_model_run_sit_on_the_metrics_rows():
    model = tm.make_model("bridge-llama")
    tokens = tm.with_bos(tm.random_tokens(3, 12))
    result = run_with_geometry_hooks(
        model, tokens, diagnostics=["chance"], n_grid=[1, 2, 4, 8, 14], keep_queries=True, query_positions=[4, 12],
        bootstrap_fields=["recall", "excess_recall"],
    )
    q = result.queries
    torch.testing.assert_close(q["excess_precision"] + q["chance_precision"], q["precision"], equal_nan=True)
    torch.testing.assert_close(q["excess_recall"] + q["chance_recall"], q["recall"], equal_nan=True)
    low, high = result.ci("excess_recall")  # intervals of the fields asked for (the list replaces the default)
    assert low.shape == result.per_head("excess_recall").shape
    assert not result.has_replicates("excess_precision")
    assert torch.isnan(result.per_head("chance_precision")[..., -1]).all()  # N = 14 > the keys of either query


@pytest.mark.model
def test_figures_draw_the_chance_band_and_excess_is_summarised():
    from tl_geometry import classify_heads
    from tl_geometry.analysis.chance_excess import excess_over_chance
    from tl_geometry.report import paper_figures as plots

    model = tm.make_model("bridge-llama")
    tokens = tm.with_bos(tm.random_tokens(4, 12))
    result = run_with_geometry_hooks(model, tokens, diagnostics=["chance", "bounds", "roles"], n_grid=[1, 2, 4, 8])
    names = {trace.name for trace in plots.precision_recall_vs_n(result).data}
    assert {"chance: random top-N sets (mean)", "floor N / L", plots.LOWER_NAME} <= names
    names = {trace.name for trace in plots.head_curves(result, 1, 0).data}
    assert {"measured", "chance: random top-N sets", "floor N / L"} <= names
    assert any((name or "").startswith(plots.UPPER_NAME[:-1]) for name in names)  # its legend adds the share above it
    names = {trace.name for trace in plots.precision_recall_by_role(classify_heads(result), result).data}
    assert "chance band (random top-N sets)" in names
    excess = excess_over_chance(result, "recall")
    torch.testing.assert_close(excess.excess, excess.measured - excess.chance)
    assert ((excess.low <= excess.excess + 1e-12) | excess.low.isnan()).all()
    with pytest.raises(GeometryError, match="no chance baselines"):
        excess_over_chance(run_with_geometry_hooks(model, tokens, n_grid=[1, 2]), "precision")


@given(
    n_keys=st.integers(2, 24),
    window=st.integers(1, 24),
    queries=st.lists(st.integers(0, 23), min_size=1, max_size=3),
    distance=st.sampled_from(["euclidean", "cosine"]),
    seed=st.integers(0, 2**16),
)
@example(n_keys=24, window=3, queries=[23, 10], distance="euclidean", seed=0)
@settings(max_examples=30, deadline=None)
def test_sliding_window_rows_match_the_reference(n_keys, window, queries, distance, seed):
    """Rows that see a window of a longer key axis (the controls are drawn and scored on the ranks and N some row
    sees) against the reference over every key and every N: each control's first N keys of the whole order
    scored from the definitions, the N beyond a row's window missing."""
    queries = [q % n_keys for q in queries]
    gen = torch.Generator().manual_seed(seed)
    alpha = torch.softmax(3 * torch.randn(len(queries), n_keys, generator=gen, dtype=torch.float64), -1)
    values = torch.randn(len(queries), n_keys, 4, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[q - window < k <= q for k in range(n_keys)] for q in queries])
    grid = list(range(1, n_keys + 1))
    settings_ = ChanceSettings(n_controls=3, seed=seed % 7)
    got, keys = chance_rows(alpha, values, mask, grid, settings_, distance=distance)
    for r in range(len(queries)):
        visible = mask[r].nonzero().flatten().tolist()
        for col, n in enumerate(grid):
            if n > len(visible):
                assert all(math.isnan(float(t[r, col])) for t in got.values())
                continue
            scores = [reference_score(alpha[r], values[r], visible, keys[r, c, :n].tolist(), n, distance)
                      for c in range(3)]
            assert float(got["chance_precision"][r, col]) == pytest.approx(sum(x[0] for x in scores) / 3, abs=1e-12)
            assert float(got["chance_recall"][r, col]) == pytest.approx(sum(x[1] for x in scores) / 3, abs=1e-12)
            assert float(got["chance_precision_floor"][r, col]) == pytest.approx(n / len(visible), abs=1e-15)


def test_ranks_cut_short_of_the_widest_window_are_caught():
    """Mutant: the metrics and the controls work on one rank fewer than the widest row of the chunk sees."""
    def one_short(chunk):
        return max(1, int(chunk.n_visible.max()) - 1)

    assert_caught(Mutant("seen ranks one short", replace_attribute(SelectionChunk, "seen_ranks", one_short),
                         (test_sliding_window_rows_match_the_reference,
                          metrics_tests.test_sliding_window_rows_match_the_reference)))
