"""Does the data show the roles at all? Gaussian mixtures over the heads' role features, compared by BIC.

The paper posits three roles (its "regimes"). A mixture of k Gaussians
(full covariance) fitted to the per-head features for k = 1..6, each by EM
from several k-means++ starts, and the Bayesian information criterion
BIC = -2 log L + p ln(n) (p free parameters, n heads) says how many groups the
data support: the smallest BIC wins, and a difference below 10 is weak
evidence. The features are standardised first (each to mean 0, variance 1).
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from tl_geometry.diagnostics.role_features import (
    ALIGN_SELF_EXCESS,
    SHARE_SELF,
    SHARE_SINK,
    SHIFT_SELF_RAW,
    SHIFT_SINK_RAW,
    TOP_REST_SHARE,
)
from tl_geometry.errors import GeometryError

# The per-head features the mixture reads: composition (two shares; the third is 1 minus them), concentration
# of the rest, alignment with v_L over chance and both raw shifts (what the rules read).
MIXTURE_FEATURES = tuple(
    spec.name for spec in (SHARE_SINK, SHARE_SELF, TOP_REST_SHARE, ALIGN_SELF_EXCESS, SHIFT_SELF_RAW, SHIFT_SINK_RAW)
)
_REG = 1e-4  # added to every covariance's diagonal (standardised units): no component collapses onto one head


@dataclass(frozen=True)
class MixtureFit:
    """One mixture: k components, its log-likelihood, parameter count and BIC, and each head's component."""

    k: int
    log_likelihood: float
    n_parameters: int
    bic: float
    assignment: Tensor


def _log_densities(x: Tensor, means: Tensor, covs: Tensor) -> Tensor:
    """log N(x_i | mu_j, Sigma_j), ``[n, k]``."""
    d = x.shape[1]
    chol = torch.linalg.cholesky(covs)  # [k, d, d]
    diff = x.unsqueeze(0) - means.unsqueeze(1)  # [k, n, d]
    solved = torch.linalg.solve_triangular(chol, diff.transpose(1, 2), upper=False)  # [k, d, n]
    maha = (solved**2).sum(1)  # [k, n]
    log_det = 2 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(-1)  # [k]
    return (-0.5 * (maha + log_det.unsqueeze(1) + d * math.log(2 * math.pi))).T


def _kmeans_pp(x: Tensor, k: int, gen: torch.Generator) -> Tensor:
    centres = [x[int(torch.randint(len(x), (1,), generator=gen))]]
    for _ in range(1, k):
        dist = torch.cdist(x, torch.stack(centres)).amin(1) ** 2
        centres.append(x[int(torch.multinomial(dist / dist.sum(), 1, generator=gen))])
    return torch.stack(centres)


def _fit(x: Tensor, k: int, gen: torch.Generator, iterations: int) -> tuple[float, Tensor]:
    n, d = x.shape
    eye = torch.eye(d, dtype=x.dtype)
    means = _kmeans_pp(x, k, gen)
    covs = torch.stack([torch.cov(x.T).reshape(d, d) + _REG * eye] * k)
    weights = torch.full((k,), 1.0 / k, dtype=x.dtype)
    previous = -math.inf
    for _ in range(iterations):
        log_p = _log_densities(x, means, covs) + weights.log()
        total = torch.logsumexp(log_p, 1)
        resp = (log_p - total.unsqueeze(1)).exp()  # [n, k]
        mass = resp.sum(0) + 1e-12
        weights = mass / n
        means = (resp.T @ x) / mass.unsqueeze(1)
        diff = x.unsqueeze(0) - means.unsqueeze(1)  # [k, n, d]
        covs = torch.einsum("kn,knd,kne->kde", resp.T, diff, diff) / mass.view(-1, 1, 1) + _REG * eye
        log_likelihood = float(total.sum())
        if log_likelihood - previous < 1e-8 * abs(log_likelihood):
            break
        previous = log_likelihood
    log_p = _log_densities(x, means, covs) + weights.log()
    return float(torch.logsumexp(log_p, 1).sum()), log_p.argmax(1)


def mixture_bic(
    features: Float[Tensor, "head feature"], ks: Sequence[int] = range(1, 7), *, n_init: int = 8, seed: int = 0,
    iterations: int = 300,
) -> list[MixtureFit]:
    """Gaussian mixtures with k components for each k in ``ks``, the best of ``n_init`` EM runs each.

    Args:
        features: one row per head (rows with a NaN are left out), standardised here.
        ks: the component counts to compare.
        n_init: EM starts per k (k-means++ seeds).
        seed: the starts' seed.
        iterations: at most this many EM steps per start.

    Returns:
        One MixtureFit per k, in the order of ``ks``; the smallest ``bic`` is the best supported.
    """
    x = features.double()
    x = x[~x.isnan().any(1)]
    n, d = x.shape
    if n < 2 * max(ks):
        raise GeometryError(f"features: {n} heads with defined features are too few for {max(ks)} components")
    x = (x - x.mean(0)) / x.std(0).clamp(min=1e-12)
    fits = []
    for k in ks:
        gen = torch.Generator().manual_seed(seed + 1000 * k)
        best = max((_fit(x, k, gen, iterations) for _ in range(n_init)), key=lambda fit: fit[0])
        p = k * d + k * d * (d + 1) // 2 + (k - 1)
        fits.append(MixtureFit(k, best[0], p, -2 * best[0] + p * math.log(n), best[1]))
    return fits


def role_feature_matrix(features: dict[str, Tensor]) -> Float[Tensor, "head feature"]:
    """The ``MIXTURE_FEATURES`` of every head (a HeadRoles's ``features``), one row per head."""
    return torch.stack([features[name].double().flatten() for name in MIXTURE_FEATURES], dim=1)
