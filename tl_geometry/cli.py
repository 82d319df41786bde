"""The ``tl-geometry`` command.

``tl-geometry report`` runs the main job: load a model (the embedded
SmolLM2-135M by default), cut a text (the Python reference documentation by
default) into windows, analyse every layer and head in one hooked pass per
batch, write the HTML report and the result files, and print a summary.
``tl-geometry analyze`` writes the result files only; ``tl-geometry plot
RESULT`` writes the report of saved results without a model; ``tl-geometry
merge OUT IN1 IN2 ...`` merges saved results of one model and config.

Inputs (``--data``): text files, JSONL / CSV / Parquet files with a text
column, ``.npy`` token ids, directories of them and datasets saved with
``save_to_disk``, read lazily (`tl_geometry.corpus_input.token_windows`); or
``--prompts FILE`` with one prompt per line, each analysed whole. The
analysis options mirror `tl_geometry.GeometryConfig` (`config_from_args`).
"""

import argparse
import contextlib
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, get_args

from tl_geometry._types import Distance, Ranking
from tl_geometry.config import DEFAULT_BOOTSTRAP, Capture, GeometryConfig
from tl_geometry.errors import GeometryError

EXIT_OK, EXIT_USAGE, EXIT_INPUT = 0, 2, 1
DEFAULT_OUT = {"report": "report", "analyze": "analysis", "intervene": "interventions", "plot": "report"}
"""Each command's output folder when ``--out`` is not given."""
# Where a run checkpoints by default: in its output folder, removed when the run ends.
CHECKPOINT_NAME = ".tl_geometry-checkpoint.pt"


def _n_grid_argument(text: str) -> str | list[int]:
    """``default``, ``all`` or comma-separated integers such as ``1,2,4,8``."""
    if text in ("default", "all"):
        return text
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'default', 'all' or integers like 1,2,4,8, got {text!r}") from None


def _int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 0,1,2, got {text!r}") from None


def _indices_argument(text: str) -> list[int] | None:
    """``all`` or comma-separated indices such as ``0,5,17``."""
    return None if text == "all" else _int_list(text)


def _queries_argument(text: str) -> str | list[int]:
    """``last``, ``all`` or comma-separated positions (negative: from the end; write ``--queries=-1,-2``)."""
    return text if text in ("last", "all") else _int_list(text)


def _picture_argument(text: str) -> tuple[int, int]:
    """``L.H``: a layer and a head, e.g. ``18.6``."""
    layer, dot, head = text.partition(".")
    if not dot or not layer.isdigit() or not head.isdigit():
        raise argparse.ArgumentTypeError(f"expected LAYER.HEAD such as 18.6 (layer 18, head 6), got {text!r}")
    return int(layer), int(head)


def _diagnostics_argument(text: str) -> str | list[str]:
    """``all``, ``none`` or comma-separated diagnostic names (a former name, such as ``taxonomy``, with a notice)."""
    from tl_geometry.diagnostics.registry import REGISTRY

    if text in ("all", "none"):
        return "all" if text == "all" else []
    names = [part.strip() for part in text.split(",") if part.strip()]
    for name in names:
        if (now := REGISTRY.current_name(name)) != name:  # on stderr: a console shows no DeprecationWarning
            print(f"tl-geometry: warning: --diagnostics {name} is deprecated; it is now called {now}", file=sys.stderr)
    return [REGISTRY.current_name(name) for name in names]


def _windows_argument(text: str) -> int | None:
    """A number of windows, or ``all`` for the whole corpus."""
    if text == "all":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of windows or 'all', got {text!r}") from None


def _add_analysis_options(run: argparse.ArgumentParser) -> None:
    """Inputs and every GeometryConfig option (see `config_from_args`)."""
    inputs = run.add_argument_group("input")
    inputs.add_argument(
        "--data", "--text", dest="data", nargs="+", type=Path, metavar="PATH",
        help="text, .jsonl, .csv, .parquet or .npy files, directories of them, or a dataset saved with "
        "save_to_disk (default: Python's reference docs)",
    )
    inputs.add_argument("--prompts", type=Path, metavar="FILE",
                        help="a file with one prompt per line, each analysed whole (instead of windows)")
    inputs.add_argument("--text-column", default="text", help="column of the text in tables and datasets (default: text)")
    inputs.add_argument("--min-context", type=int, default=None,
                        help="also keep a document's shorter last window of at least this many tokens "
                        "(default: full windows only)")
    analysis = run.add_argument_group("analysis (as in GeometryConfig)")
    analysis.add_argument("--layers", type=_indices_argument, default=None,
                          help="'all' (default) or e.g. 0,5,17 (negative from the end: --layers=-1 is the last)")
    analysis.add_argument("--heads", type=_indices_argument, default=None,
                          help="'all' (default) or e.g. 0,3 (negative from the end: --heads=-1)")
    analysis.add_argument("--queries", type=_queries_argument, default="last",
                          help="'last' (default), 'all' or positions like 0,5 (negative from the end: --queries=-1,-2)")
    analysis.add_argument("--ranking", choices=get_args(Ranking), default="attention", help="top-N score (default: attention)")
    analysis.add_argument("--distance", choices=get_args(Distance), default="euclidean", help="D_i (default: euclidean)")
    analysis.add_argument("--diagnostics", type=_diagnostics_argument, default=None,
                          help="'all', 'none' or names like assumptions,roles (default: every one that applies "
                          "to the other options; the bounds need --distance euclidean)")
    analysis.add_argument("--bootstrap", type=int, default=DEFAULT_BOOTSTRAP,
                          help=f"Poisson-bootstrap replicates over documents (default: {DEFAULT_BOOTSTRAP}; 0: none)")
    analysis.add_argument("--seed", type=int, default=0, help="seed of the bootstrap weights (default: 0)")
    analysis.add_argument("--keep-queries", action="store_true",
                          help="also keep every analysed query's row (P and R by query position in the report's head "
                          "panel; the file grows with the queries: for a few prompts, not a corpus)")
    analysis.add_argument("--capture", choices=get_args(Capture), default="auto",
                          help="'rows': run the model's fast attention and build only the analysed query rows "
                          "(TransformerBridge models; see the scale page); 'pattern': read each layer's whole "
                          "attention pattern (eager attention); 'auto' (default): the rows where the model can")
    analysis.add_argument("--picture", type=_picture_argument, action="append", default=[], metavar="L.H",
                          help="keep one query row of head H of layer L (e.g. 18.6; repeatable) and draw Figure 1 on "
                          "the model's data in the report: the keys' y_i, s(N) and both balls (a few kB per head)")


def config_from_args(args: argparse.Namespace) -> GeometryConfig:
    """The GeometryConfig the command-line options ask for (GeometryError naming a bad option)."""
    config = GeometryConfig(
        n_grid=args.n_grid, query_positions=args.queries, layers=args.layers, heads=args.heads,
        ranking=args.ranking, distance=args.distance, diagnostics=() if args.diagnostics is None else args.diagnostics,
        n_bootstrap=args.bootstrap, seed=args.seed, keep_queries=getattr(args, "keep_queries", False),
        picture_heads=getattr(args, "picture", ()), capture=getattr(args, "capture", "auto"),
    )
    if args.diagnostics is None:  # the default: everything the report can draw, where it applies
        from tl_geometry.diagnostics.registry import REGISTRY

        applies = []
        for name in REGISTRY.optional_names():
            try:
                REGISTRY.get(name).check(config)
            except GeometryError:
                continue
            applies.append(name)
        config = config.with_overrides(diagnostics=applies)
    return config


def _add_scale_arguments(run: argparse.ArgumentParser) -> None:
    """Device, dtype and checkpoints of a corpus run (one block, so that other flags merge around it)."""
    run.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1 or mps; under torchrun, cuda is "
                     "cuda:LOCAL_RANK")
    run.add_argument("--device-map", type=_device_map_argument, default=None, metavar="auto|balanced|MAP",
                     help="split the model across devices as Hugging Face places it: auto, balanced, "
                     "balanced_low_0, sequential, or a map from module names to devices (0, cuda:1, cpu, disk) as "
                     "JSON or a JSON file; instead of --device, on transformer-lens 4.x")
    run.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                     help="the model's weights (default float32); the analysis itself runs in float32 at least")
    run.add_argument("--checkpoint-every", default="5m", metavar="N|DURATION",
                     help="checkpoint after N windows or a duration such as 90s, 5m (default), 1h; a run started "
                     "again with the same arguments resumes from its checkpoint")
    run.add_argument("--checkpoint", type=Path, metavar="FILE",
                     help=f"the checkpoint file (default: OUT/{CHECKPOINT_NAME}; deleted when the run ends)")


def _device_map_argument(text: str) -> str | dict[str, str | int]:
    """``--device-map``: a strategy name, a JSON object, or a JSON file holding one; checked before loading."""
    import json

    from tl_geometry.models import check_device_map

    try:
        if text.lstrip().startswith("{"):
            device_map: Any = json.loads(text)
        elif Path(text).is_file():
            device_map = json.loads(Path(text).read_text())
        elif text.endswith(".json"):
            raise GeometryError(f"{text!r}: no such file; pass a JSON file of the map, a JSON object or a strategy")
        else:
            device_map = text
        return check_device_map(device_map)
    except (GeometryError, ValueError, OSError) as error:  # argparse shows only these errors' own message
        raise argparse.ArgumentTypeError(str(error)) from None


def _close_option(word: str, parser: argparse.ArgumentParser) -> str | None:
    """The option of ``parser`` closest to a misspelled ``word`` (``--contxt=256`` -> ``--context``), if any."""
    import difflib

    options = [o for action in parser._actions for o in action.option_strings if o.startswith("--")]
    close = difflib.get_close_matches(word.split("=", 1)[0], options, n=1, cutoff=0.6)
    return close[0] if close else None


class _Parser(argparse.ArgumentParser):
    """The top-level parser: a misspelled option or command gets the closest one and the command's usage."""

    commands: dict[str, argparse.ArgumentParser]

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self.commands.get(getattr(parsed, "command", None) or "", self)
            hints = [f"{word} (did you mean {close}?)" if (close := _close_option(word, command)) else word
                     for word in extras]
            command.error(f"unrecognized arguments: {' '.join(hints)}")  # the command's usage, exit 2
        if getattr(parsed, "out", "") is None:  # set here: the commands share one --out action (one default)
            parsed.out = Path(DEFAULT_OUT[parsed.command])
        return parsed

    def error(self, message: str) -> Any:
        import difflib
        import re

        choice = re.match(r"argument COMMAND: invalid choice: '([^']*)'", message)
        close = difflib.get_close_matches(choice.group(1), list(self.commands), n=1) if choice else []
        if close:
            message += f"; did you mean {close[0]!r}?"
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tl-geometry",
        description="Geometric analysis of token selection in multi-head attention (TransformerLens plugin). "
        "Exit codes: 0 done, 1 bad input (one-line message), 2 bad command line, 130 interrupted (SIGINT), "
        "143 terminated (SIGTERM).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = argparse.ArgumentParser(add_help=False)
    run.add_argument("--model", default="smollm2-135m", help="model name (default: the embedded smollm2-135m)")
    run.add_argument("--windows", type=_windows_argument, default=16,
                     help="number of windows, or 'all' (default: 16)")
    run.add_argument("--context", type=int, default=1024, help="tokens per window, BOS included (default: 1024)")
    run.add_argument(
        "--n-grid", type=_n_grid_argument, default="default", help="'default', 'all' or a list like 1,2,4,8"
    )
    run.add_argument("--batch-size", type=int, default=1, help="windows per forward pass (default: 1)")
    # Each command writes to its own folder by default, so that analyze or intervene never replaces a report.
    run.add_argument("--out", type=Path, default=None,
                     help="output directory (default: report, analysis or interventions, after the command)")
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    _add_analysis_options(run)
    _add_scale_arguments(run)
    report = commands.add_parser(
        "report",
        parents=[run],
        help="analyse a model on a text and write the HTML report (the main job)",
        description="Analyse every layer and head of a model on windows of a text; write OUT/index.html "
        "(self-contained, opens offline), OUT/result.npz and OUT/result.json, and print a summary.",
    )
    report.add_argument("--png", action="store_true", help="also write a PNG of every figure (kaleido + Chromium)")
    report.add_argument("--mechanism-prompts", type=int, default=4, metavar="N",
                        help="prompts in each set of the check of the head roles against known mechanisms "
                        "(natural text, repeated random tokens; default: 4, as check_known_mechanisms); 0 leaves "
                        "the check out")
    analyze = commands.add_parser(
        "analyze",
        parents=[run],
        help="analyse a model on a text and write the result files only",
        description="Like report, without the HTML: write OUT/result.npz and OUT/result.json.",
    )
    analyze.add_argument("--parquet", action="store_true",
                         help="also write OUT/statistics.parquet (result.to_dataframe(), one row per statistic)")
    merge = commands.add_parser(
        "merge",
        help="merge saved results of one model and config (other machines, runs or shards)",
        description="Read each INPUT (a result stem, file, or a directory holding result.npz/json) and write "
        "their merge to OUT/result.npz and OUT/result.json; results of different models or configs are "
        "refused, naming the difference.",
    )
    merge.add_argument("out", type=Path, help="output directory")
    merge.add_argument("inputs", nargs="+", type=Path, metavar="INPUT", help="saved results to merge (at least two)")
    plot = commands.add_parser(
        "plot",
        help="write the HTML report of saved results (no model needed)",
        description="Read RESULT.npz and RESULT.json (as written by report or analyze) and write OUT/index.html.",
    )
    plot.add_argument("result", type=Path, help="path of the saved result, with or without .npz")
    plot.add_argument("--out", type=Path, default=Path("report"), help="output directory (default: report)")
    plot.add_argument("--png", action="store_true", help="also write a PNG of every figure (kaleido + Chromium)")
    _add_intervene_parser(commands, run)
    _add_compare_parser(commands)
    parser.commands = dict(commands.choices)
    return parser


# ---- compare: two saved results side by side, one figure per claim of the paper ----


def _add_compare_parser(commands) -> None:
    compare = commands.add_parser(
        "compare",
        help="two saved results side by side (e.g. SmolLM2 and Gemma-3), one figure per claim of the paper",
        description="Read two saved results (as written by report or analyze) and write OUT/compare.html "
        "(self-contained, opens offline) and OUT/claims_<model>.csv for each (tl_geometry.claims). Files "
        "already in OUT are kept.",
    )
    compare.add_argument("out", type=Path, help="output directory")
    compare.add_argument("a", type=Path, metavar="A", help="the first saved result (stem, .npz or its folder)")
    compare.add_argument("b", type=Path, metavar="B", help="the second saved result")


def _compare(args: argparse.Namespace) -> int:
    from tl_geometry.report.compare import compare

    index = compare(args.a, args.b, args.out).path
    print(f"wrote {index} and the claims tables beside it (open it in a browser; it works offline)")
    return EXIT_OK


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
        "dNLL. Writes OUT/sweep.npz + .json, OUT/interventions.html, with --n-star OUT/n_star.json, and with a "
        "layer or head scope OUT/correlation.json (Spearman of F_N against dNLL across the units, by N).",
    )
    intervene.add_argument("--modes", default="renormalise,delete", help="renormalise and/or delete (default: both)")
    intervene.add_argument("--scope", default="model", choices=["model", "layer", "head"], help="default: model")
    intervene.add_argument("--controls", type=int, default=16, help="random rankings per setting (default: 16)")
    intervene.add_argument("--settings-per-pass", type=int, default=1,
                           help="settings (mode, N, control) stacked in one forward pass; memory grows with it "
                                "x --batch-size (default: 1)")
    intervene.add_argument("--n-star", action="store_true", help="also search N*_tau per unit (renormalise)")
    intervene.add_argument("--taus", type=_float_list, default=[0.01, 0.05, 0.1], help="default: 0.01,0.05,0.1")
    intervene.add_argument("--ablate-roles", action="store_true",
                           help="instead of the top-N sweep: zero- and mean-ablate each head role, sub-type and detector "
                                "group (tl_geometry.interventions.ablate_roles) against random head sets of the same size and layers; the "
                                "first --windows windows are evaluated, the next --windows give the mean z. Writes "
                                "OUT/ablation.csv, OUT/ablation.md and OUT/ablation.html (the roles with their ablations beside them)")
    intervene.add_argument("--random-sets", type=int, default=8, help="with --ablate-roles: random head sets per group "
                           "(default: 8)")


def _intervene(args: argparse.Namespace) -> int:
    """Run ``tl-geometry intervene``."""
    if args.ablate_roles:
        return _ablate_roles(args)
    import torch

    from tl_geometry.analysis.sweep_statistics import geometry_vs_dnll
    from tl_geometry.runs.corpus_run import analyze_corpus
    from tl_geometry.interventions.sweep import DEFAULT_SWEEP_GRID, effective_set_size, intervention_sweep
    from tl_geometry.diagnostics.selection import F_SCORE, PRECISION, RECALL
    from tl_geometry.report.html import intervention_figures, render_html
    from tl_geometry.atomic_io import atomic_path, json_text

    if args.n_grid == "all":
        raise GeometryError("--n-grid: intervene needs a list of N like 1,2,4,8 (each N is a forward pass), not 'all'")
    n_grid = list(DEFAULT_SWEEP_GRID) if args.n_grid == "default" else args.n_grid
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    model, quiet = _load_model_on_every_rank(args)  # under torchrun each rank sweeps its share of the windows
    stream, _ = _corpus(args, model, None)
    windows = torch.stack([window.tokens for window in stream])  # full windows: one length

    def write_text(path: Path, text: str) -> None:
        with atomic_path(path) as tmp:
            tmp.write_text(text)

    common = dict(layers=args.layers, heads=args.heads, ranking=args.ranking, n_bootstrap=args.bootstrap,
                  batch_size=args.batch_size, settings_per_pass=args.settings_per_pass, progress=not quiet)
    sweep = intervention_sweep(model, windows, n_grid, modes=modes, scope=args.scope, controls=args.controls, **common)
    main = _is_main_process()  # every rank holds the reduced sweep; rank 0 writes
    if main:
        args.out.mkdir(parents=True, exist_ok=True)
        sweep.save(args.out / "sweep")
    n_star = correlation = None
    if args.n_star:
        n_star = effective_set_size(model, windows, taus=tuple(args.taus), mode=modes[0], scope=args.scope, **common)
        table = {f"{tau:g}": {"n_star": n_star.n_star[t].tolist(), "low": n_star.low[t].tolist(),
                              "high": n_star.high[t].tolist()} for t, tau in enumerate(n_star.taus)}
        text_out = json_text({"layers": list(n_star.layers), "heads": list(n_star.heads), "mode": n_star.mode,
                              "max_n": n_star.max_n, "taus": table,
                              "null": "n_star: no N up to max_n passes; high: replicates that never pass"}, indent=2)
        if main:
            write_text(args.out / "n_star.json", text_out)
    geometry = analyze_corpus(model, windows, n_grid=n_grid, layers=args.layers, heads=args.heads,
                              bootstrap_fields=[f.name for f in (PRECISION, RECALL, F_SCORE)],
                              n_bootstrap=args.bootstrap, batch_size=args.batch_size, progress=not quiet)
    if not main:
        return EXIT_OK
    if args.scope != "model":
        correlation = geometry_vs_dnll(geometry, sweep, mode=modes[0])
        write_text(args.out / "correlation.json", json_text({
            "field": correlation.field, "mode": correlation.mode, "n_grid": correlation.n_grid.tolist(),
            "spearman": correlation.rho.tolist(), "low": correlation.low.tolist(), "high": correlation.high.tolist(),
            "units": [list(unit) for unit in correlation.units],
            "geometry": correlation.x.tolist(), "dnll": correlation.y.tolist(),
            "null": "a value not defined (e.g. rho where a unit's geometry or dNLL is constant or missing)",
        }, indent=2))
    tau = 0.05 if n_star is None or 0.05 in n_star.taus else n_star.taus[0]
    figures = intervention_figures(sweep, n_star, correlation, tau=tau)
    page = render_html(geometry, {"interventions": sweep.describe().splitlines()[0]}, extra_figures=figures)
    write_text(args.out / "interventions.html", page)
    print(sweep.describe())
    for mode in modes:
        print(f"relative dNLL ({mode}), first unit: " + ", ".join(
            f"N={n}: {v:.4f}" for n, v in zip(sweep.n_grid.tolist(), sweep.relative(mode)[0, 0].tolist())))
    if n_star is not None:
        print("N*_tau, first unit: " + ", ".join(f"{tau:g}: {n_star.n_star[t, 0, 0].item():g}" for t, tau in enumerate(n_star.taus)))
    written = [args.out / "sweep.npz", args.out / "interventions.html"]
    written += [args.out / name for name, made in (("n_star.json", n_star), ("correlation.json", correlation)) if made]
    print("wrote " + ", ".join(str(path) for path in written))
    return EXIT_OK


def _ablate_roles(args: argparse.Namespace) -> int:
    """``tl-geometry intervene --ablate-roles``: the roles on the evaluated windows, then `tl_geometry.interventions.ablate_roles`."""
    import torch

    from tl_geometry.interventions.head_ablation import ablate_roles
    from tl_geometry.roles.classify import classify_heads
    from tl_geometry.report.html import ablation_page
    from tl_geometry.atomic_io import atomic_path

    if args.random_sets < 2:
        raise GeometryError(f"--random-sets: expected at least 2 random head sets per group, got {args.random_sets}")
    if args.windows is None:
        raise GeometryError("--windows: --ablate-roles needs a number of windows (as many again give the mean z), not 'all'")
    model, quiet = _load_model_on_every_rank(args)
    stream, _ = _corpus(argparse.Namespace(**{**vars(args), "windows": 2 * args.windows}), model, None)
    windows = [window.tokens for window in stream]
    if len(windows) < 2:
        raise GeometryError(f"--data: the corpus gave {len(windows)} window(s) of {args.context} tokens; --ablate-roles "
                            "needs at least 2 (evaluated, then mean z); pass more text or a smaller --context")
    half = min(args.windows, len(windows) // 2)
    tokens, mean_tokens = torch.stack(windows[:half]), torch.stack(windows[half : 2 * half])
    roles = classify_heads(model, tokens, config_from_args(args))
    n_ctx = getattr(model.cfg, "n_ctx", None)
    period = min(64, (int(n_ctx) - 1) // 2) if n_ctx else 64  # repeated prompts fit a short context
    result = ablate_roles(model, roles, tokens=tokens, mean_tokens=mean_tokens, n_random=args.random_sets, period=period,
                          n_bootstrap=max(args.bootstrap, 100), seed=args.seed, batch_size=args.batch_size,
                          progress=not quiet)
    if not _is_main_process():
        return EXIT_OK
    args.out.mkdir(parents=True, exist_ok=True)
    markdown = result.to_markdown()
    for name, write in (("ablation.csv", lambda path: result.to_dataframe().to_csv(path, index=False)),
                        ("ablation.md", lambda path: path.write_text(markdown + "\n")),
                        ("ablation.html", lambda path: path.write_text(ablation_page(roles, result, {
                            "windows": f"{half} x {args.context} tokens (roles and ablations; the next {half} give "
                                       "the mean z)"})))):
        with atomic_path(args.out / name) as tmp:
            write(tmp)
    print(markdown)
    print("wrote " + ", ".join(str(args.out / name) for name in ("ablation.csv", "ablation.md", "ablation.html")))
    return EXIT_OK


def _summary(result, seconds: float) -> str:
    """A few lines on what was measured: mean P and R by N, and the layers' means at small N."""
    import torch

    from tl_geometry.diagnostics.selection import PRECISION, RECALL
    from tl_geometry.results.display import plural

    grid = result.n_grid.tolist()
    precision = torch.nanmean(result.per_head(PRECISION).flatten(0, 1), dim=0)
    recall = torch.nanmean(result.per_head(RECALL).flatten(0, 1), dim=0)
    shown = [i for i, n in enumerate(grid) if n in (1, 2, 4, 8, 16, 64, 256, 1024) or i == len(grid) - 1]
    lines = [
        f"analysed {plural(result.n_sequences, 'window')} x {plural(len(result.layers), 'layer')} x "
        f"{plural(len(result.heads), 'head')} "
        f"in {seconds:.1f} s",
        "mean over heads   " + "".join(f"{'N=' + str(grid[i]):>8}" for i in shown),
        "  Precision(r_max)" + "".join(f"{precision[i].item():>8.3f}" for i in shown),
        "  Recall(r_min)   " + "".join(f"{recall[i].item():>8.3f}" for i in shown),
    ]
    return "\n".join(lines)


def read_prompts(path: Path) -> list[str]:
    """The non-empty lines of a prompts file (blank lines are not prompts)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise GeometryError(f"--prompts: cannot read {str(path)!r} as UTF-8 text ({type(error).__name__}: {error})") from None
    prompts = [line for line in lines if line.strip()]
    if not prompts:
        raise GeometryError(f"--prompts: {str(path)!r} has no prompts; write one prompt per line")
    return prompts


def _corpus(args: argparse.Namespace, model: Any, prompts: list[str] | None) -> tuple[Any, dict[str, str]]:
    """What to analyse (prompts, or a lazy window stream) and how the report names it."""
    from tl_geometry.corpus_input.token_windows import read_corpus, window_documents
    from tl_geometry.corpus_input.plain_text import default_text

    if prompts is not None:
        return prompts, {"text": f"{args.prompts} (one prompt per line)", "prompts": str(len(prompts))}
    options = {"context": args.context, "n_windows": args.windows, "min_context": args.min_context}
    if args.data:
        stream = read_corpus(model, list(args.data), text_column=args.text_column, **options)
        source = ", ".join(str(path) for path in args.data)
    else:
        stream = window_documents(model, lambda: [default_text()], **options)
        source = "Python reference documentation (pydoc_data)"
    return stream, {"text": source}


def _analyse(args: argparse.Namespace):
    """Load the model and text, analyse the windows; the result, the summary-table details and the model."""
    from tl_geometry.runs.checkpoint import CheckpointEvery
    from tl_geometry.runs.corpus_run import analyze_corpus
    from tl_geometry.corpus_input.token_windows import WindowStream

    config = config_from_args(args)
    prompts = read_prompts(args.prompts) if args.prompts is not None else None
    every = CheckpointEvery.parse(args.checkpoint_every)
    model, quiet = _load_model_on_every_rank(args)
    corpus, details = _corpus(args, model, prompts)
    result = analyze_corpus(
        model, corpus, config, batch_size=args.batch_size, progress=not quiet,
        checkpoint=args.checkpoint or args.out / CHECKPOINT_NAME, checkpoint_every=every,
    )
    if isinstance(corpus, WindowStream):
        details["windows"] = f"{result.n_documents} x {args.context} tokens (BOS first)"
        details["corpus"] = corpus.report.summary()
        if args.windows is not None and result.n_documents < args.windows:
            details["note"] = f"the corpus gave {result.n_documents} of the {args.windows} windows asked for"
    return result, details, model


def _load_model_on_every_rank(args: argparse.Namespace) -> tuple[Any, bool]:
    """Join the torchrun process group (if any) and load the model on this rank; and whether to stay quiet.

    Rank 0 fills the model cache, the others then read it: for a bundled model rank 0 makes the float32
    export if the cache lacks one and then every rank loads at once; any other model rank 0 loads
    (downloading it) before the others.
    """
    from tqdm.auto import tqdm

    from tl_geometry.runs import distributed
    from tl_geometry.models import bundled_model_names, export_bundled_model, load_model

    ranks = distributed.init_from_env(args.device)
    quiet = args.quiet or not ranks.is_main
    device = distributed.rank_device(args.device, ranks)
    placement: dict[str, Any] = {"device": device}
    if args.device_map is not None:
        if args.device != "cpu" or ranks.world_size > 1:
            raise GeometryError(
                "--device-map: the map places every module itself; pass it without --device and run one process "
                "(under torchrun each process would split the model across the same devices)"
            )
        placement = {"device_map": args.device_map}
    # A one-step bar: the cached load takes seconds, the first export of a bundled model longer
    # (load_model then shows its own steps).
    with tqdm(total=1, desc=f"tl_geometry: loading {args.model}", disable=quiet, bar_format="{desc} {elapsed}") as bar:
        if ranks.world_size > 1 and args.model in bundled_model_names():
            if ranks.is_main:
                export_bundled_model(args.model, progress=not quiet)
            distributed.barrier()
            model = load_model(args.model, **placement, dtype=args.dtype, progress=not quiet)
        else:
            if not ranks.is_main:
                distributed.barrier()
            model = load_model(args.model, **placement, dtype=args.dtype, progress=not quiet)
            if ranks.is_main:
                distributed.barrier()
        bar.update()
    return model, quiet


def _merge(args: argparse.Namespace) -> int:
    """tl-geometry merge OUT IN1 IN2 ...: load, merge (refusing different models or configs), save."""
    from tl_geometry.results.result import GeometryResult

    if len(args.inputs) < 2:
        raise GeometryError(f"merge: expected at least two results to merge, got {len(args.inputs)}")
    parts = [GeometryResult.load(path / "result" if path.is_dir() else path) for path in args.inputs]
    try:
        merged = GeometryResult.merge(parts)
    except GeometryError as error:
        raise GeometryError(f"{error} (merging {', '.join(map(str, args.inputs))})") from None
    npz_path, json_path = merged.save(args.out / "result")
    print(f"merged {len(parts)} results ({merged.n_documents} documents) into {npz_path} and {json_path}")
    return EXIT_OK


def _with_elapsed(what: str, quiet: bool, step: Any) -> Any:
    """``step()`` behind a one-step bar that shows ``what`` and the time it has taken (none when ``quiet``)."""
    from tqdm.auto import tqdm

    with tqdm(total=1, desc=what, disable=quiet, bar_format="{desc} {elapsed}") as bar:
        out = step()
        bar.update()
    return out


def run_command(args: argparse.Namespace) -> int:
    from tl_geometry.report.html import write_report
    from tl_geometry.results.result import GeometryResult

    start = time.perf_counter()
    if args.command == "merge":
        return _merge(args)
    if args.command == "intervene":
        return _intervene(args)
    if args.command == "compare":
        return _compare(args)
    if args.command == "plot":
        result = GeometryResult.load(args.result)
        index = _with_elapsed("tl_geometry: drawing the figures and writing the report", False,
                              lambda: write_report(result, args.out, {"source": str(args.result)}, png=args.png))
        print(f"wrote {index}")
        return EXIT_OK
    result, details, model = _analyse(args)
    if not _is_main_process():
        return EXIT_OK  # every rank holds the result; rank 0 writes it
    print(_summary(result, time.perf_counter() - start))
    for key in ("corpus", "note"):
        if key in details:
            print(f"{key}: {details[key]}")
    if args.command == "report":
        mechanisms = None
        if "roles" in result.config.diagnostics and args.mechanism_prompts > 0:
            from tl_geometry.roles.prompt_sets import check_known_mechanisms

            mechanisms = check_known_mechanisms(model, n_prompts=args.mechanism_prompts, progress=not args.quiet)
        index = _with_elapsed("tl_geometry: drawing the figures and writing the report", args.quiet,
                              lambda: write_report(result, args.out, details, png=args.png, mechanisms=mechanisms))
        print(f"wrote {index} (open it in a browser; it works offline)")
    else:
        npz_path, json_path = result.save(args.out / "result")
        print(f"wrote {npz_path} and {json_path}")
        if args.parquet:
            print(f"wrote {result.to_parquet(args.out / 'statistics.parquet')}")
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


def _saved_result_exists(path: Path, command: str) -> None:
    """GeometryError unless ``path`` (a result stem or file, or a folder holding ``result``) names a saved result."""
    from tl_geometry.results.result import GeometryResult

    npz_path, json_path = GeometryResult.paths(path / "result" if path.is_dir() else path)
    missing = [str(p) for p in (npz_path, json_path) if not p.is_file()]
    if missing:
        raise GeometryError(f"{command}: {' and '.join(missing)} not found; pass results written by analyze or report")


def _check_against_model(args: argparse.Namespace) -> None:
    """``--layers``, ``--heads``, ``--picture`` and ``--context`` against the model's config, where it can be read
    without loading weights (a bundled model the cache has exported; `tl_geometry.models.bundled_model_shape`);
    other models are checked once they have loaded."""
    from tl_geometry.config import resolve_indices
    from tl_geometry.models import bundled_model_shape

    shape = bundled_model_shape(args.model)
    if shape is None:
        return
    try:
        resolve_indices("layers", args.layers, shape.n_layers, "n_layers")
        resolve_indices("heads", args.heads, shape.n_heads, "n_heads")
    except GeometryError as error:
        raise GeometryError(f"--{error} ({args.model})") from None
    for layer, head in getattr(args, "picture", []):
        if layer >= shape.n_layers or head >= shape.n_heads:
            raise GeometryError(f"--picture: {layer}.{head} is not a head of {args.model}, which has "
                                f"{shape.n_layers} layers and {shape.n_heads} heads per layer; use layers "
                                f"0..{shape.n_layers - 1} and heads 0..{shape.n_heads - 1}")
    if args.prompts is None and args.context > shape.n_ctx:
        raise GeometryError(f"--context: {args.context} tokens is longer than {args.model}'s context "
                            f"n_ctx={shape.n_ctx}; pass --context {shape.n_ctx} or less")


def check_arguments(args: argparse.Namespace) -> None:
    """Everything the command line says that can be checked before a model loads (GeometryError otherwise)."""
    _writable_folder(args.out)
    if args.command in ("plot", "merge"):
        for path in [args.result] if args.command == "plot" else args.inputs:
            _saved_result_exists(path, args.command)
        return
    if args.command == "compare":
        for path in (args.a, args.b):
            _saved_result_exists(path, "compare")
        return
    for name in ("context", "batch_size", "settings_per_pass"):
        if getattr(args, name, 1) < 1:
            raise GeometryError(f"--{name.replace('_', '-')}: expected a positive number, got {getattr(args, name)}")
    if args.prompts is None and args.context < 2:  # every window starts with BOS
        raise GeometryError(f"--context: {args.context} token leaves no room for text after BOS; pass at least 2 "
                            "(e.g. --context 256)")
    if args.windows is not None and args.windows < 1:
        raise GeometryError(f"--windows: expected a positive number or 'all', got {args.windows}")
    if getattr(args, "mechanism_prompts", 0) < 0:
        raise GeometryError(
            f"--mechanism-prompts: expected 0 (no check) or a positive number, got {args.mechanism_prompts}"
        )
    if isinstance(args.n_grid, list) and (not args.n_grid or min(args.n_grid) < 1):
        raise GeometryError(f"--n-grid: expected N >= 1 such as 1,2,4,8, got {args.n_grid}")
    if args.prompts is not None and args.data:
        raise GeometryError("--prompts and --data: pass one of them (prompts are analysed whole, data in windows)")
    config_from_args(args)  # a bad option fails here, before the model loads
    from tl_geometry.runs.checkpoint import CheckpointEvery
    from tl_geometry.models import check_device, check_model_name, model_dtype

    CheckpointEvery.parse(args.checkpoint_every)
    check_model_name(args.model)
    _check_against_model(args)
    check_device(args.device)
    model_dtype(args.dtype)
    if args.prompts is not None:
        read_prompts(args.prompts)
    for path in args.data or []:
        if not path.exists():
            raise GeometryError(f"--data: {str(path)!r} does not exist; check the path")
        if path.is_file() and not os.access(path, os.R_OK):
            raise GeometryError(f"--data: {path} cannot be read; check its permissions")
        if path.is_file() and path.stat().st_size == 0:
            raise GeometryError(f"--data: {path} is empty; pass a file with some text")
        if path.is_dir():
            from tl_geometry.corpus_input.readers import holds_readable_files

            if not holds_readable_files(path):
                raise GeometryError(
                    f"--data: the folder {path} holds no text, JSONL, CSV, Parquet or .npy files and is not a saved "
                    "dataset; pass a folder of documents"
                )


def _is_main_process() -> bool:
    from tl_geometry.runs.distributed import current_ranks

    return current_ranks().is_main


def _in_process_group() -> bool:
    """Whether this process is in a torch.distributed process group (none without torch imported)."""
    distributed = sys.modules.get("torch.distributed")
    return distributed is not None and distributed.is_available() and distributed.is_initialized()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tl-geometry`` console script; returns the exit code.

    Every argument is checked before the model loads, and the output folder is
    locked for the whole run (a second run on it is refused at once). SIGINT
    and SIGTERM end the run with 130 and 143 and a one-line message; the
    previous result in the folder is kept and no temporary file is left.
    Under torchrun the run joins the launcher's process group and leaves it
    at the end; a group the caller has joined already (a script calling
    ``main`` once per command) is used and left in place.
    """
    from tl_geometry.atomic_io import folder_lock

    args = build_parser().parse_args(argv)
    callers_group = _in_process_group()
    previous = _install_signal_handlers()
    # The folders this run would create (--out and any missing parents), innermost first.
    created = [folder for folder in (args.out, *args.out.parents) if not folder.exists()]
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
        for folder in created:  # a run that wrote nothing leaves no empty folder behind
            if not folder.is_dir() or any(folder.iterdir()):
                break
            with contextlib.suppress(OSError):  # another run may have just started writing there
                folder.rmdir()
        if _in_process_group() and not callers_group:
            sys.modules["torch.distributed"].destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
