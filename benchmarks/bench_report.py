"""Size and opening time of the default report in headless Chromium (offline), cold and warm, in one run.

The report of the default command (``tl-geometry report``; the page's size does
not grow with the windows, so one window by default) is opened ``--rounds``
times in a fresh browser profile each (cold: nothing cached) and ``--rounds``
times again in one browser (warm). The time runs from navigation until the
head explorer says it is ready, after every figure has been drawn. The
browser is `tests.browser` (the DevTools pipe, network cut).

Run: ``PYTHONPATH=. python benchmarks/bench_report.py [--windows 1] [--rounds 5] [--report PATH]``.
Targets (issue "The report and docs as a research instrument"): under 10 MB,
open in under 3 s.
"""

import argparse
import statistics
import tempfile
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--report", type=Path, help="an index.html to open instead of building the default one")
    args = parser.parse_args()

    from tests.browser import CHROMIUM, Browser, open_page

    if CHROMIUM is None:
        raise SystemExit("needs Chromium (chromium or chromium-browser on PATH)")
    with tempfile.TemporaryDirectory() as tmp:
        index = args.report
        if index is None:
            from tl_geometry.cli import main as cli

            out = Path(tmp) / "report"
            assert cli(["report", "--windows", str(args.windows), "--out", str(out), "--quiet"]) == 0
            index = out / "index.html"
        size = index.stat().st_size
        cold = []
        for k in range(args.rounds):
            browser = Browser(Path(tmp) / f"profile-{k}", timeout=120)
            try:
                cold.append(open_page(browser, index.as_uri()))
                console = browser.console()
            finally:
                browser.close()
            if console:
                raise SystemExit(f"the console is not empty: {console[:3]}")
        browser = Browser(Path(tmp) / "profile-warm", timeout=120)
        try:
            warm = [open_page(browser, index.as_uri()) for _ in range(args.rounds)]
        finally:
            browser.close()
    print(f"report: {index.name}, {size / 1e6:.2f} MB (target < 10 MB)")
    print(f"  open, cold profile: median {statistics.median(cold):.2f} s, max {max(cold):.2f} s "
          f"({', '.join(f'{s:.2f}' for s in cold)}) (target < 3 s)")
    print(f"  open, warm browser: median {statistics.median(warm):.2f} s ({', '.join(f'{s:.2f}' for s in warm)})")


if __name__ == "__main__":
    main()
