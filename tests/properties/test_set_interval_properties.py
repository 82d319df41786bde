"""Properties of the set intervals (tl_geometry.analysis.set_intervals), for heads drawn by hypothesis.

From the derivation in docs/claims.md ("Set intervals"): the interval holds
the count of heads past the threshold (every head certainly past is past,
every head past is possibly past); it widens as z grows; where every head's
interval lies on one side of the threshold it is the count itself.
"""

import numpy as np
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tl_geometry.analysis.set_intervals import (
    binomial_share_at_least_half,
    extremes_over_roles,
    possible_roles,
    share_past_interval,
)

THRESHOLD = 0.05
heads = st.integers(1, 12)


@st.composite
def estimates(draw):
    n = draw(heads)
    x = draw(st.lists(st.floats(0.0, 0.1, allow_nan=False), min_size=n, max_size=n))
    se = draw(st.lists(st.floats(0.0, 0.02, allow_nan=False), min_size=n, max_size=n))
    return torch.tensor([x], dtype=torch.float64), torch.tensor([se], dtype=torch.float64)


def count(x, side):
    past = x <= THRESHOLD if side == "<=" else x >= THRESHOLD
    return float(past.double().mean())


@settings(max_examples=200, deadline=None)
@given(heads_=estimates(), z=st.floats(0.0, 4.0), side=st.sampled_from(["<=", ">="]))
def test_the_interval_holds_the_count(heads_, z, side):
    x, se = heads_
    low, high = share_past_interval(x, se, THRESHOLD, z, side)
    assert low <= count(x, side) <= high
    if z == 0:  # every head judged by its estimate alone: the count
        assert low == high == count(x, side)


@settings(max_examples=200, deadline=None)
@given(heads_=estimates(), a=st.floats(0.0, 4.0), b=st.floats(0.0, 4.0), side=st.sampled_from(["<=", ">="]))
def test_the_interval_widens_as_z_grows(heads_, a, b, side):
    x, se = heads_
    narrow = share_past_interval(x, se, THRESHOLD, min(a, b), side)
    wide = share_past_interval(x, se, THRESHOLD, max(a, b), side)
    assert wide[0] <= narrow[0] and narrow[1] <= wide[1]


@settings(max_examples=200, deadline=None)
@given(heads_=estimates(), z=st.floats(0.0, 4.0), side=st.sampled_from(["<=", ">="]))
def test_heads_far_from_the_threshold_give_the_count(heads_, z, side):
    x, se = heads_
    assume(bool(((x - THRESHOLD).abs() > z * se).all()))
    assert share_past_interval(x, se, THRESHOLD, z, side) == (count(x, side), count(x, side))


@st.composite
def role_probabilities(draw):
    layers, per_layer = draw(st.integers(2, 3)), draw(st.integers(1, 3))
    raw = draw(st.lists(st.floats(0.0, 1.0), min_size=layers * per_layer * 3, max_size=layers * per_layer * 3))
    p = np.asarray(raw).reshape(layers, per_layer, 3) + 1e-3
    return torch.tensor(p / p.sum(-1, keepdims=True))


def heads_in_role_0(member):
    return member[..., 0].sum((-2, -1))


@settings(max_examples=100, deadline=None)
@given(p=role_probabilities(), a=st.floats(0.0, 3.0), b=st.floats(0.0, 3.0))
def test_role_extremes_hold_the_most_probable_roles_and_widen_with_z(p, a, b):
    top = torch.nn.functional.one_hot(p.argmax(-1), 3).double()
    on_top = float(heads_in_role_0(top.unsqueeze(0))[0])
    narrow = extremes_over_roles(possible_roles(p, min(a, b)), heads_in_role_0, lambda: (0.0, 99.0))
    wide = extremes_over_roles(possible_roles(p, max(a, b)), heads_in_role_0, lambda: (0.0, 99.0))
    assert narrow[0] <= on_top <= narrow[1]
    assert wide[0] <= narrow[0] and narrow[1] <= wide[1]


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 64), data=st.data(), a=st.floats(0.0, 4.0), b=st.floats(0.0, 4.0))
def test_a_binomial_share_certainly_past_half_is_possibly_past_it_and_z_widens(n, data, a, b):
    k = data.draw(st.integers(0, n))
    share, count = torch.tensor([[k / n]]), torch.tensor([[float(n)]])
    narrow = binomial_share_at_least_half(share, count, min(a, b))
    wide = binomial_share_at_least_half(share, count, max(a, b))
    assert bool(narrow[1]) or not bool(narrow[0])  # certainly implies possibly
    assert bool(wide[1]) >= bool(narrow[1]) and bool(wide[0]) <= bool(narrow[0])  # wider: less certain, more possible
