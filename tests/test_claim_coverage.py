"""Coverage of the claims' intervals on simulated studies whose true values are known, in and out of sample.

A simulated study (``tests.fixtures.simulate_study``) is a result of a few
documents: every head has true means for the fields the claims read, and
each document's value scatters around them (skewed, heteroscedastic noise,
so that the per-head means of a few documents are biased inputs to
nonlinear statistics: a trimmed mean, a share past a threshold, a
correlation over heads, a minimum or maximum of two curves' drops). The
documents go through the package's accumulator with Poisson-bootstrap
weights, as a real run does, and `claims` computes every interval. The true
value of a claim's statistic is that statistic, written here from the
claims' rules, on the true head means.

Each claim's interval method and level (its declared ``interval``, an
`IntervalChoice`, in ``claims.CLAIMS``) were chosen on one
population and document count, the tuning set (``TUNING``,
``TUNING_DOCUMENTS``); `HELD_OUT` are populations drawn with other seeds and
other generating parameters, which nothing was chosen on (a claim whose
interval covered under 90 % on one of them says so: its interval's
``uncertain``). `THRESHOLD_TUNING` places heads at the claims' lines, where the set intervals' z was chosen;
`FRESH` and `TRADEOFF_FRESH` were drawn afresh to hold those choices out (docs/claims.md, "Set intervals tuned
where heads sit at the lines" and "A set interval for trade-offs by role"); `NEAR_TUNING` and `NEAR_FRESH` the same
for large-N return and the reading within sequences ("Why two intervals miss on near and noisy"); `ONE_SIDED_TUNING`
and `ONE_SIDED_FRESH` the same for stable norms by curve's and trade-offs by role's z, with heads on one side of the
lines ("Set intervals where heads sit on one side of the line"); `BAND_FRESH` holds out the knobs chosen where cells
cover above 0.98 ("Above 0.98: measured again, and one setting for every population?"). The test here checks the held-out coverage
on a few seeded studies; ``benchmarks/bench_coverage.py`` prints the tuning table (every
method) and the held-out table at 8, 16 and 32 documents.
"""

import dataclasses
import math
from fractions import Fraction

import jaxtyping
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fixtures import STUDY_DOCUMENTS, Population, seam, simulate_study, study_roles, true_means
from tests.fixtures import STUDY_GRID as GRID
from tl_geometry import claims
from tl_geometry.analysis.claim_registry import LEVEL, IntervalChoice
from tl_geometry.analysis.claims import CLAIMS
from tl_geometry.analysis.intervals import METHODS

TUNING = Population(seed=0)  # the methods and levels were chosen on this population ...
TUNING_DOCUMENTS = STUDY_DOCUMENTS  # ... at this many documents
HELD_OUT = {  # nothing is chosen on these: other seeds and other generating parameters
    "noisier": Population(seed=101, heads=8, rho0=(0.0, 0.7), slope=(0.0, 0.2), decay_mae=(0.03, 0.25),
                          sink_norm_ratio=(0.1, 1.0), value_norm_cv=(0.015, 0.08), sink_over_base=(20.0, 400.0),
                          phase_share=(0.2, 1.0), curve_noise=0.08, curve_shape=1.5, positive_shape=3.0,
                          role_noise=1.25, curve_cv=(0.005, 0.1), positions=128, norm_noise=0.3),
    "quieter": Population(seed=202, heads=5, rho0=(0.2, 0.5), slope=(-0.1, 0.1), decay_mae=(0.05, 0.15),
                          sink_norm_ratio=(0.3, 1.5), value_norm_cv=(0.03, 0.1), precision_envelope_gap=(0.0, 0.15),
                          recall_envelope_gap=(0.0, 0.12), sink_over_base=(50.0, 200.0), phase_share=(0.4, 0.9),
                          curve_noise=0.045, curve_shape=4.0, positive_shape=6.0, role_noise=0.8,
                          curve_cv=(0.02, 0.07), positions=512, norm_noise=0.15),
    "skewed": Population(seed=303, value_norm_cv=(0.02, 0.06), sink_over_base=(10.0, 1000.0), curve_shape=1.0,
                         positive_shape=2.5, curve_cv=(0.03, 0.07), norm_noise=0.25),
}  # fmt: skip
THRESHOLD_TUNING = Population(seed=43, at_threshold=0.25)  # the set intervals' z was chosen here: heads at the lines
FRESH = {  # held out from that choice: new seeds and parameters, each with heads at the lines (`near_thresholds`)
    "crowded": Population(seed=4301, heads=8, at_threshold=0.4, threshold_spread=0.5, threshold_documents=32,
                          norm_noise=0.25, positions=384, positive_shape=3.0, curve_shape=1.5, curve_noise=0.07,
                          role_noise=1.2, curve_cv=(0.02, 0.08), phase_share=(0.35, 0.95), sink_over_base=(40.0, 250.0)),
    "sparse": Population(seed=4302, heads=5, at_threshold=0.15, threshold_spread=2.0, threshold_documents=8,
                         norm_noise=0.15, positions=192, positive_shape=5.0, curve_shape=3.0, curve_noise=0.05,
                         role_noise=0.9, curve_cv=(0.01, 0.06), phase_share=(0.3, 0.9), sink_over_base=(20.0, 500.0)),
    "on the line": Population(seed=4303, at_threshold=0.2, threshold_spread=0.1, norm_noise=0.22, positions=320,
                              positive_shape=3.5),
}  # fmt: skip
TRADEOFF_FRESH = {  # held out from trade-offs by role's z (docs/claims.md, "A set interval for trade-offs by role")
    "few heads": Population(seed=4304, heads=4, at_threshold=0.25, threshold_spread=0.5, role_noise=1.15,
                            curve_noise=0.07, curve_shape=1.5, positive_shape=3.0),
    "many heads": Population(seed=4305, heads=9, at_threshold=0.3, threshold_spread=1.0, threshold_documents=32,
                             role_noise=0.85, curve_noise=0.05, curve_shape=3.0),
    "near and noisy": Population(seed=4306, at_threshold=0.35, threshold_spread=0.25, threshold_documents=8,
                                 role_noise=1.3, curve_noise=0.08),
}  # fmt: skip
NEAR_TUNING = Population(seed=4310, at_threshold=0.35, threshold_spread=0.25, threshold_documents=8, role_noise=1.3,
                         curve_noise=0.08, within_at_threshold=0.2, rise_gap=0.0)
"""*near and noisy* with a new seed and the two kinks it has by chance placed (docs/claims.md, "Why two intervals
miss on near and noisy"): large-N return's and the reading within sequences' methods are chosen here."""
NEAR_FRESH = {  # held out from that choice: new seeds, both kinks placed
    "tied and skewed": Population(seed=4311, heads=5, at_threshold=0.25, threshold_spread=0.5, role_noise=1.2,
                                  curve_noise=0.07, curve_shape=1.5, positive_shape=3.0, within_at_threshold=0.25,
                                  rise_gap=0.001),
    "tied, many heads": Population(seed=4312, heads=8, at_threshold=0.3, threshold_spread=1.0, threshold_documents=32,
                                   curve_noise=0.09, curve_shape=2.5, positive_shape=5.0, value_norm_cv=(0.03, 0.07),
                                   within_at_threshold=0.15, rise_gap=-0.002),
}  # fmt: skip
ONE_SIDED_TUNING = Population(seed=4320, at_threshold=0.25, threshold_spread=0.5, threshold_side="outside",
                              emptied_role="retriever", role_noise=1.1, curve_noise=0.07, curve_shape=1.5,
                              positive_shape=3.0, curve_cv=(0.01, 0.04))
"""In the style of *tied and skewed*, not it (docs/claims.md, "Set intervals where heads sit on one side of the
line"): its placed heads all just outside their lines and no true Retriever; stable norms by curve's and trade-offs
by role's z are re-chosen here."""
ONE_SIDED_FRESH = {  # held out from that choice: new seeds and parameters, the placed heads on one side
    "one side, many heads": Population(seed=4321, heads=8, at_threshold=0.3, threshold_spread=1.0,
                                       threshold_documents=32, threshold_side="outside", emptied_role="retriever",
                                       norm_noise=0.25, positions=384, curve_noise=0.06),
    "one side, inside": Population(seed=4322, heads=5, at_threshold=0.2, threshold_spread=0.5, threshold_documents=8,
                                   threshold_side="inside", emptied_role="retriever", role_noise=1.25,
                                   curve_noise=0.08, curve_shape=1.5, positive_shape=3.0),
}  # fmt: skip
BAND_FRESH = {  # held out from the knobs chosen where cells cover above 0.98 (docs/claims.md, "Above 0.98")
    "mixed distances": Population(seed=4330, heads=7, at_threshold=0.2, threshold_spread=1.5, threshold_documents=16,
                                  norm_noise=0.2, positions=256, curve_noise=0.06, curve_shape=2.0, positive_shape=4.0,
                                  role_noise=1.0, curve_cv=(0.01, 0.07)),
    "few at the line, outside": Population(seed=4331, heads=6, at_threshold=0.1, threshold_spread=0.75,
                                           threshold_documents=32, threshold_side="outside", norm_noise=0.18,
                                           curve_noise=0.05, curve_shape=2.5, positive_shape=4.5, role_noise=0.95,
                                           sink_over_base=(30.0, 600.0), phase_share=(0.3, 0.95)),
}  # fmt: skip
STUDIES = 400
SMALL, MID, LARGE = (GRID >= 2) & (GRID <= 4), (GRID >= 8) & (GRID <= 16), GRID >= 32
AT3 = int(np.flatnonzero(GRID == 3)[0])
COVERED = ("compressed_sink", "exponential_decay", "stable_norms", "stable_norms_within", "four_phase_profile",
           "small_n_separability", "large_n_return", "envelope_tightness", "sink_recall_correlation",
           "sink_precision_correlation", "roles_by_depth", "role_tradeoffs")  # fmt: skip
"""Every interval checked: the claims' and one literal reading's with an interval of its own (stable norms read
within sequences, whose statistic differs from the verdict's: `LITERAL`)."""
LITERAL = {"stable_norms_within": "stable_norms"}  # interval key -> the claim whose literal reading it is


def estimate(table, key: str) -> tuple[float, float, float]:
    """The value and interval (low, high) an interval key of ``COVERED`` has in a claims table."""
    row, prefix = (LITERAL[key], "literal_") if key in LITERAL else (key, "")
    return tuple(float(table.loc[row, prefix + column]) for column in ("value", "low", "high"))


# ---- the statistics on the true means, written from the claims' rules ----


def _curve(x):
    return x.reshape(-1, x.shape[-1]).mean(0)  # over layers and heads


def _corr(x, y):
    return float(np.corrcoef(x.ravel(), y.ravel())[0, 1])


def _role_truths(m: dict[str, np.ndarray], documents: int, population: Population) -> dict[str, float]:
    """Section 4.2's smaller depth step and Figure 11's smallest margin on the true roles (-1: a role without heads),
    the roles the rules give the true means with the standard errors of ``documents`` documents."""
    roles = study_roles(m, documents, population)
    depth = np.arange(roles.shape[0])[:, None] / (roles.shape[0] - 1) * np.ones(roles.shape)
    mean_depth = {r: depth[roles == r].mean() if (roles == r).any() else math.nan for r in ("retriever", "reset", "mixer")}
    steps = (mean_depth["reset"] - mean_depth["retriever"], mean_depth["mixer"] - mean_depth["reset"])
    step = math.nan if any(map(math.isnan, steps)) else min(steps)  # min() would drop a NaN in second place
    others = (roles == "reset") | (roles == "mixer")

    def at(member, metric, mask):
        return m[metric][member][:, mask].mean() if member.any() else math.nan

    retriever, reset = roles == "retriever", roles == "reset"
    margins = [at(retriever, "recall", LARGE) - at(others, "recall", LARGE),
               at(others, "precision", LARGE) - at(retriever, "precision", LARGE),
               min(at(reset, x, LARGE) - at(reset, x, MID) for x in ("precision", "recall"))]
    return {"roles_by_depth": -1.0 if math.isnan(step) else float(step),
            "role_tradeoffs": float(min(-1.0 if math.isnan(x) else x for x in margins))}


def true_values(m: dict[str, np.ndarray], documents: int = STUDY_DOCUMENTS,
                population: Population = TUNING) -> dict[str, float]:
    drop = lambda name: _curve(m[name])[SMALL].mean() - _curve(m[name])[MID].mean()  # noqa: E731
    rise = lambda name: _curve(m[name])[LARGE].mean() - _curve(m[name])[MID].mean()  # noqa: E731
    # The envelopes' floors (p_- <= 1/2): the gap is taken above the larger of the curve and the floor.
    floor = {"precision": np.where(GRID == 1, 1.0, 1 - 0.5 / (GRID + 1)), "recall": np.where(GRID == 1, 1.0, 0.5)}
    gap = lambda metric, mask: (_curve(m[f"bound_{metric}_upper"])  # noqa: E731
                                - np.maximum(_curve(m[metric]), floor[metric]))[mask].mean()
    norms = m["value_norm_by_position"][..., 1:]  # the expected curve without the sink
    ratios = np.sort(m["sink_norm_ratio"].ravel())
    cut = len(ratios) // 4
    return {
        "compressed_sink": float(ratios[cut : len(ratios) - cut].mean()),  # the interquartile mean
        "exponential_decay": float(m["decay_mae"].mean()),
        "stable_norms": float((norms.std(-1) / norms.mean(-1) <= 0.05).mean()),  # the curve's population CV
        "stable_norms_within": float((m["value_norm_cv"] <= 0.05).mean()),
        "four_phase_profile": float(((m["profile_p_sink"] >= 100 * m["profile_p_base"]) & (m["profile_has_plateau"] >= 0.5)
                                     & (m["profile_has_recency"] >= 0.5)).mean()),
        "small_n_separability": float(min(drop("excess_precision"), drop("excess_recall"))),
        "large_n_return": float(min(rise("precision"), rise("recall"))),
        "envelope_tightness": float(max(gap("precision", SMALL), gap("precision", LARGE), gap("recall", SMALL),
                                        gap("recall", MID), gap("recall", LARGE))),
        "sink_recall_correlation": _corr(m["recall"][..., AT3], m["rho0"]),
        "sink_precision_correlation": _corr(m["precision"][..., AT3], m["rho0"]),
        **_role_truths(m, documents, population),
    }


Choice = dict[str, IntervalChoice]
"""Per claim: how its interval is read (an interval method of `METHODS`, whether its level is expanded for the
number of documents, the nominal level its quantiles are read at, 0.95 unless calibrated, and the set interval's
z per head where it has one); its ``uncertain`` is the claim's own."""


def _declared_intervals() -> dict[str, IntervalChoice]:
    """Every interval of `COVERED` as the claims declare it: a claim's own, and its literal reading's where that
    has its own (``<key>_within``)."""
    found = {key: c.interval for key, c in CLAIMS.items()}
    found.update({f"{key}_within": c.literal_interval for key, c in CLAIMS.items() if c.literal_interval is not None})
    return {key: found[key] for key in COVERED}


def chosen() -> Choice:
    """Every claim's interval as `tl_geometry.analysis.claims` chose it."""
    return dict(_declared_intervals())


def every_choice(keys: tuple[str, ...] = COVERED, levels: tuple[float, ...] = (LEVEL,)) -> dict[str, Choice]:
    """Every method at either level (expanded or not) for the claims ``keys``, by name ("basic, expanded"; with
    the nominal level where it is not 0.95: "basic, expanded, 0.99")."""
    return {f"{method}, {'expanded' if expand else 'plain'}" + ("" if level == LEVEL else f", {level:g}"):
            dict.fromkeys(keys, IntervalChoice(method, expand, level))
            for level in levels for method in METHODS for expand in (True, False)}


def set_choices(keys: tuple[str, ...], zs: tuple[float, ...]) -> dict[str, Choice]:
    """For the claims ``keys``, their declared bootstrap interval (method and level as declared) joined with the set
    interval at each per-head z of ``zs``, by name ("set, z = 1.5")."""
    declared = _declared_intervals()
    return {f"set, z = {z:g}": {key: dataclasses.replace(declared[key], per_head_z=z, uncertain=None) for key in keys}
            for z in zs}


Coverage = dict[str, tuple[int, int, int]]
"""Per claim: studies whose interval covered the truth, studies with an interval, and estimates outside their own
interval."""


def coverage(population: Population = TUNING, documents: int = TUNING_DOCUMENTS, studies: int = STUDIES,
             choices: dict[str, Choice] | None = None, stream: int = 0,
             record: dict[tuple[str, str], list[tuple[float, float, float]]] | None = None) -> dict[str, Coverage]:
    """Per choice of intervals (default: the claims' own, as ``"chosen"``), per claim, how the intervals of
    ``studies`` seeded studies of ``population`` at ``documents`` documents cover the truth. Every choice reads
    the same studies (the seed is the population's and the count's: fewer studies are the first ones). A
    ``stream`` other than 0 draws other studies: the seed (population seed, documents, stream), none of them one
    of stream 0's (docs/claims.md, "Every held-out cell under 0.90, measured again with new studies"). A
    ``record`` dict receives, per (choice, claim), each study's (value, low, high) where it has an interval.

    `claims` runs once per study: its interval reader (the fault seam ``claim_interval``) is wrapped to compute
    each claim's replicate statistic once and read it with every choice's method and level (a claim's first
    interval is its verdict's; a second one of the same declared interval is the literal reading's)."""
    choices = {"chosen": chosen(), **(choices or {})}
    means = true_means(population)
    truth = true_values(means, documents, population)
    rng = np.random.default_rng((population.seed, documents) if stream == 0 else (population.seed, documents, stream))
    found = {name: {key: (0, 0, 0) for key in COVERED} for name in choices}
    owner, attribute = seam("claim_interval")
    original = getattr(owner, attribute)
    key_of = {id(declared): key for key, declared in _declared_intervals().items()}  # the declarations themselves

    def every_interval(declared, result, names, statistic, *args, **kwargs):
        if (not isinstance(statistic, torch.Tensor) and result.n_documents >= 2
                and all(result.has_replicates(n) for n in names)):
            statistic = statistic({n: result.replicates(n) for n in names}).double()  # once for every choice
        own = original(declared, result, names, statistic, *args, **kwargs)
        key = key_of[id(declared)]
        if key in first:
            return own
        first[key] = {}
        for name, choice in choices.items():
            if key in choice:
                other = dataclasses.replace(choice[key], uncertain=declared.uncertain)
                first[key][name] = original(other, result, names, statistic, *args, **kwargs)[:2]
        return own

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: on a busy machine one thread is several times faster than two
    try:
        with pytest.MonkeyPatch.context() as patch:
            for study in range(studies):
                # the runtime shape checks see every call once; the other studies repeat them
                patch.setattr(jaxtyping.config, "jaxtyping_disable", study > 0)
                patch.setattr(owner, attribute, every_interval)
                result = simulate_study(means, rng, documents, population)
                first: dict[str, dict[str, tuple[float, float]]] = {}
                table = claims(result)
                for key in COVERED:
                    value, *bounds = estimate(table, key)
                    own = first.get(key, {}).get("chosen", (math.nan, math.nan))
                    assert np.allclose(own, bounds, equal_nan=True), (key, own)
                    for name, (low, high) in first.get(key, {}).items():
                        if not math.isnan(low):
                            covered, n, outside = found[name][key]
                            found[name][key] = (covered + (low <= truth[key] <= high), n + 1,
                                                outside + (not low <= value <= high))
                            if record is not None:
                                record.setdefault((name, key), []).append((value, low, high))
    finally:
        torch.set_num_threads(threads)
    return found


def share(cell: tuple[int, int, int]) -> float:
    return cell[0] / max(1, cell[1])


def test_every_claim_with_an_interval_is_covered():
    # Guard: every claim listed here gets an interval on a simulated study, and every claim is listed.
    table = claims(simulate_study(true_means(), np.random.default_rng(5)))
    assert set(table.index) <= set(COVERED)
    assert not any(math.isnan(estimate(table, key)[1]) for key in COVERED), table.interval.to_dict()


def test_the_depth_steps_truth_is_absent_when_any_role_lacks_heads():
    # The truth of roles by depth is -1 when any of Retriever, Reset and Mixer has no head, as the claim's statistic
    # is: checked with each role emptied in turn (the first truth, min(a, nan) = a, missed an empty Mixer).
    means = true_means()
    for emptied, into in (("retriever", "reset"), ("reset", "mixer"), ("mixer", "reset")):
        roles = study_roles(means)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(f"{__name__}.study_roles", lambda *a, **k: np.where(roles == emptied, into, roles))
            assert true_values(means)["roles_by_depth"] == -1.0, emptied
    assert true_values(means)["roles_by_depth"] > 0  # all three present: a step


def test_heads_are_placed_at_the_lines():
    # THRESHOLD_TUNING's placement (docs/claims.md, "Set intervals tuned where heads sit at the lines"), from the
    # rule's words: 6 of 24 heads per claim within one standard error of 16 documents of its line; every field the
    # placement does not touch as the same population without it draws it.
    population = THRESHOLD_TUNING
    placed, plain = true_means(population), true_means(dataclasses.replace(population, at_threshold=0.0))
    n, sigma, positions = 16, population.norm_noise, population.positions
    curve = placed["value_norm_by_position"][..., 1:]
    cv = curve.std(-1) / curve.mean(-1)
    cv_se = math.sqrt(sigma**2 / (n * positions) + sigma**4 / (2 * 0.05**2 * positions * n * (n - 1)))
    assert (abs(cv - 0.05) <= cv_se * (1 + 1e-9)).sum() >= 6
    log_ratio = np.log(placed["profile_p_sink"] / placed["profile_p_base"] / 100)
    phase_se = math.sqrt(0.25 / n)
    at_lines = ((abs(log_ratio) <= math.sqrt(2 / (population.positive_shape * n)) + 1e-12)
                & (abs(placed["profile_has_plateau"] - 0.5) <= phase_se)
                & (abs(placed["profile_has_recency"] - 0.5) <= phase_se))
    assert at_lines.sum() >= 6  # the placed six, and any drawn there by chance
    moved = {name for name in plain if not np.array_equal(plain[name], placed[name])}
    assert moved <= {"value_norm_by_position", "profile_p_base", "profile_has_plateau", "profile_has_recency",
                     "align_self_excess", "shift_self_raw", "shift_sink_raw", "top_rest_share"}, moved
    roles_moved = sum(not np.isclose(plain[k], placed[k]).all() for k in ("align_self_excess", "shift_self_raw",
                                                                            "top_rest_share"))
    assert roles_moved >= 1


def test_heads_are_placed_on_one_side_and_a_role_emptied():
    # ONE_SIDED_TUNING's placement (docs/claims.md, "Set intervals where heads sit on one side of the line"), from the
    # options' words: the same heads as placed on both sides, each at the same distance from its line but on the side
    # where it fails the claim (CV above 0.05; roles: the feature below the line), and no Retriever left; "inside"
    # the other side.
    population = ONE_SIDED_TUNING
    both = dataclasses.replace(population, threshold_side="both", emptied_role=None)

    def cvs(p):
        curve = true_means(p)["value_norm_by_position"][..., 1:]
        return curve.std(-1) / curve.mean(-1)

    sided, plain, inside = cvs(population), cvs(both), cvs(dataclasses.replace(population, threshold_side="inside"))
    moved = ~np.isclose(sided, plain)
    assert moved.sum() >= 1 and np.allclose(abs(sided - 0.05), abs(plain - 0.05))
    placed = np.isclose(abs(sided - 0.05), abs(plain - 0.05)) & (abs(sided - 0.05) < 0.01)
    assert placed.sum() == 6, placed.sum()  # 6 of 24 heads, every one outside: above the line
    assert (sided[placed] >= 0.05).all() and (inside[placed] <= 0.05).all()
    n, sigma, positions = 16, population.norm_noise, population.positions
    cv_se = math.sqrt(sigma**2 / (n * positions) + sigma**4 / (2 * 0.05**2 * positions * n * (n - 1)))
    assert (sided[placed] <= 0.05 + 0.5 * cv_se + 1e-12).all()
    assert (sided[~placed] <= 0.05 - 2.5 * cv_se).all()  # the others far on the stable side
    roles = study_roles(true_means(population), n, population)
    assert "retriever" not in roles and "retriever" in study_roles(true_means(both), n, both)


def test_the_within_line_and_the_rise_gap_are_placed():
    # NEAR_TUNING's placement, from the options' words: 5 of 24 heads' mean CV within sequences within 0.25 standard
    # errors of 8 documents of 0.05, the two large-N returns equal (written here from the claim's definition), and
    # nothing else moved but recall's large-N points (and the fields drawn from recall there).
    population = NEAR_TUNING
    placed = true_means(population)
    plain = true_means(dataclasses.replace(population, within_at_threshold=0.0, rise_gap=None))
    se = 0.05 / math.sqrt(population.positive_shape * population.threshold_documents)
    assert (abs(placed["value_norm_cv"] - 0.05) <= 0.25 * se + 1e-12).sum() >= 5
    assert (placed["value_norm_cv"] != plain["value_norm_cv"]).sum() == 5

    def rise(curves):
        by_n = curves.reshape(-1, len(GRID)).mean(0)
        return by_n[GRID >= 32].mean() - by_n[(GRID >= 8) & (GRID <= 16)].mean()

    assert abs(rise(placed["precision"]) - rise(placed["recall"])) < 1e-12
    assert abs(rise(plain["precision"]) - rise(plain["recall"])) > 1e-3  # as drawn, they differ
    moved = {name for name in plain if not np.array_equal(plain[name], placed[name])}
    assert moved == {"value_norm_cv", "recall", "excess_recall", "bound_recall_upper"}, moved
    for name in ("recall", "excess_recall", "bound_recall_upper"):
        assert np.array_equal(plain[name][..., GRID < 32], placed[name][..., GRID < 32]), name


def test_disattenuation_moves_the_correlation_towards_the_truth():
    """Precision's head means carry the documents' noise (reliability about 0.7 here): their correlation with
    rho_0 is pulled towards 0. Over 100 simulated studies the claim's value (disattenuated) lies closer to the
    true correlation on average than the uncorrected one shown beside it."""
    means = true_means()
    truth = true_values(means)["sink_precision_correlation"]
    rng = np.random.default_rng(7)
    corrected, uncorrected = [], []
    needed = {name: means[name] for name in ("precision", "recall", "rho0")}  # the other claims: not measured
    for _ in range(100):
        row = claims(simulate_study(needed, rng)).loc["sink_precision_correlation"]
        corrected.append(row.value)
        uncorrected.append(float(row.measured.split("uncorrected ")[1].split(";")[0]))
    assert truth - np.mean(uncorrected) > 0.03  # the attenuation is there to remove
    assert abs(np.mean(corrected) - truth) < truth - np.mean(uncorrected), (np.mean(corrected), np.mean(uncorrected))


HELD_OUT_TARGET = (0.90, 0.98)  # the acceptance, at 16 and 32 documents
CHECKED = ("noisier", "quieter")
CHECKED_STUDIES = 100  # per (population, count): 400 studies per claim pooled, a binomial standard error of 1.1 %


@pytest.mark.slow
def test_the_claims_intervals_cover_their_true_values_out_of_sample():
    """Pooled over two held-out populations at 16 and 32 documents, each claim's own interval covers its true
    value in 90-98 % of the studies (a nominal 95 % interval; the methods were chosen on another population),
    except the claims whose interval says it is uncertain (its declared ``uncertain``: under 90 % in some
    held-out cell of the benchmark). A set interval (``per_head_z``) is conservative by construction: only its
    lower edge is checked (docs/claims.md, "Set intervals")."""
    pooled = {key: [0, 0] for key in COVERED}
    for name in CHECKED:
        for documents in (16, 32):
            for key, cell in coverage(HELD_OUT[name], documents, CHECKED_STUDIES)["chosen"].items():
                pooled[key][0] += cell[0]
                pooled[key][1] += cell[1]
    for key, (covered, n) in pooled.items():
        assert n == 4 * CHECKED_STUDIES, (key, n)
        declared = _declared_intervals()[key]
        if declared.uncertain is None:
            high = 1.0 if declared.per_head_z is not None else HELD_OUT_TARGET[1]
            assert HELD_OUT_TARGET[0] <= covered / n <= high, (key, covered / n)


def test_an_uncertain_interval_says_so():
    table = claims(simulate_study(true_means(), np.random.default_rng(5)))
    for key in table.index:
        said = "uncertain: on simulated populations it was not chosen on" in table.loc[key, "interval"]
        assert said == (CLAIMS[key].interval.uncertain is not None), (key, table.loc[key, "interval"])
    low, high = CLAIMS["four_phase_profile"].interval.uncertain
    assert f"{low:.0%} to {high:.0%} of studies" in table.loc["four_phase_profile", "interval"]


def _exact_upper_tails(n: int, p: Fraction) -> list[Fraction]:
    """P(X >= k) for k = 0..n, X binomial(n, p), in exact fractions from the binomial's definition (the terms
    summed from the top, so that each tail is the one above plus its own term)."""
    tails = [Fraction(0)] * (n + 2)
    for k in range(n, -1, -1):
        tails[k] = tails[k + 1] + math.comb(n, k) * p**k * (1 - p) ** (n - k)
    return tails[: n + 1]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 420), p=st.sampled_from([Fraction(98, 100), Fraction(95, 100), Fraction(1, 2)]),
       tail=st.sampled_from([Fraction(25, 1000), Fraction(1, 100), Fraction(5, 100), Fraction(1, 5)]))
def test_the_over_count_is_the_smallest_count_whose_exact_upper_tail_is_under_the_tail(n, p, tail):
    # docs/claims.md, "Above 0.98": a re-measured cell is over from the smallest count whose binomial upper tail at
    # a true coverage p is under the tail; the reference sums the tail in fractions and scans every count.
    from benchmarks.bench_coverage import over_count, upper_tail

    tails = _exact_upper_tails(n, p)
    expected = next((k for k in range(n + 1) if tails[k] < tail), n + 1)
    assert over_count(n, float(p), float(tail)) == expected
    for k in {0, expected - 1, expected, n}:
        if 0 <= k <= n:
            assert math.isclose(upper_tail(k, n, float(p)), float(tails[k]), rel_tol=1e-9,
                                abs_tol=1e-15), (k, n, p)


@settings(max_examples=60, deadline=None)
@given(studies=st.integers(1, 12), candidates=st.integers(2, 5), data=st.data())
def test_nesting_failures_names_every_study_whose_wider_candidates_interval_does_not_contain_the_narrower(
        studies, candidates, data):
    # Intervals grown outwards candidate by candidate are nested; a few pulled inwards are not. The reference reads
    # the definition (a contains b when a's low <= b's low and a's high >= b's high) study by study.
    from benchmarks.bench_coverage import nesting_failures

    widths = st.floats(0, 1, allow_nan=False)
    by_knob, low, high = [], np.zeros(studies), np.zeros(studies)
    for _ in range(candidates):
        low = low - np.array(data.draw(st.lists(widths, min_size=studies, max_size=studies)))
        high = high + np.array(data.draw(st.lists(widths, min_size=studies, max_size=studies)))
        by_knob.append([(0.0, a, b) for a, b in zip(low, high, strict=True)])
    assert nesting_failures(by_knob) == []
    pulled = data.draw(st.sets(st.tuples(st.integers(1, candidates - 1), st.integers(0, studies - 1)), max_size=4))
    for i, j in pulled:
        value, a, b = by_knob[i][j]
        by_knob[i][j] = (value, a + 2.5, b) if (i + j) % 2 else (value, a, b - 2.5)  # past any narrower interval
    expected = [(i, j) for i in range(1, candidates) for j in range(studies)
                if not (by_knob[i][j][1] <= by_knob[i - 1][j][1] and by_knob[i][j][2] >= by_knob[i - 1][j][2])]
    assert nesting_failures(by_knob) == expected
    assert set(pulled) <= set(expected)
    assert nesting_failures(by_knob, tolerance=2.5) == []  # each pulled in by at most 2.5: within the tolerance
    assert nesting_failures([by_knob[0], by_knob[1][:-1]]) == [(1, -1)]  # a study short: not comparable
