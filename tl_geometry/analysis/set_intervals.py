"""Set intervals of a statistic of heads judged against a threshold: from every head's own interval, not the count's.

A claim that counts heads past a threshold (a share of heads with CV <= 0.05)
or that reads each head's role (a role is a head past the rules' thresholds)
is a step function of the heads' true values. Where a head's true value lies
within its estimate's noise of the threshold, the statistic's truth is a step
away from wherever the estimate falls, and a bootstrap interval around the
estimate, whose replicates fall on the estimate's side as often as not,
cannot cover it. The set interval judges each head by its own interval
instead:

- a share of heads past a threshold t: head h's estimate x_h with standard
  error s_h gives the interval [x_h - z s_h, x_h + z s_h]. The head is
  *certainly* past t when its whole interval is, *possibly* past t when some
  of it is. If every head's interval holds its true value, every head truly
  past t is possibly past it and every head certainly past it is truly past
  it, so

      #certainly past / H  <=  true share  <=  #possibly past / H

  (`share_past_interval`). Only the heads whose intervals reach t can be
  misjudged, and each only on one side: the interval fails when some head's
  estimate lies more than z s_h beyond its truth, towards the wrong side of
  t. A head far from t (|x_h - t| >> s_h) is certain either way; when every
  head is, the interval is the count itself;
- a statistic of the heads' roles (`extremes_over_roles`): head h possibly has
  a role when at least ``Phi(-z)`` of the bootstrap replicates give it (the
  share past a one-sided z-standard-error margin); the interval is the
  smallest and the largest value of the statistic over every assignment of
  one possible role to each head. It holds the truth whenever every head's
  true role is among its possible ones.

The standard errors are the bootstrap replicates' spread over documents
(`replicate_standard_errors`). The claims join the set interval with their
bootstrap interval where that is wider (`tl_geometry.analysis.claims`); the
per-head z is chosen on simulated studies (docs/claims.md, "Set intervals").
"""

import itertools
import math
from collections.abc import Callable
from statistics import NormalDist
from typing import Literal, get_args

import torch
from jaxtyping import Bool, Float, Real
from torch import Tensor

from tl_geometry.errors import GeometryError

Side = Literal["<=", ">="]
MAX_ASSIGNMENTS = 1 << 14
"""The most role assignments `extremes_over_roles` enumerates; past it, the claim's bounds without enumerating."""
ASSIGNMENT_CHUNK = 1024  # assignments read by the statistic at once


def replicate_standard_errors(
    replicates: Float[Tensor, "replicate layer head_index"], units: int
) -> Float[Tensor, "layer head_index"]:
    """Each head's standard error over documents from its bootstrap replicates: their standard deviation (NaN
    replicates left out) times ``sqrt(units / (units - 1))`` for ``units`` resampled units (documents or groups),
    since the replicates' spread is that of a mean with divisor n, not n - 1. NaN with fewer than two defined
    replicates or one unit.

    >>> replicate_standard_errors(torch.tensor([[[1.0]], [[3.0]]]), units=2)  # sd 1.414, times sqrt(2)
    tensor([[2.]], dtype=torch.float64)
    """
    x = replicates.double()
    defined = ~x.isnan()
    count = defined.sum(0)
    mean = x.nan_to_num().sum(0) / count
    variance = torch.where(defined, (x - mean) ** 2, 0.0).sum(0) / (count - 1)
    factor = math.sqrt(units / (units - 1)) if units > 1 else math.nan
    return (variance.sqrt() * factor).masked_fill(count < 2, math.nan)


def share_past_interval(
    estimates: Float[Tensor, "layer head_index"], standard_errors: Float[Tensor, "layer head_index"],
    threshold: float, z: float, side: str = "<=",
) -> tuple[float, float]:
    """The set interval of the share of heads past ``threshold`` (``x <= threshold`` for ``side="<="``, ``x >=
    threshold`` for ``">="``): the share of heads certainly past it (their whole interval ``x +- z se`` is) and the
    share possibly past it (some of their interval is). Heads with a NaN estimate are left out (the share's
    denominator is the heads with an estimate); a head with a NaN standard error is judged by its estimate alone.

    >>> cv = torch.tensor([[0.02, 0.049, 0.051, 0.09]])
    >>> share_past_interval(cv, torch.full_like(cv, 0.002), 0.05, z=1.0)  # the middle two are within 1 se
    (0.25, 0.75)
    >>> share_past_interval(cv, torch.full_like(cv, 0.002), 0.05, z=0.0)  # z = 0: the count itself
    (0.5, 0.5)
    """
    certainly, possibly = past_threshold(estimates, standard_errors, threshold, z, side)
    return shares_judged(certainly, possibly, ~estimates.isnan())


def past_threshold(
    estimates: Float[Tensor, "layer head_index"], standard_errors: Float[Tensor, "layer head_index"],
    threshold: float, z: float, side: str = "<=",
) -> tuple[Bool[Tensor, "layer head_index"], Bool[Tensor, "layer head_index"]]:
    """Per head, whether it is certainly and whether it is possibly past ``threshold`` (its interval ``x +- z se``
    wholly, or partly, on the ``side`` of it; a NaN standard error: the estimate alone). NaN estimates: neither."""
    if side not in get_args(Side):
        raise GeometryError(f"share_past_interval: side: expected one of {get_args(Side)}, got {side!r}")
    if not z >= 0:
        raise GeometryError(f"share_past_interval: z: expected a number of standard errors >= 0, got {z!r}")
    x, se = estimates.double(), standard_errors.double()
    margin = (threshold - x) if side == "<=" else (x - threshold)  # >= 0: past the threshold (NaN: False below)
    reach = z * se.nan_to_num(0.0)
    return margin >= reach, margin >= -reach


def shares_judged(
    certainly: Bool[Tensor, "layer head_index"], possibly: Bool[Tensor, "layer head_index"],
    defined: Bool[Tensor, "layer head_index"],
) -> tuple[float, float]:
    """The shares of the ``defined`` heads that are certainly and possibly past (NaN, NaN without one)."""
    heads = float(defined.sum())
    if not heads:
        return math.nan, math.nan
    return float((certainly & defined).sum()) / heads, float((possibly & defined).sum()) / heads


def binomial_share_at_least_half(
    share: Float[Tensor, "layer head_index"], count: Real[Tensor, "layer head_index"], z: float
) -> tuple[Bool[Tensor, "layer head_index"], Bool[Tensor, "layer head_index"]]:
    """Per head, whether a share of ``count`` documents (``share * count`` of them having a property, each with
    the same chance p) certainly and possibly has p >= 1/2, judged by the exact one-sided binomial interval
    (Clopper-Pearson's) with tail ``Phi(-z)``: certainly when its lower end is at least 1/2, i.e. ``P(X >= k | p =
    1/2) <= Phi(-z)``; possibly when its upper end is, ``P(X <= k | p = 1/2) >= Phi(-z)``. Exact at every count,
    where a normal interval around k / n changes its verdict with the count (k takes n + 1 values). No document:
    neither.

    >>> shares = torch.tensor([[12 / 16, 9 / 16, 4 / 16]])  # one-sided 5 %: 12 of 16 past 1/2, 9 maybe, 4 not
    >>> certainly, possibly = binomial_share_at_least_half(shares, torch.full_like(shares, 16.0), z=1.645)
    >>> certainly.tolist(), possibly.tolist()
    ([[True, False, False]], [[True, True, False]])
    """
    if not z >= 0:
        raise GeometryError(f"binomial_share_at_least_half: z: expected a number of standard errors >= 0, got {z!r}")
    n = count.double().nan_to_num(0.0).round()
    k = (share.double().nan_to_num(0.0) * n).round()
    largest = int(n.max()) if n.numel() else 0
    j = torch.arange(largest + 1, dtype=torch.float64)
    n_, k_ = n.unsqueeze(-1), k.unsqueeze(-1)
    log_pmf = torch.lgamma(n_ + 1) - torch.lgamma(j + 1) - torch.lgamma((n_ - j).clamp_min(0) + 1) - n_ * math.log(2)
    log_pmf = log_pmf.masked_fill(j > n_, -math.inf)
    at_least_k = torch.where(j >= k_, log_pmf, -math.inf).logsumexp(-1).exp()
    at_most_k = torch.where(j <= k_, log_pmf, -math.inf).logsumexp(-1).exp()
    tail = NormalDist().cdf(-z)
    some = n > 0
    return (at_least_k <= tail) & some, (at_most_k >= tail) & some


def possible_roles(
    probabilities: Float[Tensor, "layer head_index role"], z: float
) -> Bool[Tensor, "layer head_index role"]:
    """Whether each head possibly has each role: at least ``Phi(-z)`` of its replicates give it (the head's most
    probable role always counts). A head without replicates (NaN probabilities) has no possible role here.

    >>> possible_roles(torch.tensor([[[0.97, 0.03, 0.0]]]), z=2.0).tolist()  # Phi(-2) = 0.023
    [[[True, True, False]]]
    """
    if not z >= 0:
        raise GeometryError(f"possible_roles: z: expected a number of standard errors >= 0, got {z!r}")
    p = probabilities.double()
    least = NormalDist().cdf(-z)
    top = p == p.max(-1, keepdim=True).values
    return ((p >= least) & (p > 0)) | top


def extremes_over_roles(
    possible: Bool[Tensor, "layer head_index role"],
    statistic: Callable[[Float[Tensor, "assignment layer head_index role"]], Float[Tensor, " assignment"]],
    outer: Callable[[], tuple[float, float]],
) -> tuple[float, float]:
    """The smallest and the largest of ``statistic`` over every assignment of one possible role to each head.

    ``statistic`` reads a batch of assignments as one-hot memberships ``[assignment, layer, head, role]``. A head
    with no possible role takes none (it is in no role's count). Where the assignments number more than
    ``MAX_ASSIGNMENTS``, ``outer()``: bounds that hold every assignment's value without enumerating them (e.g.
    from `mean_ranges`), as wide as the extremes or wider.

    >>> possible = torch.tensor([[[True, False], [True, True]]])  # head 0: role 0; head 1: either
    >>> extremes_over_roles(possible, lambda m: m[..., 0].sum((-2, -1)), lambda: (0.0, 2.0))  # heads in role 0
    (1.0, 2.0)
    """
    layers, heads, roles = possible.shape
    flat = possible.reshape(-1, roles)
    options = [torch.nonzero(row).flatten().tolist() or [-1] for row in flat]
    total = math.prod(len(o) for o in options)
    if total > MAX_ASSIGNMENTS:
        return outer()
    low, high = math.inf, -math.inf
    assignments = itertools.product(*options)
    # in chunks: a model's hundreds of heads times 16,384 assignments would not fit at once
    while chunk := list(itertools.islice(assignments, ASSIGNMENT_CHUNK)):
        choices = torch.tensor(chunk, dtype=torch.long).reshape(len(chunk), len(options))
        one_hot = torch.nn.functional.one_hot(choices.clamp(min=0), roles).double() * (choices >= 0).unsqueeze(-1)
        values = statistic(one_hot.reshape(len(chunk), layers, heads, roles)).double()
        low, high = min(low, float(values.min())), max(high, float(values.max()))
    return low, high


def mean_ranges(
    possible: Bool[Tensor, "layer head_index role"], value: Float[Tensor, "layer head_index"]
) -> Float[Tensor, "role 2"]:
    """Per role, the smallest and the largest mean of ``value`` over the heads a role can hold: every head whose
    only possible role it is, and any of the heads for which it is possible (NaN, NaN where no head can hold it;
    the role may also be empty where no head certainly holds it: ``role_may_be_empty``). Each role is taken on its
    own, so the ranges hold every assignment of one possible role per head (and some that give a head two roles).

    The smallest mean: the certain heads, then the others in increasing order of value while each lowers the
    mean (with no certain head, the smallest value alone); the largest, the same from the top.

    >>> possible = torch.tensor([[[True, False]], [[True, True]], [[False, True]]])  # three layers, one head each
    >>> mean_ranges(possible, torch.tensor([[0.0], [0.5], [1.0]])).tolist()  # role 0: {0} or {0, 0.5}; role 1: {1} or {0.5, 1}
    [[0.0, 0.25], [0.75, 1.0]]
    """
    x = value.double().flatten()
    flat = possible.reshape(-1, possible.shape[-1])
    only = flat & (flat.sum(-1, keepdim=True) == 1)
    out = torch.full((flat.shape[-1], 2), math.nan, dtype=torch.float64)
    for role in range(flat.shape[-1]):
        certain = x[only[:, role]].tolist()
        others = x[flat[:, role] & ~only[:, role]].tolist()
        if not certain and not others:
            continue
        out[role, 0] = _extreme_mean(certain, sorted(others))
        out[role, 1] = -_extreme_mean([-v for v in certain], sorted(-v for v in others))
    return out


def _extreme_mean(certain: list[float], ascending: list[float]) -> float:
    """The smallest mean of ``certain`` with any of ``ascending`` added (at least one value in all)."""
    chosen = list(certain) or ascending[:1]
    rest = ascending if certain else ascending[1:]
    total = sum(chosen)
    for v in rest:
        if v >= total / len(chosen):
            break
        chosen.append(v)
        total += v
    return total / len(chosen)


def role_may_be_empty(possible: Bool[Tensor, "layer head_index role"]) -> Bool[Tensor, " role"]:
    """Per role, whether some assignment of one possible role per head leaves it without a head (no head has it as
    its only possible role).

    >>> role_may_be_empty(torch.tensor([[[True, False], [True, True]]])).tolist()
    [False, True]
    """
    flat = possible.reshape(-1, possible.shape[-1])
    return ~(flat & (flat.sum(-1, keepdim=True) == 1)).any(0)
