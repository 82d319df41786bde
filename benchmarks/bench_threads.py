"""One analysis with PyTorch's default threads against one thread, alternated in one process, with the load beside.

On a CPU shared with other jobs, PyTorch's intra-op threads wait for each
other at the end of every parallel operation; when another process holds a
core, the wait lasts a scheduler time slice, and an analysis made of many
small operations (the selection context, the diagnostics' chunks) can slow
down many times. One thread per process (``OMP_NUM_THREADS=1``, or
``torch.set_num_threads(1)``) has no one to wait for. This script measures
both on the same loaded model and windows, alternating, and prints the
load average before and after: on a quiet machine the default threads win,
on a busy one they may lose by far.

    PYTHONPATH=. python benchmarks/bench_threads.py [--windows 2] [--context 256] [--repeats 3] [--diagnostics roles]
"""

import argparse
import os
import statistics
import time

import torch

import tl_geometry as tg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--diagnostics", nargs="*", default=["roles"])
    args = parser.parse_args()
    default_threads = torch.get_num_threads()
    model = tg.load_model("smollm2-135m", progress=False)
    windows = tg.text_windows(model, tg.default_text(), context=args.context, n_windows=args.windows)
    config = tg.GeometryConfig(diagnostics=args.diagnostics)
    tg.analyze_corpus(model, windows[:1], config, batch_size=1, progress=False)  # warm-up
    load_before = os.getloadavg()[0]
    seconds: dict[int, list[float]] = {default_threads: [], 1: []}
    for _ in range(args.repeats):
        for threads in seconds:
            torch.set_num_threads(threads)
            start = time.perf_counter()
            tg.analyze_corpus(model, windows, config, batch_size=1, progress=False)
            seconds[threads].append(time.perf_counter() - start)
    torch.set_num_threads(default_threads)
    load_after = os.getloadavg()[0]
    print(f"SmolLM2-135M, {args.windows} x {args.context} tokens, diagnostics {args.diagnostics}; "
          f"{os.cpu_count()} CPUs, load average {load_before:.1f} before, {load_after:.1f} after")
    for threads, times in seconds.items():
        print(f"  {threads} thread(s): median {statistics.median(times):.1f} s  ({', '.join(f'{t:.1f}' for t in times)})")
    ratio = statistics.median(seconds[default_threads]) / statistics.median(seconds[1])
    print(f"  {default_threads} threads / 1 thread: {ratio:.2f}x")


if __name__ == "__main__":
    main()
