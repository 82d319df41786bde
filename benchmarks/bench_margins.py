"""Cost of the margins (the bounds diagnostic's work) against another git revision, side by side.

One window's worth of rows of SmolLM2-135M's shape (30 layers x 9 heads,
last query, 1024 keys, d_head 64, the default N grid), random attention and
values; the margins of every chunk are computed by this tree's
``tl_geometry.theory.bounds.chunk_margins`` and by the same function of
``--rev`` (read with ``git show``), in turns, and the medians compared.

    PYTHONPATH=. python benchmarks/bench_margins.py --rev ae270e9
"""

import argparse
import statistics
import subprocess
import sys
import time
import types

import torch

from tl_geometry.engine.context import rows_context
from tl_geometry.engine.grid import default_n_grid
from tl_geometry.theory import bounds


def module_at(rev: str) -> types.ModuleType:
    source = subprocess.run(
        ["git", "show", f"{rev}:tl_geometry/theory/bounds.py"], capture_output=True, text=True, check=True
    ).stdout
    name = "tl_geometry.theory._bounds_at_rev"
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(source, f"<bounds.py at {rev}>", "exec"), module.__dict__)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", default="ae270e9")
    parser.add_argument("--rows", type=int, default=270)
    parser.add_argument("--keys", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    alpha = torch.softmax(4 * torch.randn(args.rows, args.keys), -1)
    values = torch.randn(args.rows, args.keys, 64) * torch.rand(args.rows, args.keys, 1)
    visible = torch.ones(args.rows, args.keys, dtype=torch.bool)
    grid = default_n_grid(args.keys)
    old = module_at(args.rev)
    times: dict[str, list[float]] = {"this tree": [], args.rev: []}
    with torch.no_grad():
        for _ in range(args.repeats):
            for label, module in (("this tree", bounds), (args.rev, old)):
                context = rows_context(alpha, values, visible, grid, ranking="attention", distance="euclidean",
                                       memory_budget_mib=128.0, costs=(module.MARGINS_COST,))
                start = time.perf_counter()
                for chunk in context.chunks():
                    module.chunk_margins(chunk)
                times[label].append(time.perf_counter() - start)
    this, then = statistics.median(times["this tree"]), statistics.median(times[args.rev])
    print(f"{args.rows} rows x {args.keys} keys, grid of {len(grid)} N, {torch.get_num_threads()} threads, "
          f"{args.repeats} repeats (sorting included in both)")
    print(f"this tree: median {this:.3f} s; {args.rev}: median {then:.3f} s; ratio {this / then:.2f}")


if __name__ == "__main__":
    main()
