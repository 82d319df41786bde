"""Too few documents is a verdict, and no verdict comes from a point estimate outside its own interval.

The rule (docs/claims.md, "Too few documents"): below the claim's ``min_documents``
documents, or when the statistic lies outside its interval, the verdict is
"too few documents" and ``flip`` names how many documents would do.
"""

import dataclasses
import math

import numpy as np
import pytest
import torch

from tests import tiny_models as tm
from tests.fixtures import simulate_study, true_means
from tests.mutants import Mutant, assert_caught, replace_attribute
from tl_geometry import claims, run_with_geometry_hooks
from tl_geometry.analysis import claims as claims_module
from tl_geometry.analysis.claims import CLAIMS, Claim, judge_sample, sample_warning
from tl_geometry.report.scorecard import scorecard_html

RESOLVED = ("holds", "partly", "does not hold")
MIN_DOCUMENTS = {key: declared.min_documents for key, declared in CLAIMS.items()}


def _check_table(table, n_documents: int) -> None:
    """Written from the rule: a resolved verdict needs the documents and an estimate inside its interval."""
    for key, row in table.iterrows():
        if row.verdict in RESOLVED:
            assert n_documents >= MIN_DOCUMENTS[key], (key, n_documents, row.verdict)
            if not math.isnan(row.low):
                assert row.low - 1e-6 <= row.value <= row.high + 1e-6, (key, row.value, row.low, row.high)
        elif row.verdict == "too few documents":
            assert any(f"{x} documents" in row.flip for x in (MIN_DOCUMENTS[key], f"more than {n_documents}", "more than 32")), (key, row.flip)
        if n_documents < MIN_DOCUMENTS[key]:
            assert row.verdict in ("too few documents", "not measured"), (key, n_documents, row.verdict)
        if row.literal_verdict in RESOLVED and not math.isnan(row.literal_low):  # the literal reading: the same rule
            assert row.literal_low - 1e-6 <= row.literal_value <= row.literal_high + 1e-6, (key, row.literal_value)


@pytest.mark.parametrize("documents", [2, 4, 8, 16])
def test_no_verdict_from_an_estimate_outside_its_interval_on_simulated_studies(documents):
    table = claims(simulate_study(true_means(3), np.random.default_rng(100 + documents), documents))
    _check_table(table, documents)


@pytest.mark.model
@pytest.mark.parametrize("windows", [2, 4, 8, 16])
def test_no_verdict_from_an_estimate_outside_its_interval_on_a_model_run(windows):
    model = tm.make_model("bridge-llama")
    result = run_with_geometry_hooks(model, tm.with_bos(tm.random_tokens(windows, 24)), diagnostics="all",
                                     n_grid=[1, 2, 3, 4, 8, 12, 16, 24])
    _check_table(claims(result), windows)


def _claim(value: float, low: float, high: float, verdict: str = "holds") -> Claim:
    return Claim("sink_recall_correlation", "c", "ref", "paper", "stat", value, low, high, "interval", "measured",
                 verdict, "rule", "flip")


def test_the_reviewers_case_is_refused_and_an_estimate_inside_is_kept():
    """``0.768 [0.519, 0.656] holds`` on 2 windows: refused (too few, and outside); inside with enough: kept."""
    need = MIN_DOCUMENTS["sink_recall_correlation"]
    refused = judge_sample(_claim(0.768, 0.519, 0.656), 2)
    assert refused.verdict == "too few documents" and str(need) in refused.flip
    outside = judge_sample(_claim(0.768, 0.519, 0.656), need)
    assert outside.verdict == "too few documents" and f"more than {need}" in outside.flip
    kept = judge_sample(_claim(0.6, 0.519, 0.656), need)
    assert kept.verdict == "holds" and kept.flip == "flip"
    not_measured = judge_sample(_claim(math.nan, math.nan, math.nan, "not measured"), 2)
    assert not_measured.verdict == "not measured"


def test_the_first_screen_says_when_the_sample_is_too_small():
    small = min(MIN_DOCUMENTS.values())
    assert sample_warning(max(MIN_DOCUMENTS.values())) == ""
    assert "Too few documents to trust: this result has 2" in sample_warning(2)
    # Only the claims beyond the ladder short: "more than 32", never "from 64 to more than 32".
    assert sample_warning(32).endswith("small_n_separability: more than 32) before its bootstrap interval can "
                                       "resolve a verdict, and reads 'too few documents' until then.")
    several = sample_warning(2)  # the plural, and the range of counts from the smallest to beyond the ladder
    assert "claims need more (" in several and ": from 4 to more than 32) before their bootstrap intervals" in several
    # The default run: one claim short, said in the singular.
    assert "1 of the 11 claims needs more (small_n_separability: more than 32) before its bootstrap interval can " \
           "resolve a verdict, and reads 'too few documents'" in sample_warning(16)
    result = simulate_study(true_means(3), np.random.default_rng(7), 2)
    page = scorecard_html(result)
    assert "Too few documents to trust" in page and "too few documents</span>" in page
    assert small >= 2


def test_a_mutant_that_keeps_every_verdict_is_caught():
    assert_caught(Mutant("every verdict kept, whatever the sample",
                         replace_attribute(claims_module, "judge_sample", lambda claim, *args, **kwargs: claim),
                         (lambda: test_no_verdict_from_an_estimate_outside_its_interval_on_simulated_studies(2),)))


def test_the_scorecard_shows_the_literal_reading_beside_ours_with_its_verdict():
    result = simulate_study(true_means(3), np.random.default_rng(8), max(MIN_DOCUMENTS.values()))
    table = claims(result)
    page = scorecard_html(result)
    for key in ("small_n_separability", "four_phase_profile"):
        row = table.loc[key]
        assert row.literal_verdict in ("holds", "partly", "does not hold", "too few documents"), key
        section = page.split(f'id="claim-{key}"')[1].split("</tr>")[0]
        assert 'class="small literal"' in section and row.literal_verdict in section
