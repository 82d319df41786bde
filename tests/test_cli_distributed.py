"""The command at scale: torchrun with two processes writes the one-process result; devices checked first."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.fixtures import assert_equal_runs, free_port
from tl_geometry import GeometryResult
from tl_geometry.cli import main

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def cli(*args: str, launcher: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    command = [*launcher, "-m", "tl_geometry.cli", *args] if launcher else [sys.executable, "-m", "tl_geometry.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=900)


def in_this_process(*args: str) -> int:
    """``tl-geometry *args`` run here, on one thread as the torchrun ranks are (a new process would cost more
    to start than the run)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return main(list(args))
    finally:
        torch.set_num_threads(threads)


def torchrun(processes: int) -> tuple[str, ...]:
    """The torchrun launcher of ``processes`` ranks on a free port."""
    return (sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes),
            "--master-port", str(free_port()))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_missing_device_is_refused_before_the_model_loads(tmp_path):
    start = time.perf_counter()
    done = cli("analyze", "--device", "cuda", "--quiet", "--out", str(tmp_path / "out"))
    assert done.returncode == 1
    assert "tl-geometry: error: device: 'cuda' asked for, but torch sees no CUDA device" in done.stderr
    assert "loading" not in done.stderr and not (tmp_path / "out").exists()
    assert time.perf_counter() - start < 60  # no model was loaded (that alone takes longer under load)


def test_misspelt_model_is_refused_before_anything_loads(tmp_path):
    done = cli("analyze", "--model", "smollm2-135", "--quiet", "--out", str(tmp_path / "out"))
    assert done.returncode == 1
    assert done.stderr.startswith("tl-geometry: error: model: unknown name 'smollm2-135'; did you mean 'smollm2-135m'?")
    assert "loading" not in done.stderr and not (tmp_path / "out").exists()


def test_bad_checkpoint_every_is_one_line(tmp_path):
    done = cli("analyze", "--checkpoint-every", "5 minutes", "--quiet", "--out", str(tmp_path / "out"))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "tl-geometry: error: checkpoint_every: expected a number of windows (such as 500) or a duration (such as "
        "90s, 5m, 1h), got '5 minutes'"
    ]


@pytest.mark.slow
@pytest.mark.model
def test_torchrun_two_processes_write_the_one_process_result(tmp_path):
    common = ("analyze", "--windows", "3", "--context", "48", "--n-grid", "1,2,4,8", "--batch-size", "1", "--quiet",
              "--picture", "18.6", "--picture", "0.0")
    assert in_this_process(*common, "--out", str(tmp_path / "one")) == 0
    both = cli(*common, "--out", str(tmp_path / "two"), launcher=torchrun(2))
    assert both.returncode == 0, both.stderr
    assert both.stdout.count("wrote") == 1  # rank 0 alone writes and prints
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["result.json", "result.npz"]  # no checkpoint left
    two, one = GeometryResult.load(tmp_path / "two" / "result"), GeometryResult.load(tmp_path / "one" / "result")
    assert_equal_runs(two, one)
    # The pictures are gathered: each head keeps the row of the same document as in one process.
    assert [(p.layer, p.head, p.document, p.query_position) for p in two.pictures] == [
        (p.layer, p.head, p.document, p.query_position) for p in one.pictures] and len(one.pictures) == 2
    for a, b in zip(two.pictures, one.pictures):
        torch.testing.assert_close(a.y, b.y, atol=1e-5, rtol=0)
        assert a.order.tolist() == b.order.tolist()


@pytest.mark.slow
@pytest.mark.model
def test_torchrun_two_processes_intervene_as_one(tmp_path):
    from tl_geometry.results.interventions import InterventionResult

    common = ("intervene", "--windows", "3", "--context", "12", "--n-grid", "1,4", "--controls", "1", "--scope",
              "layer", "--layers", "0,1", "--n-star", "--taus", "0.05", "--bootstrap", "8", "--batch-size", "1",
              "--settings-per-pass", "8", "--quiet")
    assert in_this_process(*common, "--out", str(tmp_path / "one")) == 0
    both = cli(*common, "--out", str(tmp_path / "two"), launcher=torchrun(2))
    assert both.returncode == 0, both.stderr
    assert both.stdout.count("wrote") == 1  # rank 0 alone writes and prints
    one, two = InterventionResult.load(tmp_path / "one" / "sweep"), InterventionResult.load(tmp_path / "two" / "sweep")
    assert two.n_documents == one.n_documents == 3
    for name, s in one.stats.items():
        for statistic, x in s.stored().arrays().items():
            y = two.stats[name].stored().arrays()[statistic]
            torch.testing.assert_close(y, x, equal_nan=True, rtol=1e-6, atol=1e-12, msg=f"{name}/{statistic}")
    assert (tmp_path / "two" / "n_star.json").read_text() == (tmp_path / "one" / "n_star.json").read_text()
