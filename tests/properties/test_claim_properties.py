"""The scorecard's verdict rule (tl_geometry.analysis.claims), for values and intervals drawn by hypothesis.

The rule as docs/claims.md states it: "holds" when the statistic reaches the
holds threshold and so does its whole interval; "partly" when it reaches the
partly threshold (or reaches holds with an interval that crosses it);
"does not hold" otherwise; "not measured" for NaN.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_geometry import GeometryConfig, GeometryResult, claims
from tl_geometry.analysis import claims as claims_module
from tl_geometry.analysis.claims import CLAIMS, verdict
from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.results.accumulators import Accumulator
from tl_geometry.results.result import REQUIRED_FIELDS

RANK = {"does not hold": 0, "partly": 1, "holds": 2}
values = st.floats(-2, 2, allow_nan=False)


def reached(direction, value, threshold):
    return value >= threshold if direction == ">=" else value <= threshold


@settings(max_examples=200, deadline=None)
@given(key=st.sampled_from(sorted(CLAIMS)), value=values, other=values)
def test_a_better_value_never_gets_a_worse_verdict(key, value, other):
    t = CLAIMS[key].thresholds
    better, worse = (max(value, other), min(value, other)) if t.direction == ">=" else (min(value, other), max(value, other))
    assert RANK[verdict(better, t)] >= RANK[verdict(worse, t)]


@settings(max_examples=200, deadline=None)
@given(key=st.sampled_from(sorted(CLAIMS)), value=values, a=values, b=values)
def test_verdict_follows_the_stated_rule(key, value, a, b):
    t = CLAIMS[key].thresholds
    low, high = min(a, b), max(a, b)
    got = verdict(value, t, low, high)
    if reached(t.direction, value, t.holds):
        inside = reached(t.direction, low, t.holds) and reached(t.direction, high, t.holds)
        assert got == ("holds" if inside else "partly")
    elif reached(t.direction, value, t.partly):
        assert got == "partly"
    else:
        assert got == "does not hold"
    assert verdict(math.nan, t, low, high) == "not measured"


def one_document_result(fields):
    specs = [FieldSpec(name, name, axes=("n",) * (np.ndim(v) - 2)) for name, v in fields.items()]
    shape = next(iter(fields.values())).shape
    acc = Accumulator(specs, layers=range(shape[0]), heads=range(shape[1]), n_grid=torch.tensor([1, 2]))
    acc.add({k: torch.tensor(v, dtype=torch.float32)[None] for k, v in fields.items()}, torch.zeros(1, 0), n_tokens=3)
    return GeometryResult.from_accumulator(acc, config=GeometryConfig(), model_name="drawn")


@pytest.fixture(scope="module", autouse=True)
def _any_sample_resolves():
    """One-document results: the sample-size rule (each claim's min_documents) set aside, as in
    tests/test_claims.py (tests/test_claim_sample.py checks it)."""
    with pytest.MonkeyPatch.context() as patch:
        for key, declared in CLAIMS.items():
            patch.setitem(CLAIMS, key, declared.replace(min_documents=1))
        yield


@settings(max_examples=40, deadline=None)
@given(cv=st.lists(st.floats(0.0, 0.25, width=32), min_size=2, max_size=12).filter(lambda x: len(x) % 2 == 0),
       mae=st.floats(0.0, 0.5, width=32))
def test_drawn_results_get_the_share_and_mean_the_rule_reads(cv, mae):
    cv = np.array(cv, dtype=np.float32).reshape(2, -1)
    fields = {name: np.ones(cv.shape + (2,)) for name in REQUIRED_FIELDS}
    fields.update(value_norm_cv=cv, decay_mae=np.full(cv.shape, mae, dtype=np.float32))
    table = claims(one_document_result(fields))
    share = float(np.mean(cv.astype(np.float64) <= 0.05))  # the stored float32 value against 0.05
    assert table.loc["stable_norms", "value"] == share
    assert table.loc["stable_norms", "verdict"] == ("holds" if share >= 0.8 else "partly" if share >= 0.5 else "does not hold")
    assert table.loc["exponential_decay", "value"] == np.float32(mae)


def _grouped_pairwise_cv(x, groups, weights):
    """One head's expected-curve CV from its documents' curves ``x`` [document, position] (the sink left out, one
    length) in ``groups`` (lists of document indices) weighted ``weights`` [group], from the definition in
    docs/claims.md: each document centred on its own mean over positions; the variance the mean, over pairs of
    documents in different groups each weighted by its groups' weights, of the mean over positions of their
    product (0 if below); over the mean of the documents' mean norms, each weighted by its group's weight."""
    y = x - x.mean(1, keepdims=True)
    products, pairs = 0.0, 0.0
    for g, members in enumerate(groups):
        for h, others in enumerate(groups):
            if g != h:
                for d in members:
                    for e in others:
                        products += weights[g] * weights[h] * np.mean(y[d] * y[e])
                        pairs += weights[g] * weights[h]
    if pairs == 0:
        return math.nan
    level = sum(weights[g] * x[d].mean() for g, members in enumerate(groups) for d in members)
    return math.sqrt(max(products / pairs, 0.0)) / (level / sum(weights[g] * len(m) for g, m in enumerate(groups)))


@settings(max_examples=80, deadline=None)
@given(documents=st.integers(2, 12), n_groups=st.integers(2, 5), positions=st.integers(2, 6),
       seed=st.integers(0, 2**31), singletons=st.booleans())
def test_the_grouped_curve_cv_is_the_mean_over_pairs_of_groups(documents, n_groups, positions, seed, singletons):
    """`_pairwise_curve_cv` on groups' sums and counts equals the brute-force loop over pairs of documents in
    different groups, for random groupings and Poisson weights (0 included); with every document a group of its
    own, the plain pairs of different documents. A mutant pairing documents of one group fails it."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.5, 2.0, (documents, 2, positions + 1))  # [document, head, position], the sink first
    if singletons:
        n_groups = documents
    member = np.arange(documents) if singletons else rng.integers(0, n_groups, documents)
    groups = [list(np.flatnonzero(member == g)) for g in range(n_groups)]
    weights = rng.poisson(1.0, n_groups).astype(float)
    totals = np.stack([x[m].sum(0) for m in groups])[:, None]  # [group, layer, head, position]
    counts = np.stack([np.full(x.shape[1:], len(m)) for m in groups])[:, None]
    got = claims_module._pairwise_curve_cv(torch.tensor(totals), torch.tensor(counts), torch.tensor(weights)[None])
    for head in range(2):
        want = _grouped_pairwise_cv(x[:, head, 1:], groups, weights)
        if math.isnan(want):
            assert math.isnan(float(got[0, 0, head]))
        else:
            assert float(got[0, 0, head]) == pytest.approx(want, rel=1e-9, abs=1e-12)
