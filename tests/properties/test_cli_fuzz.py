"""Fuzzing the command line: any mix of good and bad arguments ends with exit 1 or 2 and one line, and every bad
one is caught before the model loads (a stand-in loader says when it was reached)."""

import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.fixtures import inject
from tl_geometry import cli, models
from tl_geometry.errors import GeometryError

LOADED = "model loading reached"
# Removed when the process ends.
_TEMPORARY = tempfile.TemporaryDirectory(prefix="tl-geometry-cli-fuzz-")
_ROOT = Path(_TEMPORARY.name)
(_ROOT / "afile").write_text("a file, not a folder")
(_ROOT / "story.txt").write_text("Once upon a time " * 50)
(_ROOT / "folder").mkdir()
NUMBERS = st.integers(-3, 3).map(str) | st.sampled_from(["x", "1.5", "", "1e3"])
OUTS = st.sampled_from(["out", "afile", "afile/sub", "folder", "new/nested/out"])
TEXTS = st.sampled_from(["story.txt", "missing.txt", "folder"])
GRIDS = st.sampled_from(["default", "all", "1,2,4", "0,4", "-1", "a,b", ""])


@st.composite
def command_lines(draw):
    command = draw(st.sampled_from(["analyze", "report", "plot"]))
    args = [command]
    if command == "plot":
        args.append(draw(st.sampled_from(["missing/result", "afile", "folder"])))
    else:
        for option, values in (("--windows", NUMBERS), ("--context", NUMBERS), ("--batch-size", NUMBERS),
                               ("--n-grid", GRIDS), ("--text", TEXTS)):
            if draw(st.booleans()):
                args += [option, draw(values)]
    if draw(st.booleans()):
        args += ["--out", draw(OUTS)]
    return args + ["--quiet"] * (command != "plot")


def _bad(args):
    """What the command line gets wrong, by our own reading of it (None if nothing)."""
    values = dict(zip(args[1::2], args[2::2])) if args[0] != "plot" else {}
    out = dict(zip(args, args[1:])).get("--out", "report")
    for option, least in (("--windows", 1), ("--context", 2), ("--batch-size", 1)):  # a context of 1 holds only BOS
        if option in values and not (values[option].lstrip("-").isdigit() and int(values[option]) >= least):
            return option
    grid = values.get("--n-grid")
    if grid is not None and grid not in ("default", "all"):
        parts = [p for p in grid.split(",") if p.strip()]
        if not all(p.lstrip("-").isdigit() for p in parts) or not parts or min(map(int, parts)) < 1:
            return "--n-grid"
    if values.get("--text", "story.txt") != "story.txt" or out.startswith("afile") or args[0] == "plot":
        return "path"
    return None


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command_lines())
@example(["analyze", "--out", "new/nested/out", "--quiet"])  # its missing parents were left behind
def test_command_lines(monkeypatch, capsys, args):
    def stand_in(*a, **k):
        raise GeometryError(LOADED)

    monkeypatch.setattr(models, "load_model", stand_in)
    inject(monkeypatch, "cli_analyse", lambda a: models.load_model())  # the default text is not needed here
    cwd = os.getcwd()
    os.chdir(_ROOT)
    try:
        try:
            code = cli.main(args)
        except SystemExit as exit:  # argparse: a value of the wrong type
            code = exit.code
    finally:
        os.chdir(cwd)
    err = capsys.readouterr().err
    assert sorted(p.name for p in _ROOT.iterdir()) == ["afile", "folder", "story.txt"]  # nothing left behind
    assert code in (cli.EXIT_INPUT, cli.EXIT_USAGE) and "Traceback" not in err
    if code == cli.EXIT_INPUT:
        assert err.count("\n") == 1
        assert (LOADED in err) == (_bad(args) is None), (args, err)
