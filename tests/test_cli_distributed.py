"""The command at scale: torchrun with two processes writes the one-process result; devices checked first."""

import json
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


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tl_geometry.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env=ENV, timeout=900)


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


ANALYZE = ("analyze", "--windows", "3", "--context", "48", "--n-grid", "1,2,4,8", "--batch-size", "1", "--quiet",
           "--picture", "18.6", "--picture", "0.0")
INTERVENE = ("intervene", "--windows", "3", "--context", "12", "--n-grid", "1,4", "--controls", "1", "--scope",
             "layer", "--layers", "0,1", "--n-star", "--taus", "0.05", "--bootstrap", "8", "--batch-size", "1",
             "--settings-per-pass", "8", "--quiet")
# Both commands in one torchrun launch (a launch costs its agent and every rank's start, more than
# either run): each rank calls the command line's `main` once per command, and each call joins the
# process group and leaves it, as the command does. The second joins on a rendezvous of its own: the
# launcher's store still holds the first group's keys.
RANK_SCRIPT = """\
import json
import os
import sys

import torch.distributed

from tl_geometry.cli import main

commands, second_port = json.loads(sys.argv[1])
for i, command in enumerate(commands):
    if i:
        os.environ.update(MASTER_PORT=str(second_port), TORCHELASTIC_USE_AGENT_STORE="False")
    code = main(command)
    if code or torch.distributed.is_initialized():
        sys.exit(code or "main did not leave its process group")
"""


def test_a_callers_process_group_is_left_in_place(tmp_path):
    torch.distributed.init_process_group("gloo", store=torch.distributed.FileStore(str(tmp_path / "store"), 1),
                                         rank=0, world_size=1)
    try:
        assert in_this_process("analyze", "--checkpoint-every", "5 minutes", "--out", str(tmp_path / "out")) == 1
        assert torch.distributed.is_initialized()
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
@pytest.mark.model
def test_torchrun_two_processes_analyze_and_intervene_as_one(tmp_path, shared_default_model):
    from tl_geometry.results.intervention_result import InterventionResult

    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    commands = json.dumps([[[*ANALYZE, "--out", str(tmp_path / "analyze-two")],
                            [*INTERVENE, "--out", str(tmp_path / "intervene-two")]], free_port()])
    # The one-process runs go on here while the ranks run.
    both = subprocess.Popen([*torchrun(2), str(script), commands], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT, env=ENV)
    try:
        assert in_this_process(*ANALYZE, "--out", str(tmp_path / "analyze-one")) == 0
        assert in_this_process(*INTERVENE, "--out", str(tmp_path / "intervene-one")) == 0
        stdout, stderr = both.communicate(timeout=900)
    finally:
        if both.poll() is None:  # a one-process run failed: stop the ranks too (torchrun passes SIGTERM on)
            both.terminate()
            both.communicate()
    assert both.returncode == 0, stderr
    assert stdout.count("wrote") == 2  # rank 0 alone writes and prints, once per command

    # analyze: the result of one process; no checkpoint left.
    assert sorted(p.name for p in (tmp_path / "analyze-two").iterdir()) == ["result.json", "result.npz"]
    two = GeometryResult.load(tmp_path / "analyze-two" / "result")
    one = GeometryResult.load(tmp_path / "analyze-one" / "result")
    assert_equal_runs(two, one)
    # The pictures are gathered: each head keeps the row of the same document as in one process.
    assert [(p.layer, p.head, p.document, p.query_position) for p in two.pictures] == [
        (p.layer, p.head, p.document, p.query_position) for p in one.pictures] and len(one.pictures) == 2
    for a, b in zip(two.pictures, one.pictures):
        torch.testing.assert_close(a.y, b.y, atol=1e-5, rtol=0)
        assert a.order.tolist() == b.order.tolist()

    # intervene: the sweep and N* of one process.
    one = InterventionResult.load(tmp_path / "intervene-one" / "sweep")
    two = InterventionResult.load(tmp_path / "intervene-two" / "sweep")
    assert two.n_documents == one.n_documents == 3
    for name, s in one.stats.items():
        for statistic, x in s.stored().arrays().items():
            y = two.stats[name].stored().arrays()[statistic]
            torch.testing.assert_close(y, x, equal_nan=True, rtol=1e-6, atol=1e-12, msg=f"{name}/{statistic}")
    assert (tmp_path / "intervene-two" / "n_star.json").read_text() == (
        tmp_path / "intervene-one" / "n_star.json").read_text()
