"""The largest kappa for which the simulated E[P], E[R] stay above the lower envelopes.

For every setting of ``SETTINGS`` (d, L, beta, lambda, rho0, profile) the
simulator draws ``SAMPLES`` rows under Assumptions 1-3; the Monte Carlo means
of P(r_max, N) and R(r_min, N) are compared with the envelopes of Theorems
1-2 computed from the settings' parameters (``assumption_margins``). A
bisection over log kappa finds the largest kappa for which every lower
envelope lies below the means (the lower envelopes grow with kappa); the
table then shows, per setting, the smallest slack of each side at that kappa
and at the module default.

    python benchmarks/bench_theory.py
"""

import math
import time


from tl_geometry import selection_metrics
from tl_geometry.theory.bounds import DEFAULT_KAPPA, assumption_margins, envelopes
from tl_geometry.theory.synthetic import (
    RECENT_PROFILE,
    VALIDATION_GRID,
    VALIDATION_SETTINGS,
    SimulationSettings,
    simulate,
)

SETTINGS, GRID = VALIDATION_SETTINGS, VALIDATION_GRID
SAMPLES = 200


def monte_carlo(settings: SimulationSettings, samples: int = SAMPLES, seed: int = 0):
    """(grid, mean P, mean R) of simulated rows at the grid's N <= L."""
    grid = [n for n in GRID if n <= settings.n_keys]
    rows = simulate(settings, samples, seed=seed)
    m = selection_metrics(rows.alpha, rows.values, grid)
    return grid, m.precision.mean(0), m.recall.mean(0)


def slack(settings, grid, p_mean, r_mean, kappa):
    """Smallest (mean - lower) and (upper - mean) over N and the two metrics."""
    s = settings
    margins = assumption_margins(s.c, s.lam, s.beta, s.rho0, s.profile, s.n_keys, grid)
    env = envelopes(margins, s.d_head, kappa=kappa)
    low = min(float((p_mean - env.precision_lower).min()), float((r_mean - env.recall_lower).min()))
    up = min(float((env.precision_upper - p_mean).min()), float((env.recall_upper - r_mean).min()))
    return low, up


def largest_kappa(runs, lo=1e-3, hi=1e6, steps=40) -> float:
    """Bisection on log kappa: the largest kappa with every lower envelope below the means."""
    if all(slack(s, *run, hi)[0] >= 0 for s, run in runs):
        return math.inf
    for _ in range(steps):
        mid = math.sqrt(lo * hi)
        ok = all(slack(s, *run, mid)[0] >= 0 for s, run in runs)
        lo, hi = (mid, hi) if ok else (lo, mid)
    return lo


def main() -> None:
    start = time.perf_counter()
    runs = [(s, monte_carlo(s)) for s in SETTINGS]
    kappa = largest_kappa(runs)
    print(f"largest kappa (lower envelopes hold on every setting): {kappa:.4g}   default kappa: {DEFAULT_KAPPA}")
    print(f"{'d':>4} {'L':>4} {'beta':>5} {'lam':>5} {'rho0':>5} {'profile':>7} | "
          f"{'low slack@k*':>12} {'up slack@k*':>12} | {'low slack@def':>13} {'up slack@def':>12}")
    for s, run in runs:
        at_best = slack(s, *run, kappa if math.isfinite(kappa) else 1e6)
        at_default = slack(s, *run, DEFAULT_KAPPA)
        name = "recent" if s.profile == RECENT_PROFILE else "wavy"
        print(f"{s.d_head:>4} {s.n_keys:>4} {s.beta:>5} {s.lam:>5} {s.rho0:>5} {name:>7} | "
              f"{at_best[0]:>12.4f} {at_best[1]:>12.4f} | {at_default[0]:>13.4f} {at_default[1]:>12.4f}")
    print(f"time: {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
