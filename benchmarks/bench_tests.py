"""The test suite's fixed costs at two git revisions, side by side in one run: collection and ``import tl_geometry``.

``make test`` is too long to time twice on a shared machine, and most of what a
refactor of the package's layout can change in it is paid before any test
runs: importing the package (every test process does) and collecting the
suite (every xdist worker does, once). This script checks both revisions out
with ``git worktree add`` into a temporary folder (the working tree is not
measured: commit first) and, alternating the two revisions run by run, times

- ``pytest --collect-only -q`` in the checkout (the suite's own options: the
  doctests of every module of the package are collected too), wall time of the
  whole process, and how many tests it collected;
- ``python -X importtime -c "import tl_geometry"``: the sum of every module's
  own import time (``self``, microseconds, the modules of the dependencies
  included) and the part of it spent in the package's own modules.

One run of each revision first, not counted, writes the checkouts' bytecode,
so that both are measured warm. Medians over ``--repeats`` runs and the ratio
new / old are printed with the machine's load average before and after:
on a machine others are using the figures are noisy, and the ratio measured
side by side is the figure to read.

    PYTHONPATH=. python benchmarks/bench_tests.py [--old a3e16f6^1] [--new HEAD] [--repeats 5]

Defaults: the revision before capture/ was split by workflow (``a3e16f6^1``)
against ``HEAD``.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLLECTED = re.compile(r"(\d+) tests? collected")


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout.strip()


def environment(checkout: Path) -> dict[str, str]:
    """The checkout's package first on the path; bytecode written (as ``make test`` runs)."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def check_imports_from(checkout: Path) -> None:
    """The package imported is the checkout's, not an installed copy (else both revisions measure one tree)."""
    found = subprocess.run([sys.executable, "-c", "import tl_geometry; print(tl_geometry.__file__)"], cwd=checkout,
                           env=environment(checkout), check=True, capture_output=True, text=True).stdout.strip()
    if not Path(found).resolve().is_relative_to(checkout.resolve()):
        raise SystemExit(f"bench_tests: {checkout} imports tl_geometry from {found}; check PYTHONPATH")


def collect(checkout: Path) -> tuple[float, int]:
    """Seconds of ``pytest --collect-only -q`` in ``checkout`` (the whole process) and the tests it collected."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                          cwd=checkout, env=environment(checkout), capture_output=True, text=True)
    seconds = time.perf_counter() - start
    found = COLLECTED.search(proc.stdout.splitlines()[-1] if proc.stdout.strip() else "")
    if proc.returncode != 0 or found is None:
        raise SystemExit(f"bench_tests: collection failed in {checkout}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return seconds, int(found.group(1))


def import_time(checkout: Path) -> tuple[float, float]:
    """Milliseconds of ``import tl_geometry`` from ``-X importtime``: every module's own time summed, and the
    package's modules' part of it."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", "import tl_geometry"], cwd=checkout,
                          env=environment(checkout), check=True, capture_output=True, text=True)
    total = package = 0
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _, name = (part.strip() for part in line.removeprefix("import time:").split("|"))
        total += int(self_us)
        if name.split(".")[0] == "tl_geometry":
            package += int(self_us)
    return total / 1e3, package / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default="a3e16f6^1", help="the revision before (default: before capture/ was split)")
    parser.add_argument("--new", default="HEAD", help="the revision after (default: HEAD)")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each measure per revision (default 5)")
    args = parser.parse_args()
    revisions = {"old": args.old, "new": args.new}
    commits = {label: git("rev-parse", "--short", rev) for label, rev in revisions.items()}
    with tempfile.TemporaryDirectory(prefix="bench_tests_") as folder:
        checkouts = {label: Path(folder) / label for label in revisions}
        try:
            for label, rev in revisions.items():
                git("worktree", "add", "--detach", str(checkouts[label]), rev)
                check_imports_from(checkouts[label])
            load_before = os.getloadavg()
            for checkout in checkouts.values():  # warm: the checkouts' bytecode written, not counted
                collect(checkout)
                import_time(checkout)
            runs = {label: {"collect": [], "import": [], "own": []} for label in revisions}
            tests = {}
            for _ in range(args.repeats):
                for label, checkout in checkouts.items():  # alternating, so that a change of load hits both
                    seconds, tests[label] = collect(checkout)
                    total, own = import_time(checkout)
                    runs[label]["collect"].append(seconds)
                    runs[label]["import"].append(total)
                    runs[label]["own"].append(own)
            load_after = os.getloadavg()
        finally:
            for checkout in checkouts.values():
                if checkout.exists():
                    git("worktree", "remove", "--force", str(checkout))
    print(f"old = {args.old} ({commits['old']}, {tests['old']} tests collected), "
          f"new = {args.new} ({commits['new']}, {tests['new']} tests collected)")
    print(f"medians of {args.repeats} runs each, alternating; load average before {load_before[0]:.2f}, "
          f"after {load_after[0]:.2f} on {os.cpu_count()} cores")
    rows = [("pytest --collect-only (s)", "collect", "{:.2f}"),
            ("import tl_geometry, all modules (ms)", "import", "{:.0f}"),
            ("  of which tl_geometry's own (ms)", "own", "{:.0f}")]
    print(f"{'':40s} {'old':>8s} {'new':>8s} {'new/old':>8s}   old range / new range")
    for title, key, fmt in rows:
        old, new = (statistics.median(runs[label][key]) for label in revisions)
        spread = " / ".join(f"{fmt.format(min(runs[label][key]))}-{fmt.format(max(runs[label][key]))}"
                            for label in revisions)
        print(f"{title:40s} {fmt.format(old):>8s} {fmt.format(new):>8s} {new / old:8.2f}   {spread}")


if __name__ == "__main__":
    main()
