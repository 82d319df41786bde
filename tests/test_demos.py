"""The demo notebooks (demos/*.py, jupytext percent format) run top to bottom at small sizes."""

import runpy
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
def test_demo_runs(demo, tmp_path, monkeypatch, shared_default_model):
    """Each demo runs as a notebook kernel runs it: top to bottom in one namespace, here in the test's process
    (a process of its own would import and load the model again)."""
    monkeypatch.setenv("TL_GEOMETRY_DEMO_SMALL", "1")
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(demo), run_name="__main__")
