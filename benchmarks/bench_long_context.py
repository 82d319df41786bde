"""The longest context: one window at a model's full context through the rows path, the last query, every diagnostic.

Each run is a fresh process that loads the model (`tl_geometry.load_model`,
default Gemma-3-270M, 32,768 positions), hands the C heap's free pages back
to the system (glibc's ``malloc_trim``), resets the kernel's high-water mark
of its resident memory and notes its resident memory, then runs once on one
window of ``--context`` random token ids after BOS. Its figures are the wall
time and the peak resident memory above the loaded model (``VmHWM`` minus
the resident memory before the run), as `benchmarks/bench_memory.py` counts
it. Linux only. Runs (``--runs``):

- ``bare``: the decoder pass alone with the rows attention and nothing
  analysed (the model's SDPA attention, no unembedding): the floor any
  analysis of this window pays;
- ``metrics``: ``run_with_geometry_hooks`` with the selection metrics alone;
- ``roles``: the metrics and the roles diagnostic, split into phases as
  ``all`` is (one diagnostic's figures without the others' work beside it);
- ``all``: ``run_with_geometry_hooks`` with every diagnostic, split into
  phases: the benchmark wraps the parts of the run (the SDPA attention, the
  mask it is given, the analysed rows' eager attention, the selection
  context and its sorted chunks, each diagnostic's per-row and per-sequence
  work) and, at every entry to and exit from a part, adds the time since the
  last boundary to the innermost part under way and reads the high-water
  mark since the last boundary (then resets it). So each part's peak is the
  most memory held above the loaded model while that part was the innermost
  one running (what the rest of the run still held included), and the part
  with the highest peak is what limits the window's length; the times add
  up to the run's. Each new high of a part (by more than 256 MiB) is
  printed to stderr as it happens, so that a run the machine kills still
  says where its memory went. The rest of the decoder pass (embeddings, norms, MLPs) is
  "decoder pass, other", and what runs outside the pass (tokens, plan,
  accumulator, result) is "outside the pass".

    PYTHONPATH=. python benchmarks/bench_long_context.py [--model gemma3-270m] [--context 32768]
        [--runs bare metrics roles all]
"""

import argparse
import ctypes
import ctypes.util
import functools
import gc
import json
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from bench_memory import _status_mib  # this script's folder is on sys.path

RUNS = ("bare", "metrics", "roles", "all")
DIAGNOSTICS = {"metrics": [], "roles": ["roles"], "all": "all"}  # what each analysed run asks for


def _reset_high_water_mark() -> None:
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


class Phases:
    """Wall time and peak resident memory per part of a run, attributed to the innermost part under way."""

    def __init__(self, base_mib: float) -> None:
        self.base_mib = base_mib
        self.stack = ["outside the pass"]
        self.seconds: dict[str, float] = defaultdict(float)
        self.peak_mib: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.mark = self.start = time.perf_counter()

    def _boundary(self) -> None:
        now, top = time.perf_counter(), self.stack[-1]
        self.seconds[top] += now - self.mark
        peak = _status_mib("VmHWM") - self.base_mib
        if peak > self.peak_mib[top] + 256:  # a new high of this part: said at once, in case the run dies later
            print(f"[{now - self.start:8.1f} s] {top}: {peak / 1024:.2f} GiB above the loaded model", file=sys.stderr,
                  flush=True)
        self.peak_mib[top] = max(self.peak_mib[top], peak)
        _reset_high_water_mark()
        self.mark = time.perf_counter()  # the boundary's own reads are nobody's time

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._boundary()
        self.stack.append(name)
        self.calls[name] += 1
        try:
            yield
        finally:
            self._boundary()
            self.stack.pop()

    def wrap(self, name: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            with self.phase(name):
                return fn(*args, **kwargs)

        return timed

    def wrap_generator(self, name: str, fn: Callable) -> Callable:
        """Each step of the generator is the part ``name`` (what the caller does between steps is not)."""

        @functools.wraps(fn)
        def stepped(*args, **kwargs):
            items = fn(*args, **kwargs)
            while True:
                with self.phase(name):
                    item = next(items, StopIteration)
                if item is StopIteration:
                    return
                yield item

        return stepped


def instrument(phases: Phases) -> None:
    """Wrap the parts of a rows-path run (in this process only) so that ``phases`` clocks them."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

    from tl_geometry.capture import hooks, layer_analysis, rows
    from tl_geometry.diagnostics import REGISTRY
    from tl_geometry.engine.context import SelectionContext

    AttentionInterface.register("sdpa", phases.wrap("SDPA attention (every query)", ALL_ATTENTION_FUNCTIONS["sdpa"]))
    rows._rows_mask = phases.wrap("attention mask (built once per pass)", rows._rows_mask)
    eager_of = rows._eager_function
    rows._eager_function = lambda module: phases.wrap("analysed rows (eager attention)", eager_of(module))
    rows.additive_rows_mask = phases.wrap("analysed rows (eager attention)", rows.additive_rows_mask)
    hooks.run_rows_pass = phases.wrap("decoder pass, other (embeddings, norms, MLPs)", hooks.run_rows_pass)
    analysis = layer_analysis.LayerAnalysis
    analysis.analyse_layers = phases.wrap("analysis, other (folding layers, reductions)", analysis.analyse_layers)
    SelectionContext.__init__ = phases.wrap("selection context", SelectionContext.__init__)
    SelectionContext.chunks = phases.wrap_generator("selection core (sorted chunks)", SelectionContext.chunks)
    for name in REGISTRY.names():
        cls = type(REGISTRY.get(name))
        label = "metrics" if name == "selection" else name
        for method in ("rows", "sequences"):
            if method in vars(cls):
                setattr(cls, method, phases.wrap(f"{label}: {method}", getattr(cls, method)))


def one(run: str, model_name: str, context: int) -> dict:
    """Child process: load, run once; wall time, peak above the loaded model, and the phases of ``all``."""
    import torch

    from tl_geometry import run_with_geometry_hooks
    from tl_geometry.capture.rows import RowsCapture, run_rows_pass
    from tl_geometry.models import load_model

    model = load_model(model_name, progress=False)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(100, 40000, (1, context), generator=gen)
    tokens[:, 0] = model.tokenizer.bos_token_id or 1
    gc.collect()
    ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)
    _reset_high_water_mark()
    before = _status_mib("VmRSS")
    phases = Phases(before)
    if run in ("roles", "all"):
        instrument(phases)
    start = time.perf_counter()
    if run == "bare":
        nothing = RowsCapture(torch.tensor([[context - 1]]), lambda *a: None, ())
        run_rows_pass(model, tokens, None, nothing)
    else:
        result = run_with_geometry_hooks(model, tokens, capture="rows", diagnostics=DIAGNOSTICS[run])
        if result.provenance["capture"] != "rows":
            raise SystemExit(f"expected the rows path, the run took {result.provenance['capture']!r}")
    seconds = time.perf_counter() - start
    peak = _status_mib("VmHWM") - before
    if run in ("roles", "all"):
        phases._boundary()
        peak = max(phases.peak_mib.values())
    return {
        "run": run, "seconds": seconds, "loaded_mib": before, "above_mib": peak,
        "phases": {name: {"seconds": phases.seconds[name], "peak_mib": phases.peak_mib[name],
                          "calls": phases.calls[name]} for name in phases.seconds},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--runs", nargs="*", choices=RUNS, default=list(RUNS))
    parser.add_argument("--child", choices=RUNS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one(args.child, args.model, args.context)))
        return
    print(f"{args.model}, 1 x {args.context} tokens, rows path, last query; one fresh process per run: wall time, "
          "peak resident memory above the loaded model")
    for run in args.runs:
        out = subprocess.run(
            [sys.executable, __file__, "--child", run, "--model", args.model, "--context", str(args.context)],
            stdout=subprocess.PIPE, text=True, check=True,  # the child's stderr (its new highs) passes through
        ).stdout
        figures = json.loads(out.strip().splitlines()[-1])
        print(f"  {run:8s} {figures['seconds']:8.1f} s  {figures['above_mib'] / 1024:6.2f} GiB above the loaded model "
              f"({figures['loaded_mib'] / 1024:.2f} GiB loaded)", flush=True)
        if figures["phases"]:
            print(f"    {'part':52s}{'calls':>7s}{'time':>10s}{'peak above model':>18s}")
            for name, p in sorted(figures["phases"].items(), key=lambda item: -item[1]["peak_mib"]):
                print(f"    {name:52s}{p['calls']:>7d}{p['seconds']:>9.1f}s{p['peak_mib'] / 1024:>14.2f} GiB")


if __name__ == "__main__":
    main()
