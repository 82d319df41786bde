"""mkdocs hook: render the demo notebooks (demos/*.py, jupytext percent format) as tutorial pages.

Each ``demos/NN_name.py`` becomes ``tutorials/NN_name.md`` at build time:
Markdown cells as they are, code cells as Python code blocks. Outputs are not
committed (the demos run in the test suite), so the pages show code and prose.
Nothing is written into ``docs/``.
"""

from pathlib import Path

import jupytext
from mkdocs.structure.files import File

DEMOS = Path(__file__).resolve().parent.parent / "demos"


def demo_markdown(path: Path) -> str:
    """The Markdown page of one demo: its cells in order, and how to run it."""
    notebook = jupytext.read(path, fmt="py:percent")
    parts = []
    for cell in notebook.cells:
        source = cell.source.strip("\n")
        if not source:
            continue
        parts.append(source if cell.cell_type == "markdown" else f"```python\n{source}\n```")
    parts.insert(
        1,
        f'!!! note "Run it yourself"\n    This page is the demo `demos/{path.name}` (a jupytext percent-format '
        f"notebook). Run it as a script with `python demos/{path.name}`, or open it as a notebook with "
        f"`jupytext --to notebook demos/{path.name}`. The test suite runs it top to bottom on the default model "
        "at small sizes (`TL_GEOMETRY_DEMO_SMALL=1`).",
    )
    return "\n\n".join(parts) + "\n"


def on_files(files, config):
    """Add one generated page per demo under ``tutorials/``."""
    for path in sorted(DEMOS.glob("[0-9][0-9]_*.py")):
        files.append(File.generated(config, f"tutorials/{path.stem}.md", content=demo_markdown(path)))
    return files
