"""The four-phase attention-profile fit recovers Assumption 3's parameters from exact and noisy profiles."""

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tl_geometry import GeometryError
from tl_geometry.diagnostics.profile_fit import ProfileFit, region_cosine_sums, fit_attention_profile, four_phase_profile
from tl_geometry.theory.synthetic import AttentionProfile, attention_profile


def paper_profile(p_sink, p_base, eta, omega, t1, t2, n_pos):
    """Assumption 3, case by case, one position at a time (float64)."""
    out = []
    for i in range(n_pos):
        if i == 0:
            out.append(p_sink)
        elif i <= t1:
            out.append(p_base)
        elif i <= t2:
            out.append(p_base * (1 + eta * math.cos(omega * i)))
        else:
            out.append(p_base * math.exp(eta * (i - t2)))
    return torch.tensor(out, dtype=torch.float64)


CASES = [
    # p_sink, p_base, eta, omega, t1, t2, n_pos
    (0.6, 1e-4, 0.05, 0.0, 300, 300, 1024),  # T1 = T2: no oscillation
    (0.3, 2e-4, 0.2, 0.0, 50, 50, 128),
    (0.5, 1e-4, 0.3, 2 * math.pi / 40, 100, 900, 1024),  # all four phases
    (0.5, 1e-3, 0.5, 2 * math.pi / 7.3, 20, 100, 128),  # off the frequency grid
    (0.9, 1e-5, 0.1, 0.0, 1, 1, 256),  # recency from position 2
]


def test_recency_from_the_first_position_is_reported_as_a_one_token_plateau():
    """T1 = T2 = 0 and T1 = T2 = 1 give the same curve (p_base moves to alpha_1); the fit reports the latter."""
    fit = fit_attention_profile(paper_profile(0.9, 1e-5, 0.1, 0.0, 0, 0, 256))
    assert (fit.t1.item(), fit.t2.item()) == (1, 1)
    assert math.isclose(fit.p_base.item(), 1e-5 * math.exp(0.1), rel_tol=1e-4) and math.isclose(fit.eta.item(), 0.1, rel_tol=1e-4)


def test_the_model_evaluates_the_paper_formula():
    for p_sink, p_base, eta, omega, t1, t2, n_pos in CASES:
        got = four_phase_profile(*(torch.tensor(float(x), dtype=torch.float64) for x in (p_sink, p_base, eta, omega, t1, t2)), n_pos)
        torch.testing.assert_close(got, paper_profile(p_sink, p_base, eta, omega, t1, t2, n_pos))


@pytest.mark.parametrize("case", CASES)
def test_exact_profiles_are_recovered(case):
    p_sink, p_base, eta, omega, t1, t2, n_pos = case
    fit = fit_attention_profile(paper_profile(*case).float())
    assert math.isclose(fit.p_sink.item(), p_sink, rel_tol=1e-6)
    assert math.isclose(fit.p_base.item(), p_base, rel_tol=1e-3)
    assert math.isclose(fit.eta.item(), eta, rel_tol=1e-3)
    assert (fit.t1.item(), fit.t2.item()) == (t1, t2)
    assert fit.has_oscillation.item() == (t2 > t1) and fit.has_plateau.item() == (t1 >= 1)
    assert fit.has_recency.item() == 1.0
    if t2 > t1:
        assert math.isclose(fit.omega.item(), omega, rel_tol=2e-3)
    else:
        assert fit.omega.isnan()
    assert fit.error.item() < 1e-3


def test_plateau_only_and_oscillation_without_recency():
    flat = paper_profile(0.5, 1e-3, 0.0, 0.0, 99, 99, 100)
    fit = fit_attention_profile(flat)
    assert fit.eta.isnan() and fit.omega.isnan() and fit.t1.item() == 99 == fit.t2.item()
    assert fit.has_recency.item() == 0 and fit.error.item() < 1e-6
    wave = paper_profile(0.5, 1e-3, 0.4, 2 * math.pi / 16, 30, 199, 200)
    fit = fit_attention_profile(wave)
    assert (fit.t1.item(), fit.t2.item(), fit.has_recency.item()) == (30, 199, 0)
    assert math.isclose(fit.eta.item(), 0.4, rel_tol=1e-3) and math.isclose(fit.omega.item(), 2 * math.pi / 16, rel_tol=2e-3)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_noisy_profiles_are_recovered_within_tolerance(seed):
    """Multiplicative log-normal noise of 5%: breakpoints within a few positions, rates within 10%."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.stack([paper_profile(0.5, 1e-4, 0.3, 2 * math.pi / 40, 100, 900, 1024),
                        paper_profile(0.5, 1e-4, 0.05, 0.0, 700, 700, 1024)])
    noisy = rows * torch.exp(0.05 * torch.randn(rows.shape, generator=gen, dtype=torch.float64))
    fit = fit_attention_profile(noisy)
    assert fit.has_oscillation.tolist() == [1.0, 0.0]
    assert (fit.t2 - torch.tensor([900.0, 700.0])).abs().max() <= 3
    assert (fit.t1[0] - 100).abs() <= 10
    assert ((fit.eta - torch.tensor([0.3, 0.05])).abs() / torch.tensor([0.3, 0.05])).max() < 0.1
    assert abs(fit.omega[0].item() - 2 * math.pi / 40) / (2 * math.pi / 40) < 0.02
    assert ((fit.p_base / 1e-4 - 1).abs() < 0.05).all()
    assert ((fit.error - 0.05).abs() < 0.01).all()  # the residual is the noise


def test_error_is_the_log_rmse_of_the_fitted_profile():
    gen = torch.Generator().manual_seed(5)
    alpha = torch.softmax(2 * torch.randn(6, 80, generator=gen, dtype=torch.float64), -1)
    fit = fit_attention_profile(alpha)
    model = fit.evaluate(80)
    rmse = (torch.log(alpha[:, 1:]) - torch.log(model[:, 1:])).pow(2).mean(-1).sqrt()
    torch.testing.assert_close(fit.error, rmse.float(), rtol=1e-4, atol=1e-5)


def test_rows_of_different_lengths_and_short_rows():
    long = paper_profile(0.5, 1e-3, 0.2, 0.0, 40, 40, 64)
    short = torch.full((64,), math.nan, dtype=torch.float64)
    short[:30] = paper_profile(0.5, 1e-3, 0.2, 0.0, 20, 20, 30)
    tiny = torch.full((64,), math.nan, dtype=torch.float64)
    tiny[:3] = torch.tensor([0.5, 0.25, 0.25])
    fit = fit_attention_profile(torch.stack([long, short, tiny]).reshape(3, 1, 64))
    assert fit.t2.shape == (3, 1)
    assert fit.t2[:2, 0].tolist() == [40.0, 20.0]
    assert all(getattr(fit, name)[2].isnan().all() for name in ("p_base", "eta", "t1", "error"))


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10_000), st.floats(1e-3, 1e3))
@example(seed=966, scale=0.5)  # a tie T1 = 26 / 27 at omega = pi / 2, once decided by rounding noise
def test_rescaling_the_weights_rescales_only_the_levels(seed, scale):
    gen = torch.Generator().manual_seed(seed)
    alpha = torch.softmax(3 * torch.randn(2, 40, generator=gen, dtype=torch.float64), -1)
    a, b = fit_attention_profile(alpha), fit_attention_profile(alpha * scale)
    for name in ("t1", "t2", "has_plateau", "has_oscillation", "has_recency"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), equal_nan=True)
    for name in ("omega", "eta"):
        torch.testing.assert_close(getattr(b, name), getattr(a, name), rtol=1e-4, atol=1e-6, equal_nan=True)
    torch.testing.assert_close(b.p_sink, a.p_sink * scale, rtol=1e-6, atol=0)
    torch.testing.assert_close(b.p_base, a.p_base * scale, rtol=1e-4, atol=0)
    torch.testing.assert_close(b.error, a.error, rtol=1e-3, atol=1e-5)
    assert (a.error >= 0).all() and (a.t1 <= a.t2).all() and (a.t2 <= 39).all()


def right_padded(row, width):
    """The row followed by NaN up to ``width`` positions."""
    out = torch.full((width,), math.nan, dtype=row.dtype)
    out[: len(row)] = row
    return out


def assert_same_fit(got: ProfileFit, want: ProfileFit):
    """Every field bit-identical (NaN where NaN)."""
    for name, value in want.as_fields().items():
        torch.testing.assert_close(getattr(got, name), value, rtol=0, atol=0, equal_nan=True, msg=name)


@st.composite
def attention_rows(draw):
    """An attention row over 5..200 positions: a softmax of random logits, or a planted four-phase profile with noise."""
    n = draw(st.integers(5, 200))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    if draw(st.booleans()):
        return torch.softmax(draw(st.floats(0.1, 5.0)) * torch.randn(n, generator=gen, dtype=torch.float64), -1)
    t1 = draw(st.integers(0, n - 1))
    t2 = draw(st.integers(t1, n - 1))
    planted = AttentionProfile(p_sink=0.5, p_base=1e-3, eta=draw(st.floats(0.0, 0.5)),
                               omega=2 * math.pi / draw(st.floats(2.5, 60.0)), t1=t1, t2=t2)
    noise = draw(st.sampled_from([0.0, 0.01, 0.2]))
    return attention_profile(planted, n) * torch.exp(noise * torch.randn(n, generator=gen, dtype=torch.float64))


@settings(max_examples=20, deadline=None)
@given(st.lists(attention_rows(), min_size=2, max_size=3), st.integers(0, 64))
def test_a_rows_fit_depends_only_on_its_own_values(rows, extra):
    """Alone, right-padded with NaN to any width, or in a batch with rows of other lengths: the same fit."""
    width = max(len(row) for row in rows) + extra
    together = fit_attention_profile(torch.stack([right_padded(row, width) for row in rows]))
    for k, row in enumerate(rows):
        alone = fit_attention_profile(row)
        assert_same_fit(fit_attention_profile(right_padded(row, width)), alone)
        assert_same_fit(ProfileFit(**{name: value[k] for name, value in together.as_fields().items()}), alone)


def test_a_batch_of_rows_of_different_lengths_fits_each_row_as_alone():
    """The user's case: texts of different lengths analysed in one batch of 4 or in 4 batches of 1."""
    gen = torch.Generator().manual_seed(11)
    rows = [paper_profile(0.5, 1e-4, 0.3, 2 * math.pi / 40, 100, 900, 1024),
            paper_profile(0.6, 2e-4, 0.05, 0.0, 500, 500, 700),
            paper_profile(0.5, 1e-3, 0.4, 2 * math.pi / 7.3, 20, 250, 300),
            torch.softmax(2 * torch.randn(90, generator=gen, dtype=torch.float64), -1)]
    rows = [row * torch.exp(0.05 * torch.randn(len(row), generator=gen, dtype=torch.float64)) for row in rows]
    batch = torch.stack([right_padded(row, 1024) for row in rows]).reshape(2, 2, 1024)
    together = fit_attention_profile(batch)
    for k, row in enumerate(rows):
        alone = fit_attention_profile(row[None])
        assert_same_fit(ProfileFit(**{name: value.reshape(4)[k : k + 1] for name, value in together.as_fields().items()}), alone)
    assert (together.t2.reshape(4)[:3] - torch.tensor([900.0, 500.0, 250.0])).abs().max() <= 3
    assert together.has_oscillation.reshape(4)[:3].tolist() == [1.0, 0.0, 1.0]


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(5, 300), st.integers(1, 4), st.booleans())
def test_blocked_cosine_sums_equal_the_direct_sums(seed, n_pos, n_freq, shared_region):
    """The fit's sums of c, c^2 and y*c over (lo, hi], c = cos(omega i), one position at a time in float64."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(2, n_pos, generator=g, dtype=torch.float64)
    omega = torch.rand(2, n_freq, generator=g, dtype=torch.float64) * math.pi
    hi = torch.randint(0, n_pos, (2,), generator=g)
    lo = (torch.rand(2, 1 if shared_region else n_freq, generator=g) * (hi.unsqueeze(-1) + 1)).long()
    c, cc, yc = region_cosine_sums(y, omega, lo, hi)
    for r in range(2):
        for w in range(n_freq):
            start = int(lo[r, 0 if shared_region else w])
            cos = [math.cos(float(omega[r, w]) * i) for i in range(start + 1, int(hi[r]) + 1)]
            ys = y[r, start + 1 : int(hi[r]) + 1].tolist()
            assert float(c[r, w]) == pytest.approx(sum(cos), abs=1e-9)
            assert float(cc[r, w]) == pytest.approx(sum(x * x for x in cos), abs=1e-9)
            assert float(yc[r, w]) == pytest.approx(sum(a * b for a, b in zip(ys, cos)), abs=1e-9)


def test_bad_input_is_refused():
    with pytest.raises(GeometryError, match="alpha: NaN inside a row"):
        fit_attention_profile(torch.tensor([0.5, math.nan, 0.2, 0.3]))
    with pytest.raises(GeometryError, match="alpha: negative attention weights"):
        fit_attention_profile(torch.tensor([0.5, -0.1, 0.2, 0.3, 0.1]))
    with pytest.raises(GeometryError, match="ProfileFit.eta: expected a tensor of shape \\[2\\]"):
        ProfileFit(*(torch.zeros(2),) * 2, torch.zeros(3), *(torch.zeros(2),) * 7)
