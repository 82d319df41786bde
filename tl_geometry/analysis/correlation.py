"""Pearson and Spearman correlations along the last axis, with weights (a pair counted w times) and NaN pairs left out.

Spearman is the Pearson correlation of average ranks (ties get the mean of
the ranks they span). Fewer than 3 pairs, or a constant variable, give NaN.
Used by the sink correlation (Figure 6) and by geometry against dNLL; the
sink correlation is also corrected for the noise of the heads' means
(`disattenuated_correlation`, used by the claims and by
`tl_geometry.analysis.sink`).
"""

import math
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor


def weighted_pearson(
    x: Float[Tensor, "*b pair"], y: Float[Tensor, "*b pair"], w: Float[Tensor, "*b pair"]
) -> Float[Tensor, "*b"]:
    total = w.sum(-1, keepdim=True)
    mx = (w * x).sum(-1, keepdim=True) / total
    my = (w * y).sum(-1, keepdim=True) / total
    dx, dy = x - mx, y - my
    cov, vx, vy = (w * dx * dy).sum(-1), (w * dx * dx).sum(-1), (w * dy * dy).sum(-1)
    r = cov / (vx * vy).sqrt()
    # Fewer than 3 distinct pairs or a constant variable: no correlation to speak of.
    undefined = ((w > 0).sum(-1) < 3) | (vx <= 1e-12 * total.squeeze(-1) * (mx.squeeze(-1) ** 2 + 1)) | (vy <= 1e-24)
    return r.masked_fill(undefined, math.nan).clamp(-1, 1)


def weighted_ranks(x: Float[Tensor, "*b pair"], w: Float[Tensor, "*b pair"]) -> Float[Tensor, "*b pair"]:
    """Average ranks (1-based) of x in the sample where pair i appears w_i times; entries with w = 0 do not count."""
    key = x.masked_fill(w <= 0, math.inf)
    ordered, order = torch.sort(key, dim=-1)
    cum = torch.cat([torch.zeros_like(w[..., :1]), w.gather(-1, order).cumsum(-1)], dim=-1)
    below = cum.gather(-1, torch.searchsorted(ordered, key.contiguous(), right=False))
    upto = cum.gather(-1, torch.searchsorted(ordered, key.contiguous(), right=True))
    return below + (upto - below + 1) / 2


def correlations(
    x: Float[Tensor, "*b pair"], y: Float[Tensor, "*b pair"], w: Float[Tensor, "*b pair"]
) -> tuple[Float[Tensor, "*b"], Float[Tensor, "*b"]]:
    w = w * ~(x.isnan() | y.isnan())
    x, y = torch.nan_to_num(x), torch.nan_to_num(y)
    return weighted_pearson(x, y, w), weighted_pearson(weighted_ranks(x, w), weighted_ranks(y, w), w)


def spearman(x: Float[Tensor, "*batch unit"], y: Float[Tensor, "*batch unit"]) -> Float[Tensor, "*batch"]:
    """Spearman rank correlation along the last axis, every pair counted once (NaN pairs left out).

    >>> round(spearman(torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([10.0, 20.0, 40.0, 30.0])).item(), 6)
    0.8
    """
    x, y = torch.broadcast_tensors(x.double(), y.double())
    return correlations(x, y, torch.ones_like(x))[1]


def partial_pearson(
    x: Float[Tensor, "*unit"], y: Float[Tensor, "*unit"], z: Float[Tensor, "*unit"]
) -> float:
    """Pearson correlation of x and y with z partialled out: of their residuals after a least-squares line on z.

    Every element is a unit (e.g. ``[layer, head]`` per head); units where any
    of the three is NaN are left out; NaN with fewer than 4 units.

    >>> z = torch.arange(10.0)
    >>> round(partial_pearson(z + torch.tensor([1.0, -1] * 5), 2 * z + torch.tensor([1.0, -1] * 5), z), 6)
    1.0
    """
    x, y, z = (t.double().flatten() for t in (x, y, z))
    keep = ~(x.isnan() | y.isnan() | z.isnan())
    x, y, z = x[keep], y[keep], z[keep]
    if len(x) < 4:
        return math.nan
    design = torch.stack([torch.ones_like(z), z], dim=1)
    residuals = [v - design @ torch.linalg.lstsq(design, v.unsqueeze(1)).solution.squeeze(1) for v in (x, y)]
    return float(weighted_pearson(residuals[0], residuals[1], torch.ones_like(x)))


def disattenuated_pearson(
    x: Float[Tensor, "*b unit"],
    y: Float[Tensor, "*b unit"],
    noise_x: float | Float[Tensor, "*c"],
    noise_y: float | Float[Tensor, "*c"],
    noise_xy: float | Float[Tensor, "*c"],
) -> Float[Tensor, "*b"]:
    """Pearson correlation of the units' true values, from estimates ``x``, ``y`` with noise (Spearman's correction).

    Each unit's ``x`` and ``y`` are estimates (e.g. a head's means over
    documents) whose errors have variances averaging ``noise_x`` and
    ``noise_y`` over the units and covariances averaging ``noise_xy`` (each
    broadcast against the leading axes ``*b``). The
    sample variances over the units (divisor units - 1) exceed the true
    values' by the mean error variance, their covariance by the mean error
    covariance; both are subtracted before the correlation is formed. NaN
    where a corrected variance is not positive (the units' spread is within
    their noise) or fewer than 3 units; clamped to [-1, 1]. Units where x or
    y is NaN are left out.

    >>> x = torch.tensor([0.0, 1, 2, 3, 4]); y = torch.tensor([1.0, 0, 3, 2, 4])
    >>> round(float(disattenuated_pearson(x, y, 0.0, 0.0, 0.0)), 6)  # no noise: Pearson's r
    0.8
    >>> round(float(disattenuated_pearson(x, y, 0.5, 0.5, 0.0)), 6)  # variances 2.5 - 0.5: r / 0.8
    1.0
    """
    x, y = torch.broadcast_tensors(x.double(), y.double())
    w = (~(x.isnan() | y.isnan())).double()
    x, y = x.nan_to_num(), y.nan_to_num()
    count = w.sum(-1, keepdim=True)
    dx = x - (w * x).sum(-1, keepdim=True) / count
    dy = y - (w * y).sum(-1, keepdim=True) / count
    dof = count.squeeze(-1) - 1
    vx = (w * dx * dx).sum(-1) / dof - torch.as_tensor(noise_x, dtype=torch.float64)
    vy = (w * dy * dy).sum(-1) / dof - torch.as_tensor(noise_y, dtype=torch.float64)
    cov = (w * dx * dy).sum(-1) / dof - torch.as_tensor(noise_xy, dtype=torch.float64)
    r = cov / (vx.clamp_min(0) * vy.clamp_min(0)).sqrt()
    return r.masked_fill((vx <= 0) | (vy <= 0) | (dof < 2), math.nan).clamp(-1, 1)


def error_covariance(
    rx: Float[Tensor, "replicate *b unit"], ry: Float[Tensor, "replicate *b unit"]
) -> Float[Tensor, "*b"]:
    """Mean over units of the covariance over bootstrap replicates of each unit's x and y (replicates where
    either is NaN left out): the mean covariance of the units' estimation errors, as the bootstrap sees it
    (the plug-in spread: times n / (n - 1) for the unbiased one of n documents).

    >>> rx = torch.tensor([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]])  # two units, variance 4 each over replicates
    >>> float(error_covariance(rx, rx)), float(error_covariance(rx, -rx))
    (4.0, -4.0)
    """
    rx, ry = rx.double(), ry.double()
    w = (~(rx.isnan() | ry.isnan())).double()
    rx, ry = rx.nan_to_num(), ry.nan_to_num()
    count = w.sum(0)
    dx = rx - (w * rx).sum(0) / count
    dy = ry - (w * ry).sum(0) / count
    per_unit = ((w * dx * dy).sum(0) / (count - 1)).masked_fill(count < 2, math.nan)
    return per_unit.nanmean(-1)


def shrunk_replicates(
    replicates: Float[Tensor, "replicate *b unit"], means: Float[Tensor, "*b unit"], noise: float | Float[Tensor, "*b"]
) -> Float[Tensor, "replicate *b unit"]:
    """The replicates' deviations from the units' means, added to those means shrunk towards their average by
    sqrt(1 - noise / spread) (spread: their variance over the units, divisor units - 1): a bootstrap world whose
    units spread as much as the true values are estimated to, so that a disattenuated statistic amplifies the
    replicates' noise as it amplifies the real one. Its correlations are the means' (an affine map per field).

    >>> means = torch.tensor([0.0, 2.0]); reps = torch.tensor([[1.0, 2.0]])  # spread 2, noise 1.5: shrink by 1/2
    >>> shrunk_replicates(reps, means, 1.5).tolist()
    [[1.5, 1.5]]
    """
    defined = ~means.isnan()
    count = defined.sum(-1, keepdim=True)
    centre = means.nan_to_num().sum(-1, keepdim=True) / count
    spread = ((means - centre).nan_to_num() ** 2).sum(-1, keepdim=True) / (count - 1)
    noise = torch.as_tensor(noise, dtype=torch.float64).unsqueeze(-1)
    shrink = torch.where(spread > 0, (1 - noise / spread).clamp_min(0).sqrt(), 1.0)
    return centre + shrink * (means - centre) + (replicates - means)


def fisher_z(r: float | Tensor) -> Tensor:
    """Fisher's z = atanh(r) in float64, with r held inside (-1, 1) so that a correlation of +-1 stays finite."""
    return torch.atanh(torch.as_tensor(r, dtype=torch.float64).clamp(-1 + 1e-12, 1 - 1e-12))


def replicate_z(replicates: Float[Tensor, "replicate *b"]) -> Float[Tensor, "replicate *b"]:
    """Fisher's z of correlation replicates, where a replicate at +-1 (a disattenuation that overshot) counts as
    the most extreme replicate inside (-1, 1) on its side: its own z is unbounded, and an interval reflecting
    that tail (the basic interval) would reach -1 however close to 1 every replicate is. NaN stays NaN.

    >>> z = replicate_z(torch.tensor([0.5, 0.9, 1.0]))  # the 1.0 counts as the 0.9
    >>> round(float(z[0]), 4), bool(z[2] == z[1])
    (0.5493, True)
    """
    r = replicates.double()
    z = fisher_z(r)
    inside = r.abs() < 1
    top = torch.where(inside, z, -math.inf).amax(0)
    bottom = torch.where(inside, z, math.inf).amin(0)
    z = torch.where((r >= 1) & top.isfinite(), top, z)
    return torch.where((r <= -1) & bottom.isfinite(), bottom, z)


@dataclass(frozen=True)
class Disattenuated:
    """A disattenuated correlation and its bootstrap replicates (`disattenuated_correlation`)."""

    value: Float[Tensor, "*b"]
    replicates: Float[Tensor, "replicate *b"]
    noise: tuple[Tensor, Tensor, Tensor]  # the errors' mean variances of x and y and their covariance, [*b] each


def disattenuated_correlation(
    x: Float[Tensor, "*b unit"],
    y: Float[Tensor, "*b unit"],
    rx: Float[Tensor, "replicate *b unit"],
    ry: Float[Tensor, "replicate *b unit"],
    n_documents: int,
) -> Disattenuated:
    """Pearson correlation of the units' true means from their means ``x``, ``y`` over ``n_documents``
    documents and the bootstrap replicates of those means: the errors' (co)variances are the replicates'
    (`error_covariance`) times n / (n - 1), and each replicate is corrected the same way in a bootstrap world
    as noisy as the real one (`shrunk_replicates`). Its replicates scatter around the uncorrected correlation
    (the bootstrap world's truth): an interval pivots on it (`fisher_z`)."""
    unbiased = n_documents / (n_documents - 1)
    noise = (unbiased * error_covariance(rx, rx), unbiased * error_covariance(ry, ry),
             unbiased * error_covariance(rx, ry))
    value = disattenuated_pearson(x, y, *noise)
    replicates = disattenuated_pearson(shrunk_replicates(rx, x, noise[0]), shrunk_replicates(ry, y, noise[1]), *noise)
    return Disattenuated(value, replicates, noise)
