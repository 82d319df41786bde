"""Cost of cutting the first windows of a long text: tokenising the whole text vs only the prefix they need.

A 16 MB text (the default text repeated) and SmolLM2's tokenizer (from the
model cache; run ``tl_geometry.load_model()`` once first). Each mode runs in
a fresh subprocess; time and the growth of peak RSS (``ru_maxrss``) over the
process after loading the text are printed side by side, with their ratio.

Run: ``PYTHONPATH=. python benchmarks/bench_text_windows.py [--mb 16] [--windows 1] [--context 1024]``.
Target: ``text_windows(..., n_windows=1)`` costs a fixed few kB of tokens, not
seconds and gigabytes that grow with the text.
"""

import argparse
import json
import resource
import subprocess
import sys
import time


def child(mode: str, mb: int, windows: int, context: int) -> dict:
    from transformers import AutoTokenizer

    from tl_geometry.models import model_cache_dir
    from tl_geometry.capture.sources import encode as _encode
    from tl_geometry.text import default_text, text_windows

    tokenizer = AutoTokenizer.from_pretrained(model_cache_dir() / "models" / "smollm2-135m")
    base = default_text()
    text = (base * (mb * 2**20 // len(base) + 1))[: mb * 2**20]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if mode == "whole":  # what text_windows did before: every token of the text, then the first windows
        ids = _encode(tokenizer, text)
        out = ids[: windows * (context - 1)]
    else:
        out = text_windows(tokenizer, text, context=context, n_windows=windows)[:, 1:].flatten().tolist()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": seconds, "peak_growth_mb": (peak - before) / 1024, "first_ids": out[:50], "n": len(out)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=16)
    parser.add_argument("--windows", type=int, default=1)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--child", choices=("whole", "prefix"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.mb, args.windows, args.context)))
        return
    runs = {}
    for mode in ("whole", "prefix"):
        done = subprocess.run([sys.executable, __file__, "--child", mode, "--mb", str(args.mb), "--windows",
                               str(args.windows), "--context", str(args.context)], capture_output=True, text=True,
                              check=True)
        runs[mode] = json.loads(done.stdout.splitlines()[-1])
    assert runs["whole"]["first_ids"] == runs["prefix"]["first_ids"] and runs["whole"]["n"] == runs["prefix"]["n"]
    print(f"{args.mb} MB of text, {args.windows} window(s) of {args.context} tokens (same ids either way)")
    for mode, r in runs.items():
        print(f"  {mode:7s} {r['seconds']:8.3f} s   peak RSS +{r['peak_growth_mb']:8.1f} MB")
    w, p = runs["whole"], runs["prefix"]
    print(f"  whole / prefix: time x{w['seconds'] / p['seconds']:.0f}, "
          f"peak RSS growth {w['peak_growth_mb']:.0f} MB vs {p['peak_growth_mb']:.0f} MB")


if __name__ == "__main__":
    main()
