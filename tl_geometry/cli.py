"""The ``tl-geometry`` command.

``tl-geometry report`` runs the main job: load a model (the embedded
SmolLM2-135M by default), cut a text (the Python reference documentation by
default) into windows, analyse every layer and head in one hooked pass per
batch, write the HTML report and the result files, and print a summary.
``tl-geometry analyze`` writes the result files only; ``tl-geometry plot
RESULT`` writes the report of saved results without a model.
"""

import argparse
import contextlib
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tl_geometry.errors import GeometryError

EXIT_OK, EXIT_USAGE, EXIT_INPUT = 0, 2, 1
# Everything the report draws is computed in the same hooked pass.
DIAGNOSTICS = "all"


def _n_grid_argument(text: str) -> str | list[int]:
    """``default``, ``all`` or comma-separated integers such as ``1,2,4,8``."""
    if text in ("default", "all"):
        return text
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'default', 'all' or integers like 1,2,4,8, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tl-geometry",
        description="Geometric analysis of token selection in multi-head attention (TransformerLens plugin). "
        "Exit codes: 0 done, 1 bad input (one-line message), 2 bad command line, 130 interrupted (SIGINT), "
        "143 terminated (SIGTERM).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = argparse.ArgumentParser(add_help=False)
    run.add_argument("--model", default="smollm2-135m", help="model name (default: the embedded smollm2-135m)")
    run.add_argument(
        "--text", nargs="+", type=Path, metavar="FILE", help="text files to analyse (default: Python's reference docs)"
    )
    run.add_argument("--windows", type=int, default=16, help="number of text windows (default: 16)")
    run.add_argument("--context", type=int, default=1024, help="tokens per window, BOS included (default: 1024)")
    run.add_argument(
        "--n-grid", type=_n_grid_argument, default="default", help="'default', 'all' or a list like 1,2,4,8"
    )
    run.add_argument("--batch-size", type=int, default=1, help="windows per forward pass (default: 1)")
    run.add_argument("--out", type=Path, default=Path("report"), help="output directory (default: report)")
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    report = commands.add_parser(
        "report",
        parents=[run],
        help="analyse a model on a text and write the HTML report (the main job)",
        description="Analyse every layer and head of a model on windows of a text; write OUT/index.html "
        "(self-contained, opens offline), OUT/result.npz and OUT/result.json, and print a summary.",
    )
    report.add_argument("--png", action="store_true", help="also write a PNG of every figure (kaleido + Chromium)")
    commands.add_parser(
        "analyze",
        parents=[run],
        help="analyse a model on a text and write the result files only",
        description="Like report, without the HTML: write OUT/result.npz and OUT/result.json.",
    )
    plot = commands.add_parser(
        "plot",
        help="write the HTML report of saved results (no model needed)",
        description="Read RESULT.npz and RESULT.json (as written by report or analyze) and write OUT/index.html.",
    )
    plot.add_argument("result", type=Path, help="path of the saved result, with or without .npz")
    plot.add_argument("--out", type=Path, default=Path("report"), help="output directory (default: report)")
    plot.add_argument("--png", action="store_true", help="also write a PNG of every figure (kaleido + Chromium)")
    return parser


def _summary(result, seconds: float) -> str:
    """A few lines on what was measured: mean P and R by N, and the layers' means at small N."""
    import torch

    grid = result.n_grid.tolist()
    precision = torch.nanmean(result.precision.flatten(0, 1), dim=0)
    recall = torch.nanmean(result.recall.flatten(0, 1), dim=0)
    shown = [i for i, n in enumerate(grid) if n in (1, 2, 4, 8, 16, 64, 256, 1024) or i == len(grid) - 1]
    lines = [
        f"analysed {result.n_sequences} windows x {len(result.layers)} layers x {len(result.heads)} heads "
        f"in {seconds:.1f} s",
        "mean over heads   " + "".join(f"{'N=' + str(grid[i]):>8}" for i in shown),
        "  Precision(r_max)" + "".join(f"{precision[i].item():>8.3f}" for i in shown),
        "  Recall(r_min)   " + "".join(f"{recall[i].item():>8.3f}" for i in shown),
    ]
    return "\n".join(lines)


def _analyse(args: argparse.Namespace):
    """Load the model and text, analyse the windows; the result and the summary-table details."""
    from tqdm.auto import tqdm

    from tl_geometry.capture.corpus import analyze_corpus
    from tl_geometry.models import load_model
    from tl_geometry.text import default_text, read_text_files, text_windows

    text = read_text_files(args.text) if args.text else default_text()
    # A one-step bar: the cached load takes seconds, the first export of a bundled model longer
    # (load_model then shows its own steps).
    with tqdm(total=1, desc=f"tl_geometry: loading {args.model}", disable=args.quiet, bar_format="{desc} {elapsed}") as bar:
        model = load_model(args.model, progress=not args.quiet)
        bar.update()
    windows = text_windows(model, text, context=args.context, n_windows=args.windows)
    result = analyze_corpus(
        model, windows, batch_size=args.batch_size, progress=not args.quiet, n_grid=args.n_grid, diagnostics=DIAGNOSTICS
    )
    source = ", ".join(str(path) for path in args.text) if args.text else "Python reference documentation (pydoc_data)"
    details = {"text": source, "windows": f"{len(windows)} x {args.context} tokens (BOS first)"}
    return result, details


def run_command(args: argparse.Namespace) -> int:
    from tl_geometry.report.html import write_report
    from tl_geometry.results.result import GeometryResult

    start = time.perf_counter()
    if args.command == "plot":
        result = GeometryResult.load(args.result)
        index = write_report(result, args.out, {"source": str(args.result)}, png=args.png)
        print(f"wrote {index}")
        return EXIT_OK
    result, details = _analyse(args)
    print(_summary(result, time.perf_counter() - start))
    if args.command == "report":
        index = write_report(result, args.out, details, png=args.png)
        print(f"wrote {index} (open it in a browser; it works offline)")
    else:
        npz_path, json_path = result.save(args.out / "result")
        print(f"wrote {npz_path} and {json_path}")
    return EXIT_OK


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised in the main thread so that every ``finally`` and ``except`` cleans up."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def _install_signal_handlers() -> dict[int, object]:
    """SIGINT and SIGTERM raise `Interrupted` (SIGTERM would otherwise kill before any cleanup); the old ones."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}  # signals reach the main thread only
    return {signum: signal.signal(signum, _raise_interrupted) for signum in (signal.SIGINT, signal.SIGTERM)}


def _writable_folder(out: Path) -> None:
    """Raise unless ``out`` is (or can be created as) a folder this process can write in."""
    if out.exists() and not out.is_dir():
        raise GeometryError(f"--out: {out} is a file, not a folder; pass a folder for the result (it is created)")
    existing = out
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise GeometryError(f"--out: {existing} is a file, so {out} cannot be created; pass another folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise GeometryError(f"--out: cannot write in {existing} (permission denied); pass a folder you can write to")


def check_arguments(args: argparse.Namespace) -> None:
    """Everything the command line says that can be checked before a model loads (GeometryError otherwise)."""
    _writable_folder(args.out)
    if args.command == "plot":
        from tl_geometry.results.result import GeometryResult

        npz_path, json_path = GeometryResult.paths(args.result)
        missing = [str(p) for p in (npz_path, json_path) if not p.is_file()]
        if missing:
            raise GeometryError(f"plot: {' and '.join(missing)} not found; pass the result written by analyze or report")
        return
    for name in ("windows", "context", "batch_size"):
        if getattr(args, name) < 1:
            raise GeometryError(f"--{name.replace('_', '-')}: expected a positive number, got {getattr(args, name)}")
    if isinstance(args.n_grid, list) and (not args.n_grid or min(args.n_grid) < 1):
        raise GeometryError(f"--n-grid: expected N >= 1 such as 1,2,4,8, got {args.n_grid}")
    for path in args.text or []:
        if not path.is_file() or not os.access(path, os.R_OK):
            why = "is a folder" if path.is_dir() else "cannot be read" if path.exists() else "does not exist"
            raise GeometryError(f"--text: {path} {why}; pass readable text files")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tl-geometry`` console script; returns the exit code.

    Every argument is checked before the model loads, and the output folder is
    locked for the whole run (a second run on it is refused at once). SIGINT
    and SIGTERM end the run with 130 and 143 and a one-line message; the
    previous result in the folder is kept and no temporary file is left.
    """
    from tl_geometry.results.files import folder_lock

    args = build_parser().parse_args(argv)
    previous = _install_signal_handlers()
    created = not args.out.exists()
    try:
        check_arguments(args)
        # Under torchrun / accelerate only rank 0 writes the result, so only it holds --out.
        with folder_lock(args.out) if os.environ.get("RANK", "0") == "0" else contextlib.nullcontext():
            return run_command(args)
    except (GeometryError, OSError) as error:
        print(f"tl-geometry: error: {error}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt as error:
        signum = error.signum if isinstance(error, Interrupted) else signal.SIGINT
        what = "interrupted" if signum == signal.SIGINT else "terminated"
        print(f"tl-geometry: {what} ({signal.Signals(signum).name}); no partial files were left in {args.out}",
              file=sys.stderr)
        return 128 + signum
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if created and args.out.is_dir() and not any(args.out.iterdir()):
            with contextlib.suppress(OSError):  # another run may have just started writing there
                args.out.rmdir()  # a run that wrote nothing leaves no empty folder behind


if __name__ == "__main__":
    sys.exit(main())
