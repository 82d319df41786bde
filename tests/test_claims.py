"""The claims scorecard (tl_geometry.analysis.claims) against statistics written here from the result's fields.

The references read ``result.per_head`` / ``result.replicates`` and follow the
rules as the module docstring (and docs/claims.md) state them, with numpy;
they never call the module's own helpers.
"""

import dataclasses
import math

import numpy as np
import pytest
import torch

from tests import tiny_models as tm
from tl_geometry import GeometryConfig, GeometryError, GeometryResult, claims, run_with_geometry_hooks
from tl_geometry.analysis import claims as claims_module
from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.report.scorecard import scorecard_html
from tl_geometry.results.accumulators import Accumulator
from tl_geometry.results.result import REQUIRED_FIELDS

KEYS = ["stable_norms", "compressed_sink", "exponential_decay", "four_phase_profile", "small_n_separability",
        "sink_recall_correlation", "regimes_by_depth", "envelopes"]  # fmt: skip


@pytest.fixture(scope="module")
def result():
    model = tm.make_model("bridge-llama")
    tokens = tm.with_bos(tm.random_tokens(4, 40))
    # precision and value_norm_cv keep replicates too, so that their claims get an interval.
    return run_with_geometry_hooks(model, tokens, diagnostics="all", n_bootstrap=50,
                                   bootstrap_fields=["precision", "recall", "rho0", "value_norm_cv", "decay_mae"])


@pytest.fixture(scope="module")
def table(result):
    return claims(result)


def _np(t):
    return t.double().numpy()


def _quantiles(values):
    values = np.asarray(values, dtype=float)
    values = values[~np.isnan(values)]
    return np.quantile(values, 0.025), np.quantile(values, 0.975)


def test_one_row_per_claim_with_the_documented_columns(table):
    assert list(table.index) == KEYS
    assert list(table.columns) == ["claim", "paper_ref", "paper_value", "statistic", "value", "low", "high",
                                   "interval", "measured", "verdict", "rule", "option"]
    assert set(table.verdict) <= {"holds", "partly", "does not hold", "not measured"}
    assert table.loc["sink_recall_correlation", "paper_ref"].startswith("Figure 6")


def test_stable_norms_is_the_share_of_heads_with_cv_at_most_005(result, table):
    """Figure 2's reading: the norm averaged over sequences, by position (sink left out); the within-sequence CV beside."""
    curves = _np(result.per_head("value_norm_by_position"))[..., 1:].reshape(-1, result.per_head("value_norm_by_position").shape[-1] - 1)
    cvs = [np.std(c[~np.isnan(c)]) / np.mean(c[~np.isnan(c)]) for c in curves]
    assert table.loc["stable_norms", "value"] == pytest.approx(np.mean(np.array(cvs) <= 0.05))
    within = _np(result.per_head("value_norm_cv")).ravel()
    share_within = np.mean(within[~np.isnan(within)] <= 0.05)
    assert f"within each sequence: {share_within:.0%} of heads" in table.loc["stable_norms", "measured"]
    assert "Figure 2's reading" in table.loc["stable_norms", "measured"]


def test_sink_and_decay_statistics(result, table):
    ratio = _np(result.per_head("sink_norm_ratio")).ravel()
    defined = np.sort(ratio[~np.isnan(ratio)])
    assert table.loc["compressed_sink", "value"] == pytest.approx(defined[(len(defined) - 1) // 2])  # lower median
    mae = _np(result.per_head("decay_mae"))
    assert table.loc["exponential_decay", "value"] == pytest.approx(np.nanmean(mae))
    low, high = _quantiles([np.nanmean(r) for r in _np(result.replicates("decay_mae"))])
    assert (table.loc["exponential_decay", "low"], table.loc["exponential_decay", "high"]) == pytest.approx((low, high))
    assert math.isnan(table.loc["compressed_sink", "low"])  # sink_norm_ratio kept no replicates
    assert "no bootstrap replicates of sink_norm_ratio" in table.loc["compressed_sink", "interval"]


def test_four_phase_share(result, table):
    f = {name: _np(result.per_head(f"profile_{name}")) for name in
         ("p_sink", "p_base", "has_plateau", "has_oscillation", "has_recency")}
    # The oscillation may be absent (T1 = T2): not required.
    shows = (f["p_sink"] >= 100 * f["p_base"]) & (f["has_plateau"] >= 0.5) & (f["has_recency"] >= 0.5)
    defined = ~(np.isnan(f["p_sink"]) | np.isnan(f["p_base"]))
    assert table.loc["four_phase_profile", "value"] == pytest.approx(shows[defined].mean())


def test_a_profile_without_oscillation_counts():
    """Section 3.3 allows T1 = T2 (no oscillation): such heads show the profile; a head without recency does not."""
    one = lambda *v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    f = {"profile_p_sink": one(0.5, 0.5, 0.5), "profile_p_base": one(1e-3, 1e-3, 1e-2),
         "profile_has_plateau": one(1.0, 1.0, 1.0), "profile_has_oscillation": one(0.0, 1.0, 1.0),
         "profile_has_recency": one(1.0, 0.0, 1.0)}  # fmt: skip
    assert claims_module._four_phase(f).tolist() == [1.0, 0.0, 0.0]  # the third: sink only 50 x the plateau
    # Mutant (requiring the oscillation, as before): the first head would not count.


def _drop(precision, recall, grid):
    small = (grid >= 2) & (grid <= 4)
    mid = (grid >= 8) & (grid <= grid.max() / 4)
    drops = []
    for curve in (precision, recall):
        mean = np.nanmean(curve.reshape(-1, curve.shape[-1]), axis=0)  # over layers and heads
        drops.append(np.nanmean(mean[small]) - np.nanmean(mean[mid]))
    return min(drops)


def test_small_n_separability_is_the_smaller_drop_from_small_to_mid_n(result, table):
    """On the excess over random top-N sets; the raw drops beside."""
    grid = result.n_grid.numpy()
    value = _drop(_np(result.per_head("excess_precision")), _np(result.per_head("excess_recall")), grid)
    assert table.loc["small_n_separability", "value"] == pytest.approx(value)
    raw_p = _drop(_np(result.per_head("precision")), _np(result.per_head("precision")), grid)
    assert f"(raw: P {raw_p:.3g}" in table.loc["small_n_separability", "measured"]


def _partial(x, y, z):
    """corr(x, y | z), from the residuals of least-squares lines on z (numpy, written from the definition)."""
    ok = ~(np.isnan(x) | np.isnan(y) | np.isnan(z))
    x, y, z = x[ok], y[ok], z[ok]
    design = np.stack([np.ones_like(z), z], axis=1)
    rx = x - design @ np.linalg.lstsq(design, x, rcond=None)[0]
    ry = y - design @ np.linalg.lstsq(design, y, rcond=None)[0]
    return np.corrcoef(rx, ry)[0, 1]


def test_sink_recall_correlation_is_the_pearson_at_n_3_with_depth_partialled_beside(result, table):
    recall = _np(result.per_head("recall"))
    rho0 = _np(result.per_head("rho0"))
    grid = result.n_grid.tolist()
    at = grid.index(3)
    x, y = recall[..., at].ravel(), rho0.ravel()
    ok = ~np.isnan(x) & ~np.isnan(y)
    assert table.loc["sink_recall_correlation", "value"] == pytest.approx(np.corrcoef(x[ok], y[ok])[0, 1], abs=1e-6)
    n_layers, n_heads = rho0.shape
    depth = np.repeat(np.arange(n_layers) / max(1, n_layers - 1), n_heads)
    partial = _partial(x, y, depth)
    assert f"{partial:.3g} with layer depth partialled out" in table.loc["sink_recall_correlation", "measured"]


def test_sink_recall_correlation_needs_n_3():
    model = tm.make_model("bridge-llama")
    without = run_with_geometry_hooks(model, tm.with_bos(tm.random_tokens(2, 20)), diagnostics=["assumptions"],
                                      n_grid=[1, 2, 4, 8])
    row = claims(without).loc["sink_recall_correlation"]
    assert row.verdict == "not measured" and "N = 3" in row.option


def test_envelope_share_counts_points_of_the_mean_curves_inside(result, table):
    inside = defined = 0
    for metric in ("precision", "recall"):
        mean = lambda name: np.nanmean(_np(result.per_head(name)).reshape(-1, len(result.n_grid)), axis=0)  # noqa: E731
        curve, lower, upper = mean(metric), mean(f"bound_{metric}_lower"), mean(f"bound_{metric}_upper")
        ok = ~(np.isnan(curve) | np.isnan(lower) | np.isnan(upper))
        inside += np.sum(ok & (curve >= lower - 1e-6) & (curve <= upper + 1e-6))
        defined += ok.sum()
    assert table.loc["envelopes", "value"] == pytest.approx(inside / defined)


def test_a_result_without_a_diagnostic_shows_not_measured_with_the_option(result):
    plain = dataclasses.replace(result, stats={k: v for k, v in result.stats.items() if k in REQUIRED_FIELDS})
    table = claims(plain)
    for key in ("stable_norms", "compressed_sink", "exponential_decay", "four_phase_profile",
                "sink_recall_correlation"):
        assert table.loc[key, "verdict"] == "not measured"
        assert 'diagnostics=["assumptions"]' in table.loc[key, "option"]
    assert 'diagnostics=["taxonomy"]' in table.loc["regimes_by_depth", "option"]
    assert 'diagnostics=["bounds"]' in table.loc["envelopes", "option"]
    assert math.isnan(table.loc["envelopes", "value"])
    assert 'diagnostics=["chance"]' in table.loc["small_n_separability", "option"]  # judged on the excess over chance
    page = scorecard_html(plain)
    assert page.count("not measured") >= 8 and "measure it with diagnostics=[&quot;assumptions&quot;]" in page


def test_scorecard_shows_each_claim_value_interval_and_verdict(result, table):
    page = scorecard_html(result)
    assert page.startswith('<section id="claims-scorecard">') and "<script" not in page and "http" not in page
    for key, row in table.iterrows():
        assert f'id="claim-{key}"' in page and row.verdict in page
        if not math.isnan(row.value):
            assert f"<b>{row.value:.3g}</b>" in page
        if not math.isnan(row.low):
            assert f"[{row.low:.3g}, {row.high:.3g}]" in page


def test_claims_refuses_what_is_not_a_result():
    with pytest.raises(GeometryError, match="result: expected a GeometryResult"):
        claims({"precision": 1})


# ---- hand-built results: the verdict follows the rule ----


def _hand_built(fields: dict[str, np.ndarray], n_grid=(1, 2)) -> GeometryResult:
    """A result of one document whose per-head fields are the given ``[layer, head_index, ...]`` arrays."""
    specs = [FieldSpec(name, name, axes=(("position",) if name.endswith("_by_position") else ("n",)) * (np.ndim(v) - 2))
             for name, v in fields.items()]
    first = next(iter(fields.values()))
    acc = Accumulator(specs, layers=range(first.shape[0]), heads=range(first.shape[1]), n_grid=torch.tensor(n_grid))
    acc.add({k: torch.tensor(v, dtype=torch.float32)[None] for k, v in fields.items()}, torch.zeros(1, 0), n_tokens=5)
    return GeometryResult.from_accumulator(acc, config=GeometryConfig(), model_name="hand")


def _with_required(fields, n_grid=(1, 2)):
    shape = next(iter(fields.values())).shape[:2] + (len(n_grid),)
    return {**{name: np.ones(shape) for name in REQUIRED_FIELDS if name not in fields}, **fields}


@pytest.mark.parametrize("cv, expected", [([0.02] * 8 + [0.1] * 2, "holds"), ([0.02] * 6 + [0.1] * 4, "partly"),
                                          ([0.02] * 4 + [0.1] * 6, "does not hold")])
def test_stable_norms_verdict_on_hand_built_results(cv, expected):
    """Per-head norm curves whose non-sink CV is the given value: the verdict reads them; flat within-sequence CVs
    beside them do not change it (a mutant reading value_norm_cv would say "holds" every time)."""
    cv = np.array(cv).reshape(2, 5)
    pattern = np.array([1.0, -1.0] * 4)  # population std 1 over the 8 non-sink positions
    curves = np.concatenate([np.full((2, 5, 1), 0.1), 1.0 + cv[..., None] * pattern], axis=-1)  # [layer, head, 9]
    fields = _with_required({"value_norm_cv": np.full((2, 5), 0.01), "value_norm_by_position": curves})
    row = claims(_hand_built(fields)).loc["stable_norms"]
    assert row.verdict == expected and row.value == pytest.approx(np.mean(cv <= 0.05))


@pytest.mark.parametrize("mae, expected", [(0.09, "holds"), (0.15, "partly"), (0.3, "does not hold")])
def test_decay_verdict_on_hand_built_results(mae, expected):
    fields = _with_required({"decay_mae": np.full((2, 3), mae)})
    assert claims(_hand_built(fields)).loc["exponential_decay", "verdict"] == expected


def test_small_n_drop_on_hand_built_curves():
    """Raw curves that drop from small to mid N, with chance levels that drop as much (excess flat): the claim
    fails; the same raw curves over a flat chance level: it holds. A mutant reading the raw curves holds both."""
    grid = (1, 2, 4, 8, 16, 32, 64)
    shape = (1, 2, len(grid))
    precision = np.broadcast_to(np.array([1, 0.9, 0.8, 0.3, 0.3, 0.6, 1.0]), shape).copy()
    recall = np.broadcast_to(np.array([1, 0.9, 0.9, 0.88, 0.8, 0.9, 1.0]), shape).copy()
    flat_chance = np.full(shape, 0.2)
    same_drop = {"excess_precision": np.full(shape, 0.1), "excess_recall": np.full(shape, 0.1)}
    over_flat = {"excess_precision": precision - flat_chance, "excess_recall": recall - flat_chance}
    fields = {"precision": precision, "recall": recall}
    row = claims(_hand_built(_with_required({**fields, **over_flat}, grid), grid)).loc["small_n_separability"]
    # mid N: 8 and 16 (<= 64 / 4); drops: P 0.85 - 0.3 = 0.55, R 0.9 - 0.84 = 0.06
    assert row.value == pytest.approx(0.06) and row.verdict == "holds"
    row = claims(_hand_built(_with_required({**fields, **same_drop}, grid), grid)).loc["small_n_separability"]
    assert row.value == pytest.approx(0.0) and row.verdict == "does not hold"
    assert "raw: P 0.55, R 0.06" in row.measured
    short = _hand_built(_with_required({"precision": precision[..., :3].copy()}, grid[:3]), grid[:3])
    row = claims(short).loc["small_n_separability"]
    assert row.verdict == "not measured" and "N grid" in row.option
    plain = _hand_built(_with_required(fields, grid), grid)
    row = claims(plain).loc["small_n_separability"]
    assert row.verdict == "not measured" and 'diagnostics=["chance"]' in row.option


def _roles_in_layers(result, order, n_replicates=50, flip=0.0, seed=0):
    """Probabilities and replicate roles of heads built in ``order`` by depth: first layer order[0] (one head
    order[1]), last layer order[2] (one head order[1]), order[1] in between; each replicate moves a head to a
    random role with probability ``flip``."""
    from tl_geometry.analysis.taxonomy import ROLES

    n_layers, n_heads = len(result.layers), len(result.heads)
    names = [[order[1]] * n_heads for _ in range(n_layers)]
    names[0] = [order[0]] * (n_heads - 1) + [order[1]]
    names[-1] = [order[1]] + [order[2]] * (n_heads - 1)
    roles = torch.tensor([[ROLES.index(name) for name in row] for row in names])
    gen = torch.Generator().manual_seed(seed)
    draws = roles.expand(n_replicates, -1, -1).clone()
    moved = torch.rand(draws.shape, generator=gen) < flip
    draws[moved] = torch.randint(len(ROLES), (int(moved.sum()),), generator=gen)
    probabilities = torch.nn.functional.one_hot(draws, len(ROLES)).double().mean(0)
    return probabilities, draws


@pytest.mark.parametrize("order, expected", [(("retriever", "reset", "mixer"), ("holds", 3.0)),
                                             (("reset", "retriever", "mixer"), ("partly", 2.0)),
                                             (("mixer", "reset", "retriever"), ("does not hold", 0.0))])
def test_regimes_by_depth_counts_ordered_pairs(monkeypatch, result, order, expected):
    monkeypatch.setattr(claims_module, "_role_probabilities", lambda r: _roles_in_layers(r, order))
    row = claims(result).loc["regimes_by_depth"]
    assert (row.verdict, row.value) == expected
    assert row.low == row.high == expected[1]  # every replicate agrees


def test_regimes_by_depth_with_uncertain_roles_does_not_hold(monkeypatch, result):
    """Roles in the paper's order, but each replicate reassigns most heads at random: the interval says so."""
    verdicts = []
    for seed in range(10):
        monkeypatch.setattr(claims_module, "_role_probabilities",
                            lambda r, seed=seed: _roles_in_layers(r, ("retriever", "reset", "mixer"), flip=0.9, seed=seed))
        row = claims(result).loc["regimes_by_depth"]
        assert row.low < 3  # some replicates put the roles out of order
        verdicts.append(row.verdict)
    assert "holds" not in verdicts
    # Mutant (run by hand, fails this test): the interval ignored, the ordered point estimate reads "holds".


def test_regimes_by_depth_reads_the_taxonomy(result):
    from tl_geometry.analysis.taxonomy import taxonomy_from_result

    row = claims(result).loc["regimes_by_depth"]
    probabilities = taxonomy_from_result(result).probabilities
    n_layers = probabilities.shape[0]
    depth = torch.arange(n_layers, dtype=torch.float64) / max(1, n_layers - 1)
    means = {}
    for role, k in (("retriever", 0), ("reset", 2), ("mixer", 1)):
        w = probabilities[..., k].sum(-1)
        means[role] = float((w * depth).sum() / w.sum()) if w.sum() > 0 else math.nan
    want = (means["retriever"] < means["reset"]) + (means["retriever"] < means["mixer"]) + (means["reset"] < means["mixer"])
    assert row.value == want


def test_envelope_share_on_hand_built_curves():
    grid = (1, 2, 4, 8)
    shape = (1, 2, len(grid))
    curve = np.broadcast_to(np.array([1.0, 0.5, 0.4, 0.9]), shape).copy()
    lower = np.broadcast_to(np.array([0.9, 0.6, 0.1, 0.0]), shape).copy()  # N = 2 lies below the lower envelope
    upper = np.broadcast_to(np.array([1.0, 0.9, 0.3, 1.0]), shape).copy()  # N = 4 lies above the upper envelope
    fields = {"precision": curve, "recall": curve}
    for metric in ("precision", "recall"):
        fields.update({f"bound_{metric}_lower": lower, f"bound_{metric}_upper": upper})
    row = claims(_hand_built(_with_required(fields, grid), grid)).loc["envelopes"]
    assert row.value == pytest.approx(0.5) and row.verdict == "partly"
