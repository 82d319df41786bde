"""The small report of the installation page, step by step, beside a bare forward pass over the same tokens.

One process runs ``tl-geometry report --windows 2 --context 256`` (through
``tl_geometry.cli.main``, as the console script does) with a clock around each
step: loading the model, the analysis (one hooked pass per window with every
diagnostic the report draws), the check of the head roles against known
mechanisms, drawing the figures and the page, and writing the files. Right
after, in the same process and on the same loaded model:

- the analysis again with no optional diagnostic (the selection metrics
  alone), so that the analysis splits into the metrics and the diagnostics;
- a bare forward pass (no hooks) over the report's windows, one at a time as
  the command runs them, and over the check's prompts.

Every figure is printed as seconds and as a share of the command's wall time,
with the process's CPU time and the load average before and after: on a
shared machine absolute times move with the load, shares much less.

Run: ``PYTHONPATH=. python benchmarks/bench_main_job.py [--windows 2] [--context 256] [--mechanism-prompts 4]``.
Target (issue "A notebook-first library", a main job in a minute): the
command in at most 90 s of wall time on a quiet 2-core machine.
"""

import argparse
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch


class Clock:
    """Wall seconds per step, summed over calls; wraps a module's function in place."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.returned: dict[str, object] = {}

    def wrap(self, module: object, name: str, step: str) -> None:
        original = getattr(module, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                out = original(*args, **kwargs)
            finally:
                self.seconds[step] += time.perf_counter() - start
            self.returned[step] = out
            return out

        setattr(module, name, timed)


def bare_forward(model, windows: torch.Tensor) -> float:
    """Seconds of a forward pass with no hooks, one window at a time."""
    start = time.perf_counter()
    with torch.no_grad():
        for window in windows:
            model(window[None], return_type=None)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--mechanism-prompts", type=int, default=None,
                        help="prompts per set of the known-mechanism check (default: the command's default)")
    args = parser.parse_args()

    import tl_geometry.runs.corpus_run as corpus
    import tl_geometry.roles.prompt_sets as roles
    import tl_geometry.models as models
    import tl_geometry.report.html as html
    from tl_geometry.cli import build_parser, config_from_args
    from tl_geometry.cli import main as cli
    from tl_geometry.corpus_input.token_windows import text_windows
    from tl_geometry.corpus_input.plain_text import default_text

    analyze_corpus = corpus.analyze_corpus  # the unwrapped one, for the side-by-side run
    clock = Clock()
    clock.wrap(models, "load_model", "model load")
    clock.wrap(corpus, "analyze_corpus", "analysis")
    clock.wrap(roles, "check_known_mechanisms", "mechanism check")
    clock.wrap(html, "render_figures", "figures and page")
    clock.wrap(html, "render_html", "figures and page")
    clock.wrap(html, "write_report", "report (figures, page, files)")
    argv = ["report", "--windows", str(args.windows), "--context", str(args.context), "--quiet"]
    if args.mechanism_prompts is not None:
        argv += ["--mechanism-prompts", str(args.mechanism_prompts)]
    prompts = build_parser().parse_args(argv).mechanism_prompts

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        start, cpu = time.perf_counter(), time.process_time()
        assert cli([*argv, "--out", str(Path(tmp) / "report")]) == 0
        total, total_cpu = time.perf_counter() - start, time.process_time() - cpu
    load_after = os.getloadavg()[0]

    model = clock.returned["model load"]
    config = config_from_args(build_parser().parse_args(argv))
    windows = text_windows(model, default_text(), context=args.context, n_windows=args.windows)
    start = time.perf_counter()
    analyze_corpus(model, windows, config.with_overrides(diagnostics=()), batch_size=1, progress=False)
    metrics_alone = time.perf_counter() - start
    bare = bare_forward(model, windows)
    check_tokens = [roles.natural_text(model, prompts), roles.repeated_random_tokens(model, prompts)] if prompts else []
    start = time.perf_counter()
    with torch.no_grad():
        for tokens in check_tokens:
            model(tokens, return_type=None)
    bare_check = time.perf_counter() - start

    seconds = clock.seconds
    writing = seconds["report (figures, page, files)"] - seconds["figures and page"]
    analysis = seconds["analysis"]
    steps = [
        ("model load", seconds["model load"]),
        ("analysis: selection metrics (measured alone, after)", min(metrics_alone, analysis)),
        ("analysis: the diagnostics (the rest of the analysis)", max(analysis - metrics_alone, 0.0)),
        (f"mechanism check ({prompts} prompts per set)", seconds["mechanism check"]),
        ("figures and page", seconds["figures and page"]),
        ("writing the files", writing),
    ]
    steps.append(("the rest (imports, arguments, summary)", total - sum(s for _, s in steps)))
    print(f"tl-geometry {' '.join(argv)}: {total:.1f} s wall, {total_cpu:.1f} s CPU "
          f"(load average {load_before:.1f} before, {load_after:.1f} after; absolute times move with the load)")
    for name, s in steps:
        print(f"  {name:<55} {s:7.1f} s  {s / total:6.1%}")
    print(f"  bare forward over the report's {args.windows} x {args.context} tokens, one window at a time: {bare:.2f} s "
          f"(the analysis: {analysis / bare:.1f} times it)")
    if check_tokens:
        sizes = " and ".join(f"{t.shape[0]} x {t.shape[1]}" for t in check_tokens)
        print(f"  bare forward over the check's prompts ({sizes} tokens): {bare_check:.2f} s "
              f"(the check: {seconds['mechanism check'] / bare_check:.1f} times it)")
    print(f"target: at most 90 s of wall time on a quiet 2-core machine; here {total:.1f} s")


if __name__ == "__main__":
    main()
