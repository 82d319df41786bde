"""The simulator has the statistics of Assumptions 1-3; the 2-D toy of Figure 1 follows the definitions."""

import math

import pytest
import torch

from tests.reference import reference_row
from tl_geometry.errors import GeometryError
from tl_geometry.theory.synthetic import AttentionProfile, SimulationSettings, attention_profile, simulate, toy_2d

SETTINGS = SimulationSettings(d_head=64, n_keys=96, c=2.5, lam=0.15, beta=0.4, rho0=0.3)


@pytest.fixture(scope="module")
def rows():
    return simulate(SETTINGS, 100, seed=3)


def test_norms_are_c_and_lambda_c(rows):
    norms = torch.linalg.vector_norm(rows.values, dim=-1)
    torch.testing.assert_close(norms[:, 1:], torch.full_like(norms[:, 1:], 2.5))
    torch.testing.assert_close(norms[:, 0], torch.full_like(norms[:, 0], 2.5 * 0.15))


def test_sink_cosine_is_rho0(rows):
    unit = rows.values / rows.values.norm(dim=-1, keepdim=True)
    cos0 = torch.einsum("bd,bkd->bk", unit[:, 0], unit[:, 1:])
    torch.testing.assert_close(cos0, torch.full_like(cos0, 0.3))


def test_cosine_decay_recovers_beta(rows):
    # Mean cosine at each lag, floor rho0^2 removed (see the module docstring), log-linear fit on lags 1..6.
    unit = rows.values[:, 1:] / rows.values[:, 1:].norm(dim=-1, keepdim=True)
    gram = torch.einsum("bid,bjd->bij", unit, unit)
    lags = torch.arange(1, 7)
    mean_cos = torch.stack([torch.diagonal(gram, offset=int(k), dim1=1, dim2=2).mean() for k in lags])
    decay = (mean_cos - 0.09) / (1 - 0.09)
    slope = torch.linalg.lstsq(
        torch.stack([lags.double(), torch.ones(6, dtype=torch.float64)], -1), decay.log().unsqueeze(-1)
    ).solution[0, 0]
    assert -float(slope) == pytest.approx(0.4, abs=0.04)  # within 10% of the true beta


def test_profile_has_four_phases():
    p = AttentionProfile(p_sink=0.5, p_base=0.01, eta=0.3, omega=0.7, t1=10, t2=30)
    alpha = attention_profile(p, 50)
    assert float(alpha.sum()) == pytest.approx(1.0)
    base = alpha[1]
    assert torch.allclose(alpha[1:11], base.expand(10))  # plateau
    i = torch.arange(11, 31, dtype=torch.float64)
    torch.testing.assert_close(alpha[11:31] / base, 1 + 0.3 * torch.cos(0.7 * i))  # oscillation
    torch.testing.assert_close(alpha[31:] / base, torch.exp(0.3 * torch.arange(1, 20, dtype=torch.float64)))  # recency
    assert float(alpha[0] / base) == pytest.approx(50.0)  # sink ratio p_sink / p_base kept


def test_rows_are_seeded_and_share_the_profile():
    a, b = simulate(SETTINGS, 3, seed=7), simulate(SETTINGS, 3, seed=7)
    assert torch.equal(a.values, b.values) and not torch.equal(a.values, simulate(SETTINGS, 3, seed=8).values)
    torch.testing.assert_close(a.alpha, attention_profile(SETTINGS.profile, 96).expand(3, -1))


def test_bad_settings_name_the_field():
    with pytest.raises(GeometryError, match=r"SimulationSettings.rho0: expected in \(-1, 1\), got 1.5"):
        SimulationSettings(rho0=1.5)
    with pytest.raises(GeometryError, match=r"AttentionProfile.t2: expected >= t1 = 10, got 5"):
        AttentionProfile(t1=10, t2=5)
    with pytest.raises(GeometryError, match="n_samples: expected at least 1 sample, got 0"):
        simulate(SETTINGS, 0)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_toy_2d_agrees_with_the_definitions(seed):
    toy = toy_2d(n_points=8, n_selected=3, seed=seed)
    assert int(toy.selected.sum()) == 3
    torch.testing.assert_close(toy.points.norm(dim=-1), torch.ones(8, dtype=torch.float64))
    expected = reference_row(toy.weights, toy.points, torch.ones(8, dtype=torch.bool), 3)
    for name in ("precision", "recall", "r_min", "r_max"):
        assert getattr(toy, name) == pytest.approx(expected[name]), name
    # The picture's distances draw the same balls.
    assert toy.r_max == pytest.approx(float(toy.distances[toy.selected].max()))
    assert toy.r_min == pytest.approx(float(toy.distances[~toy.selected].min()))
    assert math.isclose(float(toy.s.norm()), float((toy.weights.unsqueeze(-1) * toy.points)[toy.selected].sum(0).norm()))


def test_toy_2d_rejects_bad_sizes():
    with pytest.raises(GeometryError, match=r"n_selected: expected 1 <= N <= n_points - 1 = 7, got 8"):
        toy_2d(8, 8)
