"""Fields kept as rows of documents: the same statistics as sums, exact round trips and merges, bounded files.

A run of few documents keeps each field's per-document values (its rows)
instead of the sums, up to `rows_limit` documents; the statistics are
computed from the rows. Against an accumulator that keeps sums from the
start, counts must be exactly equal and the rest equal to 1e-6 relative
(with the absolute floor of tests/properties/test_merge_properties.py: the
two add the same float64 numbers in other orders). Saved and loaded, and
merged in either order, rows are bit for bit the same.
"""

import math
import tempfile
import zipfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.properties.test_merge_properties import SPECS, corpora, floor, pad_stack
from tl_geometry.config import GeometryConfig
from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.results import stats as stats_module
from tl_geometry.results.accumulators import Accumulator
from tl_geometry.results.bootstrap import document_weights
from tl_geometry.results.result import GeometryResult

# The profile keeps replicates too here: a position profile's replicates are kept only as rows.
ROW_SPECS = [*SPECS[:2], FieldSpec("profile", "by position", axes=("position",), documents="mean", bootstrap=True),
             SPECS[3]]
REPLICATED = ["metric", "scalar", "profile"]


def accumulate(tokens, values, shape, n, n_bootstrap, cuts=(), rows=True):
    acc = Accumulator(ROW_SPECS, layers=range(shape[0]), heads=range(shape[1]), n_grid=torch.arange(1, n + 1),
                      n_bootstrap=n_bootstrap, replicate_fields=REPLICATED, document_rows=rows)
    bounds = [0, *cuts, len(tokens)]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        batch = {name: pad_stack([v[name] for v in values[lo:hi]]) for name in values[0]}
        acc.add(batch, document_weights(tokens[lo:hi], n_bootstrap, seed=7), sum(len(t) for t in tokens[lo:hi]))
    return acc


def sums_by_definition(tokens, values, n_bootstrap):
    """Per field, count, total and the replicate sums straight from the definitions (float64, NaN: undefined)."""
    w = document_weights(tokens, n_bootstrap, seed=7)
    out = {}
    for name in values[0]:
        x = pad_stack([v[name] for v in values]).double()
        defined = ~x.isnan()
        count = defined.sum(0)
        total = torch.where(defined, x, 0.0).sum(0)
        reps = []
        for b in range(n_bootstrap):
            weight = w[:, b].reshape(-1, *[1] * (x.ndim - 1))
            # w * x over the documents where x is defined, a zero weight times inf counting as 0
            terms = torch.where(defined & (weight > 0), weight * x, 0.0)
            reps.append(terms.sum(0) / (weight * defined).sum(0))
        out[name] = count, total, reps
    return out


@settings(max_examples=60, deadline=None)
@given(corpora())
def test_rows_hold_the_statistics_of_the_definitions_and_of_sums(corpus):
    tokens, values, shape, n, cuts, n_bootstrap = corpus
    rows = accumulate(tokens, values, shape, n, n_bootstrap, cuts)
    sums = accumulate(tokens, values, shape, n, n_bootstrap, rows=False)
    floors = floor(tokens, values, n_bootstrap)
    wanted = sums_by_definition(tokens, values, n_bootstrap)
    for name, (count, total, reps) in wanted.items():
        mine = rows.stats[name]
        assert torch.equal(mine.count, count[..., : mine.count.shape[-1]] if mine.spec.growing else count)
        assert torch.equal(mine.count, sums.stats[name].count)
        torch.testing.assert_close(mine.total, sums.stats[name].total, rtol=1e-6, atol=floors[1], equal_nan=True)
        if name in REPLICATED and mine.n_replicates:
            got = mine.replicate_means()
            torch.testing.assert_close(got, torch.stack(reps) if reps else got, rtol=1e-6, atol=floors[1],
                                       equal_nan=True)
            if sums.stats[name].n_replicates:
                torch.testing.assert_close(got, sums.stats[name].replicate_means(), rtol=1e-6, atol=floors[1],
                                           equal_nan=True)


@settings(max_examples=40, deadline=None)
@given(corpora(), st.data())
def test_rows_round_trip_and_merge_in_any_order_bit_for_bit(corpus, data):
    tokens, values, shape, n, _, n_bootstrap = corpus
    cut = data.draw(st.integers(0, len(tokens)))
    config = GeometryConfig()
    parts = [GeometryResult.from_accumulator(accumulate(tokens[lo:hi], values[lo:hi], shape, n, n_bootstrap),
                                             config=config, model_name="m")
             for lo, hi in ((0, cut), (cut, len(tokens))) if hi > lo]
    one = GeometryResult.from_accumulator(accumulate(tokens, values, shape, n, n_bootstrap), config=config,
                                          model_name="m")
    with tempfile.TemporaryDirectory() as folder:
        loaded = []
        for i, part in enumerate(parts):
            part.save(Path(folder) / str(i))
            loaded.append(GeometryResult.load(Path(folder) / str(i)))
            assert loaded[-1].equals(part)
    merged = GeometryResult.merge(loaded)
    assert merged.equals(GeometryResult.merge(loaded[::-1]))
    for name, s in one.stats.items():
        if s.is_rows and merged.stats[name].is_rows:  # the same documents as rows: the same rows and statistics
            assert torch.equal(merged.stats[name].documents.nan_to_num(7.0), s.documents.nan_to_num(7.0))
        assert torch.equal(merged.stats[name].count, s.count)


@settings(max_examples=40, deadline=None)
@given(corpora())
def test_saved_rows_are_no_larger_than_the_sums_they_replace(corpus):
    """The file's arrays (unpacked) of a field kept as rows: at most the sums' bytes, plus the weights."""
    tokens, values, shape, n, cuts, n_bootstrap = corpus
    config = GeometryConfig()
    results = {kind: GeometryResult.from_accumulator(accumulate(tokens, values, shape, n, n_bootstrap, cuts, rows=kind),
                                                     config=config, model_name="m") for kind in (True, False)}
    sizes = {}
    with tempfile.TemporaryDirectory() as folder:
        for kind, result in results.items():
            npz, _ = result.save(Path(folder) / str(kind))
            with zipfile.ZipFile(npz) as archive:
                sizes[kind] = {info.filename.removesuffix(".npy"): info.file_size for info in archive.infolist()}
    header = 128  # an .npy header (numpy pads it to 64 bytes; at most 128 for these shapes)
    docs, cells = len(tokens), shape[0] * shape[1]
    for name, s in results[True].stats.items():
        mine = sum(v for k, v in sizes[True].items() if k.startswith(f"{name}/"))
        theirs = sum(v for k, v in sizes[False].items() if k.startswith(f"{name}/"))
        if s.is_rows:
            width = cells * max(1, *s.trailing) if s.trailing else cells
            assert mine <= docs * width * 8 + docs * n_bootstrap * 8 + 2 * header
            assert mine <= theirs + docs * n_bootstrap * 8 + 2 * header
        else:
            assert mine <= theirs + 8 * header


def test_a_profile_past_its_rows_keeps_no_replicates_and_still_merges(monkeypatch):
    monkeypatch.setattr(stats_module, "GROWING_ROWS", 2)
    gen = torch.Generator().manual_seed(0)
    tokens = [torch.tensor([i, i + 1]) for i in range(3)]
    values = [{"metric": torch.rand(1, 2, 2, generator=gen), "scalar": torch.rand(1, 2, generator=gen),
               "profile": torch.rand(1, 2, 3, generator=gen), "lags": torch.rand(1, 2, 2, generator=gen)}
              for _ in tokens]
    two = accumulate(tokens[:2], values[:2], (1, 2), 2, 5)
    assert two.stats["profile"].is_rows and two.stats["profile"].n_replicates == 5
    three = two.merge(accumulate(tokens[2:], values[2:], (1, 2), 2, 5))
    assert three.stats["profile"].n_replicates == 0 and not three.stats["profile"].is_rows
    assert three.stats["metric"].is_rows and three.stats["metric"].n_replicates == 5
    want = torch.stack([v["profile"] for v in values]).mean(0)
    torch.testing.assert_close(three.stats["profile"].mean(), want.double(), rtol=1e-6, atol=0)
    # ... and merges with a part that still keeps them, either way round
    again = accumulate(tokens[:1], values[:1], (1, 2), 2, 5)
    for a, b in ((three, again), (again, three)):
        assert a.merge(b).stats["profile"].n_replicates == 0


@pytest.mark.parametrize("inf", [math.inf, -math.inf])
def test_rows_keep_infinite_values_as_sums_do(inf):
    tokens = [torch.tensor([1]), torch.tensor([2])]
    values = [{"metric": torch.tensor([[[inf]]]), "scalar": torch.tensor([[1.0]]), "profile": torch.tensor([[[1.0]]]),
               "lags": torch.tensor([[[0.5]]])},
              {"metric": torch.tensor([[[2.0]]]), "scalar": torch.tensor([[3.0]]), "profile": torch.tensor([[[1.0]]]),
               "lags": torch.tensor([[[0.5]]])}]
    rows, sums = (accumulate(tokens, values, (1, 1), 1, 6, rows=kind) for kind in (True, False))
    assert rows.stats["metric"].is_rows
    for statistic in ("mean", "replicate_means"):
        a, b = (getattr(acc.stats["metric"], statistic)() for acc in (rows, sums))
        assert torch.equal(a.nan_to_num(5.0), b.nan_to_num(5.0))
