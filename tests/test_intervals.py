"""The interval methods of `tl_geometry.analysis.intervals` against references written from their definitions."""

import math
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_geometry.analysis.intervals import normal_interval

levels = st.sampled_from([0.5, 0.8, 0.9, 0.95, 0.99])


@settings(max_examples=100, deadline=None)
@given(st.floats(-10, 10), st.lists(st.floats(-10, 10), min_size=2, max_size=30), levels)
def test_normal_interval_is_the_bias_corrected_estimate_plus_minus_z_sd(value, replicates, level):
    mean, sd = statistics.fmean(replicates), statistics.stdev(replicates)
    z = statistics.NormalDist().inv_cdf(1 - (1 - level) / 2)
    centre = value - (mean - value)  # the estimate minus the replicates' bias
    expected = (centre - z * sd, centre + z * sd)
    assert normal_interval(value, torch.tensor(replicates, dtype=torch.float64), level) == pytest.approx(
        expected, abs=1e-9)


def test_normal_interval_needs_two_replicates_and_a_value():
    assert all(math.isnan(x) for x in normal_interval(1.0, torch.tensor([1.0])))
    assert all(math.isnan(x) for x in normal_interval(math.nan, torch.tensor([1.0, 2.0])))
