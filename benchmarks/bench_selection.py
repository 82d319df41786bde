"""Engine speed and memory: 270 rows (30 layers x 9 heads) x 1024 keys x d_head 64.

Prints, from one run: the engine's time for every N and for the 40-point log
grid, the slow reference loop's time on the same work (extrapolated from a
subset of rows and N), the ratio, and the peak extra memory of each engine
call. Each engine measurement runs in a fresh subprocess so that peaks do not
mask each other.

Targets: every N < 3 s, 40-point grid < 0.3 s, peak extra memory < 512 MiB.

    python benchmarks/bench_selection.py
"""

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

ROWS, KEYS, D_HEAD = 270, 1024, 64
REPEATS = 3


def make_inputs(seed: int = 0):
    torch.manual_seed(seed)
    concentration = torch.full((ROWS, KEYS), 0.1, dtype=torch.float64)
    alpha = torch.distributions.Dirichlet(concentration).sample().float()
    values = torch.randn(ROWS, KEYS, D_HEAD)
    return alpha, values


def measure_engine(grid_name: str) -> dict:
    """Run in a subprocess: best-of-REPEATS time and the peak RSS above the inputs."""
    from tl_geometry import selection_metrics
    from tl_geometry.engine.grid import default_n_grid

    torch.set_num_threads(torch.get_num_threads())
    alpha, values = make_inputs()
    grid = None if grid_name == "every" else default_n_grid(KEYS)
    selection_metrics(alpha[:2], values[:2], grid)  # warm-up of kernels, not of data
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        selection_metrics(alpha, values, grid)
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": min(times), "peak_extra_mib": (peak - before) / 1024, "n": KEYS if grid is None else len(grid)}


def measure_reference(grid_name: str) -> float:
    """Seconds of the slow float64 reference, extrapolated from a few rows and N."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.reference import reference_metrics
    from tl_geometry.engine.grid import default_n_grid

    alpha, values = make_inputs()
    grid = list(range(1, KEYS + 1)) if grid_name == "every" else default_n_grid(KEYS).tolist()
    rows, sample = 2, grid[:: max(1, len(grid) // 8)]
    start = time.perf_counter()
    reference_metrics(alpha[:rows], values[:rows], sample)
    elapsed = time.perf_counter() - start
    return elapsed * (ROWS / rows) * (len(grid) / len(sample))


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(measure_engine(sys.argv[2])))
        return
    print(f"selection_metrics on {ROWS} rows x {KEYS} keys x d_head {D_HEAD}, float32, "
          f"{torch.get_num_threads()} threads, best of {REPEATS}")
    print(f"{'grid':<10}{'n':>6}{'engine s':>11}{'reference s':>14}{'speed-up':>11}{'peak extra MiB':>16}  target")
    targets = {"every": (3.0, "every N < 3 s"), "log40": (0.3, "40-point grid < 0.3 s")}
    for grid_name in ("every", "log40"):
        child = subprocess.run(
            [sys.executable, __file__, "--child", grid_name], capture_output=True, text=True, check=True
        )
        engine = json.loads(child.stdout.strip().splitlines()[-1])
        reference = measure_reference(grid_name)
        limit, label = targets[grid_name]
        ok = engine["seconds"] < limit and engine["peak_extra_mib"] < 512
        print(f"{grid_name:<10}{engine['n']:>6}{engine['seconds']:>11.3f}{reference:>14.1f}"
              f"{reference / engine['seconds']:>10.0f}x{engine['peak_extra_mib']:>16.1f}  "
              f"{label}, < 512 MiB: {'met' if ok else 'MISSED'}")


if __name__ == "__main__":
    main()
