"""Fields kept as rows of documents: the same statistics as sums, exact round trips and merges, bounded files.

A run of few documents keeps each field's per-document values (its rows)
instead of the sums, up to `rows_limit` documents; the statistics are
computed from the rows. Against an accumulator that keeps sums from the
start, counts must be exactly equal and the rest equal to 1e-6 relative
(with the absolute floor of tests/properties/test_merge_properties.py: the
two add the same float64 numbers in other orders). Saved and loaded, and
merged in either order, rows are bit for bit the same.
"""

import hashlib
import math
import tempfile
import zipfile
from dataclasses import replace
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


def test_a_profile_past_its_rows_keeps_groups_of_documents_and_still_merges(monkeypatch):
    monkeypatch.setattr(stats_module, "GROWING_ROWS", 2)
    gen = torch.Generator().manual_seed(0)
    tokens = [torch.tensor([i, i + 1]) for i in range(3)]
    values = [{"metric": torch.rand(1, 2, 2, generator=gen), "scalar": torch.rand(1, 2, generator=gen),
               "profile": torch.rand(1, 2, 3, generator=gen), "lags": torch.rand(1, 2, 2, generator=gen)}
              for _ in tokens]
    two = accumulate(tokens[:2], values[:2], (1, 2), 2, 5)
    assert two.stats["profile"].is_rows and two.stats["profile"].n_replicates == 5
    three = two.merge(accumulate(tokens[2:], values[2:], (1, 2), 2, 5))
    profile = three.stats["profile"]
    assert profile.is_grouped and not profile.is_rows and profile.n_replicates == 5 and profile.replicate_total is None
    assert three.stats["metric"].is_rows and three.stats["metric"].n_replicates == 5
    want = torch.stack([v["profile"] for v in values]).mean(0)
    torch.testing.assert_close(profile.mean(), want.double(), rtol=1e-6, atol=0)
    # ... and merges with a part that still keeps rows, either way round, as one pass would
    again = accumulate(tokens[:1], values[:1], (1, 2), 2, 5)
    want = groups_by_definition(tokens + tokens[:1], values + values[:1], 5)
    for a, b in ((three, again), (again, three)):
        assert_groups(a.merge(b).stats["profile"], want)


def groups_by_definition(tokens, values, n_bootstrap):
    """The profile's groups from their definition (tl_geometry.results.stats): each document in the group the
    first 8 bytes (little-endian) of the SHA-256 of its float64 weights name, modulo GROWING_ROWS; per group
    the sum of its documents' values (NaN: not counted) and their count, and the weights of its document whose
    hash is lowest (NaN: no document)."""
    w = document_weights(tokens, n_bootstrap, seed=7)
    x = pad_stack([v["profile"] for v in values]).double()
    groups = stats_module.GROWING_ROWS
    total = torch.zeros(groups, *x.shape[1:], dtype=torch.float64)
    count = torch.zeros(groups, *x.shape[1:], dtype=torch.int64)
    weights = torch.full((groups, n_bootstrap), math.nan, dtype=torch.float64)
    lowest = {}
    for d in range(len(tokens)):
        digest = hashlib.sha256(w[d].numpy().astype("<f8").tobytes()).digest()
        g = int.from_bytes(digest[:8], "little") % groups
        defined = ~x[d].isnan()
        for index in zip(*torch.nonzero(defined, as_tuple=True)):
            total[(g, *index)] += x[d][index]
            count[(g, *index)] += 1
        if g not in lowest or digest < lowest[g]:
            lowest[g], weights[g] = digest, w[d]
    return total, count, weights


def assert_groups(stats, want):
    """A profile's groups against `groups_by_definition` (its growing axis as wide as the widest document)."""
    total, count, weights = want
    width = stats.group_total.shape[-1]
    assert stats.is_grouped and width >= total.shape[-1]
    assert torch.equal(stats.group_count[..., : total.shape[-1]], count)
    assert not stats.group_count[..., total.shape[-1]:].any()
    torch.testing.assert_close(stats.group_total[..., : total.shape[-1]], total, rtol=1e-9, atol=1e-9, equal_nan=True)
    assert torch.equal(stats.group_weights.isnan(), weights.isnan())
    assert torch.equal(stats.group_weights.nan_to_num(-1.0), weights.nan_to_num(-1.0))


@settings(max_examples=60, deadline=None)
@given(corpora(), st.data())
def test_groups_hold_their_definition_and_merge_as_one_pass(corpus, data):
    """Past GROWING_ROWS documents (3 here) the profile keeps groups: in one pass, in batches, and merged from two
    parts in either order, each equal to the groups of the definition (sums to float64 rounding, counts and
    weights exactly); at most GROWING_ROWS documents keep their rows unchanged (folding is for more)."""
    tokens, values, shape, n, cuts, n_bootstrap = corpus
    n_bootstrap = max(n_bootstrap, 1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stats_module, "GROWING_ROWS", 3)
        one = accumulate(tokens, values, shape, n, n_bootstrap)
        profile = one.stats["profile"]
        if len(tokens) <= 3:
            assert profile.is_rows and not profile.is_grouped
            x = pad_stack([v["profile"] for v in values]).double().nan_to_num(7.0)
            kept = profile.documents.nan_to_num(7.0)[..., : x.shape[-1]]
            assert sorted(d.numpy().tobytes() for d in kept) == sorted(d.numpy().tobytes() for d in x)
            return
        want = groups_by_definition(tokens, values, n_bootstrap)
        assert_groups(profile, want)
        assert_groups(accumulate(tokens, values, shape, n, n_bootstrap, cuts).stats["profile"], want)
        cut = data.draw(st.integers(1, len(tokens) - 1))
        parts = [accumulate(tokens[lo:hi], values[lo:hi], shape, n, n_bootstrap) for lo, hi in ((0, cut), (cut, len(tokens)))]
        for a, b in (parts, parts[::-1]):
            assert_groups(a.merge(b).stats["profile"], want)
        # a replicate resamples groups: the weighted sum of the group sums over that of their counts
        total, count, weights = want
        w = weights.nan_to_num(0.0)
        replicates = torch.stack([(w[:, b].reshape(-1, *[1] * (total.ndim - 1)) * total).sum(0)
                                  / (w[:, b].reshape(-1, *[1] * (total.ndim - 1)) * count).sum(0)
                                  for b in range(n_bootstrap)])
        got = profile.replicate_means()[..., : total.shape[-1]]
        torch.testing.assert_close(got, replicates, rtol=1e-9, atol=1e-9, equal_nan=True)


def test_groups_round_trip_and_a_result_saved_before_groups_still_loads_and_merges(monkeypatch):
    monkeypatch.setattr(stats_module, "GROWING_ROWS", 2)
    gen = torch.Generator().manual_seed(1)
    tokens = [torch.tensor([i, 2 * i + 1, 5]) for i in range(5)]
    values = [{"metric": torch.rand(1, 2, 2, generator=gen), "scalar": torch.rand(1, 2, generator=gen),
               "profile": torch.rand(1, 2, 3, generator=gen), "lags": torch.rand(1, 2, 2, generator=gen)}
              for _ in tokens]
    config = GeometryConfig()
    grouped = GeometryResult.from_accumulator(accumulate(tokens[:3], values[:3], (1, 2), 2, 4), config=config,
                                              model_name="m")
    assert grouped.stats["profile"].is_grouped
    # before groups, a profile past its rows kept its sums only (no replicates)
    old = replace(grouped, stats={**grouped.stats, "profile": grouped.stats["profile"].ungrouped()})
    with tempfile.TemporaryDirectory() as folder:
        for name, result in (("grouped", grouped), ("old", old)):
            result.save(Path(folder) / name)
            loaded = GeometryResult.load(Path(folder) / name)
            assert loaded.equals(result)
        old = GeometryResult.load(Path(folder) / "old")
    assert not old.stats["profile"].is_grouped and not old.has_replicates("profile")
    rest = GeometryResult.from_accumulator(accumulate(tokens[3:], values[3:], (1, 2), 2, 4), config=config,
                                           model_name="m")
    for parts in ((old, rest), (rest, old)):
        merged = GeometryResult.merge(parts)
        assert not merged.stats["profile"].is_grouped and not merged.has_replicates("profile")
    assert GeometryResult.merge([grouped, rest]).stats["profile"].is_grouped


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
