"""Cost of the metrics, the chance diagnostic and the roles diagnostic against another git revision, side by
side, on rows that see a window of a long key axis (or all of it).

Random attention rows and values of the given shape, the default N grid; the
rows of every chunk go through this tree's
``tl_geometry.engine.metrics.chunk_metrics``,
``tl_geometry.diagnostics.chance.DIAGNOSTIC.rows`` and
``tl_geometry.diagnostics.role_features.DIAGNOSTIC.rows`` (the sink: key 0
where a row sees it, as `rows_context` has it), and through the same
functions of ``--rev`` (their modules read with ``git show`` and run on this
tree's selection context, which both revisions share), in turns, and the
medians are compared. Every field of the two is compared too (the largest
difference is printed; NaN and infinite entries must agree). The sorted
chunks alone (no diagnostic) are timed in the same turns, and the time
beyond them is compared as well: where a part costs little beside the sort
of its rows, that ratio is its own.

A sliding-window row of Gemma-3-270M at its full context (d_head 256; 512 of
32,768 keys visible), then a full-attention row and SmolLM2's shape (270
rows of 1,024 keys, d_head 64):

    PYTHONPATH=. python benchmarks/bench_window_rows.py --rev 62355f0 --rows 4 --keys 32768 --d-head 256 --window 512
    PYTHONPATH=. python benchmarks/bench_window_rows.py --rev 62355f0 --rows 1 --keys 16384 --d-head 256
    PYTHONPATH=. python benchmarks/bench_window_rows.py --rev 62355f0

``--parts roles`` times the roles diagnostic alone (against 03c8d60, the
commit before its controls and shares were cut to the seen ranks).
"""

import argparse
import statistics
import time
from types import ModuleType

import torch
from against_revision import largest_difference, module_at, random_rows

from tl_geometry.diagnostics import chance, role_features
from tl_geometry.engine import metrics
from tl_geometry.engine.context import rows_context
from tl_geometry.engine.grid import default_n_grid

MODULES = {"metrics": "tl_geometry/engine/metrics.py", "chance": "tl_geometry/diagnostics/chance.py",
           "roles": "tl_geometry/diagnostics/role_features.py"}
THIS_TREE = {"metrics": metrics, "chance": chance, "roles": role_features}
SORT_ONLY = "the sorted chunks alone"


def runner(part: str, module: ModuleType):
    """The per-chunk function of ``part`` in ``module``, and its declared cost per row."""
    if part == "metrics":
        return module.chunk_metrics, module.METRICS_COST
    settings = module.RoleSettings() if part == "roles" else module.ChanceSettings()
    return (lambda chunk: module.DIAGNOSTIC.rows(chunk, settings)), module.DIAGNOSTIC.cost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", required=True, help="the revision to compare with (e.g. the commit before)")
    parser.add_argument("--rows", type=int, default=270)
    parser.add_argument("--keys", type=int, default=1024)
    parser.add_argument("--d-head", type=int, default=64)
    parser.add_argument("--window", type=int, default=None, help="each row sees only its last WINDOW keys")
    parser.add_argument("--parts", nargs="*", choices=tuple(MODULES), default=list(MODULES))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    alpha, values, visible = random_rows(args.rows, args.keys, args.d_head, args.window)
    grid = default_n_grid(args.keys)
    seen = f", each seeing its last {args.window}" if args.window is not None else ""
    print(f"{args.rows} rows x {args.keys} keys{seen}, d_head {args.d_head}, grid of {len(grid)} N, "
          f"{torch.get_num_threads()} threads, {args.repeats} repeats in turns, alternating which goes first (the sort "
          "of the rows included in both)")
    for part in args.parts:
        versions = {"this tree": runner(part, THIS_TREE[part]),
                    args.rev: runner(part, module_at(args.rev, MODULES[part]))}
        versions[SORT_ONLY] = (lambda chunk: {}), versions["this tree"][1]
        times: dict[str, list[float]] = {label: [] for label in versions}
        largest = 0.0
        with torch.no_grad():
            for repeat in range(args.repeats):
                outputs = {}
                for label, (rows, cost) in list(versions.items())[:: 1 if repeat % 2 == 0 else -1]:
                    context = rows_context(alpha, values, visible, grid, ranking="attention", distance="euclidean",
                                           memory_budget_mib=128.0, costs=(cost,))
                    start = time.perf_counter()
                    parts = [{name: t.clone() for name, t in rows(chunk).items()} for chunk in context.chunks()]
                    times[label].append(time.perf_counter() - start)
                    outputs[label] = {name: torch.cat([p[name] for p in parts]) for name in parts[0]}
                largest = max(largest, largest_difference(outputs["this tree"], outputs[args.rev]))
        this, then, sort = (statistics.median(times[label]) for label in ("this tree", args.rev, SORT_ONLY))
        print(f"{part}: this tree median {this:.3f} s; {args.rev} median {then:.3f} s; ratio {this / then:.3f}; "
              f"largest difference of a field {largest:.1e}; the sorted chunks alone {sort:.3f} s, beyond them "
              f"{this - sort:.3f} s against {then - sort:.3f} s (ratio {(this - sort) / (then - sort):.3f})",
              flush=True)


if __name__ == "__main__":
    main()
