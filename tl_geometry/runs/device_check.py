"""The device check: the analysis on an accelerator, in float32 and bfloat16, against the CPU float64 reference.

``python scripts/gpu_check.py`` (the command `main` is) loads a bundled model
on the device in each dtype and analyses a few windows of the default text on
a few heads through every capture path the package has: the default run (the
rows path), the pattern path, and every diagnostic on each path; then a short
``torchrun`` (NCCL, the ranks on their own GPUs) of the default analysis. Each
result is compared, field by field, with the same analysis of a float64 copy
of the model on the CPU (`compare_results`, with the tolerances of
`TOLERANCES`), and the wall times are printed against the bare forward pass of
the same dtype (`timing_table`). The exit code is 1 when any field differs
beyond its tolerance or a run fails, else 0.

Without CUDA it says so in one line and runs the CPU half: the same runs and
comparisons with the CPU as the device, and the torchrun part with gloo.
"""

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from tl_geometry.capture.rows import RowsCapture, run_rows_pass
from tl_geometry.corpus_input.plain_text import default_text
from tl_geometry.corpus_input.token_windows import text_windows
from tl_geometry.diagnostics.bounds import EXCEEDED_OF
from tl_geometry.errors import GeometryError
from tl_geometry.models import DEFAULT_MODEL, bundled_model_names, load_model
from tl_geometry.results.result import GeometryResult
from tl_geometry.runs.corpus_run import analyze_corpus
from tl_geometry.runs.distributed import current_ranks, init_from_env

BARE = "bare forward (decoder, SDPA)"
TORCHRUN = "torchrun, default analysis"
# The analyses checked, each a set of config overrides: every capture path, then every diagnostic on each.
RUNS: Mapping[str, Mapping[str, Any]] = {
    "default analysis (rows path)": {},
    "pattern path": {"capture": "pattern"},
    "all diagnostics, rows path": {"capture": "rows", "diagnostics": "all"},
    "all diagnostics, pattern path": {"capture": "pattern", "diagnostics": "all"},
}
DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class Tolerance:
    """How far a field's per-head mean may be from the float64 reference: ``|got - want| <= atol + rtol |want|``.

    Selection quantities are discrete (a count of keys in a ball, the top-N
    set): where two keys' scores are within the dtype's rounding of each
    other, the two runs may rank them differently and a document's value
    jumps or turns undefined. ``outliers`` is the share of a field's entries
    allowed off for that reason (beyond the tolerance, or missing on one side
    only; so too for the defined counts); ``gross`` bounds the finite ones (relative to the
    largest reference magnitude of the field, at least 1), so a wrong mask or
    a lost layer still fails.
    """

    rtol: float
    atol: float
    outliers: float
    gross: float
    why: str


TOLERANCES: Mapping[str, Tolerance] = {
    "float32": Tolerance(
        rtol=1e-3, atol=1e-4, outliers=0.0, gross=0.0,
        why="float32 against float64: the rows and pattern paths alone differ by up to 2e-3 relative on "
            "SmolLM2 (SDPA's rounding carried through later layers); 1e-3 relative with 1e-4 absolute for values "
            "near 0, no entry beyond",
    ),
    "bfloat16": Tolerance(
        rtol=0.1, atol=0.05, outliers=0.25, gross=0.5,
        why="bfloat16 keeps 8 bits of mantissa (0.4 % per rounding) through every layer, and rounds near-tied "
            "attention weights to equal ones, which reorders the top-N: 10 % relative and 0.05 absolute, with up to "
            "a quarter of a field's entries off (on the CPU's bfloat16, a tiny Llama had 13 % of k_out and "
            "margin_delta0 off), none by more than half the field's scale",
    ),
}  # fmt: skip


# Shares of rows whose measured P or R lies above an envelope: where the envelope is 1 and so is the measured
# value, the comparison is a tie that rounding decides (float32 flipped a third of a head's documents at N = 1
# on SmolLM2, 3 windows of 64 tokens). Up to TIE_SHARE of their entries may differ by anything, in any dtype.
TIE_FIELDS = frozenset(spec.name for spec in EXCEEDED_OF.values())
TIE_SHARE = 0.05


@dataclass(frozen=True)
class Mismatch:
    """One way a run's result differs from the reference beyond its tolerance."""

    run: str
    dtype: str
    field: str
    detail: str

    def __str__(self) -> str:
        return f"MISMATCH {self.run}, {self.dtype}, {self.field}: {self.detail}"


def compare_results(
    result: GeometryResult, reference: GeometryResult, tolerance: Tolerance, *, run: str, dtype: str
) -> list[Mismatch]:
    """Every field of ``result`` against ``reference``: the same fields and documents, the same defined counts
    exactly, the same missing (NaN) and infinite entries, and the per-head means within ``tolerance`` (the
    fields of `TIE_FIELDS` with up to `TIE_SHARE` of their entries beyond it).

    Args:
        result: the run on the device.
        reference: the same analysis of the float64 model on the CPU.
        tolerance: the dtype's `Tolerance`.
        run: the run's name, given to each `Mismatch`.
        dtype: the dtype's name, given to each `Mismatch`.

    Returns:
        The mismatches, empty when the result passes.
    """
    found: list[Mismatch] = []

    def miss(name: str, detail: str) -> None:
        found.append(Mismatch(run, dtype, name, detail))

    if set(result.fields) != set(reference.fields):
        missing, extra = sorted(set(reference.fields) - set(result.fields)), sorted(set(result.fields) - set(reference.fields))
        miss("fields", f"missing {missing}, unexpected {extra}")
    if (result.n_documents, result.n_tokens) != (reference.n_documents, reference.n_tokens):
        miss("documents", f"{result.n_documents} documents of {result.n_tokens} tokens, reference "
                          f"{reference.n_documents} of {reference.n_tokens}")
    if not torch.equal(result.n_grid.cpu(), reference.n_grid.cpu()):
        miss("n_grid", f"{result.n_grid.tolist()}, reference {reference.n_grid.tolist()}")
        return found
    for name in sorted(set(result.fields) & set(reference.fields)):
        allowed = tolerance if name not in TIE_FIELDS else replace(
            tolerance, outliers=max(tolerance.outliers, TIE_SHARE), gross=math.inf)
        counts, want_counts = result.count(name).cpu(), reference.count(name).cpu()
        differ = counts != want_counts
        if float(differ.double().mean()) > allowed.outliers:
            miss(name, f"defined counts differ at {int(differ.sum())} of {counts.numel()} entries")
        detail = _compare_means(result.per_head(name).cpu().double(), reference.per_head(name).double(), allowed)
        if detail:
            miss(name, detail)
    return found


def _compare_means(got: torch.Tensor, want: torch.Tensor, tolerance: Tolerance) -> str | None:
    """What is wrong with ``got`` against ``want`` under ``tolerance``, or None.

    An entry is off when one side is missing (NaN) or infinite and the other is not the same, or when both are
    finite and differ beyond ``atol + rtol |want|``; at most ``tolerance.outliers`` of the entries may be off,
    none of the finite ones by more than ``tolerance.gross`` times the field's scale.
    """
    if got.shape != want.shape:
        return f"shape {list(got.shape)}, reference {list(want.shape)}"
    if not want.numel():
        return None
    finite = got.isfinite() & want.isfinite()
    odd = ~finite & ~((got == want) | (got.isnan() & want.isnan()))
    error = torch.where(finite, got - want, 0.0).abs()
    allowed = tolerance.atol + tolerance.rtol * torch.where(finite, want, 0.0).abs()
    off = odd | (error > allowed)
    if not off.any():
        return None
    share = float(off.double().mean())
    said = f"{int(off.sum())} of {want.numel()} means off"
    if odd.any():
        said += f" ({int(odd.sum())} missing or infinite on one side only)"
    if (error > allowed).any():
        worst = int((error / allowed).argmax())
        said += (f"; worst {float(got.flatten()[worst]):.6g} against {float(want.flatten()[worst]):.6g} "
                 f"(allowed {tolerance.rtol:g} relative + {tolerance.atol:g})")
    if share > tolerance.outliers:
        return f"{said}; at most {tolerance.outliers:.0%} may be"
    scale = max(float(want[finite].abs().max()), 1.0) if finite.any() else 1.0
    if float(error.max()) > tolerance.gross * scale:
        return f"{said}; one by more than {tolerance.gross:g} x the field's scale {scale:.3g}"
    return None


@dataclass(frozen=True)
class Timing:
    """The wall time of one run in one dtype (NaN: the run failed)."""

    run: str
    dtype: str
    seconds: float


def timing_table(timings: Sequence[Timing]) -> str:
    """The wall times of the runs (rows) in each dtype (columns), with their ratio to the dtype's `BARE` pass.

    Raises:
        GeometryError: a dtype with timings but no bare forward to divide by.
    """
    dtypes = list(dict.fromkeys(t.dtype for t in timings))
    runs = list(dict.fromkeys(t.run for t in timings))
    seconds = {(t.run, t.dtype): t.seconds for t in timings}
    for dtype in dtypes:
        if (BARE, dtype) not in seconds:
            raise GeometryError(f"timing_table: no {BARE!r} timing for {dtype}; time it before the other runs")
    width = max(len(run) for run in runs)
    lines = [f"{'run':<{width}}" + "".join(f"{dtype:>22}" for dtype in dtypes)]
    for run in runs:
        cells = []
        for dtype in dtypes:
            s = seconds.get((run, dtype))
            cells.append("-" if s is None else "failed" if math.isnan(s) else
                         f"{s:8.3f} s ({s / seconds[BARE, dtype]:5.2f}x)")
        lines.append(f"{run:<{width}}" + "".join(f"{cell:>22}" for cell in cells))
    return "\n".join(lines)


def no_cuda_line() -> str:
    """The one line said on a machine without CUDA, before the CPU half runs."""
    return ("no CUDA device (torch.cuda.is_available() is False): running the CPU half, every run and comparison "
            "on the CPU and the torchrun part with gloo")


@dataclass
class CheckReport:
    """What a check found: the timings, the mismatches and failures, and how many comparisons passed."""

    device: str
    timings: list[Timing] = field(default_factory=list)
    mismatches: list[Mismatch] = field(default_factory=list)
    compared: int = 0

    @property
    def exit_code(self) -> int:
        """1 on any mismatch or failure, else 0."""
        return 1 if self.mismatches else 0


Loader = Callable[..., torch.nn.Module]


@dataclass(frozen=True)
class CheckSetup:
    """What the check runs on: the model, the windows, the heads compared and the device."""

    model: str = DEFAULT_MODEL
    device: str = "cuda"
    windows: int = 4
    context: int = 128
    layers: tuple[int, ...] | None = None  # None: the first, middle and last layer
    heads: tuple[int, ...] = (0, 1)
    repeats: int = 3  # the median of this many timed passes
    n_bootstrap: int = 20

    def config_overrides(self, model: Any) -> dict[str, Any]:
        n = model.cfg.n_layers
        layers = self.layers if self.layers is not None else tuple(sorted({0, n // 2, n - 1}))
        return {"layers": list(layers), "heads": list(self.heads), "n_bootstrap": self.n_bootstrap}


def float64_reference(load: Loader, setup: CheckSetup) -> torch.nn.Module:
    """The model on the CPU in float64: loaded in float32, then cast (TransformerLens reads ``cfg.dtype``)."""
    model = load(setup.model, device="cpu", dtype="float32", progress=False)
    torch.nn.Module.to(model, torch.float64)
    model.cfg.dtype = torch.float64
    return model


def _windows(model: Any, setup: CheckSetup) -> torch.Tensor:
    windows = text_windows(model, default_text(), context=setup.context)[: setup.windows]
    if len(windows) < setup.windows:
        raise GeometryError(f"gpu check: the default text gives {len(windows)} windows of {setup.context} tokens, "
                            f"{setup.windows} asked; ask for fewer or shorter windows")
    return windows


def _synchronize(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], Any], device: str, repeats: int) -> tuple[Any, float]:
    """``fn``'s last value and the median wall time of ``repeats`` calls after one warm-up."""
    out = fn()
    times = []
    for _ in range(repeats):
        _synchronize(device)
        start = time.perf_counter()
        out = fn()
        _synchronize(device)
        times.append(time.perf_counter() - start)
    return out, sorted(times)[len(times) // 2]


def _analyse(model: Any, windows: torch.Tensor, overrides: Mapping[str, Any]) -> GeometryResult:
    return analyze_corpus(model, windows, batch_size=len(windows), progress=False, **overrides)


def run_check(
    setup: CheckSetup,
    *,
    load: Loader = load_model,
    dtypes: Sequence[str] = DTYPES,
    torchrun: bool = True,
    say: Callable[[str], None] = print,
) -> CheckReport:
    """Every run of `RUNS` on ``setup.device`` in each dtype (and the torchrun part), compared with the float64
    reference on the CPU; ``say`` gets a line per step.

    Args:
        setup: the model, windows, heads and device.
        load: `tl_geometry.load_model` or a stand-in with its signature (tests pass a tiny model's).
        dtypes: the dtypes run on the device, each with its `TOLERANCES` entry.
        torchrun: also run the default analysis under torchrun (`torchrun_part`).
        say: where progress lines go.

    Returns:
        The `CheckReport`.
    """
    report = CheckReport(setup.device)
    reference_model = float64_reference(load, setup)
    overrides = setup.config_overrides(reference_model)
    windows = _windows(reference_model, setup)
    say(f"{setup.model}: {len(windows)} windows of {windows.shape[1]} tokens, layers {overrides['layers']}, heads "
        f"{overrides['heads']}; reference: float64 on the CPU")
    references = {run: _analyse(reference_model, windows, {**overrides, **extra}) for run, extra in RUNS.items()}
    del reference_model
    for dtype in dtypes:
        tolerance = TOLERANCES[dtype]
        model = load(setup.model, device=setup.device, dtype=dtype, progress=False)
        on_device = windows.to(setup.device)
        nothing = RowsCapture(torch.full((len(windows), 1), windows.shape[1] - 1), lambda *a: None, ())
        _, seconds = _timed(lambda: run_rows_pass(model, on_device, None, nothing), setup.device, setup.repeats)
        report.timings.append(Timing(BARE, dtype, seconds))
        for run, extra in RUNS.items():
            try:
                result, seconds = _timed(lambda extra=extra: _analyse(model, windows, {**overrides, **extra}),
                                         setup.device, setup.repeats)
            except Exception as error:  # a run that fails on the device is a finding, not the end of the check
                report.timings.append(Timing(run, dtype, math.nan))
                report.mismatches.append(Mismatch(run, dtype, "run", f"failed: {type(error).__name__}: {error}"))
                continue
            report.timings.append(Timing(run, dtype, seconds))
            found = compare_results(result, references[run], tolerance, run=run, dtype=dtype)
            found += _path_taken(result, extra.get("capture", "rows"), run, dtype)
            report.mismatches += found
            report.compared += len(result.fields)
            say(f"{run}, {dtype}: {len(result.fields)} fields, " + (f"{len(found)} MISMATCHES" if found else "equal "
                f"within tolerance"))
        del model
    if torchrun:
        report.mismatches += torchrun_part(setup, references["default analysis (rows path)"], report, say)
    return report


def _path_taken(result: GeometryResult, expected: str, run: str, dtype: str) -> list[Mismatch]:
    """A mismatch if the run took another capture path than ``expected`` (the default must take the rows)."""
    taken = (result.provenance or {}).get("capture")  # the path taken; the config keeps what was asked
    if taken != expected:
        return [Mismatch(run, dtype, "capture", f"took {taken!r}, not {expected!r}")]
    return []


def torchrun_ranks(device: str) -> int:
    """How many ranks the torchrun part starts: two on the CPU or with two GPUs; one on a single GPU (NCCL
    refuses two ranks on one device), which checks the launch and NCCL's start but no reduction."""
    if torch.device(device).type == "cuda":
        return min(2, torch.cuda.device_count())
    return 2


def torchrun_part(setup: CheckSetup, reference: GeometryResult, report: CheckReport,
                  say: Callable[[str], None]) -> list[Mismatch]:
    """The default analysis under ``torchrun`` (NCCL on CUDA, gloo on the CPU), float32, against ``reference``."""
    ranks = torchrun_ranks(setup.device)
    backend = "nccl" if torch.device(setup.device).type == "cuda" else "gloo"
    with tempfile.TemporaryDirectory(prefix="tl_geometry-gpu-check-") as folder:
        out = Path(folder) / "result"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
                   "-m", __name__, "--rank-part", str(out), "--model", setup.model, "--device", setup.device,
                   "--windows", str(setup.windows), "--context", str(setup.context),
                   "--heads", *map(str, setup.heads), "--n-bootstrap", str(setup.n_bootstrap)]
        if setup.layers is not None:
            command += ["--layers", *map(str, setup.layers)]
        package_root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])),
               "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        seconds = time.perf_counter() - start
        name = f"{TORCHRUN} ({ranks} x {backend})"
        if done.returncode != 0:
            report.timings.append(Timing(name, "float32", math.nan))
            tail = " | ".join(done.stderr.strip().splitlines()[-3:])
            return [Mismatch(name, "float32", "run", f"torchrun exited with {done.returncode}: {tail}")]
        report.timings.append(Timing(name, "float32", seconds))
        result = GeometryResult.load(out)
    found = compare_results(result, reference, TOLERANCES["float32"], run=name, dtype="float32")
    report.compared += len(result.fields)
    say(f"{name}, float32 (wall time with the launch and {ranks} model loads): {len(result.fields)} fields, "
        + (f"{len(found)} MISMATCHES" if found else "equal within tolerance"))
    return found


def rank_part(setup: CheckSetup, out: str, load: Loader = load_model) -> None:
    """One rank of the torchrun part: join the group (NCCL on CUDA), analyse the default run; rank 0 saves it."""
    cuda = torch.device(setup.device).type == "cuda"
    init_from_env(setup.device)
    if cuda and not torch.distributed.is_initialized():  # one rank: init_from_env leaves it alone; start NCCL anyway
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.distributed.init_process_group(backend="nccl")
    device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if cuda else "cpu"
    try:
        model = load(setup.model, device=device, dtype="float32", progress=False)
        windows = _windows(model, setup)
        result = _analyse(model, windows, setup.config_overrides(model))
        if current_ranks().is_main:
            result.save(out)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu_check.py",
        description="The analysis on a CUDA device in float32 and bfloat16 against the CPU float64 reference; exit "
                    "code 1 on any mismatch.",
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, choices=bundled_model_names())
    parser.add_argument("--device", default=None, help="default: cuda if available, else the CPU half on cpu")
    parser.add_argument("--windows", type=int, default=CheckSetup.windows)
    parser.add_argument("--context", type=int, default=CheckSetup.context)
    parser.add_argument("--layers", type=int, nargs="*", default=None, help="default: the first, middle and last")
    parser.add_argument("--heads", type=int, nargs="*", default=list(CheckSetup.heads))
    parser.add_argument("--n-bootstrap", type=int, default=CheckSetup.n_bootstrap)
    parser.add_argument("--repeats", type=int, default=CheckSetup.repeats, help="timed calls per run (the median)")
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES), help="the dtypes run on the device")
    parser.add_argument("--no-torchrun", action="store_true", help="leave the torchrun part out")
    parser.add_argument("--rank-part", metavar="OUT", help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None, *, load: Loader = load_model) -> int:
    """The command: run the check, print the mismatches and the table of times; the exit code."""
    args = _parser().parse_args(argv)
    device = args.device
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cpu":
            print(no_cuda_line(), flush=True)
    setup = CheckSetup(model=args.model, device=device, windows=args.windows, context=args.context,
                       layers=None if args.layers is None else tuple(args.layers), heads=tuple(args.heads),
                       n_bootstrap=args.n_bootstrap, repeats=args.repeats)
    if args.rank_part:
        rank_part(setup, args.rank_part, load)
        return 0
    start = time.perf_counter()
    report = run_check(setup, load=load, dtypes=args.dtypes, torchrun=not args.no_torchrun, say=lambda line: print(line, flush=True))
    for mismatch in report.mismatches:
        print(mismatch)
    print(f"\nwall times on {device}, median of {setup.repeats} after a warm-up (x: the bare forward of the dtype):")
    print(timing_table(report.timings))
    print("\ntolerances: " + "; ".join(f"{dtype}: {t.why}" for dtype, t in TOLERANCES.items()))
    verdict = f"{len(report.mismatches)} MISMATCHES" if report.mismatches else "every field within tolerance"
    print(f"\n{report.compared} field comparisons, {verdict}; {time.perf_counter() - start:.0f} s in all")
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
