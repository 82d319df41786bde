"""Lazy corpus reading and prefix tokenising against tokenising a text whole: time and peak memory to the first windows.

Writes a text file of about ``--mb`` MB (the CPython reference docs, repeated),
then, each in a fresh process so that peak memory is its own, draws
``--windows`` windows of ``--context`` tokens with the default model's
tokenizer (loaded from the model cache, no weights):

- lazy: ``read_corpus(tokenizer, file, n_windows=...)`` (reads and tokenises
  a piece at a time, stops when enough windows are out);
- prefix: ``text_windows(tokenizer, file.read_text(), n_windows=...)`` (the
  text in memory, only the prefix the windows need tokenised);
- whole: the whole text tokenised, then cut (what ``text_windows`` did before).

Prints seconds and peak resident memory of each, and their ratios.

    python benchmarks/bench_sources.py --mb 16 --windows 1
"""

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tokenizer():
    from transformers import AutoTokenizer

    from tl_geometry.models import load_model, model_cache_dir

    export = model_cache_dir() / "models" / "smollm2-135m"
    if not (export / "tokenizer.json").exists():
        load_model(progress=False)  # the first use exports the bundled model
    return AutoTokenizer.from_pretrained(str(export))


def _child(mode: str, path: str, context: int, windows: int) -> None:
    tokenizer = _tokenizer()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if mode == "lazy":
        from tl_geometry.corpus_input.token_windows import read_corpus

        got = len(list(read_corpus(tokenizer, path, context=context, n_windows=windows)))
    elif mode == "prefix":
        from tl_geometry.corpus_input.token_windows import text_windows

        got = len(text_windows(tokenizer, Path(path).read_text(), context=context, n_windows=windows))
    else:
        from tl_geometry.corpus_input.token_windows import text_windows

        got = len(text_windows(tokenizer, Path(path).read_text(), context=context)[:windows])
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": seconds, "extra_mib": (peak - base) / 1024, "windows": got}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=16)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--windows", type=int, default=1)
    parser.add_argument("--child", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child[0], args.child[1], args.context, args.windows)
        return
    from tl_geometry.corpus_input.plain_text import default_text

    text = default_text()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "corpus.txt"
        with open(path, "w", encoding="utf-8") as f:
            while f.tell() < args.mb * 1e6:
                f.write(text)
        size = path.stat().st_size / 1e6
        runs = {}
        for mode in ("lazy", "prefix", "whole"):
            done = subprocess.run(
                [sys.executable, __file__, "--child", mode, str(path), "--context", str(args.context),
                 "--windows", str(args.windows)],
                capture_output=True, text=True, check=True, cwd=ROOT,
            )
            runs[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{size:.1f} MB of text, {args.windows} window(s) of {args.context} tokens, SmolLM2 tokenizer")
    for mode, run in runs.items():
        print(f"  {mode:6}  {run['seconds']:7.2f} s   +{run['extra_mib']:8.1f} MiB peak")
    whole = runs["whole"]
    for mode in ("lazy", "prefix"):
        run = runs[mode]
        # The peak is a high-water mark: loading the tokenizer sets the baseline, so "+0.0" means "never above it".
        memory = (f"x{whole['extra_mib'] / run['extra_mib']:.0f}" if run["extra_mib"] >= 1
                  else f"{whole['extra_mib']:.0f} MiB against under 1 MiB")
        print(f"  whole / {mode}: time x{whole['seconds'] / run['seconds']:.0f}, extra memory {memory}")


if __name__ == "__main__":
    main()
