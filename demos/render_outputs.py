"""Pre-render the demos' outputs for the docs: printed text per cell, and every figure shown as a small PNG.

Runs each demo (``demos/NN_name.py``) cell by cell at the test suite's small
sizes (``TL_GEOMETRY_DEMO_SMALL=1``), and writes

- ``demos/outputs/NN_name.json``: for each code cell (by its index among the
  code cells), the text it printed and the PNGs of the figures it showed;
- ``docs/assets/tutorials/NN_name-K.png``: those figures (kaleido + Chromium).

The docs build (``docs/hooks.py``) puts them under each code cell, so the
tutorials show real outputs without running a model at build time. Run it
again after changing a demo:

    TL_GEOMETRY_DEMO_SMALL=1 python demos/render_outputs.py [NN_name ...]
"""

import contextlib
import io
import json
import os
import sys
from pathlib import Path

import jupytext

DEMOS = Path(__file__).resolve().parent
OUTPUTS = DEMOS / "outputs"
IMAGES = DEMOS.parent / "docs" / "assets" / "tutorials"
MAX_LINES = 40  # longer printed outputs are cut (the docs show the start)
WIDTH, HEIGHT = 760, 420


def render(demo: Path) -> dict[str, dict[str, object]]:
    """Run ``demo`` cell by cell; its outputs by code-cell index."""
    notebook = jupytext.read(demo, fmt="py:percent")
    namespace: dict[str, object] = {"__name__": "__main__", "__file__": str(demo)}
    outputs: dict[str, dict[str, object]] = {}
    shown: list = []
    code_index = -1
    for cell in notebook.cells:
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        code_index += 1
        buffer = io.StringIO()
        shown.clear()
        with contextlib.redirect_stdout(buffer):
            exec(compile(cell.source, f"{demo.name} cell {code_index}", "exec"), namespace)
        show = namespace.get("show")
        if callable(show) and not getattr(show, "records", False):
            namespace["show"] = _recording(show, shown)
        images = []
        for figure in shown:
            name = f"{demo.stem}-{code_index}-{len(images)}.png"
            figure.write_image(IMAGES / name, width=WIDTH, height=HEIGHT, scale=1)
            images.append(name)
        lines = buffer.getvalue().rstrip("\n").splitlines()
        if len(lines) > MAX_LINES:
            lines = [*lines[:MAX_LINES], f"... ({len(lines) - MAX_LINES} more lines)"]
        if lines or images:
            outputs[str(code_index)] = {"text": "\n".join(lines), "images": images}
    return outputs


def _recording(show, shown: list):
    def recording_show(fig):
        show(fig)
        shown.append(fig)

    recording_show.records = True
    return recording_show


def main(names: list[str]) -> None:
    if os.environ.get("TL_GEOMETRY_DEMO_SMALL") != "1":
        sys.exit("set TL_GEOMETRY_DEMO_SMALL=1: the docs show the small runs the test suite runs")
    OUTPUTS.mkdir(exist_ok=True)
    IMAGES.mkdir(parents=True, exist_ok=True)
    for demo in sorted(DEMOS.glob("[0-9][0-9]_*.py")):
        if names and demo.stem not in names:
            continue
        for old in IMAGES.glob(f"{demo.stem}-*.png"):
            old.unlink()
        outputs = render(demo)
        (OUTPUTS / f"{demo.stem}.json").write_text(json.dumps(outputs, indent=1) + "\n")
        print(f"{demo.name}: {len(outputs)} cells with output", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
