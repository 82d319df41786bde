"""Peak memory above the loaded model, per diagnostic and capture path, side by side in one run.

For each diagnostic (the metrics alone, then the metrics plus each optional
diagnostic, then all of them) and each capture path (``"rows"``,
``"pattern"``), a fresh process loads SmolLM2 (`tl_geometry.load_model`),
hands the C heap's free pages back to the system (glibc's ``malloc_trim``:
loading leaves about 400 MiB of freed pages resident, which a run would reuse
unseen, so that without it the same run measured anywhere from 15 to 336 MiB),
resets the kernel's high-water mark of its resident memory (``5`` to
``/proc/self/clear_refs``), notes its resident memory (``VmRSS``), runs
``run_with_geometry_hooks`` once on ``--batch`` windows of ``--context``
random tokens, and reads the high-water mark (``VmHWM``). The figure is that
peak minus the resident memory before the run: the most memory the run held
at once beyond the loaded model, as the operating system counts it (every
allocation: torch's, the C heap's and Python's; pages the C heap keeps after
freeing them count while they stay resident). Linux only.

A fresh process per measurement: peaks do not hide each other, and the order of
the runs does not matter; the two paths' processes of a figure run at once. The table prints rows / pattern per diagnostic;
the target is at most 1.2x.

With ``--windows 1 4 16`` each figure is instead ``analyze_corpus`` over that
many windows of ``--context`` tokens, ``--batch`` windows per forward pass
(fewer when there are fewer windows): the peak must stay flat as the corpus
grows (the statistics are sums; only one batch of activations is held). The
table adds, per path, the peak at the most windows over the peak at the fewest.

With ``--heap glibc pinned`` each figure is measured twice: under glibc's
default malloc (``glibc``: its mmap threshold moves up each time a large block
is freed, so later blocks below that size come from its heap) and with the
threshold pinned at its starting 128 KiB for the whole process
(``pinned``: ``MALLOC_MMAP_THRESHOLD_=131072`` in the child's environment, so
that loading the model leaves no free blocks in the heap either and every
block from 128 KiB up is mapped afresh and returned when freed); ``pinned-32k`` pins it at 32 KiB: the free
holes that blocks of 32 to 128 KiB leave in the heap otherwise add up from batch to batch, resident, while
nothing is held (a float64 array of SmolLM2's layers x heads x N grid is 84 KiB). Each figure
also prints the run's CPU time (user + system, from ``getrusage``) and its
minor page faults: what the pinned heap costs.

With ``--trace 16 64 128 256`` one process per path in ``--paths`` runs ``analyze_corpus`` over the largest
number of windows under ``--heap``'s first entry and, after the batch that reaches each number, prints its peak
so far above the loaded model and the accumulator's statistics (`Accumulator.nbytes`): past the accumulator's
rows (about ``n_bootstrap`` + 6 documents) the peak must stop growing.

    PYTHONPATH=. python benchmarks/bench_memory.py [--batch 4] [--context 256] [--budget 128]
        [--diagnostics metrics assumptions bounds roles chance all] [--windows 1 4 16]
        [--heap glibc pinned pinned-32k] [--trace 16 64 128 256 --paths rows]
"""

import argparse
import ctypes
import ctypes.util
import gc
import json
import os
import resource
import subprocess
import sys
from typing import Any

DIAGNOSTICS = ("metrics", "assumptions", "bounds", "roles", "chance", "all")
PATHS = ("rows", "pattern")
# glibc's mmap threshold pinned for the whole process: at its starting 128 KiB, or at 32 KiB (the free holes
# that blocks of 32 to 128 KiB leave in the heap otherwise add up from batch to batch, see docs/scale.md).
PINNED_THRESHOLDS = {"pinned": 128 * 1024, "pinned-32k": 32 * 1024}
HEAPS = ("glibc", *PINNED_THRESHOLDS)
TARGET = 1.2


def _status_mib(key: str) -> float:
    """A memory figure of this process from /proc/self/status, in MiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024  # kB
    raise KeyError(key)


def _diagnostics(name: str) -> list[str] | str:
    return [] if name == "metrics" else "all" if name == "all" else [name]


def _loaded(windows: int, context: int):
    """SmolLM2 and ``windows`` seeded random windows of ``context`` tokens, each opened by BOS."""
    import torch

    from tl_geometry.models import load_model

    model = load_model(progress=False)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(100, 40000, (windows, context), generator=gen)
    tokens[:, 0] = model.tokenizer.bos_token_id or 1
    return model, tokens


def _peak_reset() -> float:
    """Hand the C heap's free pages back, reset the high-water mark; the resident memory now, in MiB."""
    gc.collect()
    ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    return _status_mib("VmRSS")


def _heap_env(heap: str) -> dict[str, str]:
    """This environment with glibc's mmap threshold as ``heap`` asks (read by glibc when the process starts)."""
    env = {name: value for name, value in os.environ.items() if name != "MALLOC_MMAP_THRESHOLD_"}
    if heap in PINNED_THRESHOLDS:
        env["MALLOC_MMAP_THRESHOLD_"] = str(PINNED_THRESHOLDS[heap])
    return env


def _child_output(child: subprocess.Popen) -> Any:
    """The JSON a child process printed last, once it has ended (its failure raised)."""
    out, _ = child.communicate()
    if child.returncode:
        raise subprocess.CalledProcessError(child.returncode, child.args, out)
    return json.loads(out.strip().splitlines()[-1])


def one(path: str, diagnostic: str, batch: int, context: int, budget: float, windows: int | None = None) -> dict:
    """Child process: load, run once (one batch, or ``windows`` windows through ``analyze_corpus``); the peak
    resident memory above the loaded model."""
    from tl_geometry import analyze_corpus, run_with_geometry_hooks

    model, tokens = _loaded(batch if windows is None else windows, context)
    settings = {"capture": path, "diagnostics": _diagnostics(diagnostic), "memory_budget_mib": budget}
    before = _peak_reset()
    start = resource.getrusage(resource.RUSAGE_SELF)
    if windows is None:
        run_with_geometry_hooks(model, tokens, **settings)
    else:
        analyze_corpus(model, tokens, batch_size=batch, progress=False, **settings)
    end = resource.getrusage(resource.RUSAGE_SELF)
    return {"path": path, "diagnostic": diagnostic, "loaded_mib": before, "above_mib": _status_mib("VmHWM") - before,
            "cpu_s": end.ru_utime + end.ru_stime - start.ru_utime - start.ru_stime,
            "system_s": end.ru_stime - start.ru_stime, "minor_faults": end.ru_minflt - start.ru_minflt}


def traced(path: str, diagnostic: str, batch: int, context: int, budget: float, stages: list[int]) -> list[dict]:
    """Child process: ``analyze_corpus`` over ``max(stages)`` windows, the peak above the loaded model read after
    the batch that reaches each stage (one process: what the run holds so far, its model and code loaded once)."""
    from tl_geometry import analyze_corpus
    from tl_geometry.runs import corpus_run

    model, tokens = _loaded(max(stages), context)
    before = _peak_reset()
    analyse, seen, out = corpus_run.analyse_prepared, [0], []
    start = resource.getrusage(resource.RUSAGE_SELF)

    def watched(model, prepared, plan, accumulator):  # the seam corpus_run looks up for each batch
        analyse(model, prepared, plan, accumulator)
        seen[0] += len(prepared.tokens)
        if seen[0] in stages:
            used = resource.getrusage(resource.RUSAGE_SELF)
            out.append({"windows": seen[0], "above_mib": _status_mib("VmHWM") - before,
                        "accumulator_mib": accumulator.nbytes / 2**20,
                        "cpu_s": used.ru_utime + used.ru_stime - start.ru_utime - start.ru_stime})
            print(json.dumps({"path": path, **out[-1]}), file=sys.stderr, flush=True)

    corpus_run.analyse_prepared = watched
    analyze_corpus(model, tokens, batch_size=batch, progress=False, capture=path,
                   diagnostics=_diagnostics(diagnostic), memory_budget_mib=budget)
    return out


def trace(args: argparse.Namespace) -> None:
    """The peak after each stage of one run per path (`traced`), the paths' processes at once."""
    heap = args.heap[0]
    env = _heap_env(heap)
    children = {}
    for path in args.paths:
        for diagnostic in args.diagnostics:
            command = [sys.executable, __file__, "--child", path, diagnostic, "--batch", str(args.batch),
                       "--context", str(args.context), "--budget", str(args.budget), "--trace", *map(str, args.trace)]
            children[path, diagnostic] = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    print(f"SmolLM2, analyze_corpus over {max(args.trace)} windows of {args.context} tokens, batches of {args.batch}, "
          f"memory_budget_mib={args.budget:g}, heap {heap}: peak resident memory above the loaded model so far (MiB) "
          "after each stage, one process per path")
    print(f"{'diagnostics':<14}{'path':<9}{'windows':>8}{'peak':>8}{'accumulator':>13}{'CPU time':>10}")
    for (path, diagnostic), child in children.items():
        for stage in _child_output(child):
            print(f"{diagnostic:<14}{path:<9}{stage['windows']:>8}{stage['above_mib']:>8.0f}"
                  f"{stage['accumulator_mib']:>13.0f}{stage['cpu_s']:>9.0f}s", flush=True)


def _paths(diagnostic: str, args: argparse.Namespace, windows: int | None = None,
           heap: str = "glibc") -> dict[str, dict]:
    """One figure per path (the peak above the loaded model, the CPU time, the page faults), each measured in a
    fresh process under ``heap``; the two processes run at once (each reads its own high-water mark, so neither
    sees the other's memory)."""
    env = _heap_env(heap)
    children = {}
    for path in PATHS:
        command = [sys.executable, __file__, "--child", path, diagnostic, "--batch", str(args.batch),
                   "--context", str(args.context), "--budget", str(args.budget)]
        if windows is not None:
            command += ["--windows", str(windows)]
        children[path] = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    return {path: _child_output(child) for path, child in children.items()}


def _costs(figures: dict[str, dict]) -> str:
    """Each path's CPU time (of which system) and minor page faults."""
    return "; ".join(f"{path} {f['cpu_s']:.1f} s ({f['system_s']:.1f} s system), {f['minor_faults'] / 1e6:.2f} M faults"
                     for path, f in figures.items())


def corpus_sizes(args: argparse.Namespace) -> None:
    """The peak per diagnostic, heap, path and number of windows: flat in the corpus size, rows within 1.2x pattern."""
    print(f"SmolLM2, analyze_corpus over {args.windows} windows of {args.context} tokens, batches of {args.batch}, "
          f"memory_budget_mib={args.budget:g}: peak resident memory above the loaded model (MiB), one fresh process "
          "per figure; CPU time and minor page faults of each run")
    print(f"{'diagnostics':<14}{'heap':<12}{'windows':>8}{'rows':>9}{'pattern':>9}{'rows/pattern':>14}   CPU time")
    for diagnostic in args.diagnostics:
        for heap in args.heap:
            above = {path: [] for path in PATHS}
            for windows in args.windows:
                figures = _paths(diagnostic, args, windows, heap)
                for path in PATHS:
                    above[path].append(figures[path]["above_mib"])
                ratio = above["rows"][-1] / max(above["pattern"][-1], 1e-9)
                print(f"{diagnostic:<14}{heap:<12}{windows:>8}{above['rows'][-1]:>9.0f}{above['pattern'][-1]:>9.0f}"
                      f"{ratio:>13.2f}x   {_costs(figures)}", flush=True)
            growth = ", ".join(f"{path} {above[path][-1] / max(above[path][0], 1e-9):.2f}x" for path in PATHS)
            print(f"{'':<14}{heap:<12}peak at {args.windows[-1]} windows / at {args.windows[0]}: {growth}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--budget", type=float, default=128.0, help="memory_budget_mib")
    parser.add_argument("--diagnostics", nargs="*", choices=DIAGNOSTICS, default=list(DIAGNOSTICS))
    parser.add_argument("--windows", nargs="*", type=int, default=None,
                        help="numbers of windows, each run through analyze_corpus (the corpus-size check)")
    parser.add_argument("--heap", nargs="*", choices=HEAPS, default=["glibc"],
                        help="glibc's default malloc, and/or its mmap threshold pinned at 128 KiB or 32 KiB")
    parser.add_argument("--trace", nargs="*", type=int, default=None,
                        help="numbers of windows: one run over the most, its peak read after each")
    parser.add_argument("--paths", nargs="*", choices=PATHS, default=list(PATHS), help="the paths --trace runs")
    parser.add_argument("--child", nargs=2, metavar=("PATH", "DIAGNOSTIC"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child and args.trace:
        print(json.dumps(traced(*args.child, args.batch, args.context, args.budget, args.trace)))
        return
    if args.trace:
        trace(args)
        return
    if args.child:
        windows = args.windows[0] if args.windows else None
        print(json.dumps(one(*args.child, args.batch, args.context, args.budget, windows)))
        return
    if args.windows:
        corpus_sizes(args)
        return
    print(f"SmolLM2, {args.batch} x {args.context} tokens, memory_budget_mib={args.budget:g}: peak resident memory "
          "above the loaded model (MiB), one fresh process per figure")
    print(f"{'diagnostics':<14}{'heap':<12}{'rows':>9}{'pattern':>9}{'rows/pattern':>14}   CPU time")
    missed = []
    for diagnostic in args.diagnostics:
        for heap in args.heap:
            figures = _paths(diagnostic, args, heap=heap)
            above = {path: figures[path]["above_mib"] for path in PATHS}
            ratio = above["rows"] / max(above["pattern"], 1e-9)
            if ratio > TARGET:
                missed.append(f"{diagnostic} ({heap})")
            print(f"{diagnostic:<14}{heap:<12}{above['rows']:>9.0f}{above['pattern']:>9.0f}{ratio:>13.2f}x   "
                  f"{_costs(figures)}", flush=True)
    print(f"target rows <= {TARGET}x pattern: " + (f"MISSED for {', '.join(missed)}" if missed else "met"))


if __name__ == "__main__":
    main()
