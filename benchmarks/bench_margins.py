"""Cost of the margins (the bounds diagnostic's work) against another git revision, side by side.

By default one window's worth of rows of SmolLM2-135M's shape (30 layers x
9 heads, last query, 1024 keys, d_head 64, the default N grid), random
attention and values; the margins of every chunk are computed by this
tree's ``tl_geometry.theory.theorem_bounds.chunk_margins`` and by the same function
of ``--rev`` (read with ``git show``), in turns, and the medians compared.
Every field of the two is compared too (the largest difference is printed).

    PYTHONPATH=. python benchmarks/bench_margins.py --rev ae270e9

Long rows, as Gemma-3-270M's at its full context (d_head 256): a
full-attention row, and a sliding-window row that sees the last 512 of
32,768 keys:

    PYTHONPATH=. python benchmarks/bench_margins.py --rev ac32526 --rows 1 --keys 16384 --d-head 256 --repeats 3
    PYTHONPATH=. python benchmarks/bench_margins.py --rev ac32526 --rows 4 --keys 32768 --d-head 256 --window 512
"""

import argparse
import statistics
import time

import torch
from against_revision import largest_difference, module_at, random_rows

from tl_geometry.engine.context import rows_context
from tl_geometry.engine.grid import default_n_grid
from tl_geometry.theory import theorem_bounds as bounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", default="ae270e9")
    parser.add_argument("--rows", type=int, default=270)
    parser.add_argument("--keys", type=int, default=1024)
    parser.add_argument("--d-head", type=int, default=64)
    parser.add_argument("--window", type=int, default=None, help="each row sees only its last WINDOW keys")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    alpha, values, visible = random_rows(args.rows, args.keys, args.d_head, args.window)
    grid = default_n_grid(args.keys)
    old = module_at(args.rev, "tl_geometry/theory/theorem_bounds.py", former_path="tl_geometry/theory/bounds.py")
    times: dict[str, list[float]] = {"this tree": [], args.rev: []}
    largest = 0.0
    with torch.no_grad():
        for _ in range(args.repeats):
            outputs = []
            for label, module in (("this tree", bounds), (args.rev, old)):
                context = rows_context(alpha, values, visible, grid, ranking="attention", distance="euclidean",
                                       memory_budget_mib=128.0, costs=(module.MARGINS_COST,))
                start = time.perf_counter()
                parts = [module.chunk_margins(chunk) for chunk in context.chunks()]
                times[label].append(time.perf_counter() - start)
                outputs.append({name: torch.cat([p[name] for p in parts]) for name in parts[0]})
            largest = max(largest, largest_difference(*outputs))
    this, then = statistics.median(times["this tree"]), statistics.median(times[args.rev])
    seen = f", each seeing its last {args.window}" if args.window is not None else ""
    print(f"{args.rows} rows x {args.keys} keys{seen}, d_head {args.d_head}, grid of {len(grid)} N, "
          f"{torch.get_num_threads()} threads, {args.repeats} repeats (sorting included in both)")
    print(f"this tree: median {this:.3f} s; {args.rev}: median {then:.3f} s; ratio {this / then:.2f}; "
          f"largest difference of a field {largest:.2e}")


if __name__ == "__main__":
    main()
