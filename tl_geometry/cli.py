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
    _add_intervene_parser(commands, run)
    return parser


def _int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 1,2,4,8, got {text!r}") from None


def _float_list(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 0.01,0.05,0.1, got {text!r}") from None


def _add_intervene_parser(commands, run: argparse.ArgumentParser) -> None:
    """``tl-geometry intervene``: top-N interventions (its own block, so that other commands merge cleanly)."""
    intervene = commands.add_parser(
        "intervene",
        parents=[run],
        help="top-N interventions: how many keys the model, each layer or head needs",
        description="Keep only the top-N keys of every attention row (delete or renormalise) and measure the change "
        "in next-token NLL with random-ranking controls; optionally search N*_tau and correlate the geometry with "
        "dNLL. Writes OUT/sweep.npz + .json, OUT/interventions.html and, with --n-star, OUT/n_star.json.",
    )
    intervene.set_defaults(n_grid=[1, 2, 4, 8, 16, 32, 64, 128, 256], batch_size=8)
    intervene.add_argument("--modes", default="renormalise,delete", help="renormalise and/or delete (default: both)")
    intervene.add_argument("--scope", default="model", choices=["model", "layer", "head"], help="default: model")
    intervene.add_argument("--layers", type=_int_list, default=None, help="layers to intervene, e.g. 0,1,2 (default: all)")
    intervene.add_argument("--heads", type=_int_list, default=None, help="heads to intervene (default: all)")
    intervene.add_argument("--controls", type=int, default=16, help="random rankings per setting (default: 16)")
    intervene.add_argument("--ranking", default="attention", choices=["attention", "contribution"])
    intervene.add_argument("--n-star", action="store_true", help="also search N*_tau per unit (renormalise)")
    intervene.add_argument("--taus", type=_float_list, default=[0.01, 0.05, 0.1], help="default: 0.01,0.05,0.1")
    intervene.add_argument("--n-bootstrap", type=int, default=200, help="document-bootstrap replicates (default: 200)")


def _intervene(args: argparse.Namespace) -> int:
    """Run ``tl-geometry intervene``."""
    import json

    from tqdm.auto import tqdm

    from tl_geometry.analysis.interventions import geometry_vs_dnll
    from tl_geometry.capture.corpus import analyze_corpus
    from tl_geometry.capture.sweep import effective_set_size, intervention_sweep
    from tl_geometry.models import load_model
    from tl_geometry.report.html import intervention_figures, render_html, write_atomically
    from tl_geometry.text import default_text, read_text_files, text_windows

    for name in ("windows", "context", "batch_size"):
        if getattr(args, name) < 1:
            raise GeometryError(f"--{name.replace('_', '-')}: expected a positive number, got {getattr(args, name)}")
    if not isinstance(args.n_grid, list):
        raise GeometryError(f"--n-grid: intervene needs a list of N like 1,2,4,8, got {args.n_grid!r}")
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    text = read_text_files(args.text) if args.text else default_text()
    with tqdm(total=1, desc=f"tl_geometry: loading {args.model}", disable=args.quiet, bar_format="{desc} {elapsed}") as bar:
        model = load_model(args.model, progress=not args.quiet)
        bar.update()
    windows = text_windows(model, text, context=args.context, n_windows=args.windows)
    common = dict(layers=args.layers, heads=args.heads, ranking=args.ranking, n_bootstrap=args.n_bootstrap,
                  batch_size=args.batch_size, progress=not args.quiet)
    sweep = intervention_sweep(model, windows, args.n_grid, modes=modes, scope=args.scope, controls=args.controls, **common)
    args.out.mkdir(parents=True, exist_ok=True)
    sweep.save(args.out / "sweep")
    n_star = correlation = None
    if args.n_star:
        n_star = effective_set_size(model, windows, taus=tuple(args.taus), mode=modes[0], scope=args.scope, **common)
        table = {f"{tau:g}": {"n_star": n_star.n_star[t].tolist(), "low": n_star.low[t].tolist(),
                              "high": n_star.high[t].tolist()} for t, tau in enumerate(n_star.taus)}
        text_out = json.dumps({"layers": list(n_star.layers), "heads": list(n_star.heads), "mode": n_star.mode,
                               "taus": table}, indent=2)
        write_atomically(args.out / "n_star.json", text_out)
    geometry = analyze_corpus(model, windows, n_grid=args.n_grid, layers=args.layers, heads=args.heads,
                              bootstrap_fields=["precision", "recall", "f_score"], n_bootstrap=args.n_bootstrap,
                              batch_size=args.batch_size, progress=not args.quiet)
    if args.scope != "model":
        correlation = geometry_vs_dnll(geometry, sweep, mode=modes[0])
    tau = 0.05 if n_star is None or 0.05 in n_star.taus else n_star.taus[0]
    figures = intervention_figures(sweep, n_star, correlation, tau=tau)
    page = render_html(geometry, {"interventions": sweep.describe().splitlines()[0]}, extra_figures=figures)
    write_atomically(args.out / "interventions.html", page)
    print(sweep.describe())
    for mode in modes:
        print(f"relative dNLL ({mode}), first unit: " + ", ".join(
            f"N={n}: {v:.4f}" for n, v in zip(sweep.n_grid.tolist(), sweep.relative(mode)[0, 0].tolist())))
    if n_star is not None:
        print("N*_tau, first unit: " + ", ".join(f"{tau:g}: {n_star.n_star[t, 0, 0].item():g}" for t, tau in enumerate(n_star.taus)))
    print(f"wrote {args.out / 'sweep.npz'}, {args.out / 'interventions.html'}")
    return EXIT_OK


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

    for name in ("windows", "context", "batch_size"):
        if getattr(args, name) < 1:
            raise GeometryError(f"--{name.replace('_', '-')}: expected a positive number, got {getattr(args, name)}")
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
    if args.command == "intervene":
        return _intervene(args)
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


if __name__ == "__main__":
    sys.exit(main())
