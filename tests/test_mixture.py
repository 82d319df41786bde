"""The mixture's BIC finds the number of groups that synthetic heads were drawn from."""

import math

import pytest
import torch

from tl_geometry.analysis.mixture import mixture_bic
from tl_geometry.errors import GeometryError


def _groups(k: int, n_per: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    centres = 6 * torch.randn(k, 4, generator=gen, dtype=torch.float64)
    return torch.cat([c + torch.randn(n_per, 4, generator=gen, dtype=torch.float64) for c in centres])


@pytest.mark.parametrize("k", [1, 2, 3])
def test_bic_picks_the_number_of_groups(k):
    fits = mixture_bic(_groups(k, 80, seed=k), ks=range(1, 5), n_init=4)
    assert min(fits, key=lambda f: f.bic).k == k
    assert [f.k for f in fits] == [1, 2, 3, 4]


def test_likelihood_of_one_component_is_the_gaussian_fit():
    x = _groups(1, 200, seed=7)
    fit = mixture_bic(x, ks=[1], n_init=1)[0]
    z = (x - x.mean(0)) / x.std(0)
    cov = torch.cov(z.T) * (len(z) - 1) / len(z)  # the maximum-likelihood covariance
    expected = torch.distributions.MultivariateNormal(z.mean(0), cov + 1e-4 * torch.eye(4, dtype=torch.float64)).log_prob(z).sum()
    assert fit.log_likelihood == pytest.approx(float(expected), rel=1e-6)
    assert fit.n_parameters == 4 + 10 and fit.bic == pytest.approx(-2 * fit.log_likelihood + 14 * math.log(200))


def test_rows_with_nan_are_left_out_and_too_few_heads_refused():
    x = _groups(2, 40, seed=1)
    x[0, 0] = math.nan
    assert len(mixture_bic(x, ks=[1, 2], n_init=2)[0].assignment) == 79
    with pytest.raises(GeometryError, match="too few for 6 components"):
        mixture_bic(x[:10])
