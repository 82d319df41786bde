"""Sizes of saved results and the claims with an interval, this version's files beside the layout before, in one run.

Two results of SmolLM2 (the bundled default model) are measured: one prompt
(`run_with_geometry_hooks`, default config) and the result of
``tl-geometry analyze --windows 2 --context 256`` (the same ``result.npz`` as
``tl-geometry report --windows 2 --context 256``). For each, the script
prints the bytes of the ``.npz`` as this version saves it (documents kept as
rows while they are few, deflated) beside the bytes the same statistics take
in the layout of the version before (every field as sums, each field that kept
replicates before with ``n_bootstrap`` replicate sums, not deflated: the
``.npy`` bytes of each array), broken down by the diagnostic that declares the
fields and by what is kept (rows, sums, replicate sums). It then counts the
claims of the scorecard (`tl_geometry.claims`) that get an interval, on this
result and on the same result without the replicates that this version added
to the defaults (what the version before kept).

Targets: one prompt <= 1 MB, the 2-window report <= 5 MB, 11 of 11 claims with
an interval on the report run. Sizes do not depend on the machine's load; the
runs take a few minutes on 2 busy cores.

    PYTHONPATH=. python benchmarks/bench_sizes.py [--results DIR_OR_STEM ...] [--keep DIR]

``--results``: measure saved results (a stem or a folder holding
``result.npz``) instead of running the model.
"""

import argparse
import collections
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from tl_geometry import GeometryResult, claims, load_model, run_with_geometry_hooks
from tl_geometry.diagnostics.registry import REGISTRY
from tl_geometry.results.storage import stats_arrays

PROMPT = "The quick brown fox jumps over the lazy dog because it wanted to see what was on the other side."
# The fields whose replicates this version added to the defaults (the claims' intervals read them).
ADDED_REPLICATES = (
    "value_norm_by_position", "value_norm_cv", "sink_norm_ratio", "decay_mae", "profile_p_sink", "profile_p_base",
    "profile_has_plateau", "profile_has_recency", "excess_precision", "excess_recall", "bound_precision_upper",
    "bound_recall_upper",
)
NPY_HEADER = 128  # bytes numpy writes before each array of these shapes
TARGETS = {"one prompt": 1e6, "2 windows x 256": 5e6}


def _group(name: str) -> str:
    try:
        return REGISTRY.owner(name)
    except Exception:  # a field no installed diagnostic declares
        return "other"


def _kind(statistic: str) -> str:
    if statistic in ("documents", "document_weights"):
        return "rows"
    return "replicate sums" if statistic.startswith("replicate") else "sums"


def new_sizes(npz: Path) -> dict[tuple[str, str], int]:
    """Bytes of each (diagnostic, kind) in the saved file, as stored (deflated)."""
    out: dict[tuple[str, str], int] = collections.Counter()
    with zipfile.ZipFile(npz) as archive:
        for info in archive.infolist():
            name = info.filename.removesuffix(".npy")
            field, _, statistic = name.partition("/")
            out[(_group(field), _kind(statistic) if statistic else "grid")] += info.compress_size
    return out


def old_sizes(result: GeometryResult) -> dict[tuple[str, str], int]:
    """Bytes each (diagnostic, kind) takes in the layout before: sums, replicates where they were kept, no deflate."""
    out: dict[tuple[str, str], int] = collections.Counter()
    for name, s in result.stats.items():
        old = s.summed()
        if name in ADDED_REPLICATES:
            old = replace(old, replicate_total=None, replicate_count=None)
        for key, a in stats_arrays(old.stored()).items():
            width = 2 if a.dtype == np.float16 else 1  # replicate sums were float32 before
            out[(_group(name), _kind(key.partition("/")[2]))] += width * a.nbytes + NPY_HEADER
    return out


def without_added_replicates(result: GeometryResult) -> GeometryResult:
    stats = {name: replace(s.summed(), replicate_total=None, replicate_count=None) if name in ADDED_REPLICATES else s
             for name, s in result.stats.items()}
    return replace(result, stats=stats)


def intervals(result: GeometryResult) -> int:
    table = claims(result)
    return int((~(table["low"].isna() | table["high"].isna())).sum())


def report(label: str, npz: Path) -> None:
    result = GeometryResult.load(npz)
    new, old = new_sizes(npz), old_sizes(result)
    total_new, total_old = npz.stat().st_size, sum(old.values())
    print(f"\n{label}: {result.n_documents} documents, {result.n_tokens} tokens, {len(result.layers)} layers x "
          f"{len(result.heads)} heads, {len(result.n_grid)} N, {len(result.fields)} fields")
    print(f"  {'diagnostic':<12} {'kept as':<15} {'before (MB)':>12} {'now (MB)':>10}")
    for key in sorted(set(new) | set(old)):
        print(f"  {key[0]:<12} {key[1]:<15} {old.get(key, 0) / 1e6:12.3f} {new.get(key, 0) / 1e6:10.3f}")
    target = TARGETS[label]
    print(f"  {'total':<28} {total_old / 1e6:12.3f} {total_new / 1e6:10.3f}   (ratio {total_new / total_old:.3f}; "
          f"target <= {target / 1e6:g} MB: {'met' if total_new <= target else 'NOT met'})")
    n_claims = len(claims(result))
    print(f"  claims with an interval: {intervals(without_added_replicates(result))} of {n_claims} with the "
          f"replicates kept before, {intervals(result)} of {n_claims} now")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", nargs=2, metavar=("ONE_PROMPT", "TWO_WINDOWS"),
                        help="saved results (stems or folders with result.npz) instead of running the model")
    parser.add_argument("--keep", type=Path, help="a folder to keep the results written (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.keep or Path(scratch)
        if args.results:
            paths = [Path(p) / "result.npz" if Path(p).is_dir() else Path(p).with_suffix(".npz") for p in args.results]
        else:
            one, _ = run_with_geometry_hooks(load_model(), PROMPT).save(folder / "one-prompt")
            subprocess.run([sys.executable, "-m", "tl_geometry", "analyze", "--windows", "2", "--context", "256",
                            "--out", str(folder / "two-windows"), "--quiet"], check=True)
            paths = [one, folder / "two-windows" / "result.npz"]
        for label, path in zip(TARGETS, paths):
            report(label, path)


if __name__ == "__main__":
    main()
