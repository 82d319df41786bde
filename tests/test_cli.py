"""The tl-geometry command, through its console script."""

import subprocess
import sys
from pathlib import Path

import pytest

from tl_geometry import GeometryResult

SCRIPT = Path(sys.executable).with_name("tl-geometry")


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, cwd=cwd, timeout=900)


@pytest.fixture(autouse=True)
def _needs_console_script():
    if not SCRIPT.exists():
        pytest.skip("the tl-geometry console script is not installed (pip install -e .)")


def test_help_lists_the_report_options(tmp_path):
    done = run("report", "--help", cwd=tmp_path)
    assert done.returncode == 0
    for option in ("--model", "--text", "--windows", "--context", "--n-grid", "--out"):
        assert option in done.stdout


@pytest.mark.slow
@pytest.mark.model
def test_report_analyze_and_plot(tmp_path):
    text = tmp_path / "story.txt"
    text.write_text(" ".join(f"Sentence number {i} is about attention heads." for i in range(200)))
    common = ("--text", str(text), "--windows", "2", "--context", "128", "--quiet")
    done = run("report", *common, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Precision(r_max)" in done.stdout and "report/index.html" in done.stdout
    page = (tmp_path / "report" / "index.html").read_text()
    assert page.count("<section") >= 3 and "story.txt" in page
    result = GeometryResult.load(tmp_path / "report" / "result")
    assert result.n_sequences == 2 and result.precision.shape[:2] == (30, 9)

    done = run("analyze", *common, "--out", "only-files", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "only-files").iterdir()) == ["result.json", "result.npz"]

    done = run("plot", "only-files/result", "--out", "replotted", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "replotted" / "index.html").read_text().count("<section") == page.count("<section")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("report", "--model", "no-such-model", "--quiet"), "load_model('no-such-model')"),
        (("report", "--text", "missing.txt", "--quiet"), "missing.txt"),
        (("report", "--windows", "0", "--quiet"), "--windows: expected a positive number, got 0"),
    ],
)
def test_errors_are_one_line_and_exit_non_zero(tmp_path, args, message):
    done = run(*args, cwd=tmp_path)
    assert done.returncode == 1
    assert message in done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1


def test_empty_text_file_is_refused(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    done = run("report", "--text", "empty.txt", "--quiet", cwd=tmp_path)
    assert done.returncode == 1 and "empty.txt" in done.stderr and "Traceback" not in done.stderr
