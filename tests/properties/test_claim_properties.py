"""The scorecard's verdict rule (tl_geometry.analysis.claims), for values and intervals drawn by hypothesis.

The rule as docs/claims.md states it: "holds" when the statistic reaches the
holds threshold and so does its whole interval; "partly" when it reaches the
partly threshold (or reaches holds with an interval that crosses it);
"does not hold" otherwise; "not measured" for NaN.
"""

import itertools
import math
from statistics import NormalDist

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tl_geometry import GeometryConfig, GeometryResult, claims
from tests.reference import reference_tradeoff_margin
from tl_geometry.analysis import claims as claims_module
from tl_geometry.analysis import set_intervals
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


# ---- trade-offs by role's set interval (docs/claims.md, "A set interval for trade-offs by role")

TRADEOFF_GRID = (1, 2, 4, 8, 16, 32, 64)
ROLE_NAMES = claims_module.ROLES


@st.composite
def heads_in_doubt(draw):
    """Role probabilities ``[layer, head, role]`` of a few heads, and their P and R curves in [0, 1] (some NaN)."""
    layers, per_layer = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    heads = layers * per_layer
    raw = draw(st.lists(st.floats(0.0, 1.0), min_size=heads * len(ROLE_NAMES), max_size=heads * len(ROLE_NAMES)))
    p = np.asarray(raw).reshape(layers, per_layer, len(ROLE_NAMES)) ** 3  # some roles near 0: fewer in doubt
    p = p + 1e-6
    point = st.one_of(st.floats(0.0, 1.0), st.just(math.nan))
    curves = [draw(st.lists(point, min_size=heads * len(TRADEOFF_GRID), max_size=heads * len(TRADEOFF_GRID)))
              for _ in range(2)]
    precision, recall = (np.asarray(c).reshape(layers, per_layer, len(TRADEOFF_GRID)) for c in curves)
    return p / p.sum(-1, keepdims=True), precision, recall


def possible_by_hand(p, z):
    """Per head (flat), the roles at least Phi(-z) of its replicates give it, and its most probable role."""
    least = NormalDist().cdf(-z)
    return [[r for r, q in enumerate(row) if (q >= least and q > 0) or q == row.max()]
            for row in p.reshape(-1, p.shape[-1])]


def margins_by_hand(p, precision, recall, z):
    """The smallest margin on every assignment of one possible role per head, enumerated here."""
    flat_p, flat_r = precision.reshape(-1, len(TRADEOFF_GRID)), recall.reshape(-1, len(TRADEOFF_GRID))
    return [reference_tradeoff_margin([ROLE_NAMES[r] for r in choice], flat_p.tolist(), flat_r.tolist(),
                                      TRADEOFF_GRID)
            for choice in itertools.product(*possible_by_hand(p, z))]


def package_interval(p, precision, recall, z):
    return claims_module.tradeoff_set_interval(torch.tensor(p), torch.tensor(precision), torch.tensor(recall),
                                               torch.tensor(TRADEOFF_GRID), z)


@settings(max_examples=150, deadline=None)
@given(case=heads_in_doubt(), z=st.floats(0.0, 4.0))
def test_the_tradeoff_set_interval_is_every_assignment_s_extremes_and_the_fallback_holds_them(case, z):
    p, precision, recall = case
    values = margins_by_hand(p, precision, recall, z)
    assume(len(values) <= 729)
    low, high = package_interval(p, precision, recall, z)
    assert (low, high) == pytest.approx((min(values), max(values)), abs=1e-12)
    with pytest.MonkeyPatch.context() as patch:  # past the enumeration limit: bounds that hold every assignment
        patch.setattr(set_intervals, "MAX_ASSIGNMENTS", 0)
        outer_low, outer_high = package_interval(p, precision, recall, z)
    assert -1.0 <= outer_low <= min(values) + 1e-12 and max(values) - 1e-12 <= outer_high <= 1.0


@settings(max_examples=100, deadline=None)
@given(case=heads_in_doubt(), a=st.floats(0.0, 4.0), b=st.floats(0.0, 4.0))
def test_the_tradeoff_set_interval_holds_the_most_probable_roles_and_widens_with_z(case, a, b):
    p, precision, recall = case
    most_probable = [ROLE_NAMES[int(r)] for r in p.reshape(-1, p.shape[-1]).argmax(-1)]
    statistic = reference_tradeoff_margin(most_probable, precision.reshape(-1, len(TRADEOFF_GRID)).tolist(),
                                          recall.reshape(-1, len(TRADEOFF_GRID)).tolist(), TRADEOFF_GRID)
    narrow = package_interval(p, precision, recall, min(a, b))
    wide = package_interval(p, precision, recall, max(a, b))
    assert narrow[0] - 1e-12 <= statistic <= narrow[1] + 1e-12
    assert wide[0] <= narrow[0] + 1e-12 and narrow[1] <= wide[1] + 1e-12


@settings(max_examples=100, deadline=None)
@given(case=heads_in_doubt(), z=st.floats(0.0, 4.0))
def test_the_tradeoff_set_interval_of_heads_in_no_doubt_is_the_statistic(case, z):
    p, precision, recall = case
    one_hot = np.eye(len(ROLE_NAMES))[p.argmax(-1)]  # every replicate agrees: no head in doubt at any z
    statistic = reference_tradeoff_margin([ROLE_NAMES[int(r)] for r in p.argmax(-1).ravel()],
                                          precision.reshape(-1, len(TRADEOFF_GRID)).tolist(),
                                          recall.reshape(-1, len(TRADEOFF_GRID)).tolist(), TRADEOFF_GRID)
    assert package_interval(one_hot, precision, recall, z) == pytest.approx((statistic, statistic), abs=1e-12)
