"""A small real run saved to disk, and two saved runs compared field by field: for checking that a refactor
changes no number.

``save DIR`` runs the bundled SmolLM2 on ``--windows`` windows of ``--context`` seeded random tokens with every
diagnostic, once per capture path (``pattern``, ``rows`` and the default ``auto``), through
`tl_geometry.analyze_corpus` (the path the command-line report takes), and saves each result as
``DIR/<capture>``; ``--batch`` windows a forward pass (all at once by default) and ``--bootstrap`` replicates
(the config's default by default): with a few replicates and more windows than they are, in several batches,
the fields pass their rows (`tl_geometry.results.stats.rows_limit`) and the later batches are added to sums.
``compare BEFORE AFTER`` loads the results of both directories and compares every array of
every field (counts, sums, ranges, replicates, per-document rows: bit for bit, NaN equal to NaN), the N grid,
the layers and heads, the pictures, and the config; it prints one line per capture path and exits 1 on any
difference. The capture path taken is read from the result where it records it (``provenance["capture"]``),
else from ``config.capture`` (results written before the run plan recorded the path).

    PYTHONPATH=. python benchmarks/equal_runs.py save /tmp/before [--windows 2] [--context 128] [--batch 4]
        [--bootstrap 4]
    PYTHONPATH=. python benchmarks/equal_runs.py compare /tmp/before /tmp/after
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

CAPTURES = ("pattern", "rows", "auto")


def save(out: Path, windows: int, context: int, batch: int | None = None, bootstrap: int | None = None) -> None:
    from tl_geometry import GeometryConfig, analyze_corpus
    from tl_geometry.models import load_model

    model = load_model()
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(100, 40000, (windows, context), generator=gen)
    tokens[:, 0] = model.tokenizer.bos_token_id or 1
    out.mkdir(parents=True, exist_ok=True)
    for capture in CAPTURES:
        replicates = {} if bootstrap is None else {"n_bootstrap": bootstrap}
        config = GeometryConfig(diagnostics="all", capture=capture, picture_heads=[(0, 0)], **replicates)
        result = analyze_corpus(model, tokens, config, batch_size=batch or windows, progress=False)
        result.save(out / capture)
        print(f"saved {out / capture} ({path_taken(result)})")


def path_taken(result) -> str:
    recorded = (result.provenance or {}).get("capture")
    return recorded if recorded is not None else result.config.capture


def _differences(a, b) -> list[str]:
    """What differs between two results, one line each (empty: every array equal)."""
    out = []
    if a.model_name != b.model_name:
        out.append(f"model_name {a.model_name!r} != {b.model_name!r}")
    # The requested path is compared through path_taken (older results recorded the path taken as the config's).
    ca = {k: v for k, v in a.config.to_json().items() if k != "capture"}
    cb = {k: v for k, v in b.config.to_json().items() if k != "capture"}
    if ca != cb:
        out.append(f"config {ca} != {cb}")
    if path_taken(a) != path_taken(b):
        out.append(f"capture path {path_taken(a)!r} != {path_taken(b)!r}")
    for name, x, y in (("n_grid", a.n_grid, b.n_grid), ("layers", a.layers, b.layers), ("heads", a.heads, b.heads)):
        if not np.array_equal(np.asarray(x), np.asarray(y)):
            out.append(f"{name} {x} != {y}")
    if sorted(a.stats) != sorted(b.stats):
        out.append(f"fields {sorted(set(a.stats) ^ set(b.stats))} in one only")
    for name in sorted(set(a.stats) & set(b.stats)):
        xa, xb = a.stats[name].arrays(), b.stats[name].arrays()
        if sorted(xa) != sorted(xb):
            out.append(f"{name}: arrays {sorted(xa)} != {sorted(xb)}")
            continue
        for key in xa:
            u, v = xa[key].numpy(), xb[key].numpy()
            if u.dtype != v.dtype or u.shape != v.shape or not np.array_equal(u, v, equal_nan=u.dtype.kind == "f"):
                out.append(f"{name}.{key}: differs ({u.dtype}{list(u.shape)} vs {v.dtype}{list(v.shape)})")
    if len(a.pictures) != len(b.pictures) or not all(p.equals(q) for p, q in zip(a.pictures, b.pictures)):
        out.append("pictures differ")
    return out


def compare(before: Path, after: Path) -> int:
    from tl_geometry import GeometryResult

    failed = 0
    for capture in CAPTURES:
        a, b = GeometryResult.load(before / capture), GeometryResult.load(after / capture)
        arrays = sum(len(s.arrays()) for s in a.stats.values())
        differences = _differences(a, b)
        verdict = "equal" if not differences else f"{len(differences)} DIFFERENCES"
        print(f"capture={capture!r}: {len(a.stats)} fields, {arrays} arrays, {len(a.pictures)} pictures: {verdict} "
              f"(path taken: {path_taken(a)} before, {path_taken(b)} after)")
        for line in differences:
            print(f"  {line}")
        failed += bool(differences)
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    saving = sub.add_parser("save")
    saving.add_argument("out", type=Path)
    saving.add_argument("--windows", type=int, default=2)
    saving.add_argument("--context", type=int, default=128)
    saving.add_argument("--batch", type=int, default=None, help="windows a forward pass (default: all)")
    saving.add_argument("--bootstrap", type=int, default=None, help="n_bootstrap (default: the config's)")
    comparing = sub.add_parser("compare")
    comparing.add_argument("before", type=Path)
    comparing.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "save":
        save(args.out, args.windows, args.context, args.batch, args.bootstrap)
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
