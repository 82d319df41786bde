"""Bootstrap intervals of a statistic from its replicates: percentile, bias-corrected, basic, shifted and normal.

A result keeps Poisson-bootstrap replicates over documents (each replicate's
per-head means), not each document's values. From the replicates
``theta*_b`` of a statistic and its value ``theta`` on the result:

- the percentile interval is the ``tail`` and ``1 - tail`` quantiles of the
  replicates (``tail = (1 - level) / 2``);
- the bias-corrected interval (Efron's BC) moves those quantile levels by the
  replicates' median bias ``z0 = Phi^-1(share of replicates below theta, ties
  counting half)``: the quantiles at ``Phi(2 z0 + Phi^-1(tail))`` and
  ``Phi(2 z0 + Phi^-1(1 - tail))``. It is BCa with acceleration 0: the
  acceleration needs a jackknife over documents, whose values a result does
  not keep. When the replicates centre on theta (z0 = 0) it is the
  percentile interval;
- the basic interval reflects the replicates about theta: ``[2 theta -
  q(1 - tail), 2 theta - q(tail)]``. Where the replicates sit below theta by
  b on average, it sits above theta by b: it corrects a bias that the
  resampling repeats, as the attenuation of a correlation between noisy
  per-head means (each replicate's means carry the documents' noise once
  more, so its correlation is attenuated twice);
- the shifted percentile interval keeps the percentile interval's shape and
  moves it by twice the replicates' mean bias ``b = mean(theta*) - theta``:
  ``[q(tail) - 2 b, q(1 - tail) - 2 b]``, centred on the bias-corrected
  estimate ``theta - b`` as the basic interval is, without reflecting the
  replicates' skew;
- the normal interval is ``theta - b +- z s``, with ``s`` the replicates'
  standard deviation and ``z`` the normal quantile of the level: it reads
  only the replicates' first two moments, not their quantiles, so the few
  values a jumpy statistic's replicates take (a step between roles' depths)
  do not set its ends. At the expanded level (below) ``z`` is
  ``sqrt(n / (n - 1)) t_{n-1}``: a studentised interval with the bootstrap
  standard error.

Statistics of many noisy per-head means (a correlation over heads, a
minimum of two drops) are biased by the noise itself; the percentile
interval then sits off-centre around the value (a correlation's estimate at
or beyond the top of its interval), which the bias corrections undo. Their
coverage on simulated studies, where each claim's method is chosen and
then checked on other populations, is printed by
``benchmarks/bench_coverage.py``.

With few documents every bootstrap interval is too narrow: the replicates'
spread estimates the standard error with divisor n instead of n - 1, and
the normal quantile stands in for Student's t. `expanded_level` widens the
nominal level for n documents as Hesterberg's expanded percentile interval
does (the tail at Phi(-sqrt(n / (n - 1)) t_{n-1})); the claims pass it to
every method unless a claim's plain level covered better. With two or
three documents that level rounds to 1 (t_1 is 12.7): it is held at
`MAX_LEVEL`, the widest interval the replicates give, instead of a tail of
zero that has no normal quantile.

Quantiles interpolate linearly between replicates (as ``torch.quantile``);
NaN replicates are left out; no replicates or a NaN value give NaN bounds.
"""

import math
from statistics import NormalDist

import torch
from jaxtyping import Float
from torch import Tensor


def _student_t_central(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with an integer ``df`` (Abramowitz and Stegun 26.7.3-4, exact finite sums)."""
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2 == 0:  # sin(theta) (1 + 1/2 c^2 + 1.3/(2.4) c^4 + ... up to c^(df - 2))
        term, total = 1.0, 1.0
        for k in range(1, df // 2):
            term *= (2 * k - 1) / (2 * k) * c2
            total += term
        return math.sin(theta) * total
    if df == 1:
        return 2 * theta / math.pi
    term, total = 1.0, 1.0  # (2/pi)(theta + sin cos (1 + 2/3 c^2 + 2.4/(3.5) c^4 + ... up to c^(df - 3)))
    for k in range(1, (df - 1) // 2):
        term *= (2 * k) / (2 * k + 1) * c2
        total += term
    return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)


def student_t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (p > 1/2) of Student's t with an integer ``df`` >= 1, by bisection on its exact CDF.

    >>> tuple(round(student_t_quantile(0.975, df), 3) for df in (1, 3, 15, 1000))
    (12.706, 3.182, 2.131, 1.962)
    """
    low, high = 0.0, 1.0
    while (1 + _student_t_central(high, df)) / 2 < p:
        high *= 2
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if (1 + _student_t_central(mid, df)) / 2 < p else (low, mid)
    return (low + high) / 2


MAX_LEVEL = 1 - 1e-9
"""The highest level an interval is asked for: its tails keep a finite normal quantile."""


def expanded_level(level: float, n: int) -> float:
    """The level whose percentile interval has the width of a ``level`` t interval for ``n`` documents.

    >>> round(expanded_level(0.95, 16), 4)
    0.9723
    >>> expanded_level(0.95, 2) == MAX_LEVEL  # two documents: as wide as the replicates go
    True
    """
    if n < 2:  # one document: nothing to resample
        return level
    tail = (1 - level) / 2
    expanded = 1 - 2 * NormalDist().cdf(-math.sqrt(n / (n - 1)) * student_t_quantile(1 - tail, n - 1))
    return min(expanded, MAX_LEVEL)


def _quantiles(values: Float[Tensor, " replicate"], levels: tuple[float, float]) -> tuple[float, float]:
    q = torch.quantile(values, torch.tensor(levels, dtype=values.dtype))
    return float(q[0]), float(q[1])


def percentile_interval(replicates: Float[Tensor, " replicate"], level: float = 0.95) -> tuple[float, float]:
    """The ``level`` percentile interval of the replicates.

    >>> tuple(round(x, 6) for x in percentile_interval(torch.arange(101.0), 0.9))
    (5.0, 95.0)
    """
    values = replicates.double().flatten()
    values = values[~values.isnan()]
    if not len(values):
        return math.nan, math.nan
    tail = (1 - level) / 2
    return _quantiles(values, (tail, 1 - tail))


def bias_corrected_interval(
    value: float, replicates: Float[Tensor, " replicate"], level: float = 0.95
) -> tuple[float, float]:
    """The ``level`` bias-corrected percentile interval (BC) of the replicates around the statistic's ``value``.

    >>> tuple(round(x, 6) for x in bias_corrected_interval(50.0, torch.arange(101.0), 0.9))  # centred: percentile
    (5.0, 95.0)
    >>> low, high = bias_corrected_interval(60.0, torch.arange(101.0), 0.9)  # replicates biased low: shifted up
    >>> low > 5.0 and high > 95.0
    True
    """
    values = replicates.double().flatten()
    values = values[~values.isnan()]
    if not len(values) or math.isnan(value):
        return math.nan, math.nan
    n = len(values)
    below = float((values < value).double().sum() + 0.5 * (values == value).double().sum()) / n
    below = min(max(below, 0.5 / n), 1 - 0.5 / n)  # all replicates on one side: as far as n replicates can tell
    normal = NormalDist()
    z0, z = normal.inv_cdf(below), normal.inv_cdf((1 - level) / 2)
    return _quantiles(values, (normal.cdf(2 * z0 + z), normal.cdf(2 * z0 - z)))


def basic_interval(value: float, replicates: Float[Tensor, " replicate"], level: float = 0.95) -> tuple[float, float]:
    """The ``level`` basic bootstrap interval: the percentile interval reflected about ``value``.

    >>> tuple(round(x, 6) for x in basic_interval(60.0, torch.arange(101.0), 0.9))
    (25.0, 115.0)
    """
    low, high = percentile_interval(replicates, level)
    if math.isnan(value):
        return math.nan, math.nan
    return 2 * value - high, 2 * value - low


def shifted_percentile_interval(
    value: float, replicates: Float[Tensor, " replicate"], level: float = 0.95
) -> tuple[float, float]:
    """The ``level`` percentile interval moved by twice the replicates' mean bias (centred on ``theta - b``).

    >>> tuple(round(x, 6) for x in shifted_percentile_interval(60.0, torch.arange(101.0), 0.9))  # b = -10
    (25.0, 115.0)
    >>> skewed = torch.arange(101.0) ** 2 / 100  # mean 33.5, 90 % percentile interval [0.25, 90.25]
    >>> tuple(round(x, 2) for x in shifted_percentile_interval(50.0, skewed, 0.9))  # basic: (9.75, 99.75)
    (33.25, 123.25)
    """
    low, high = percentile_interval(replicates, level)
    shift = 2 * (float(torch.nanmean(replicates.double())) - value)  # NaN without replicates or value
    return low - shift, high - shift


def normal_interval(value: float, replicates: Float[Tensor, " replicate"], level: float = 0.95) -> tuple[float, float]:
    """The ``level`` normal interval around the bias-corrected estimate: ``theta - b +- z s`` (``b`` the
    replicates' mean minus ``value``, ``s`` their standard deviation).

    >>> tuple(round(x, 3) for x in normal_interval(60.0, torch.tensor([40.0, 50.0, 60.0]), 0.95))  # b = -10
    (50.4, 89.6)
    """
    values = replicates.double().flatten()
    values = values[~values.isnan()]
    if len(values) < 2 or math.isnan(value):
        return math.nan, math.nan
    centre = 2 * value - float(values.mean())
    half = NormalDist().inv_cdf(1 - (1 - level) / 2) * float(values.std())
    return centre - half, centre + half


METHODS = {
    "percentile": lambda value, replicates, level: percentile_interval(replicates, level),
    "bias-corrected": bias_corrected_interval,
    "basic": basic_interval,
    "shifted": shifted_percentile_interval,
    "normal": normal_interval,
}
"""Every interval from replicates by name, called as ``(value, replicates, level)``."""
