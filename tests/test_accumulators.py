"""Accumulator: statistics over documents added in batches, growing axes, flat memory, exact merge."""

import math
import weakref

import numpy as np
import pytest
import torch

from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.errors import GeometryError
from tests.mutants import Mutant, assert_caught, replace_attribute, wrap_function
from tl_geometry.results import accumulators
from tl_geometry.results.accumulators import Accumulator
from tl_geometry.results.stats import FieldStats, same_values

SPECS = [
    FieldSpec("recall", "R(r_min, N)", axes=("n",), bootstrap=True),
    FieldSpec("rho0", "sink similarity", bootstrap=True),
    FieldSpec("profile", "attention by position", axes=("position",), queries="last", documents="mean"),
]
GRID = torch.tensor([1, 2, 4])


def make(**overrides):
    kwargs = dict(layers=(0, 1), heads=(0, 1, 2), n_grid=GRID, n_bootstrap=4, replicate_fields=["recall", "rho0"])
    kwargs.update(overrides)
    return Accumulator(overrides.pop("specs", SPECS), **{k: v for k, v in kwargs.items() if k != "specs"})


def batch(n_docs, width, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return {
        "recall": torch.rand(n_docs, 2, 3, 3, generator=gen),
        "rho0": torch.rand(n_docs, 2, 3, generator=gen),
        "profile": torch.rand(n_docs, 2, 3, width, generator=gen),
    }


def test_growing_axes_pad_with_not_counted_and_means_match_numpy():
    first, second = batch(2, 3, seed=1), batch(1, 5, seed=2)
    first["profile"][1, ..., 2] = math.nan  # the second document is shorter
    acc = make()
    acc.add(first, torch.ones(2, 4), n_tokens=5)
    acc.add(second, torch.ones(1, 4), n_tokens=5)
    stats = acc.stats["profile"]
    assert stats.count.shape == (2, 3, 5)
    assert stats.count[0, 0].tolist() == [3, 3, 2, 1, 1]
    padded = np.full((3, 2, 3, 5), np.nan)
    padded[:2, ..., :3] = first["profile"].double().numpy()
    padded[2] = second["profile"][0].double().numpy()
    np.testing.assert_allclose(stats.mean().numpy(), np.nanmean(padded, axis=0), rtol=1e-12)
    assert stats.total_sq is None and stats.minimum is None  # documents="mean": count and sum only
    assert acc.n_documents == 3 and acc.n_tokens == 10


def test_memory_does_not_grow_with_documents():
    acc = make()
    acc.add(batch(2, 8), torch.ones(2, 4), n_tokens=16)
    size = acc.nbytes
    for seed in range(10):
        acc.add(batch(3, 8, seed=seed), torch.ones(3, 4), n_tokens=24)
    assert acc.nbytes == size and acc.n_documents == 32


def test_infinities_are_values_and_zero_weights_do_not_make_nan():
    values = batch(3, 2)
    values["recall"][0, 0, 0, 0] = math.inf  # r_min-like: everything selected
    values["recall"][:, 0, 1, 0] = torch.tensor([math.inf, -math.inf, 1.0])
    weights = torch.tensor([[1.0, 1.0, 2.0, 0.0]] * 3)
    weights[0] = torch.tensor([0.0, 1.0, 0.0, 3.0])
    acc = make()
    acc.add(values, weights, n_tokens=6)
    stats = acc.stats["recall"]
    reference = torch.nanmean(values["recall"].double(), dim=0)
    torch.testing.assert_close(stats.mean(), reference, equal_nan=True)
    assert stats.mean()[0, 0, 0] == math.inf and stats.mean()[0, 1, 0].isnan()
    assert stats.maximum[0, 0, 0] == math.inf and stats.minimum[0, 1, 0] == -math.inf
    replicate = stats.replicate_means()[:, 0, 0, 0]
    # Replicates 0 and 2 give the infinite document weight 0: finite means, not NaN.
    assert replicate[0].isfinite() and replicate[2].isfinite() and replicate[1] == math.inf and replicate[3] == math.inf


def test_add_refuses_bad_batches():
    acc = make()
    values = batch(2, 4)
    with pytest.raises(GeometryError, match=r"values: expected exactly the declared fields \['profile', 'recall', 'rho0'\]"):
        acc.add({k: v for k, v in values.items() if k != "rho0"}, torch.ones(2, 4), n_tokens=1)
    with pytest.raises(GeometryError, match=r"values\['recall'\]: expected a float tensor \[doc, layer, head_index, n\] = \[2, 2, 3, 3\]"):
        acc.add({**values, "recall": torch.zeros(2, 2, 3, 4)}, torch.ones(2, 4), n_tokens=1)
    with pytest.raises(GeometryError, match=r"values\['rho0'\]: expected a float tensor \[doc, layer, head_index\] = \[2, 2, 3\]"):
        acc.add({**values, "rho0": torch.zeros(2, 1, 3)}, torch.ones(2, 4), n_tokens=1)
    with pytest.raises(GeometryError, match=r"weights: expected \[doc, replicate\] with 4 replicates"):
        acc.add(values, torch.ones(2, 3), n_tokens=1)
    with pytest.raises(GeometryError, match="n_tokens: expected the batch's number of real tokens"):
        acc.add(values, torch.ones(2, 4), n_tokens=-1)
    with pytest.raises(GeometryError, match="keep_queries=False"):
        acc.add(values, torch.ones(2, 4), n_tokens=1, queries={}, query_positions=torch.zeros(2, 1, dtype=torch.long))
    assert acc.n_documents == 0  # nothing half-added
    with pytest.raises(GeometryError, match=r"replicate_fields: \['nope'\] are not declared fields"):
        make(replicate_fields=["nope"])


def test_merge_is_exact_and_refuses_other_runs():
    a, b, both = make(), make(), make()
    first, second = batch(2, 3, seed=1), batch(3, 6, seed=2)
    w1, w2 = torch.rand(2, 4), torch.rand(3, 4)
    a.add(first, w1, n_tokens=4)
    b.add(second, w2, n_tokens=9)
    both.add(first, w1, n_tokens=4)
    both.add(second, w2, n_tokens=9)
    merged = a.merge(b)
    assert merged.n_documents == 5 and merged.n_tokens == 13 and a.n_documents == 2  # a unchanged
    for name in both.stats:
        for statistic, t in both.stats[name].arrays().items():
            torch.testing.assert_close(merged.stats[name].arrays()[statistic], t, rtol=1e-12, atol=0, equal_nan=True)
    assert torch.equal(merged.stats["recall"].count, both.stats["recall"].count)
    for other, what in [
        (make(layers=(0, 2)), r"layers \(\(0, 1\) vs \(0, 2\)\)"),
        (make(heads=(0, 1, 3)), "heads"),
        (make(n_grid=torch.tensor([1, 2, 8])), r"n_grid \(\[1, 2, 4\] vs \[1, 2, 8\]\)"),
        (make(n_bootstrap=5), "n_bootstrap"),
        (make(specs=SPECS[:2]), "fields"),
        (make(keep_queries=True), "keep_queries"),
    ]:
        with pytest.raises(GeometryError, match=f"merge: the accumulators differ in {what}"):
            a.merge(other)


def test_per_query_rows_are_joined_and_padded():
    acc = make(keep_queries=True)
    values = batch(1, 2)
    acc.add(values, torch.ones(1, 4), n_tokens=2, queries={"recall": torch.rand(1, 2, 3, 2, 3)},
            query_positions=torch.tensor([[0, 1]]))
    acc.add(batch(1, 2), torch.ones(1, 4), n_tokens=3, queries={"recall": torch.rand(1, 2, 3, 3, 3)},
            query_positions=torch.tensor([[0, 1, 2]]))
    rows, positions = acc.queries
    assert rows["recall"].shape == (2, 2, 3, 3, 3) and positions.tolist() == [[0, 1, -1], [0, 1, 2]]
    assert rows["recall"][0, :, :, 2].isnan().all() and not rows["recall"][1].isnan().any()
    with pytest.raises(GeometryError, match="keep_queries=True needs queries and query_positions"):
        acc.add(values, torch.ones(1, 4), n_tokens=1)


def _processes(parts, fn):
    """Run ``fn(rank, all_reduce, gather)`` for each rank in its own thread, with collectives that combine the
    ranks' tensors (sum, min, max) and gather their objects in rank order, as torch.distributed would."""
    import threading

    barrier = threading.Barrier(len(parts))
    slots: list = [None] * len(parts)
    out: list = [None] * len(parts)

    def exchange(rank, value):
        slots[rank] = value
        barrier.wait()
        everything = list(slots)
        barrier.wait()
        return everything

    def all_reduce(rank):
        def reduce(t, op):
            ts = exchange(rank, t)
            combined = ts[0].clone()
            for u in ts[1:]:
                combined = combined + u if op == "sum" else torch.minimum(combined, u) if op == "min" \
                    else torch.maximum(combined, u)
            return combined
        return reduce

    threads = [threading.Thread(target=lambda r=r: out.__setitem__(r, fn(r, all_reduce(r), lambda obj, r=r: exchange(r, obj))))
               for r in range(len(parts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


@pytest.mark.parametrize("split", [(3, 3), (1, 4)])
def test_processes_past_the_rows_reduce_to_the_groups_of_one_process(monkeypatch, split):
    """A profile past GROWING_ROWS (2 here) keeps groups of documents; processes that hold rows or groups
    gather them, so the reduced groups are those of one process over every document (sums to rounding)."""
    from tl_geometry.results import stats as stats_module

    monkeypatch.setattr(stats_module, "GROWING_ROWS", 2)
    spec = FieldSpec("profile", "by position", axes=("position",), documents="mean", bootstrap=True)
    gen = torch.Generator().manual_seed(3)
    values = torch.rand(sum(split), 1, 2, 4, generator=gen, dtype=torch.float64)
    weights = torch.randint(0, 3, (sum(split), 5), generator=gen).double()

    def accumulate(lo, hi):
        acc = Accumulator([spec], layers=(0,), heads=(0, 1), n_grid=torch.tensor([1]), n_bootstrap=5,
                          replicate_fields=["profile"], document_rows=True)
        for d in range(lo, hi):
            acc.add({"profile": values[d : d + 1]}, weights[d : d + 1], n_tokens=4)
        return acc

    one = accumulate(0, sum(split)).stats["profile"]
    bounds = [(0, split[0]), (split[0], sum(split))]
    reduced = _processes(bounds, lambda rank, reduce, gather: accumulate(*bounds[rank]).reduced(reduce, gather))
    for acc in reduced:
        got = acc.stats["profile"]
        assert got.is_grouped and one.is_grouped and acc.n_documents == sum(split)
        assert torch.equal(got.group_count, one.group_count) and torch.equal(got.count, one.count)
        assert torch.equal(got.group_weights.nan_to_num(-1.0), one.group_weights.nan_to_num(-1.0))
        torch.testing.assert_close(got.group_total, one.group_total, rtol=1e-12, atol=0)
        torch.testing.assert_close(got.replicate_means(), one.replicate_means(), rtol=1e-12, atol=0, equal_nan=True)


def test_nbytes_counts_the_rows_and_the_sums_beside_them():
    """A field kept as rows holds its documents' values (float64), their weights and the sums computed from
    them (count int64; total, total_sq, minimum, maximum float64 for a "moments" field): 8 bytes a number."""
    spec = FieldSpec("recall", "R", axes=("n",))
    acc = Accumulator([spec], layers=(0, 1), heads=(0, 1, 2), n_grid=GRID, n_bootstrap=4,
                      replicate_fields=["recall"], document_rows=True)
    acc.add({"recall": torch.rand(3, 2, 3, len(GRID))}, torch.ones(3, 4), n_tokens=9)
    cells = 2 * 3 * len(GRID)
    rows, weights, sums = 3 * cells, 3 * 4, 5 * cells
    assert acc.stats["recall"].is_rows
    assert acc.nbytes == 8 * (rows + weights + sums)


def merges_one_field_at_a_time() -> None:
    """While a field is merged, every field merged before it has let its old statistics go."""
    acc = make()
    acc.add(batch(2, 8), torch.ones(2, 4), n_tokens=16)
    merged: list[weakref.ref] = []  # the old statistics of the fields merged so far
    merge = accumulators.merge_stats

    def watched(a, b, *args, **kwargs):
        assert all(old() is None for old in merged), "an earlier field's old statistics are still held"
        merged.append(weakref.ref(a))
        return merge(a, b, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(accumulators, "merge_stats", watched)
        acc.add(batch(3, 8, seed=1), torch.ones(3, 4), n_tokens=24)
    assert len(merged) == len(SPECS)


def test_add_merges_one_field_at_a_time():
    """Adding a batch holds one field twice at most, never the whole accumulator's old and new statistics at
    once (replicate sums of every field: the add's peak would be twice the accumulator)."""
    merges_one_field_at_a_time()
    held = []  # a bug that keeps the old statistics until the add ends
    real = accumulators.merge_stats

    def holding(a, b, *args, **kwargs):
        held.append(a)
        return real(a, b, *args, **kwargs)

    assert_caught(Mutant("old statistics held through the add", replace_attribute(accumulators, "merge_stats", holding),
                         (merges_one_field_at_a_time,)))


def _summed_bytes(layers: int, heads: int, n_grid: int, width: int, n_bootstrap: int) -> int:
    """The bytes of the sums a run's accumulator ends with, from the layout of the module docstring of
    `tl_geometry.results.stats`: 8 bytes a number; a "moments" field holds count, total, total_sq, minimum and
    maximum per cell, and with replicates a replicate total and count per replicate and cell; a "mean" profile
    with replicates holds count and total, and its 32 groups of documents a total and a count per cell and
    each group's weights."""
    cells = layers * heads
    grid, scalar, profile = cells * n_grid, cells, cells * width
    return 8 * (grid * (5 + 2 * n_bootstrap) + scalar * (5 + 2 * n_bootstrap) + grid * 5
                + profile * 2 + 32 * profile * 2 + 32 * n_bootstrap)


# Layers x heads of SmolLM2: a field's rows (with each its own copy of the documents' 200 weights, and the sums
# computed from them beside) stay below the sums they replace only with at least about 212 cells per field.
LAYERS, HEADS = 30, 9


def growth_of_the_statistics(n_documents: int = 230) -> list[int]:
    """`Accumulator.nbytes` after each of ``n_documents`` documents added one at a time (200 replicates, as a
    run's default: rows up to 206 documents, a profile's groups past 32)."""
    specs = [
        FieldSpec("recall", "R(r_min, N)", axes=("n",), bootstrap=True),
        FieldSpec("rho0", "sink similarity", bootstrap=True),
        FieldSpec("plain", "a field without replicates", axes=("n",)),
        FieldSpec("profile", "attention by position", axes=("position",), documents="mean", bootstrap=True),
    ]
    acc = Accumulator(specs, layers=range(LAYERS), heads=range(HEADS), n_grid=GRID, n_bootstrap=200,
                      replicate_fields=["recall", "rho0", "profile"], document_rows=True)
    gen = torch.Generator().manual_seed(3)
    sizes = []
    for _ in range(n_documents):
        cells = (1, LAYERS, HEADS)
        values = {"recall": torch.rand(*cells, 3, generator=gen), "rho0": torch.rand(*cells, generator=gen),
                  "plain": torch.rand(*cells, 3, generator=gen), "profile": torch.rand(*cells, 8, generator=gen)}
        acc.add(values, torch.poisson(torch.ones(1, 200), generator=gen), n_tokens=8)
        sizes.append(acc.nbytes)
    return sizes


def test_the_statistics_grow_to_their_sums_and_no_further():
    """A run's accumulator keeps its first documents as rows and grows with them, by design, up to the size
    of the sums they replace (replicate sums, a profile's groups), which it reaches past the rows' limit and
    keeps: its memory over the whole run is bounded by that size (docs/scale.md gives it for SmolLM2)."""
    sizes = growth_of_the_statistics()
    bound = _summed_bytes(LAYERS, HEADS, len(GRID), 8, 200)
    assert sizes[-1] == bound and sizes[-20:] == [bound] * 20  # flat past every field's limit
    assert max(sizes) <= bound, f"{max(sizes)} bytes at {sizes.index(max(sizes)) + 1} documents, bound {bound}"
    assert sizes[0] < bound / 10  # the check can fail: it grows


def test_rows_kept_past_their_limit_are_caught():
    """Mutant: the fields keep their documents as rows for ever (no limit)."""
    from tl_geometry.results import stats

    assert_caught(Mutant("rows without a limit", replace_attribute(stats, "rows_limit", lambda spec, n: 10**6),
                         (test_the_statistics_grow_to_their_sums_and_no_further,)))


def _poisson(n_docs: int, seed: int) -> torch.Tensor:
    return torch.poisson(torch.ones(n_docs, 4), generator=torch.Generator().manual_seed(seed))


def _tensors(stats) -> dict[tuple[str, str], torch.Tensor]:
    """Every tensor of every field's statistics (rows, sums, groups), by field and name."""
    return {(name, k): t for name, s in stats.items() for k, t in vars(s).items() if isinstance(t, torch.Tensor)}


def _copies(stats) -> dict[tuple[str, str], torch.Tensor]:
    return {key: t.clone() for key, t in _tensors(stats).items()}


def _unchanged(stats, copies) -> list[str]:
    """The tensors of ``stats`` that differ from ``copies`` (NaN equal to NaN), by field and name."""
    now = _tensors(stats)
    assert sorted(now) == sorted(copies)
    return [f"{name}.{k}" for (name, k), t in now.items()
            if not torch.equal(t.nan_to_num(-7.0), copies[name, k].nan_to_num(-7.0))]


def results_stay_as_taken() -> None:
    """What an accumulator hands out (a result's statistics, a state, a merge with another) stays as it was
    when taken while batches are added to the accumulator, to the merge and to one restored from the state;
    a merge changes neither of its inputs."""
    acc, other = make(document_rows=True), make(document_rows=True)
    for seed in range(4):  # 12 documents, past the rows of 4 replicates (10): the later batches add to sums
        acc.add(batch(3, 8, seed=seed), _poisson(3, seed), n_tokens=24)
    other.add(batch(2, 8, seed=9), _poisson(2, 9), n_tokens=16)
    assert not acc.stats["recall"].is_rows and other.stats["recall"].is_rows
    inputs = {"accumulator": (acc.stats, _copies(acc.stats)), "other": (other.stats, _copies(other.stats))}
    taken = acc.stored_stats()
    state = acc.state_dict()
    merged = acc.merge(other)
    restored = make(document_rows=True)
    restored.load_state_dict(state)
    for what, (stats, copies) in inputs.items():
        assert _unchanged(stats, copies) == [], f"the merge changed its input, the {what}"
    saved = {name: FieldStats.from_arrays(acc.specs[name], arrays) for name, arrays in state["stats"].items()}
    held = {"result": (taken, _copies(taken)), "merge": (merged.stats, _copies(merged.stats)),
            "state": (saved, _copies(saved))}
    acc.add(batch(3, 8, seed=10), _poisson(3, 10), n_tokens=24)
    for what, (stats, copies) in held.items():
        assert _unchanged(stats, copies) == [], f"an add to the accumulator changed its {what}"
    held = {"accumulator": (acc.stats, _copies(acc.stats)), "other": (other.stats, _copies(other.stats)),
            "state": held["state"]}
    merged.add(batch(3, 8, seed=11), _poisson(3, 11), n_tokens=24)
    restored.add(batch(3, 8, seed=12), _poisson(3, 12), n_tokens=24)
    for what, (stats, copies) in held.items():
        assert _unchanged(stats, copies) == [], f"adds to the merge and the restored copy changed the {what}"


def test_results_stay_as_taken():
    results_stay_as_taken()


def test_writing_into_what_was_handed_out_is_caught():
    """Mutant: every merge writes into its first statistics (adds in place without asking who holds them)."""
    def in_place(real):
        return lambda a, b, *args, **kwargs: real(a, b, *args, **{**kwargs, "into": True})

    assert_caught(Mutant("merges always in place", wrap_function(accumulators, "merge_stats", in_place),
                         (results_stay_as_taken,)))


def test_a_steady_add_writes_into_its_statistics():
    """Past its rows, an add of a batch as wide as the statistics leaves every field in the tensors it held (no
    new ones, whose old ones freed would leave holes in the C heap from batch to batch), with the numbers of
    an accumulator fed the same batches into new tensors (a merge of one batch at a time)."""
    acc = make(document_rows=True)
    batches = [(batch(3, 8, seed=seed), _poisson(3, seed)) for seed in range(6)]
    for values, weights in batches[:4]:
        acc.add(values, weights, n_tokens=24)
    held = {key: t.untyped_storage().data_ptr() for key, t in _tensors(acc.stats).items()}
    for values, weights in batches[4:]:
        acc.add(values, weights, n_tokens=24)
    assert {key: t.untyped_storage().data_ptr() for key, t in _tensors(acc.stats).items()} == held
    merged = make(document_rows=True)
    for values, weights in batches:
        one = make(document_rows=True)
        one.add(values, weights, n_tokens=24)
        merged = merged.merge(one)
    for name, s in merged.stats.items():
        for k, t in s.arrays().items():
            assert same_values(acc.stats[name].arrays()[k], t), f"{name}.{k}"


def test_fields_of_rows_hold_one_copy_of_their_weights():
    """Fields kept as rows of the same documents hold one tensor of their bootstrap weights, counted once by
    nbytes: 8 bytes a number of every field's rows and sums and of one [document, replicate] weights."""
    acc = make(document_rows=True)
    for seed in range(2):
        acc.add(batch(3, 8, seed=seed), _poisson(3, seed), n_tokens=24)
    recall, rho0 = acc.stats["recall"], acc.stats["rho0"]
    assert recall.is_rows and rho0.is_rows and recall.document_weights is rho0.document_weights
    numbers = sum(t.numel() for s in acc.stats.values() for k, t in vars(s).items()
                  if isinstance(t, torch.Tensor) and k != "document_weights")
    assert acc.nbytes == 8 * (numbers + 6 * 4)
