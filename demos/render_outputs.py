"""Render the demos' outputs for the docs: printed text per cell, and every figure shown as a small PNG.

Runs each demo (``demos/NN_name.py``) cell by cell at the test suite's small
sizes (``TL_GEOMETRY_DEMO_SMALL=1``, set here), and writes

- ``demos/outputs/NN_name.json``: the TransformerLens and torch versions of
  the run, and for each code cell (by its index among the code cells) the
  text it printed and the PNGs of the figures it showed;
- ``docs/assets/tutorials/NN_name-K-F.png``: those figures (kaleido + Chromium).

The docs build (``docs/hooks.py``) puts them under each code cell, so the
tutorials show real outputs without running a model at build time.
``tests/test_demos.py`` runs the demos through `run` as well and fails when
what they print no longer matches the committed text. Regenerate after a
change to a demo or to what it prints (a few minutes on 2 CPU cores):

    make tutorials                            # every demo
    make tutorials DEMOS=02_head_classification   # some of them

or ``python demos/render_outputs.py [NN_name ...]`` in an environment of the
package with its dev extras.
"""

import contextlib
import importlib.metadata
import io
import json
import os
import sys
from pathlib import Path
from typing import Any, NamedTuple

import jupytext
import plotly.io

DEMOS = Path(__file__).resolve().parent
OUTPUTS = DEMOS / "outputs"
IMAGES = DEMOS.parent / "docs" / "assets" / "tutorials"
MAX_LINES = 40  # longer printed outputs are cut (the docs show the start)
WIDTH, HEIGHT = 760, 420


class CellOutput(NamedTuple):
    """What one code cell printed (cut to `MAX_LINES`) and the figures it passed to the demo's ``show``."""

    text: str
    figures: list[Any]


def run(demo: Path) -> dict[int, CellOutput]:
    """Run ``demo`` as a notebook kernel does, top to bottom in one namespace; its outputs by code-cell index.

    Cells that print nothing and show no figure are left out. The caller sets ``TL_GEOMETRY_DEMO_SMALL``.
    """
    notebook = jupytext.read(demo, fmt="py:percent")
    namespace: dict[str, object] = {"__name__": "__main__", "__file__": str(demo)}
    outputs: dict[int, CellOutput] = {}
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
        # The demos define `show(fig)` in their first cell; from then on it also records what it shows.
        show = namespace.get("show")
        if callable(show) and not getattr(show, "records", False):
            namespace["show"] = _recording(show, shown)
        lines = buffer.getvalue().rstrip("\n").splitlines()
        if len(lines) > MAX_LINES:
            lines = [*lines[:MAX_LINES], f"... ({len(lines) - MAX_LINES} more lines)"]
        if lines or shown:
            outputs[code_index] = CellOutput("\n".join(lines), list(shown))
    return outputs


def _recording(show, shown: list):
    def recording_show(fig):
        show(fig)
        shown.append(fig)

    recording_show.records = True
    return recording_show


def saved_cells(stem: str, outputs: dict[int, CellOutput]) -> dict[str, dict[str, object]]:
    """The ``cells`` of ``demos/outputs/<stem>.json`` for these outputs: text and figure file names by cell index."""
    return {
        str(index): {"text": output.text, "images": [f"{stem}-{index}-{k}.png" for k in range(len(output.figures))]}
        for index, output in outputs.items()
    }


def environment() -> dict[str, str]:
    """The versions a run's printed numbers depend on (TransformerLens 3 and 4 print differently)."""
    return {package.replace("-", "_"): importlib.metadata.version(package) for package in ("transformer-lens", "torch")}


def render(demo: Path, rendered_with: dict[str, str]) -> dict[str, object]:
    """Run ``demo``, write its figures' PNGs, and return the contents of its outputs file."""
    outputs = run(demo)
    cells = saved_cells(demo.stem, outputs)
    for old in IMAGES.glob(f"{demo.stem}-*.png"):
        old.unlink()
    figures = [figure for output in outputs.values() for figure in output.figures]
    names = [IMAGES / name for cell in cells.values() for name in cell["images"]]
    if figures:  # one Chromium for all of them (a call per figure starts one each time)
        plotly.io.write_images(figures, names, width=WIDTH, height=HEIGHT, scale=1)
    return {"rendered_with": rendered_with, "cells": cells}


def main(names: list[str]) -> None:
    os.environ["TL_GEOMETRY_DEMO_SMALL"] = "1"  # the docs show the small runs the test suite runs
    demos = sorted(DEMOS.glob("[0-9][0-9]_*.py"))
    unknown = set(names) - {demo.stem for demo in demos}
    if unknown:
        sys.exit(f"no demo named {sorted(unknown)}; the demos are {[demo.stem for demo in demos]}")
    rendered_with = environment()
    OUTPUTS.mkdir(exist_ok=True)
    IMAGES.mkdir(parents=True, exist_ok=True)
    for demo in demos:
        if names and demo.stem not in names:
            continue
        saved = render(demo, rendered_with)
        (OUTPUTS / f"{demo.stem}.json").write_text(json.dumps(saved, indent=1) + "\n")
        print(f"{demo.name}: {len(saved['cells'])} cells with output", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
