"""mkdocs hook: render the demo notebooks (demos/*.py, jupytext percent format) as tutorial pages.

Each ``demos/NN_name.py`` becomes ``tutorials/NN_name.md`` at build time:
Markdown cells as they are, code cells as Python code blocks, each followed by
its pre-rendered output when ``demos/outputs/NN_name.json`` has one (printed
text, and figures as PNGs in ``docs/assets/tutorials/``, both written by
``demos/render_outputs.py`` (``make tutorials``) from the test suite's small
run, which ``tests/test_demos.py`` checks against the code). No model runs at
build time and nothing is written into ``docs/``.
"""

import json
from pathlib import Path

import jupytext
from mkdocs.structure.files import File

DEMOS = Path(__file__).resolve().parent.parent / "demos"
OUTPUTS = DEMOS / "outputs"


def _output_markdown(output: dict) -> list[str]:
    """A code cell's pre-rendered output: its printed text, then its figures."""
    parts = []
    if output.get("text"):
        parts.append(f'```text title="output"\n{output["text"]}\n```')
    parts.extend(f"![figure {name}](../assets/tutorials/{name})" for name in output.get("images", []))
    return parts


def demo_markdown(path: Path) -> str:
    """The Markdown page of one demo: its cells in order, and how to run it."""
    notebook = jupytext.read(path, fmt="py:percent")
    saved = OUTPUTS / f"{path.stem}.json"
    outputs = json.loads(saved.read_text())["cells"] if saved.is_file() else {}
    parts = []
    code_index = -1
    for cell in notebook.cells:
        source = cell.source.strip("\n")
        if not source:
            continue
        if cell.cell_type == "markdown":
            parts.append(source)
            continue
        code_index += 1
        parts.append(f"```python\n{source}\n```")
        parts.extend(_output_markdown(outputs.get(str(code_index), {})))
    parts.insert(
        1,
        f'!!! note "Run it yourself"\n    This page is the demo `demos/{path.name}` (a jupytext percent-format '
        f"notebook). Run it as a script with `python demos/{path.name}`, or open it as a notebook with "
        f"`jupytext --to notebook demos/{path.name}`. The test suite runs it top to bottom on the default model "
        "at small sizes (`TL_GEOMETRY_DEMO_SMALL=1`); the outputs below are from that run.",
    )
    return "\n\n".join(parts) + "\n"


def on_files(files, config):
    """Add one generated page per demo under ``tutorials/``."""
    for path in sorted(DEMOS.glob("[0-9][0-9]_*.py")):
        files.append(File.generated(config, f"tutorials/{path.stem}.md", content=demo_markdown(path)))
    return files
