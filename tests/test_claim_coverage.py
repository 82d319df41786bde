"""Coverage of the claims' intervals on simulated studies whose true values are known.

A simulated study (``tests.fixtures.simulate_study``) is a result of
``DOCUMENTS`` documents: every head has true means for the fields the claims
read, and each document's value scatters around them (skewed,
heteroscedastic noise, so that the per-head means of a few documents are
biased inputs to nonlinear statistics: a trimmed mean, a share past a
threshold, a correlation over heads, a minimum or maximum of two curves'
drops). The
documents go through the package's accumulator with Poisson-bootstrap
weights, as a real run does, and `claims` computes every interval. The true
value of a claim's statistic is that statistic, written here from the claims'
rules, on the true head means. A nominal 95 % interval must cover it in 93-97 %
of ``STUDIES`` studies (the binomial standard error of a 95 % coverage over
400 studies is 1.1 %).

``python -m tests.test_claim_coverage`` prints, for each claim, the coverage
of every interval method of `tl_geometry.analysis.intervals` on the same
studies and the one the claim uses (``claims.INTERVAL_METHOD``, chosen by it).
"""

import math

import jaxtyping
import numpy as np
import pytest

from tests.fixtures import STUDY_DOCUMENTS as DOCUMENTS
from tests.fixtures import STUDY_GRID as GRID
from tests.fixtures import STUDY_REPLICATES as REPLICATES
from tests.fixtures import simulate_study, study_roles, true_means
from tl_geometry import claims
from tl_geometry.analysis import claims as claims_module
from tl_geometry.analysis.intervals import METHODS

STUDIES = 400
SMALL, MID, LARGE = (GRID >= 2) & (GRID <= 4), (GRID >= 8) & (GRID <= 16), GRID >= 32
AT3 = int(np.flatnonzero(GRID == 3)[0])
COVERED = ("compressed_sink", "exponential_decay", "stable_norms", "four_phase_profile", "small_n_separability",
           "large_n_return", "envelope_tightness", "sink_recall_correlation", "sink_precision_correlation",
           "regimes_by_depth", "regime_tradeoffs")  # fmt: skip


# ---- the statistics on the true means, written from the claims' rules ----


def _curve(x):
    return x.reshape(-1, x.shape[-1]).mean(0)  # over layers and heads


def _corr(x, y):
    return float(np.corrcoef(x.ravel(), y.ravel())[0, 1])


def _role_truths(m: dict[str, np.ndarray]) -> dict[str, float]:
    """Section 4.2's smaller depth step and Figure 11's smallest margin on the true roles (-1: a role without heads)."""
    roles = study_roles(m)
    depth = np.arange(roles.shape[0])[:, None] / (roles.shape[0] - 1) * np.ones(roles.shape)
    mean_depth = {r: depth[roles == r].mean() if (roles == r).any() else math.nan for r in ("retriever", "reset", "mixer")}
    step = min(mean_depth["reset"] - mean_depth["retriever"], mean_depth["mixer"] - mean_depth["reset"])
    others = (roles == "reset") | (roles == "mixer")

    def at(member, metric, mask):
        return m[metric][member][:, mask].mean() if member.any() else math.nan

    retriever, reset = roles == "retriever", roles == "reset"
    margins = [at(retriever, "recall", LARGE) - at(others, "recall", LARGE),
               at(others, "precision", LARGE) - at(retriever, "precision", LARGE),
               min(at(reset, x, LARGE) - at(reset, x, MID) for x in ("precision", "recall"))]
    return {"regimes_by_depth": -1.0 if math.isnan(step) else float(step),
            "regime_tradeoffs": float(min(-1.0 if math.isnan(x) else x for x in margins))}


def true_values(m: dict[str, np.ndarray]) -> dict[str, float]:
    drop = lambda name: _curve(m[name])[SMALL].mean() - _curve(m[name])[MID].mean()  # noqa: E731
    rise = lambda name: _curve(m[name])[LARGE].mean() - _curve(m[name])[MID].mean()  # noqa: E731
    # The envelopes' floors (p_- <= 1/2): the gap is taken above the larger of the curve and the floor.
    floor = {"precision": np.where(GRID == 1, 1.0, 1 - 0.5 / (GRID + 1)), "recall": np.where(GRID == 1, 1.0, 0.5)}
    gap = lambda metric, mask: (_curve(m[f"bound_{metric}_upper"])  # noqa: E731
                                - np.maximum(_curve(m[metric]), floor[metric]))[mask].mean()
    ratios = np.sort(m["sink_norm_ratio"].ravel())
    cut = len(ratios) // 4
    return {
        "compressed_sink": float(ratios[cut : len(ratios) - cut].mean()),  # the interquartile mean
        "exponential_decay": float(m["decay_mae"].mean()),
        "stable_norms": float((m["value_norm_cv"] <= 0.05).mean()),
        "four_phase_profile": float(((m["profile_p_sink"] >= 100 * m["profile_p_base"]) & (m["profile_has_plateau"] >= 0.5)
                                     & (m["profile_has_recency"] >= 0.5)).mean()),
        "small_n_separability": float(min(drop("excess_precision"), drop("excess_recall"))),
        "large_n_return": float(min(rise("precision"), rise("recall"))),
        "envelope_tightness": float(max(gap("precision", SMALL), gap("precision", LARGE), gap("recall", SMALL),
                                        gap("recall", MID), gap("recall", LARGE))),
        "sink_recall_correlation": _corr(m["recall"][..., AT3], m["rho0"]),
        "sink_precision_correlation": _corr(m["precision"][..., AT3], m["rho0"]),
        **_role_truths(m),
    }


def coverage(studies: int = STUDIES, seed: int = 0, method: str | None = None) -> dict[str, tuple[float, int]]:
    """Per claim: the share of the studies with an interval whose interval covers the true value, and how many
    had one. ``method``: every claim's replicates read with that interval instead of the claim's own."""
    means = true_means(seed)
    truth = true_values(means)
    rng = np.random.default_rng(seed + 1)
    hits = {key: [0, 0] for key in COVERED}
    with pytest.MonkeyPatch.context() as patch:
        if method is not None:
            patch.setattr(claims_module, "INTERVAL_METHOD", dict.fromkeys(claims_module.INTERVAL_METHOD, method))
        for study in range(studies):
            if study == 1:  # the runtime shape checks have seen every call once; the other studies repeat them
                patch.setattr(jaxtyping.config, "jaxtyping_disable", True)
            table = claims(simulate_study(means, rng))
            for key in COVERED:
                low, high = table.loc[key, "low"], table.loc[key, "high"]
                if not math.isnan(low):
                    hits[key][0] += low <= truth[key] <= high
                    hits[key][1] += 1
    return {key: (covered / max(1, n), n) for key, (covered, n) in hits.items()}


def test_every_claim_with_an_interval_is_covered():
    # Guard: every claim listed here gets an interval on a simulated study.
    table = claims(simulate_study(true_means(), np.random.default_rng(5)))
    assert not table.loc[list(COVERED), "low"].isna().any(), table.loc[list(COVERED), "interval"]


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


COVERAGE_TARGET = (0.93, 0.97)
@pytest.mark.slow
def test_the_claims_intervals_cover_their_true_values_on_simulated_studies():
    """Each claim's own interval covers in 93-97 % of the studies."""
    for key, (share, studies) in coverage().items():
        assert studies == STUDIES, (key, share, studies)
        assert COVERAGE_TARGET[0] <= share <= COVERAGE_TARGET[1], (key, share)


if __name__ == "__main__":
    found = {method: coverage(method=method) for method in METHODS}
    print(f"coverage of nominal 95 % intervals, {STUDIES} studies of {DOCUMENTS} documents ({REPLICATES} replicates)")
    print(f"| claim | {' | '.join(METHODS)} | used |\n|---|{'---|' * len(METHODS)}---|")
    for key in COVERED:
        cells = " | ".join(f"{found[m][key][0]:.3f}" for m in METHODS)
        print(f"| {key} | {cells} | {claims_module.INTERVAL_METHOD[key]} |")
