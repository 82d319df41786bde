"""Data parallel corpus runs: two gloo processes give the one-process result."""

import faulthandler
import os
import warnings
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tests import tiny_models as tm
from tests.fixtures import TEXTS, assert_equal_runs
from tl_geometry.corpus_input.token_windows import window_documents
from tl_geometry.errors import GeometryError
from tl_geometry.results.result import GeometryResult
from tl_geometry.runs.corpus_run import analyze_corpus
from tl_geometry.runs.distributed import Ranks, init_from_env

pytestmark = pytest.mark.model

KIND = "bridge-llama"
SETTINGS = {"query_positions": "all", "keep_queries": True, "diagnostics": "all", "n_bootstrap": 50}
# Seven documents of different lengths: the ranks' shards pad to different widths.
CORPUS = TEXTS + ["sky sea star bird tree house moon sun", "ten nine eight"]


# What the two ranks do, in this order, in one launch (starting a pair of processes costs more than the work).
MODES = ("run", "windows", "sweep", "mismatch")


@pytest.fixture(scope="module")
def ranks_out(tmp_path_factory) -> Path:
    """The folder where two gloo ranks, launched once, left what each mode of `MODES` wrote: ``{mode}/rank{r}``."""
    out = tmp_path_factory.mktemp("ranks")
    _spawn_ranks(out)
    return out


def _spawn_ranks(out: Path, world_size: int = 2) -> None:
    """Start ``world_size`` ranks as torchrun does: the launcher (here the test) hosts the rendezvous store.

    Every rank is then a client of the store, so no rank's exit takes the store
    away from another that is still leaving the group (with rank 0 hosting it,
    rank 0 sometimes aborted on exit after a refusal).
    """
    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                       timeout=timedelta(seconds=120))
    try:
        mp.spawn(_worker, args=(world_size, store.port, str(out)), nprocs=world_size, join=True)
    except mp.ProcessExitedException as error:
        # A rank that had left the group and written everything, then died as the interpreter exited (seen once in
        # this project's runs, with gloo's threads going down), did all the tests read; any earlier death fails.
        if not all(Path(out, f"left{rank}").exists() for rank in range(world_size)):
            raise
        warnings.warn(f"a gloo rank died after leaving the group, its work done: {error}", stacklevel=1)
    finally:
        del store


def _worker(rank: int, world_size: int, port: int, out: str) -> None:
    """One rank, started as torchrun would: the rendezvous in the environment, joined by init_from_env."""
    faulthandler.enable(all_threads=True)  # a crash in a rank shows its Python stacks in the captured stderr
    os.environ.update(
        {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
         "MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "True"}
    )
    torch.set_num_threads(1)
    ranks = init_from_env("cpu")
    assert ranks == Ranks(rank, world_size)
    model = tm.make_model(KIND)
    try:
        for mode in MODES:
            _run_mode(model, mode, Path(out, mode, f"rank{rank}"))
    finally:
        # Leave together: a rank that destroys the group while the other is still in a collective aborts it.
        torch.distributed.monitored_barrier(timeout=timedelta(seconds=120))
        torch.distributed.destroy_process_group()
    Path(out, f"left{rank}").touch()


def _run_mode(model, mode: str, out: Path) -> None:
    """One rank's part of ``mode``, written to ``out`` (one folder per rank: a folder has one writer at a time)."""
    if mode == "mismatch":  # rank 1 asks for another grid: every rank must refuse before analysing
        rank = torch.distributed.get_rank()
        settings = {**SETTINGS, "n_grid": [1, 2] if rank else [1, 3]}
        with pytest.raises(GeometryError, match=r"rank 1 has model and config .* but rank 0 has"):
            analyze_corpus(model, CORPUS, progress=False, **settings)
        out.mkdir(parents=True)
        (out / "refused").touch()
    elif mode == "sweep":  # the intervention sweep and the N*_tau search run under the same launcher
        sweep, n_star = _sweeps(model)
        sweep.save(out / "sweep")
        torch.save({"n_star": n_star.n_star, "low": n_star.low, "high": n_star.high}, out / "n_star.pt")
    else:
        corpus = _windows(model) if mode == "windows" else CORPUS
        analyze_corpus(model, corpus, batch_size=2, progress=False, **SETTINGS).save(out / "result")


@pytest.fixture(scope="module")
def one_process():
    return analyze_corpus(tm.make_model(KIND), CORPUS, batch_size=3, progress=False, **SETTINGS)


def test_two_gloo_processes_equal_one(ranks_out, one_process):
    for rank in range(2):  # every rank ends with the whole result (rank 0 writes it)
        both = GeometryResult.load(ranks_out / "run" / f"rank{rank}" / "result")
        assert both.n_documents == len(CORPUS)
        assert_equal_runs(both, one_process, tm.padding_close(tm.make_model(KIND)))


def _windows(model):
    """A lazy window stream: each rank draws it whole and keeps every other window."""
    return window_documents(model, lambda: [" ".join(CORPUS * 3)], context=12, n_windows=7)


def test_two_gloo_processes_equal_one_on_a_window_stream(ranks_out):
    model = tm.make_model(KIND)
    alone = analyze_corpus(model, _windows(model), batch_size=3, progress=False, **SETTINGS)
    assert alone.n_documents == 7
    for rank in range(2):
        both = GeometryResult.load(ranks_out / "windows" / f"rank{rank}" / "result")
        assert_equal_runs(both, alone, tm.padding_close(model))


def _sweeps(model):
    from tl_geometry.interventions.sweep import effective_set_size, intervention_sweep

    settings = dict(layers=[0, 1], n_bootstrap=20, batch_size=2, progress=False)
    sweep = intervention_sweep(model, CORPUS, [1, 2, 4], scope="layer", controls=2, **settings)
    return sweep, effective_set_size(model, CORPUS, taus=(0.05, 0.5), scope="layer", **settings)


def test_two_gloo_processes_sweep_as_one(ranks_out):
    from tl_geometry.results.intervention_result import InterventionResult

    model = tm.make_model(KIND)
    sweep, n_star = _sweeps(model)
    close = {"equal_nan": True, "rtol": 1e-6, "atol": 1e-12, **tm.padding_close(model)}
    for rank in range(2):  # every rank ends with the whole sweep and the same search
        both = InterventionResult.load(ranks_out / "sweep" / f"rank{rank}" / "sweep")
        assert both.n_documents == sweep.n_documents == len(CORPUS) and both.n_tokens == sweep.n_tokens
        assert list(both.stats) == list(sweep.stats)
        for name, s in sweep.stats.items():
            mine, theirs = s.stored().arrays(), both.stats[name].stored().arrays()
            assert mine.keys() == theirs.keys()
            for statistic, x in mine.items():
                if x.is_floating_point():
                    torch.testing.assert_close(theirs[statistic], x, msg=f"{name}/{statistic}", **close)
                else:
                    assert torch.equal(theirs[statistic], x), f"{name}/{statistic}"
        searched = torch.load(ranks_out / "sweep" / f"rank{rank}" / "n_star.pt")
        for what in ("n_star", "low", "high"):
            torch.testing.assert_close(searched[what], getattr(n_star, what), equal_nan=True, rtol=0, atol=0)


def test_ranks_that_disagree_refuse(ranks_out):
    assert [(p.parent.name, p.name) for p in sorted((ranks_out / "mismatch").glob("*/*"))] == [
        ("rank0", "refused"), ("rank1", "refused")]


def test_shards_are_round_robin_by_window_whatever_the_batching():
    from tl_geometry.runs.corpus_run import shard_batches

    rows = torch.arange(7)[:, None].repeat(1, 3)
    for ranks in (Ranks(0, 2), Ranks(1, 2), Ranks(2, 3)):
        expected = [i for i in range(7) if i % ranks.world_size == ranks.rank]
        whole = torch.cat(shard_batches(rows, ranks, batch_size=2))[:, 0].tolist()
        batched = torch.cat(shard_batches(list(rows.split(3)), ranks, batch_size=99))[:, 0].tolist()
        texts = [t for batch in shard_batches([str(i) for i in range(7)], ranks, 2) for t in batch]
        assert whole == batched == [int(t) for t in texts] == expected


def test_torchrun_without_rendezvous_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(GeometryError, match=r"WORLD_SIZE=2 asks for several processes but \[.*'MASTER_ADDR'"):
        init_from_env("cpu")
