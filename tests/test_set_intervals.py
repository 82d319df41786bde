"""Set intervals of statistics of heads judged against a threshold (tl_geometry.analysis.set_intervals).

Each function is compared with a slow reference written from the definition
in docs/claims.md ("Set intervals"): a loop over heads, each judged by its own
interval x +- z se, and a loop over every assignment of one possible role per
head. The properties (the interval holds the count, widens with z, is the
count where every head is far from the threshold) are in
tests/properties/test_set_interval_properties.py; the claims that use them
are checked in tests/test_claims.py.
"""

import itertools
import math
from statistics import NormalDist

import numpy as np
import pytest
import torch

from tl_geometry.analysis import set_intervals
from tl_geometry.errors import GeometryError


def reference_share_interval(x, se, threshold, z, side):
    """Per head: certainly past when its whole interval [x - z se, x + z se] is past the threshold, possibly past
    when some of it is; the shares over the heads with an estimate (a NaN se: the estimate alone)."""
    certain = possible = heads = 0
    for value, error in zip(np.ravel(x), np.ravel(se)):
        if math.isnan(value):
            continue
        heads += 1
        error = 0.0 if math.isnan(error) else error
        low, high = value - z * error, value + z * error
        if side == "<=":
            certain += high <= threshold
            possible += low <= threshold
        else:
            certain += low >= threshold
            possible += high >= threshold
    return (certain / heads, possible / heads) if heads else (math.nan, math.nan)


@pytest.mark.parametrize("side", ["<=", ">="])
@pytest.mark.parametrize("z", [0.0, 0.5, 1.0, 2.0])
def test_share_past_interval_is_the_loop_over_heads(side, z):
    rng = np.random.default_rng(4)
    x = rng.uniform(0.03, 0.07, (4, 6))
    se = rng.uniform(0.0, 0.01, (4, 6))
    x[1, 2], se[0, 3] = math.nan, math.nan
    got = set_intervals.share_past_interval(torch.tensor(x), torch.tensor(se), 0.05, z, side)
    assert got == pytest.approx(reference_share_interval(x, se, 0.05, z, side), abs=1e-12)


def test_share_past_interval_refuses_a_bad_side_or_z():
    x = torch.zeros(1, 2)
    with pytest.raises(GeometryError, match=r"side: expected one of \('<=', '>='\), got '<'"):
        set_intervals.share_past_interval(x, x, 0.05, 1.0, "<")
    with pytest.raises(GeometryError, match="z: expected a number of standard errors >= 0, got -1"):
        set_intervals.share_past_interval(x, x, 0.05, -1.0)


def test_replicate_standard_errors_are_the_replicates_spread_for_n_minus_one():
    rng = np.random.default_rng(5)
    reps = rng.normal(0.0, 1.0, (50, 2, 3))
    reps[4, 0, 0] = math.nan
    got = set_intervals.replicate_standard_errors(torch.tensor(reps), units=16).numpy()
    for layer, head in itertools.product(range(2), range(3)):
        values = reps[:, layer, head]
        values = values[~np.isnan(values)]
        expected = np.std(values, ddof=1) * math.sqrt(16 / 15)
        assert got[layer, head] == pytest.approx(expected, rel=1e-12)


def reference_depth_step(roles, depth):
    """The smaller of Reset - Retriever and Mixer - Reset of the roles' mean depths (0 first layer, 1 last), one
    role per head (-1: a head in none of them); -1 where a role has no head."""
    names = ("retriever", "reset", "mixer")
    mean = {}
    for index, name in enumerate(names):
        members = [depth[h] for h, role in enumerate(roles) if role == index]
        if not members:
            return -1.0
        mean[name] = sum(members) / len(members)
    return min(mean["reset"] - mean["retriever"], mean["mixer"] - mean["reset"])


def test_extremes_over_roles_is_every_assignment_of_possible_roles():
    """Heads of four layers, each with a few possible roles of four (a fourth role in none of the depth roles);
    the extremes of the depth step over every assignment, from a loop."""
    rng = np.random.default_rng(6)
    layers, heads, roles = 4, 3, 4
    probabilities = rng.dirichlet(np.full(roles, 0.3), (layers, heads))
    z = 1.5
    least = NormalDist().cdf(-z)
    flat = probabilities.reshape(-1, roles)
    options = [[r for r in range(roles) if (p[r] >= least and p[r] > 0) or p[r] == p.max()] for p in flat]
    depth = [layer / (layers - 1) for layer in range(layers) for _ in range(heads)]
    values = [reference_depth_step([r if r < 3 else -1 for r in choice], depth) for choice in itertools.product(*options)]
    assert len(values) > 1  # some head is in doubt: the interval is not a point

    possible = set_intervals.possible_roles(torch.tensor(probabilities), z)
    assert possible.reshape(-1, roles).tolist() == [[r in o for r in range(roles)] for o in options]
    layer_depth = torch.arange(layers, dtype=torch.float64).unsqueeze(-1) / (layers - 1)

    def step(member):  # the package's statistic is not called: the same definition, batched here
        means = []
        for r in range(3):
            w = member[..., r]
            total = w.sum((-2, -1))
            means.append(((w * layer_depth).sum((-2, -1)) / total).masked_fill(total < 1, math.nan))
        return torch.minimum(means[1] - means[0], means[2] - means[1]).nan_to_num(-1.0)

    got = set_intervals.extremes_over_roles(possible, step, lambda: (-1.0, 1.0))
    assert got == pytest.approx((min(values), max(values)), abs=1e-12)


def test_extremes_over_roles_past_the_cap_are_the_outer_bounds():
    possible = torch.ones(4, 8, 2, dtype=torch.bool)  # 2^32 assignments: not enumerated
    assert set_intervals.extremes_over_roles(possible, lambda m: 1 / 0, lambda: (-0.5, 0.5)) == (-0.5, 0.5)


def reference_mean_ranges(options, value, roles):
    """Per role, the smallest and largest mean of ``value`` over the heads holding it, over every assignment of one
    possible role per head in which it has a head (a loop over the assignments; NaN where none has)."""
    found = {r: [] for r in range(roles)}
    for choice in itertools.product(*options):
        for r in range(roles):
            members = [value[h] for h, c in enumerate(choice) if c == r]
            if members:
                found[r].append(sum(members) / len(members))
    return [[min(v), max(v)] if v else [math.nan, math.nan] for v in found.values()]


@pytest.mark.parametrize("seed", range(6))
def test_mean_ranges_hold_every_assignment_and_are_exact_for_one_role_in_doubt(seed):
    """Each role's range of mean value holds the mean over every assignment (a loop); where each head in doubt
    is torn between one role and roles no other head can take, the ranges are the assignments' extremes."""
    rng = np.random.default_rng(seed)
    heads, roles = 7, 3
    possible = rng.random((heads, roles)) < 0.4
    possible[np.arange(heads), rng.integers(0, roles, heads)] = True
    value = rng.uniform(0, 1, heads)
    options = [list(np.flatnonzero(row)) for row in possible]
    got = set_intervals.mean_ranges(torch.tensor(possible)[:, None], torch.tensor(value)[:, None]).numpy()
    expected = np.array(reference_mean_ranges(options, value, roles))
    assert np.array_equal(np.isnan(got), np.isnan(expected))
    defined = ~np.isnan(expected)
    assert (got[defined][..., 0] <= expected[defined][..., 0] + 1e-12).all()  # never narrower
    assert (got[defined][..., 1] >= expected[defined][..., 1] - 1e-12).all()
    # each role on its own: its range is exact (the other roles' heads do not constrain it)
    for r in range(roles):
        alone = [[r, -1] if (r in o and len(o) > 1) else ([r] if r in o else [-1]) for o in options]
        exact = reference_mean_ranges(alone, value, roles)[r]
        assert got[r] == pytest.approx(exact, abs=1e-12, nan_ok=True)
    may_be_empty = set_intervals.role_may_be_empty(torch.tensor(possible)[:, None]).numpy()
    assert may_be_empty.tolist() == [not any(o == [r] for o in options) for r in range(roles)]


def reference_binomial_sides(k, n, z):
    """Certainly p >= 1/2: the exact one-sided binomial interval's lower end (tail Phi(-z)) at least 1/2, i.e.
    P(X >= k | n, 1/2) <= Phi(-z); possibly: its upper end at least 1/2, P(X <= k | n, 1/2) >= Phi(-z)."""
    tail = NormalDist().cdf(-z)
    at_least = sum(math.comb(n, j) for j in range(k, n + 1)) / 2**n
    at_most = sum(math.comb(n, j) for j in range(0, k + 1)) / 2**n
    return at_least <= tail, at_most >= tail


@pytest.mark.parametrize("n", [1, 5, 16, 33])
@pytest.mark.parametrize("z", [0.5, 1.645, 3.0])
def test_binomial_share_at_least_half_is_the_exact_binomial_test(n, z):
    k = np.arange(n + 1)
    certainly, possibly = set_intervals.binomial_share_at_least_half(
        torch.tensor(k / n)[None], torch.full((1, n + 1), float(n)), z)
    expected = [reference_binomial_sides(int(x), n, z) for x in k]
    assert certainly[0].tolist() == [c for c, _ in expected]
    assert possibly[0].tolist() == [p for _, p in expected]
