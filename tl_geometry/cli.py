"""The ``tl-geometry`` command.

``tl-geometry report`` runs the main job: load a model (the embedded
SmolLM2-135M by default), cut a text (the Python reference documentation by
default) into windows, analyse every layer and head in one hooked pass per
batch, write the HTML report and the result files, and print a summary.
``tl-geometry analyze`` writes the result files only; ``tl-geometry plot
RESULT`` writes the report of saved results without a model.
"""

import argparse
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


def _add_scale_arguments(run: argparse.ArgumentParser) -> None:
    """Device, dtype and checkpoints of a corpus run (one block, so that other flags merge around it)."""
    run.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1 or mps; under torchrun, cuda is "
                     "cuda:LOCAL_RANK")
    run.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                     help="the model's weights (default float32); the analysis itself runs in float32 at least")
    run.add_argument("--checkpoint-every", default="5m", metavar="N|DURATION",
                     help="checkpoint after N windows or a duration such as 90s, 5m (default), 1h; a run started "
                     "again with the same arguments resumes from its checkpoint")
    run.add_argument("--checkpoint", type=Path, metavar="FILE",
                     help="the checkpoint file (default: OUT/.tl_geometry-checkpoint.pt; deleted when the run ends)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tl-geometry",
        description="Geometric analysis of token selection in multi-head attention (TransformerLens plugin). "
        "Exit codes: 0 done, 1 bad input (one-line message), 2 bad command line, 130 interrupted.",
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
    _add_scale_arguments(run)
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

    from tl_geometry.capture import distributed
    from tl_geometry.capture.checkpoint import CheckpointEvery
    from tl_geometry.capture.corpus import analyze_corpus
    from tl_geometry.models import check_device, load_model
    from tl_geometry.text import default_text, read_text_files, text_windows

    for name in ("windows", "context", "batch_size"):
        if getattr(args, name) < 1:
            raise GeometryError(f"--{name.replace('_', '-')}: expected a positive number, got {getattr(args, name)}")
    every = CheckpointEvery.parse(args.checkpoint_every)
    check_device(args.device)
    ranks = distributed.init_from_env(args.device)
    quiet = args.quiet or not ranks.is_main
    text = read_text_files(args.text) if args.text else default_text()
    # A one-step bar: the cached load takes seconds, the first export of a bundled model longer
    # (load_model then shows its own steps).
    with tqdm(total=1, desc=f"tl_geometry: loading {args.model}", disable=quiet, bar_format="{desc} {elapsed}") as bar:
        if not ranks.is_main:
            distributed.barrier()  # rank 0 first: it alone fills the model cache
        model = load_model(args.model, device=distributed.rank_device(args.device, ranks), dtype=args.dtype,
                           progress=not quiet)
        if ranks.is_main:
            distributed.barrier()
        bar.update()
    windows = text_windows(model, text, context=args.context, n_windows=args.windows)
    result = analyze_corpus(
        model, windows, batch_size=args.batch_size, progress=not quiet, n_grid=args.n_grid, diagnostics=DIAGNOSTICS,
        checkpoint=args.checkpoint or args.out / ".tl_geometry-checkpoint.pt", checkpoint_every=every,
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
    if not _is_main_process():
        return EXIT_OK  # every rank holds the result; rank 0 writes it
    print(_summary(result, time.perf_counter() - start))
    if args.command == "report":
        index = write_report(result, args.out, details, png=args.png)
        print(f"wrote {index} (open it in a browser; it works offline)")
    else:
        npz_path, json_path = result.save(args.out / "result")
        print(f"wrote {npz_path} and {json_path}")
    return EXIT_OK


def _is_main_process() -> bool:
    from tl_geometry.capture.distributed import current_ranks

    return current_ranks().is_main


def _leave_process_group() -> None:
    """Leave the torchrun process group, if this run joined one."""
    import torch.distributed

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tl-geometry`` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        return run_command(args)
    except (GeometryError, OSError) as error:
        print(f"tl-geometry: error: {error}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        print("tl-geometry: interrupted", file=sys.stderr)
        return 130
    finally:
        _leave_process_group()


if __name__ == "__main__":
    sys.exit(main())
