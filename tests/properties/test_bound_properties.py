"""Invariants of the envelopes of Theorems 1-2, for inputs drawn by hypothesis."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_geometry import selection_metrics
from tl_geometry.theory.theorem_bounds import envelopes, lower_envelopes, selection_margins


@st.composite
def rows(draw):
    """alpha [rows, key] (softmax of drawn logits) and values [rows, key, d] of drawn norms and directions."""
    seed = draw(st.integers(0, 2**31 - 1))
    n_rows, n_keys, d_head = draw(st.integers(1, 3)), draw(st.integers(2, 12)), draw(st.integers(2, 6))
    gen = torch.Generator().manual_seed(seed)
    alpha = torch.softmax(draw(st.floats(0.5, 6.0)) * torch.randn(n_rows, n_keys, generator=gen, dtype=torch.float64), -1)
    norms = torch.exp(torch.randn(n_rows, n_keys, 1, generator=gen, dtype=torch.float64))
    values = torch.randn(n_rows, n_keys, d_head, generator=gen, dtype=torch.float64) * norms
    return alpha, values


@settings(max_examples=60, deadline=None)
@given(data=rows(), c=st.floats(1e-3, 1e3), kappa=st.floats(1e-2, 1e6))
def test_scaling_a_rows_values_leaves_every_envelope_unchanged(data, c, kappa):
    alpha, values = data
    d_head = values.shape[-1]
    base = envelopes(selection_margins(alpha, values, None), d_head, kappa=kappa)
    scaled = envelopes(selection_margins(alpha, c * values, None), d_head, kappa=kappa)
    for name, t in base.as_dict().items():
        torch.testing.assert_close(scaled.as_dict()[name], t, equal_nan=True, rtol=1e-9, atol=1e-9, msg=name)


@settings(max_examples=60, deadline=None)
@given(data=rows(), kappa=st.floats(1e-2, 1e12))
def test_sink_aware_lower_envelopes_hold_on_any_row_for_any_kappa(data, kappa):
    alpha, values = data
    m = selection_metrics(alpha, values, None)
    p_low, r_low = lower_envelopes(selection_margins(alpha, values, None), values.shape[-1], kappa=kappa)
    assert (m.precision >= p_low - 1e-9).all()
    assert (m.recall >= r_low - 1e-9).all()


def test_the_paper_exponent_is_not_scale_free():
    # Kept to show why the default changed: (Delta / B)^2 has the units of a^2. A clean row (orthogonal values,
    # weights falling fast): the paper's envelope at N = 2, 3 moves when the values are scaled by 10, P does not.
    alpha = torch.tensor([2.0**-k for k in range(8)], dtype=torch.float64)
    alpha = alpha / alpha.sum()
    values = torch.eye(8, dtype=torch.float64)
    grid = [2, 3]
    base = lower_envelopes(selection_margins(alpha, values, grid), 8, kappa=10.0, variant="paper")[0]
    scaled = lower_envelopes(selection_margins(alpha, 10 * values, grid), 8, kappa=10.0, variant="paper")[0]
    assert (scaled - base).abs().min() > 0.05, (base, scaled)
    torch.testing.assert_close(selection_metrics(alpha, 10 * values, grid).precision, selection_metrics(alpha, values, grid).precision)
