"""What the benchmarks that time a module against another git revision share: the module as it was, random
attention rows, and the comparison of their outputs (`bench_margins.py`, `bench_window_rows.py`)."""

import subprocess
import sys
import types

import torch


def module_at(rev: str, path: str, former_path: str | None = None) -> types.ModuleType:
    """The module at ``path`` (or at ``former_path``, where it lived before a rename) as it was at ``rev``,
    importing the rest of this tree."""
    for candidate in (path, former_path):
        if candidate is None:
            continue
        shown = subprocess.run(["git", "show", f"{rev}:{candidate}"], capture_output=True, text=True)
        if shown.returncode == 0:
            name = f"_bench_at_rev.{candidate}"
            module = types.ModuleType(name)
            sys.modules[name] = module
            exec(compile(shown.stdout, f"<{candidate} at {rev}>", "exec"), module.__dict__)
            return module
    raise SystemExit(f"{rev} has neither {path} nor {former_path}")


def random_rows(rows: int, keys: int, d_head: int, window: int | None) -> tuple[torch.Tensor, ...]:
    """Seeded attention rows ``[rows, keys]``, values ``[rows, keys, d_head]`` of varied norms, and the visible
    keys (each row's last ``window`` keys, or all)."""
    torch.manual_seed(0)
    alpha = torch.softmax(4 * torch.randn(rows, keys), -1)
    values = torch.randn(rows, keys, d_head) * torch.rand(rows, keys, 1)
    visible = torch.ones(rows, keys, dtype=torch.bool)
    if window is not None:
        visible[:, : keys - window] = False
    return alpha, values, visible


def largest_difference(new: dict[str, torch.Tensor], old: dict[str, torch.Tensor]) -> float:
    """The largest difference of a field's finite entries over the fields both revisions give (a field one of
    them lacks is new or gone, not a difference); SystemExit where NaN or infinite entries differ."""
    largest = 0.0
    for name in new.keys() & old.keys():
        a, b = new[name], old[name]
        both = a.isfinite() & b.isfinite()
        if not (torch.equal(a.isnan(), b.isnan()) and torch.equal(a[~both & ~a.isnan()], b[~both & ~b.isnan()])):
            raise SystemExit(f"{name}: NaN or infinite entries differ between the two revisions")
        if both.any():
            largest = max(largest, float((a[both] - b[both]).abs().max()))
    return largest
