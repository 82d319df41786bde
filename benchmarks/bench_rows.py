"""The rows capture path against the pattern path and the bare forward passes, SmolLM2, side by side in one run.

Prints, for 1 x ``--short`` tokens (default 1024), median wall times of two bare
passes with the model's fast attention (SDPA): the model's forward (a plain
Hugging Face model of the same architecture, logits included: what
``model(tokens)`` costs; its weights are random, which does not change the
time) and the decoder alone (the rows pass with nothing analysed: no
unembedding, which no analysis needs, so the stricter baseline); then the bare
eager forward of the bridge, the default run (``capture="auto"``, which takes
the rows on this model), with ``capture="rows"`` and with
``capture="pattern"``, and their ratios to both bare passes (the four fast
passes take turns among themselves, then the two eager ones). Then for
1 x ``--long`` tokens (default 8192) each path runs in its own process, which
reports its wall time and its peak resident memory above the loaded model.

With ``--every-query 128 256``, also both paths with every query analysed at those lengths.

    python benchmarks/bench_rows.py [--short 1024] [--long 8192] [--repeats 3] [--every-query 128 256]
"""

import argparse
import json
import random
import statistics
import subprocess
import sys
import time

import torch


def _tokens(model, n: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    body = torch.randint(100, 40000, (1, n - 1), generator=gen)
    return torch.cat([torch.full((1, 1), model.tokenizer.bos_token_id or 1), body], dim=1)


def _clock_interleaved(fns: dict, repeats: int) -> dict[str, float]:
    """Median wall time of each function, run in turn within every repeat (the machine is shared: a slow
    spell then slows every path alike instead of one). Each repeat runs them in its own (seeded) random
    order, so that no path always runs right after the same one (after an eager pass's large patterns, say)."""
    for fn in fns.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in fns}
    order = random.Random(0)
    for _ in range(repeats):
        names = list(fns)
        order.shuffle(names)
        for name in names:
            fn = fns[name]
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def short(n: int, repeats: int) -> None:
    from tl_geometry import run_with_geometry_hooks
    from tl_geometry.capture.rows import RowsCapture, run_rows_pass
    from tl_geometry.models import load_model

    model = load_model(progress=False)
    plain = _plain_sdpa_model(model)
    tokens = _tokens(model, n)
    nothing = lambda: RowsCapture(torch.tensor([[n - 1]]), lambda *a: None, ())  # noqa: E731
    model_forward, decoder = "model forward, sdpa (logits)", "decoder pass, sdpa (no logits)"
    # The eager passes build every layer's pattern (gigabytes freed after each): a pass right after one pays
    # for mapping that memory again, so the fast paths are clocked among themselves, then the eager ones.
    figures = _clock_interleaved({
        model_forward: lambda: _plain_forward(plain, tokens),
        decoder: lambda: run_rows_pass(model, tokens, None, nothing()),
        'default run (capture="auto")': lambda: run_with_geometry_hooks(model, tokens),
        'default run, capture="rows"': lambda: run_with_geometry_hooks(model, tokens, capture="rows"),
    }, repeats)
    figures |= _clock_interleaved({
        "bare eager forward (bridge)": lambda: _eager(model, tokens),
        'default run, capture="pattern"': lambda: run_with_geometry_hooks(model, tokens, capture="pattern"),
    }, repeats)
    print(f"1 x {n} tokens, SmolLM2, median of {repeats} (s, and ratios to the model's SDPA forward and to the "
          "SDPA decoder pass):")
    for name, seconds in figures.items():
        print(f"  {name:34s} {seconds:7.3f} s  {seconds / figures[model_forward]:5.2f}x  "
              f"{seconds / figures[decoder]:5.2f}x")


def every_query(lengths: list[int], repeats: int) -> None:
    """Both paths with every query analysed (``query_positions="all"``), where the rows path builds every row."""
    from tl_geometry import run_with_geometry_hooks
    from tl_geometry.models import load_model

    model = load_model(progress=False)
    for n in lengths:
        tokens = _tokens(model, n)
        figures = _clock_interleaved({
            path: lambda path=path: run_with_geometry_hooks(model, tokens, capture=path, query_positions="all")
            for path in ("rows", "pattern")
        }, repeats)
        print(f"1 x {n} tokens, every query, median of {repeats}: rows {figures['rows']:.2f} s, pattern "
              f"{figures['pattern']:.2f} s ({figures['rows'] / figures['pattern']:.2f}x)")


def _plain_sdpa_model(model):
    """A plain Hugging Face model of the bridge's architecture with SDPA attention (random weights: the time
    of a pass does not depend on them; the bridge's own Hugging Face modules are wrapped by its components)."""
    from transformers import AutoModelForCausalLM

    # A copy: the model would hold the bridge's config itself and set its attention implementation to SDPA.
    config = type(model.original_model.config).from_dict(model.original_model.config.to_dict())
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


def _plain_forward(plain, tokens):
    with torch.inference_mode():
        plain(input_ids=tokens, use_cache=False)


def _eager(model, tokens):
    with torch.inference_mode():
        model(tokens, return_type=None)


def one_long(path: str, n: int) -> None:
    """Child process: load, note the resident memory, run one path once, print JSON."""
    from tl_geometry import run_with_geometry_hooks
    from tl_geometry.models import load_model

    model = load_model(progress=False)
    tokens = _tokens(model, n)
    # Loading the bundled model peaks higher than a short run: reset the kernel's high-water mark (Linux).
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    loaded = _status_gib("VmRSS")
    start = time.perf_counter()
    run_with_geometry_hooks(model, tokens, capture=path)
    seconds = time.perf_counter() - start
    peak = _status_gib("VmHWM")
    print(json.dumps({"path": path, "seconds": seconds, "loaded_gib": loaded, "above_model_gib": peak - loaded}))


def _status_gib(key: str) -> float:
    """A memory figure of this process from /proc/self/status, in GiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 2**20  # kB
    raise KeyError(key)


def long(n: int) -> None:
    results = {}
    for path in ("rows", "pattern"):
        out = subprocess.run([sys.executable, __file__, "--child", path, "--long", str(n)], capture_output=True,
                             text=True, check=True).stdout
        results[path] = json.loads(out.strip().splitlines()[-1])
    rows, pattern = results["rows"], results["pattern"]
    print(f"1 x {n} tokens, SmolLM2, one run per path in its own process:")
    for r in (rows, pattern):
        print(f"  capture={r['path']!r:10s} {r['seconds']:7.1f} s  peak above the loaded model {r['above_model_gib']:.2f} GiB")
    print(f"  rows / pattern: wall {rows['seconds'] / pattern['seconds']:.2f}x, "
          f"memory {rows['above_model_gib'] / max(pattern['above_model_gib'], 1e-9):.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--short", type=int, default=1024)
    parser.add_argument("--long", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child")
    parser.add_argument("--skip-long", action="store_true")
    parser.add_argument("--every-query", type=int, nargs="*", default=[], metavar="TOKENS",
                        help="also time both paths with every query analysed, at these lengths")
    args = parser.parse_args()
    if args.child:
        one_long(args.child, args.long)
    else:
        short(args.short, args.repeats)
        if args.every_query:
            every_query(args.every_query, args.repeats)
        if not args.skip_long:
            long(args.long)
