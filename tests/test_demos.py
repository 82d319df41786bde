"""The demo notebooks (demos/*.py, jupytext percent format) run top to bottom at small sizes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

DEMOS = sorted((Path(__file__).resolve().parents[1] / "demos").glob("[0-9][0-9]_*.py"))


def test_there_are_demos():
    assert len(DEMOS) >= 3


def test_demos_are_jupytext_percent_notebooks():
    for demo in DEMOS:
        text = demo.read_text()
        assert "format_name: percent" in text and "# %% [markdown]" in text, demo.name
        assert text.split("# %% [markdown]", 1)[1].lstrip("\n").startswith("# # "), f"{demo.name}: no title cell"


@pytest.mark.slow
@pytest.mark.parametrize("demo", DEMOS, ids=[d.stem for d in DEMOS])
def test_demo_runs(demo, tmp_path):
    env = dict(os.environ, TL_GEOMETRY_DEMO_SMALL="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", MPLBACKEND="Agg")
    proc = subprocess.run(
        [sys.executable, str(demo)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"{demo.name} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
