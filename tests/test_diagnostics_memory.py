"""The per-sequence diagnostics keep their working memory within the budget, chunk by chunk, with equal results.

The memory is counted by `tests.live_bytes.LiveBytes`: every tensor made
inside the call, alive at once (device-agnostic: no allocator statistics).
"""

import gc
import warnings

import pytest
import torch

from tests import tiny_models as tm
from tests.live_bytes import LiveBytes
from tests.mutants import Mutant, assert_caught, replace_attribute
from tl_geometry import analyze_corpus
from tl_geometry.capture.layer_analysis import LayerAnalysis
from tl_geometry.diagnostics.assumptions import DIAGNOSTIC as assumptions
from tl_geometry.diagnostics.assumptions import value_statistics_bytes
from tl_geometry.diagnostics.profile_fit import fit_attention_profile, fit_bytes_per_row
from tl_geometry.diagnostics.role_features import DIAGNOSTIC as taxonomy
from tl_geometry.diagnostics.role_features import position_features_bytes
from tl_geometry.engine.context import SelectionContext
from tl_geometry.runs import corpus_run

N_BATCH, N_HEADS, N_KV, N_KEYS, D_HEAD = 6, 9, 3, 257, 64  # SmolLM2's heads; 257 keys: the longest FFT per key
BUDGET_MIB = 6.0


def _context(budget: float, dtype: torch.dtype = torch.float32) -> SelectionContext:
    """A layer as the rows path folds it: the last query's rows of sequences with left padding, GQA values."""
    gen = torch.Generator().manual_seed(0)
    pads = torch.arange(N_BATCH) * 7  # sequence b starts at key 7 b
    keys = torch.arange(N_KEYS)
    real = keys[None, :] >= pads[:, None]
    visible = real[:, None, :]  # the last query sees every real key
    logits = torch.randn(N_BATCH, N_HEADS, 1, N_KEYS, generator=gen, dtype=dtype)
    rows = torch.softmax(logits.masked_fill(~visible[:, None], -torch.inf), -1)
    values = torch.randn(N_BATCH, N_KEYS, N_KV, D_HEAD, generator=gen, dtype=dtype) * real[:, :, None, None]
    kv_heads = torch.arange(N_HEADS) // (N_HEADS // N_KV)
    return SelectionContext(
        rows, values, visible, pads[:, None], torch.ones(N_BATCH, 1, dtype=torch.bool), torch.tensor([1, 4, 16]),
        memory_budget_mib=budget, query_index=torch.zeros(N_BATCH, 1, dtype=torch.long), real=real,
        kv_heads=kv_heads, value_heads=kv_heads,
    )


def _nbytes(out: dict[str, torch.Tensor]) -> int:
    return sum(t.nbytes for t in out.values())


@pytest.mark.parametrize("diagnostic", [assumptions, taxonomy], ids=lambda d: d.name)
def test_sequences_stay_within_the_budget_and_equal_the_whole(diagnostic):
    """Within a 6 MiB budget (outputs aside) where the whole batch at once takes several times that, and
    every field equal, array by array, to the one computed on the whole batch at once."""
    settings = diagnostic.Settings()
    whole_context = _context(budget=1e6)
    with LiveBytes() as whole:
        expected = diagnostic.sequences(whole_context, settings)
    context = _context(budget=BUDGET_MIB)
    with LiveBytes() as chunked:
        out = diagnostic.sequences(context, settings)
    budget = BUDGET_MIB * 2**20
    assert whole.peak > 1.5 * budget + _nbytes(expected)  # the check below can fail
    assert chunked.peak <= budget + _nbytes(out), f"{chunked.peak / 2**20:.1f} MiB"
    assert set(out) == set(expected)
    for name in expected:
        torch.testing.assert_close(out[name], expected[name], rtol=0, atol=0, equal_nan=True, msg=name)


def test_declared_costs_bound_what_one_sequence_takes():
    """The costs the chunks are sized by are upper bounds of the measured working memory of one sequence
    (float32 and float64, with a key count just past a power of two, where the FFT is longest)."""
    for dtype in (torch.float32, torch.float64):
        context = _context(budget=1e-6, dtype=dtype)  # one sequence per slice, one row per fit
        for diagnostic, declared in (
            (assumptions, value_statistics_bytes(N_KV, N_KEYS, D_HEAD, dtype)),
            (taxonomy, position_features_bytes(N_HEADS, N_KEYS, D_HEAD, dtype)),
        ):
            with LiveBytes() as live:
                out = diagnostic.sequences(context, diagnostic.Settings())
            assert live.peak - _nbytes(out) <= max(declared, fit_bytes_per_row(N_KEYS)), (diagnostic.name, dtype)


@pytest.mark.parametrize("n_pos", [16, 257, 1100])
def test_the_profile_fit_cost_bounds_its_working_memory(n_pos):
    rows = torch.softmax(torch.randn(4, n_pos, generator=torch.Generator().manual_seed(n_pos)), -1)
    with LiveBytes() as live:
        fit_attention_profile(rows)
    assert live.peak <= 4 * fit_bytes_per_row(n_pos), f"{live.peak / 4} bytes per row"


def test_the_profile_fit_in_slices_equals_the_whole_and_keeps_the_budget():
    """Rows of several lengths (NaN tails) fitted one row at a time and all at once: equal field by field."""
    gen = torch.Generator().manual_seed(1)
    alpha = torch.softmax(torch.randn(24, 200, generator=gen, dtype=torch.float64), -1)
    alpha[::3, 150:] = float("nan")
    whole = fit_attention_profile(alpha)
    budget = fit_bytes_per_row(200) / 2**20  # one row per slice
    with LiveBytes() as live:
        sliced = fit_attention_profile(alpha, memory_budget_mib=budget)
    assert live.peak <= budget * 2**20 + _nbytes(sliced.as_fields()) + 10 * alpha.nbytes  # the rows' float64 copies
    for name, value in whole.as_fields().items():
        torch.testing.assert_close(sliced.as_fields()[name], value, rtol=0, atol=0, equal_nan=True, msg=name)


@pytest.mark.parametrize("window", [None, 300])
def test_the_margins_of_long_rows_stay_within_their_declared_cost(window):
    """The bounds' margins of long rows (the cosines of their key pairs in tiles) hold at most the declared cost
    per row (MARGINS_COST), outputs aside, where the cosines below the grid's largest N would take about
    L^2 / 2 per row; rows of a sliding window take about what their visible keys need."""
    from tl_geometry.engine.context import rows_context
    from tl_geometry.engine.grid import default_n_grid
    from tl_geometry.theory.theorem_bounds import MARGINS_COST, chunk_margins

    n_rows, n_keys, d_head = 2, 3000, 8
    gen = torch.Generator().manual_seed(2)
    alpha = torch.softmax(torch.randn(n_rows, n_keys, generator=gen), -1)
    values = torch.randn(n_rows, n_keys, d_head, generator=gen)
    visible = torch.ones(n_rows, n_keys, dtype=torch.bool)
    if window is not None:
        visible[:, :-window] = False
    grid = default_n_grid(n_keys)
    context = rows_context(alpha, values, visible, grid, ranking="attention", distance="euclidean",
                           memory_budget_mib=1e6, costs=(MARGINS_COST,))
    chunk = next(context.chunks())
    assert chunk.n_rows == n_rows
    with LiveBytes() as live:
        out = chunk_margins(chunk)
    seen = n_keys if window is None else window
    declared = n_rows * 4 * MARGINS_COST.per_row(seen, len(grid), d_head)
    assert declared < n_rows * 4 * n_keys**2 / 2  # the check below can fail: the staircase at once would not fit
    assert live.peak - _nbytes(out) <= declared, f"{(live.peak - _nbytes(out)) / 2**20:.1f} MiB"


def _live_storages() -> set[int]:
    """The storages of every tensor Python holds now (after a collection)."""
    gc.collect()
    with warnings.catch_warnings():  # isinstance on torch.distributed's deprecated reduce_op warns
        warnings.simplefilter("ignore", FutureWarning)
        return {o.untyped_storage().data_ptr() for o in gc.get_objects() if isinstance(o, torch.Tensor)}


def _batch_leftovers(capture: str) -> list[set[int]]:
    """Per batch of a corpus run (3 batches, every diagnostic), the storages of the tensors made while it was
    analysed that are still alive after it, other than the accumulator's statistics."""
    model = tm.tiny_bridge("llama")
    tokens = tm.with_bos(tm.random_tokens(6, 12))
    leftovers = []
    analyse = corpus_run.analyse_prepared

    def watched(model, prepared, plan, accumulator):
        before = _live_storages()
        analyse(model, prepared, plan, accumulator)
        kept = {t.untyped_storage().data_ptr() for s in accumulator.stats.values() for t in vars(s).values()
                if isinstance(t, torch.Tensor)}  # its rows of documents and the sums computed from them
        leftovers.append(_live_storages() - before - kept)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(corpus_run, "analyse_prepared", watched)
        analyze_corpus(model, tokens, batch_size=2, capture=capture, diagnostics="all", n_bootstrap=4, progress=False)
    return leftovers


@pytest.mark.parametrize("capture", ["rows", "pattern"])
def test_nothing_of_a_batch_outlives_it(capture):
    """A corpus run holds one batch at a time: no tensor made while a batch is analysed (a pattern, a context,
    a chunk's buffers, a layer's outputs) is alive after it but the accumulator's statistics, so that the next
    batch's peak does not carry this one's (the first batch may leave the model's own lazily built tensors)."""
    leftovers = _batch_leftovers(capture)
    assert len(leftovers) == 3
    assert leftovers[1:] == [set(), set()]


def test_a_pattern_held_across_batches_is_caught():
    """Mutant: the layer analysis keeps the last attention rows it analysed (a per-batch cache)."""
    held = {}
    analyse = LayerAnalysis.analyse_layers

    def keeping(self, layers, pattern, *args, **kwargs):
        held["last"] = pattern.clone()
        return analyse(self, layers, pattern, *args, **kwargs)

    assert_caught(Mutant("pattern held across batches", replace_attribute(LayerAnalysis, "analyse_layers", keeping),
                         (lambda: test_nothing_of_a_batch_outlives_it("pattern"),
                          lambda: test_nothing_of_a_batch_outlives_it("rows"))))
