"""The demo notebooks (demos/*.py, jupytext percent format) run top to bottom at small sizes, and print what
their tutorials show (demos/outputs/*.json, rendered by demos/render_outputs.py)."""

import difflib
import importlib.util
import json
import re
from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parents[1]
DEMOS = sorted((ROOT / "demos").glob("[0-9][0-9]_*.py"))
OUTPUTS = ROOT / "demos" / "outputs"
IMAGES = ROOT / "docs" / "assets" / "tutorials"

_spec = importlib.util.spec_from_file_location("render_outputs", ROOT / "demos" / "render_outputs.py")
render_outputs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render_outputs)

# What may differ between the committed outputs and a run of the same code elsewhere, and why; nothing else:
# - temporary folders: their names are random (tempfile.mkdtemp), so they are masked;
# - the last printed digit of a decimal, by one unit: another CPU's vector width or another number of
#   threads sums floats in another order, and a value near a rounding boundary then prints one unit
#   higher or lower. Words, integers (counts, layers, N, percentages) and the number of digits must match.
#   (Heads are written L16H0, as `HeadRoles.describe` and the demos write them, and compared exactly.)
TEMPORARY_FOLDER = re.compile(r"[^\s'\"]*/tmp[a-z0-9_]{8}(?=[/\s'\"]|$)")
DECIMAL = re.compile(r"-?\d+\.\d+")


def same_text(committed: str, printed: str) -> bool:
    """Whether a cell printed its committed text, but for temporary folders and a decimal's last digit."""
    committed, printed = (TEMPORARY_FOLDER.sub("<temporary folder>", text) for text in (committed, printed))
    if DECIMAL.split(committed) != DECIMAL.split(printed):
        return False
    for old, new in zip(DECIMAL.findall(committed), DECIMAL.findall(printed)):
        places = len(old.split(".")[1])
        if len(new.split(".")[1]) != places or abs(float(old) - float(new)) > 1.5 * 10.0**-places:
            return False
    return True


def differences(committed: dict[str, dict], printed: dict[str, dict]) -> list[str]:
    """What a run printed or showed differently from the committed cells (both as in the outputs files)."""
    problems = []
    for index in sorted(committed.keys() | printed.keys(), key=int):
        old, new = committed.get(index, {"text": "", "images": []}), printed.get(index, {"text": "", "images": []})
        if len(old["images"]) != len(new["images"]):
            problems.append(f"code cell {index} showed {len(new['images'])} figures, the tutorial {len(old['images'])}")
        if not same_text(old["text"], new["text"]):
            diff = difflib.unified_diff(old["text"].splitlines(), new["text"].splitlines(), "committed", "printed",
                                        lineterm="", n=0)
            problems.append(f"code cell {index} printed other text:\n" + "\n".join(diff))
    return problems


def major_version(version: str) -> int:
    return int(version.split(".")[0])


def test_there_are_demos():
    assert len(DEMOS) >= 3


def test_demos_are_jupytext_percent_notebooks():
    for demo in DEMOS:
        text = demo.read_text()
        assert "format_name: percent" in text and "# %% [markdown]" in text, demo.name
        assert text.split("# %% [markdown]", 1)[1].lstrip("\n").startswith("# # "), f"{demo.name}: no title cell"


def test_every_demo_has_outputs_whose_cells_and_figures_exist():
    """Each committed outputs file names code cells its demo has and figures that are on disk, and no figure
    on disk is left from an earlier rendering."""
    named = set()
    for demo in DEMOS:
        saved = json.loads((OUTPUTS / f"{demo.stem}.json").read_text())
        assert set(saved["rendered_with"]) == {"transformer_lens", "torch"}, demo.name
        n_code_cells = sum(1 for cell in jupytext.read(demo).cells if cell.cell_type == "code" and cell.source.strip())
        assert all(0 <= int(index) < n_code_cells for index in saved["cells"]), demo.name
        for output in saved["cells"].values():
            named.update(output["images"])
    assert named == {path.name for path in IMAGES.glob("*.png")}
    assert {path.stem for path in OUTPUTS.glob("*.json")} == {demo.stem for demo in DEMOS}


# What a reader should never see in a tutorial: a bare "nan" (a missing value says why) and a head written
# layer.head at the start of a line, which reads as a number ("16.0: content ...").
UNREADABLE = {"a bare nan": re.compile(r"\bnan\b"), "a head written layer.head": re.compile(r"(?m)^\d+\.\d+: ")}


def unreadable(cells: dict[str, dict]) -> list[str]:
    return [f"code cell {index} prints {what}: {cell['text']!r}" for index, cell in sorted(cells.items())
            for what, pattern in UNREADABLE.items() if pattern.search(cell["text"])]


def test_committed_outputs_say_why_a_value_is_missing_and_name_heads_as_l_h():
    """Once the outputs are rendered again: no cell prints "nan" or a head as "16.0"."""
    problems = [f"{path.name}: {problem}" for path in sorted(OUTPUTS.glob("*.json"))
                for problem in unreadable(json.loads(path.read_text())["cells"])]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(("text", "found"), [
    ("N=1 Spearman = nan [nan, nan]", True), ("mixer: 0 heads (mean layer nan)", True),
    ("16.0: content (previous-token)", True), ("N=1 Spearman: no value: dNLL the same for every unit", False),
    ("L16H0: content", False), ("relative dNLL 0.7222 [0.6943, 0.7522]", False), ("nanoGPT, NaN-free", False),
])
def test_what_counts_as_unreadable(text, found):
    assert bool(unreadable({"1": {"text": text, "images": []}})) == found


TEXT = "L16H0 content previous-token 0.79, 102 Content heads; relative dNLL  -0.0016 [-0.0024, 0.0939]"


@pytest.mark.parametrize(("committed", "printed"), [
    (TEXT, TEXT),
    (TEXT, TEXT.replace("0.79", "0.80").replace("-0.0016", "-0.0015")),  # last digits, one unit
    (TEXT + "\nwrote /tmp/tmp1olola57/report/index.html", TEXT + "\nwrote /tmp/tmpabcd_234/report/index.html"),
])
def test_a_run_may_differ_in_temporary_folders_and_a_decimals_last_digit(committed, printed):
    assert same_text(committed, printed)
    assert not differences({"3": {"text": committed, "images": ["a.png"]}}, {"3": {"text": printed, "images": ["b.png"]}})


@pytest.mark.parametrize("printed", [
    TEXT.replace("content previous-token", "unclassified weak"),  # a word
    TEXT.replace("102", "14"),  # an integer
    TEXT.replace("L16H0", "L16H1"),
    TEXT.replace("0.79", "0.81"),  # two units of the last digit
    TEXT.replace("0.79", "0.790"),  # another number of digits
    TEXT.replace("0.0939", "0.0939 0.1"),
    TEXT + "\nwrote report/index.html",
])
def test_a_run_that_prints_anything_else_differs(printed):
    assert not same_text(TEXT, printed)
    problems = differences({"3": {"text": TEXT, "images": []}}, {"3": {"text": printed, "images": []}})
    assert len(problems) == 1 and problems[0].startswith("code cell 3 printed other text")


def test_a_run_that_shows_other_figures_or_cells_differs():
    cell = {"text": TEXT, "images": ["x-3-0.png"]}
    assert differences({"3": cell}, {"3": {"text": TEXT, "images": []}}) == [
        "code cell 3 showed 0 figures, the tutorial 1"]
    assert len(differences({"3": cell}, {"3": cell, "4": {"text": "more", "images": []}})) == 1
    assert len(differences({"3": cell, "4": cell}, {"3": cell})) == 2


@pytest.mark.slow
@pytest.mark.parametrize("demo", DEMOS, ids=[d.stem for d in DEMOS])
def test_demo_runs_and_prints_what_its_tutorial_shows(demo, tmp_path, monkeypatch, shared_default_model):
    """Each demo runs as a notebook kernel runs it: top to bottom in one namespace, here in the test's process
    (a process of its own would import and load the model again), cell by cell as demos/render_outputs.py
    runs it; then each cell's printed text and number of figures are compared with the committed outputs."""
    monkeypatch.setenv("TL_GEOMETRY_DEMO_SMALL", "1")
    monkeypatch.chdir(tmp_path)
    printed = render_outputs.saved_cells(demo.stem, render_outputs.run(demo))

    regenerate = f"Render them again with `make tutorials DEMOS={demo.stem}` and commit them."
    saved_path = OUTPUTS / f"{demo.stem}.json"
    assert saved_path.is_file(), f"{demo.name} has no outputs file {saved_path.relative_to(ROOT)}. {regenerate}"
    saved = json.loads(saved_path.read_text())
    rendered_with, running = saved["rendered_with"]["transformer_lens"], render_outputs.environment()["transformer_lens"]
    if major_version(rendered_with) != major_version(running):
        pytest.skip(f"{demo.name} ran; its outputs come from TransformerLens {rendered_with}, which prints "
                    f"differently from {running} (a HookedTransformer or not): not compared")
    assert not unreadable(printed), "\n".join(unreadable(printed))
    problems = differences(saved["cells"], printed)
    assert not problems, (f"{demo.name} no longer prints what its tutorial shows "
                          f"({saved_path.relative_to(ROOT)}):\n" + "\n".join(problems) + f"\n{regenerate}")
