"""Memory and file size of a corpus run against the number of windows: both must stay flat.

``analyze_corpus`` over N windows of ``--context`` tokens of the default model
with every diagnostic on, for each N of ``--windows`` (default 16 and 256), each
in a fresh subprocess: the peak RSS of the analysis (the kernel's high-water
mark, reset after the model is loaded), the size of the saved result (npz +
json) and the time. Windows come from the default text; when it runs out,
further windows are random token ids after BOS (memory and file size do not
depend on the content).

Run: ``PYTHONPATH=. python benchmarks/bench_corpus.py [--windows 16 256] [--context 1024]``.
Targets (issue "results that merge"): peak RSS at 256 windows at most 1.1x that
at 16; result files of the same size; at most 25 MB for the default report's
result.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_size(n_windows: int, context: int, batch_size: int) -> dict:
    import torch

    from bench_hooks import PeakRSS  # the kernel's high-water mark (this script's folder is on sys.path)

    from tl_geometry import analyze_corpus, default_text, load_model, text_windows

    model = load_model(progress=False)
    from_text = text_windows(model, default_text(), context=context)[:n_windows]
    extra = n_windows - len(from_text)
    gen = torch.Generator().manual_seed(0)
    random = torch.randint(10, model.cfg.d_vocab, (max(extra, 0), context), generator=gen)
    random[:, 0] = from_text[0, 0]  # BOS
    windows = torch.cat([from_text, random])
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # reset the high-water mark: the model is loaded, the analysis starts
    before = PeakRSS._high_water_mark()
    start = time.perf_counter()
    result = analyze_corpus(model, windows, batch_size=batch_size, progress=False, diagnostics="all")
    seconds = time.perf_counter() - start
    peak = PeakRSS._high_water_mark()
    with tempfile.TemporaryDirectory() as tmp:
        npz, meta = result.save(Path(tmp) / "result")
        size = npz.stat().st_size + meta.stat().st_size
    return {
        "windows": n_windows,
        "random_windows": max(extra, 0),
        "seconds": seconds,
        "rss_loaded_mib": before / 2**20,
        "rss_peak_mib": peak / 2**20,
        "file_mb": size / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, nargs="+", default=[16, 256])
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.size:
        print(json.dumps(run_size(args.size, args.context, args.batch_size)))
        return
    rows = []
    for n in args.windows:
        out = subprocess.run(
            [sys.executable, __file__, "--size", str(n), "--context", str(args.context), "--batch-size", str(args.batch_size)],
            capture_output=True, text=True, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"analyze_corpus, every diagnostic, windows of {args.context} tokens, batch size {args.batch_size}")
    print(f"{'windows':>8}{'random':>8}{'seconds':>9}{'RSS loaded MiB':>16}{'peak MiB':>10}{'file MB':>9}")
    for r in rows:
        print(f"{r['windows']:>8}{r['random_windows']:>8}{r['seconds']:>9.1f}{r['rss_loaded_mib']:>16.0f}"
              f"{r['rss_peak_mib']:>10.0f}{r['file_mb']:>9.2f}")
    small, large = rows[0], rows[-1]
    ratio = large["rss_peak_mib"] / small["rss_peak_mib"]
    print(f"peak RSS x{ratio:.3f} from {small['windows']} to {large['windows']} windows: "
          f"{'met' if ratio <= 1.1 else 'MISSED'} (target x1.1)")
    print(f"file size {small['file_mb']:.2f} MB vs {large['file_mb']:.2f} MB: "
          f"{'same' if abs(large['file_mb'] - small['file_mb']) < 0.01 else 'DIFFERENT'}; "
          f"{'met' if large['file_mb'] <= 25 else 'MISSED'} (target <= 25 MB)")


if __name__ == "__main__":
    main()
