"""Write the claims' numbers in docs/claims.md and docs/concepts.md from real runs, so that they cannot go stale.

    PYTHONPATH=. python scripts/claims_docs.py [--smollm2 DIR] [--gemma DIR]

Runs ``tl-geometry analyze`` with its defaults on each bundled model (or reads
the result a previous run saved in DIR), writes each claims table to
``docs/data/claims-<model>.csv`` and replaces every block between
``<!-- claims:<model> -->`` and ``<!-- /claims:<model> -->`` in the docs with
that table as Markdown. The table of the claims' statistics and thresholds
(between ``<!-- claims:declared -->`` and ``<!-- /claims:declared -->``) is
written from the claims' declarations (``tl_geometry.analysis.claims.CLAIMS``).
``tests/test_docs.py`` checks that every block is what its CSV file, or the
registry, renders. It prints how long `tl_geometry.claims` took on each.

    PYTHONPATH=. python scripts/claims_docs.py --declared-only   # the declarations' table alone, no run
"""

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

import tl_geometry as tg
from tl_geometry.analysis.claims import CLAIMS
from tl_geometry.report.scorecard import scorecard_markdown

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "data"
PAGES = (ROOT / "docs" / "claims.md", ROOT / "docs" / "concepts.md")
MODELS = {"smollm2-135m": "smollm2-135m", "gemma3-270m": "gemma3-270m"}  # block name -> --model
DECLARED = "declared"  # the block of the claims' statistics and thresholds, on the claims page


def csv_path(name: str) -> Path:
    return DATA / f"claims-{name}.csv"


def block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- claims:{re.escape(name)} -->\n)(.*?)(<!-- /claims:{re.escape(name)} -->)", re.S)


def rendered(name: str) -> str:
    """The Markdown table of a model's recorded claims (what every block of that name holds)."""
    table = pd.read_csv(csv_path(name), index_col="key")
    text = [column for column in table.columns if column not in ("value", "low", "high")]
    return scorecard_markdown(table.astype({column: object for column in text}).fillna({c: "" for c in text}))


def declared_table() -> str:
    """The claims' statistics and thresholds as a Markdown table, one row per declared claim, in CLAIMS's order."""
    def cell(text: str) -> str:
        return text.replace("|", "&#124;")  # a pipe inside a cell would end it

    rows = ["| claim | paper | statistic | holds | partly |", "|---|---|---|---|---|"]
    for c in CLAIMS.values():
        t = c.thresholds
        rows.append(f"| {cell(c.docs_name)} | {cell(c.docs_paper)} | {cell(c.docs_statistic)} | "
                    f"{t.direction} {t.holds:g} | {t.direction} {t.partly:g} |")
    return "\n".join(rows) + "\n"


def write_declared() -> None:
    page = PAGES[0]
    text, found = block(DECLARED).subn(lambda m: m.group(1) + declared_table() + m.group(3), page.read_text())
    if not found:
        raise SystemExit(f"{page.relative_to(ROOT)} has no <!-- claims:{DECLARED} --> block")
    page.write_text(text)
    print(f"wrote the declared claims' table in {page.relative_to(ROOT)}")


def result_of(name: str, folder: Path | None) -> tg.GeometryResult:
    if folder is None:
        folder = ROOT / "runs" / f"docs-{name}"
        subprocess.run([sys.executable, "-m", "tl_geometry", "analyze", "--model", MODELS[name], "--out", str(folder)],
                       check=True)
    return tg.GeometryResult.load(folder / "result")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smollm2", type=Path, help="a folder with a saved default run of SmolLM2-135M")
    parser.add_argument("--gemma", type=Path, help="a folder with a saved default run of Gemma-3-270M")
    parser.add_argument("--declared-only", action="store_true", help="only the table of the claims' declarations")
    args = parser.parse_args()
    write_declared()
    if args.declared_only:
        return
    DATA.mkdir(parents=True, exist_ok=True)
    for name, folder in (("smollm2-135m", args.smollm2), ("gemma3-270m", args.gemma)):
        result = result_of(name, folder)
        start = time.perf_counter()
        table = tg.claims(result)
        print(f"{name}: tg.claims took {time.perf_counter() - start:.2f} s")
        table.to_csv(csv_path(name))
    for page in PAGES:
        text = page.read_text()
        for name in MODELS:
            text = block(name).sub(lambda m: m.group(1) + rendered(name) + m.group(3), text)
        page.write_text(text)
        print(f"wrote {page.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
