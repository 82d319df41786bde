"""How often the envelopes of Theorems 1-2 say something, and how often they are wrong, as a function of kappa.

Three sources of (row, N) cells, each with its measured P(r_max, N) and R(r_min, N):

- the simulator (every setting of ``VALIDATION_SETTINGS``, ``SAMPLES`` rows
  each) with the envelopes from the settings' parameters
  (``assumption_margins``: the theorem's own setting, where the margins are
  expectations and kappa is a real tail constant);
- the same simulated rows with their measured margins (``selection_margins``);
- real rows: the last query of ``--windows`` windows of the bundled models
  (measured margins, read from the bounds diagnostic's per-query fields).

For each variant (``sink_aware``, ``paper``) and kappa, a cell is
*informative* when P_low > 0.5 at 1 < N < L, and *violated* when P < P_low or
R < R_low. Also printed: the largest kappa for which the lower envelopes hold
on at least 99 % of simulated rows in every setting and seed (and under every
Monte Carlo mean), the Monte Carlo means
against the upper envelopes (statements about expectations), and on real
rows the excess of P and R over chance (random top-N sets, the chance
diagnostic) at a few N.

    python benchmarks/bench_theory.py                      # simulator only (about 10 s)
    python benchmarks/bench_theory.py --models smollm2-135m gemma3-270m --windows 16
"""

import argparse
import math
import time

import torch

from tl_geometry import selection_metrics
from tl_geometry.theory.theorem_bounds import (
    DEFAULT_KAPPA,
    SelectionMargins,
    assumption_margins,
    envelopes,
    lower_envelopes,
    selection_margins,
)
from tl_geometry.theory.synthetic import RECENT_PROFILE, VALIDATION_GRID, VALIDATION_SETTINGS, simulate

SAMPLES = 200
KAPPAS = (1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6)
VARIANTS = ("sink_aware", "paper")
EXCESS_N = (1, 2, 4, 8, 16, 64)
REAL_GRID = sorted({*range(1, 17), 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024})


def rates(margins: SelectionMargins, d_head: int, precision: torch.Tensor, recall: torch.Tensor, kappa: float, variant: str):
    """(informative, P violated, R violated, either violated) fractions over the defined cells."""
    p_low, r_low = lower_envelopes(margins, d_head, kappa=kappa, variant=variant)
    n = margins.n_grid.to(p_low.dtype)
    defined = ~torch.isnan(p_low) & ~torch.isnan(precision)
    mid = defined & (n > 1) & (n < margins.n_visible.to(p_low.dtype).unsqueeze(-1))
    p_bad = (precision < p_low - 1e-6) & defined
    r_bad = (recall < r_low - 1e-6) & defined
    total = max(int(defined.sum()), 1)
    return (
        float((p_low > 0.5)[mid].double().mean()) if bool(mid.any()) else math.nan,
        int(p_bad.sum()) / total,
        int(r_bad.sum()) / total,
        int((p_bad | r_bad).sum()) / total,
    )


SEEDS = (0, 1)


def simulated():
    """Per setting and seed: (settings, grid, metrics, assumption margins, measured margins)."""
    out = []
    for s, seed in [(s, seed) for seed in SEEDS for s in VALIDATION_SETTINGS]:
        grid = [n for n in VALIDATION_GRID if n <= s.n_keys]
        rows = simulate(s, SAMPLES, seed=seed)
        m = selection_metrics(rows.alpha, rows.values, grid)
        fitted = assumption_margins(s.c, s.lam, s.beta, s.rho0, s.profile, s.n_keys, grid)
        measured = selection_margins(rows.alpha, rows.values, grid)
        out.append((s, grid, m, fitted, measured))
    return out


def expand(margins: SelectionMargins, rows: int) -> SelectionMargins:
    """One row of assumption margins repeated for every simulated row (so that cells compare one to one)."""
    fields = {name: getattr(margins, name) for name in SelectionMargins.__dataclass_fields__ if name != "n_grid"}
    fields = {name: t.expand(rows, *t.shape) for name, t in fields.items()}
    return SelectionMargins(n_grid=margins.n_grid, **fields)


def print_simulator(runs) -> None:
    print(f"== simulator: {len(VALIDATION_SETTINGS)} settings x seeds {SEEDS} x {SAMPLES} rows; cells (row, N) ==")
    print(f"{'margins':>9} {'variant':>10} {'kappa':>7} | {'informative':>11} {'P viol':>7} {'R viol':>7} {'worst setting viol':>18}")
    largest = {}
    for source in ("fitted", "measured"):
        for variant in VARIANTS:
            ok_kappas = []
            for kappa in KAPPAS:
                per, means_hold = [], True
                for s, grid, m, fitted, measured in runs:
                    margins = expand(fitted, SAMPLES) if source == "fitted" else measured
                    per.append(rates(margins, s.d_head, m.precision, m.recall, kappa, variant))
                    p_low, r_low = lower_envelopes(margins, s.d_head, kappa=kappa, variant=variant)
                    means_hold &= bool((m.precision.mean(0) >= p_low.mean(0) - 1e-12).all())
                    means_hold &= bool((m.recall.mean(0) >= r_low.mean(0) - 1e-12).all())
                informative = sum(r[0] for r in per) / len(per)
                worst = max(r[3] for r in per)
                if worst <= 0.01 and means_hold:
                    ok_kappas.append(kappa)
                print(f"{source:>9} {variant:>10} {kappa:>7.0e} | {informative:>11.3f} {sum(r[1] for r in per) / len(per):>7.4f} "
                      f"{sum(r[2] for r in per) / len(per):>7.4f} {worst:>18.4f}")
            largest[source, variant] = max(ok_kappas) if ok_kappas else math.nan
    for (source, variant), kappa in largest.items():
        print(f"largest kappa of the grid with lower envelopes holding on >= 99% of rows in every setting and seed, "
              f"and under every Monte Carlo mean ({source}, {variant}): {kappa:.0e}")
    print(f"\n== simulator: Monte Carlo means against the upper envelopes (fitted margins, sink_aware, kappa = {DEFAULT_KAPPA:g}) ==")
    print(f"{'d':>4} {'L':>4} {'beta':>5} {'lam':>5} {'rho0':>5} {'profile':>7} | {'max(mean P - P_up)':>18} {'max(mean R - R_up)':>18}")
    for s, grid, m, fitted, measured in runs[: len(VALIDATION_SETTINGS)]:  # seed 0, the rows the tests check
        env = envelopes(fitted, s.d_head, kappa=DEFAULT_KAPPA)
        p_excess = float((m.precision.mean(0) - env.precision_upper).max())
        r_excess = float((m.recall.mean(0) - env.recall_upper).max())
        name = "recent" if s.profile == RECENT_PROFILE else "wavy"
        print(f"{s.d_head:>4} {s.n_keys:>4} {s.beta:>5} {s.lam:>5} {s.rho0:>5} {name:>7} | {p_excess:>+18.4f} {r_excess:>+18.4f}")


def real_rows(model_name: str, n_windows: int):
    """Per-row margins, metrics and chance fields of the last query of each window: [sequence, layer, head, n] each."""
    import tl_geometry
    from tl_geometry.capture.hooks import run_with_geometry_hooks

    model = tl_geometry.models.load_model(model_name, progress=False)
    windows = tl_geometry.text_windows(model, tl_geometry.default_text(), context=1024, n_windows=n_windows)
    parts: dict[str, list[torch.Tensor]] = {}
    start = time.perf_counter()
    for w in range(len(windows)):
        result = run_with_geometry_hooks(
            model, windows[w : w + 1], diagnostics=["bounds", "chance"], n_grid=REAL_GRID, keep_queries=True
        )
        for name, t in result.queries.items():
            parts.setdefault(name, []).append(t[:, :, :, 0])
    print(f"{model_name}: {len(windows)} windows in {time.perf_counter() - start:.0f} s")
    d_head = model.cfg.d_head
    del model
    return {name: torch.cat(ts) for name, ts in parts.items()}, d_head, torch.tensor(REAL_GRID)


def margins_of(rows: dict[str, torch.Tensor], grid: torch.Tensor) -> SelectionMargins:
    """SelectionMargins of the kept per-row margins (the fields the lower envelopes read; the rest NaN)."""
    like = rows["margin_delta"]
    nan = torch.full_like(like, math.nan)
    fields = {}
    for name in SelectionMargins.__dataclass_fields__:
        if name in ("n_grid", "n_visible", "gap_in"):
            continue
        fields[name] = rows.get(f"margin_{name}", nan)
    n_visible = rows["margin_n_keys"][..., 0] if rows["margin_n_keys"].ndim == like.ndim else rows["margin_n_keys"]
    return SelectionMargins(
        n_grid=grid, n_visible=n_visible.round().long(), gap_in=nan.unsqueeze(-1), **fields
    )


def print_real(model_name: str, n_windows: int) -> None:
    rows, d_head, grid = real_rows(model_name, n_windows)
    margins = margins_of(rows, grid)
    print(f"== {model_name}: {n_windows} windows, last query, every (window, layer, head, N) ==")
    print(f"{'variant':>10} {'kappa':>7} | {'informative':>11} {'P viol':>7} {'R viol':>7} {'either':>7}")
    for variant in VARIANTS:
        for kappa in KAPPAS:
            inf, p_bad, r_bad, bad = rates(margins, d_head, rows["precision"], rows["recall"], kappa, variant)
            print(f"{variant:>10} {kappa:>7.0e} | {inf:>11.3f} {p_bad:>7.4f} {r_bad:>7.4f} {bad:>7.4f}")
    print(f"excess over chance (mean over windows, layers and heads; {model_name}):")
    print(f"{'N':>5} | {'P':>6} {'chance P':>8} {'floor N/L':>9} {'P - chance':>10} | {'R':>6} {'chance R':>8} {'R - chance':>10}")
    for n in EXCESS_N:
        col = REAL_GRID.index(n)

        def mean(name: str) -> float:
            return float(torch.nanmean(rows[name][..., col].double()))

        print(f"{n:>5} | {mean('precision'):>6.3f} {mean('chance_precision'):>8.3f} {mean('chance_precision_floor'):>9.3f} "
              f"{mean('excess_precision'):>+10.3f} | {mean('recall'):>6.3f} {mean('chance_recall'):>8.3f} {mean('excess_recall'):>+10.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=[], help="bundled models to measure real rows on (e.g. smollm2-135m gemma3-270m)")
    parser.add_argument("--windows", type=int, default=16, help="1024-token windows per model")
    parser.add_argument("--skip-simulator", action="store_true")
    args = parser.parse_args()
    start = time.perf_counter()
    torch.set_grad_enabled(False)
    if not args.skip_simulator:
        print_simulator(simulated())
    for name in args.models:
        print()
        print_real(name, args.windows)
    print(f"time: {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
