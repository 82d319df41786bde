"""Resumable corpus runs: a killed run, started again, ends with exactly the uninterrupted result."""

import json
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta

import pytest
import torch

from tests import tiny_models as tm
from tests.fixtures import spy
from tl_geometry.errors import GeometryError
from tl_geometry.runs import corpus_run as corpus_module
from tl_geometry.runs.checkpoint import CheckpointEvery
from tl_geometry.runs.corpus_run import analyze_corpus

pytestmark = pytest.mark.model

KIND = "bridge-gpt2"
N_WINDOWS = 16
SETTINGS = {"query_positions": "all", "n_bootstrap": 20, "keep_queries": True}


def corpus() -> torch.Tensor:
    return tm.with_bos(tm.random_tokens(N_WINDOWS, 9, seed=3))


@pytest.fixture(scope="module")
def model():
    return tm.make_model(KIND)


@pytest.fixture(scope="module")
def uninterrupted(model):
    return analyze_corpus(model, corpus(), batch_size=2, progress=False, **SETTINGS)


def assert_identical(a, b):
    """Bit for bit: every statistic of every field, the counts of documents and tokens, per-query rows."""
    assert (a.n_documents, a.n_tokens) == (b.n_documents, b.n_tokens)
    assert torch.equal(a.n_grid, b.n_grid) and a.fields == b.fields
    for name in a.fields:
        mine, theirs = a.stats[name].arrays(), b.stats[name].arrays()
        assert mine.keys() == theirs.keys()
        for statistic, t in mine.items():
            assert torch.equal(t.nan_to_num(-7.0), theirs[statistic].nan_to_num(-7.0)), (name, statistic)
    assert torch.equal(a.query_positions, b.query_positions)
    for name, t in a.queries.items():
        assert torch.equal(t.nan_to_num(-7.0), b.queries[name].nan_to_num(-7.0)), name


def interrupt_after(monkeypatch, n_batches: int) -> None:
    """Make the n-th batch of the next run raise KeyboardInterrupt (as Ctrl-C would)."""
    calls = {"n": 0}
    original = corpus_module.analyse_prepared

    def analyse(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n_batches:
            raise KeyboardInterrupt
        original(*args, **kwargs)

    monkeypatch.setattr(corpus_module, "analyse_prepared", analyse)


# The child analyses slowly (a pause after every batch) so that the kill lands part-way.
CHILD = textwrap.dedent(
    """
    import sys, time
    from tests import tiny_models as tm
    from tests.test_checkpoint import KIND, SETTINGS, corpus
    from tl_geometry.runs import corpus_run as corpus_module
    original = corpus_module.analyse_prepared
    def slow(*args, **kwargs):
        original(*args, **kwargs)
        time.sleep(0.3)
    corpus_module.analyse_prepared = slow
    corpus_module.analyze_corpus(tm.make_model(KIND), corpus(), batch_size=2, progress=False,
                                 checkpoint=sys.argv[1], checkpoint_every=2, **SETTINGS)
    """
)


# SIGINT is a KeyboardInterrupt in Python: test_interrupted_in_process_resumes_exactly.
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_killed_run_resumes_to_the_uninterrupted_result(tmp_path, model, uninterrupted, signum):
    path = tmp_path / "run.ckpt"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not path.exists():  # the first checkpoint: 2 windows done
            assert child.poll() is None, child.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.05)
        time.sleep(0.8)  # a few more batches
        child.send_signal(signum)
        child.wait(timeout=60)
    finally:
        child.kill()
        child.wait()
    assert child.returncode != 0
    saved = torch.load(path, weights_only=True)
    assert 2 <= saved["windows_done"] < N_WINDOWS
    resumed = analyze_corpus(model, corpus(), batch_size=2, progress=False, checkpoint=path, checkpoint_every=2,
                             **SETTINGS)
    assert_identical(resumed, uninterrupted)
    assert not path.exists()  # deleted after the successful finish


def test_interrupted_in_process_resumes_exactly(tmp_path, model, uninterrupted, monkeypatch):
    path = tmp_path / "run.ckpt"
    interrupt_after(monkeypatch, 5)  # Ctrl-C in batch 5; checkpoints after windows 4 and 8 (batches of 2)
    with pytest.raises(KeyboardInterrupt):
        analyze_corpus(model, corpus(), batch_size=2, progress=False, checkpoint=path, checkpoint_every=4, **SETTINGS)
    assert torch.load(path, weights_only=True)["windows_done"] == 8
    assert not list(tmp_path.glob(".*.tmp"))
    monkeypatch.undo()
    calls = spy(monkeypatch, corpus_module, "analyse_prepared")
    resumed = analyze_corpus(model, corpus(), batch_size=2, progress=False, checkpoint=path, checkpoint_every=4,
                             **SETTINGS)
    assert len(calls) == (N_WINDOWS - 8) // 2  # only the batches after the checkpoint run again
    assert_identical(resumed, uninterrupted)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"n_grid": [1, 2]}, r"config\.n_grid \('default' in the checkpoint, \[1, 2\] now\)"),
        ({"batch_size": 4}, r"batch_size \(2 in the checkpoint, 4 now\)"),
        ({"corpus": "other"}, r"tokens_sha256 \('[0-9a-f]+' in the checkpoint, '[0-9a-f]+' now\)"),
        ({"seed": 1}, r"config\.seed \(0 in the checkpoint, 1 now\)"),
    ],
)
def test_checkpoint_of_other_arguments_is_refused(tmp_path, model, monkeypatch, change, message):
    path = tmp_path / "run.ckpt"
    interrupt_after(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        analyze_corpus(model, corpus(), batch_size=2, progress=False, checkpoint=path, checkpoint_every=1, **SETTINGS)
    monkeypatch.undo()
    change = dict(change)
    tokens = tm.with_bos(tm.random_tokens(N_WINDOWS, 9, seed=4)) if change.pop("corpus", None) else corpus()
    kwargs = {"batch_size": 2, "progress": False, "checkpoint": path, **SETTINGS, **change}
    with pytest.raises(GeometryError, match=f"checkpoint {path}: written by a run with different arguments: .*{message}"):
        analyze_corpus(model, tokens, **kwargs)
    assert path.exists()  # refused, not overwritten


def interrupted_checkpoint(path, model, monkeypatch, **settings) -> None:
    """A checkpoint after 8 of the 16 windows, as Ctrl-C in batch 5 leaves it."""
    interrupt_after(monkeypatch, 5)
    with pytest.raises(KeyboardInterrupt):
        analyze_corpus(model, corpus(), batch_size=2, progress=False, checkpoint=path, checkpoint_every=4, **settings)
    monkeypatch.undo()


def rewrite_checkpoint(path, change) -> None:
    """Rewrite a checkpoint as an earlier version wrote it: ``change(identity, accumulator_state)`` edits both."""
    state = torch.load(path, weights_only=True)
    identity = json.loads(state["identity"])
    change(identity, state["accumulator"])
    state["identity"] = json.dumps(identity)
    torch.save(state, path)


def test_a_checkpoint_of_the_taxonomy_diagnostic_resumes_as_roles(tmp_path, model, monkeypatch):
    """Written when the role diagnostic was "taxonomy" (config and its two taxonomy_attention_* fields), resumed by a
    run that asks for "roles": the same result as an uninterrupted run."""
    settings = {**SETTINGS, "diagnostics": ["roles"], "settings": {"roles": {"n_queries": 3}}}
    whole = analyze_corpus(model, corpus(), batch_size=2, progress=False, **settings)
    path = tmp_path / "run.ckpt"
    interrupted_checkpoint(path, model, monkeypatch, **settings)
    before = {"role_attention_sink": "taxonomy_attention_sink", "role_attention_last": "taxonomy_attention_last"}

    def old_form(identity, accumulator):
        config = identity["config"]
        config["diagnostics"] = ["taxonomy" if name == "roles" else name for name in config["diagnostics"]]
        config["settings"] = {"taxonomy" if name == "roles" else name: s for name, s in config["settings"].items()}
        layout = accumulator["layout"]
        layout["fields"] = [[before.get(name, name), *rest] for name, *rest in layout["fields"]]
        layout["replicate_fields"] = sorted(before.get(name, name) for name in layout["replicate_fields"])
        accumulator["stats"] = {before.get(name, name): s for name, s in accumulator["stats"].items()}
        values = accumulator["queries"]["values"]
        accumulator["queries"]["values"] = {before.get(name, name): t for name, t in values.items()}

    rewrite_checkpoint(path, old_form)
    saved = torch.load(path, weights_only=True)
    assert "taxonomy" in json.loads(saved["identity"])["config"]["diagnostics"]
    assert {"taxonomy_attention_sink", "taxonomy_attention_last"} <= set(saved["accumulator"]["stats"])
    resumed = analyze_corpus(model, corpus(), batch_size=2, progress=False, checkpoint=path, **settings)
    assert "role_attention_sink" in resumed.fields and "taxonomy_attention_sink" not in resumed.fields
    assert_identical(resumed, whole)


def test_a_checkpoint_that_recorded_the_path_taken_resumes_in_an_auto_run(tmp_path, model, uninterrupted, monkeypatch):
    """Before the run plan, the config recorded the capture path ``capture="auto"`` took (``"rows"``, say): an auto run
    that takes that path again resumes it; one asked for the other path does not."""
    path = tmp_path / "run.ckpt"
    interrupted_checkpoint(path, model, monkeypatch, **SETTINGS)
    taken = uninterrupted.capture_taken
    assert taken in ("rows", "pattern")

    def old_form(identity, accumulator):
        assert identity["config"]["capture"] == "auto"
        identity["config"]["capture"] = taken

    rewrite_checkpoint(path, old_form)
    other = "pattern" if taken == "rows" else "rows"
    with pytest.raises(GeometryError, match=rf"config\.capture \('{taken}' in the checkpoint, '{other}' now\)"):
        analyze_corpus(model, corpus(), batch_size=2, progress=False, checkpoint=path, **SETTINGS, capture=other)
    resumed = analyze_corpus(model, corpus(), batch_size=2, progress=False, checkpoint=path, **SETTINGS)
    assert_identical(resumed, uninterrupted)


def test_a_file_that_is_not_a_checkpoint_is_refused(tmp_path, model):
    path = tmp_path / "run.ckpt"
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(GeometryError, match=r"run.ckpt: cannot be read .* delete it to start the run over"):
        analyze_corpus(model, corpus()[:2], progress=False, checkpoint=path)


@pytest.mark.parametrize(
    "value, expected",
    [
        (500, CheckpointEvery(windows=500)),
        ("12", CheckpointEvery(windows=12)),
        ("90s", CheckpointEvery(seconds=90.0)),
        ("5m", CheckpointEvery(seconds=300.0)),
        ("1.5h", CheckpointEvery(seconds=5400.0)),
        (timedelta(minutes=2), CheckpointEvery(seconds=120.0)),
    ],
)
def test_checkpoint_every_parses_windows_and_durations(value, expected):
    assert CheckpointEvery.parse(value) == expected


@pytest.mark.parametrize("value", [0, -3, "0", "5 minutes", "m", True, 1.5, None])
def test_bad_checkpoint_every(value):
    with pytest.raises(GeometryError, match=r"checkpoint_every: expected a number of windows \(such as 500\) or a "):
        CheckpointEvery.parse(value)


def test_checkpoint_due_by_windows_or_time():
    assert CheckpointEvery(windows=4).due(4, 0.0) and not CheckpointEvery(windows=4).due(3, 1e9)
    assert CheckpointEvery(seconds=60.0).due(1, 60.0) and not CheckpointEvery(seconds=60.0).due(10**6, 59.0)


def test_checkpoints_of_another_number_of_processes_are_refused(tmp_path, model):
    (tmp_path / "run.ckpt.rank0-of-2").write_bytes(b"")
    (tmp_path / "run.ckpt.rank1-of-2").write_bytes(b"")
    (tmp_path / "run.ckpt.old").write_bytes(b"")  # not a checkpoint name: ignored
    with pytest.raises(GeometryError, match=r"checkpoint .*run.ckpt: not found, but \['run.ckpt.rank0-of-2', "
                       r"'run.ckpt.rank1-of-2'\] .* another number of processes"):
        analyze_corpus(model, corpus()[:2], progress=False, checkpoint=tmp_path / "run.ckpt")
