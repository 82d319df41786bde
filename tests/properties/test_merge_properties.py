"""Merging statistics: one pass, any batching and any merge order give the same result.

Counts must be exactly equal. Sums are compared to 1e-6 relative, with an
absolute floor of 1e-6 times the largest possible partial sum (total weight
times the largest |value|): float32 statistics (sums of "mean" fields,
replicates) are rounded once per part, and parts of opposite sign may cancel,
so their error scales with the parts, not with the merged sum.
"""

import math
import tempfile
from pathlib import Path

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_geometry.config import GeometryConfig
from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.results.accumulators import Accumulator
from tl_geometry.results.bootstrap import document_weights
from tl_geometry.results.result import GeometryResult

SPECS = [
    FieldSpec("metric", "on the grid", axes=("n",), bootstrap=True),
    FieldSpec("scalar", "one per head", bootstrap=True),
    FieldSpec("profile", "by position", axes=("position",), documents="mean"),
    FieldSpec("lags", "by lag, with moments", axes=("lag",)),
]


@st.composite
def corpora(draw):
    """Documents (token ids), their per-document values with NaN and +-inf, the shapes, and cut points."""
    n_docs = draw(st.integers(1, 7))
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 3)))
    n = draw(st.integers(1, 3))
    lengths = draw(st.lists(st.integers(1, 5), min_size=n_docs, max_size=n_docs))
    tokens = [torch.tensor(draw(st.lists(st.integers(0, 99), min_size=k, max_size=k))) for k in lengths]
    p_nan, p_inf = draw(st.sampled_from([0.0, 0.2, 0.6])), draw(st.sampled_from([0.0, 0.05, 0.3]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))

    def sample(*size):
        x = torch.rand(*size, generator=gen) * 8 - 4
        x = x.masked_fill(torch.rand(*size, generator=gen) < p_inf, math.inf)
        x = x.masked_fill(torch.rand(*size, generator=gen) < p_inf / 2, -math.inf)
        return x.masked_fill(torch.rand(*size, generator=gen) < p_nan, math.nan)

    values = [{"metric": sample(*shape, n), "scalar": sample(*shape), "profile": sample(*shape, k),
               "lags": sample(*shape, max(k - 1, 1))} for k in lengths]
    cuts = sorted(draw(st.sets(st.integers(1, n_docs - 1), max_size=3))) if n_docs > 1 else []
    n_bootstrap = draw(st.integers(0, 4))
    return tokens, values, shape, n, cuts, n_bootstrap


def pad_stack(tensors):
    width = [max(s) for s in zip(*(t.shape for t in tensors))]
    out = torch.full((len(tensors), *width), math.nan)
    for i, t in enumerate(tensors):
        out[(i, *(slice(0, k) for k in t.shape))] = t
    return out


def accumulate(tokens, values, shape, n, n_bootstrap, cuts=()):
    acc = Accumulator(SPECS, layers=range(shape[0]), heads=range(shape[1]), n_grid=torch.arange(1, n + 1),
                      n_bootstrap=n_bootstrap, replicate_fields=["metric", "scalar"])
    bounds = [0, *cuts, len(tokens)]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        batch = {name: pad_stack([v[name] for v in values[lo:hi]]) for name in values[0]}
        acc.add(batch, document_weights(tokens[lo:hi], n_bootstrap, seed=7), sum(len(t) for t in tokens[lo:hi]))
    return acc


def floor(tokens, values, n_bootstrap):
    """1e-6 times the largest partial sum a statistic can hold, by statistic."""
    w = document_weights(tokens, n_bootstrap, seed=7)
    weight = max(len(tokens), float(w.sum(0).max()) if n_bootstrap else 0.0)
    biggest = max(float(v[name].nan_to_num(0, 0, 0).abs().max()) for v in values for name in v)
    return {"total_sq": 1e-6 * weight * biggest**2, "replicate_count": 0.0}, 1e-6 * weight * biggest


def assert_same(got, want, floors):
    """Two dicts of FieldStats: counts exactly, the rest to 1e-6 relative (see the module docstring)."""
    assert list(got) == list(want)
    for name in want:
        mine, theirs = got[name].arrays(), want[name].arrays()
        assert list(mine) == list(theirs)
        for statistic, t in theirs.items():
            u = mine[statistic]
            assert u.dtype == t.dtype and u.shape == t.shape, (name, statistic)
            if statistic == "count":
                assert torch.equal(u, t), (name, statistic)
            else:
                atol = floors[0].get(statistic, floors[1])
                torch.testing.assert_close(u, t, rtol=1e-6, atol=atol, equal_nan=True, msg=f"{name}/{statistic}")


def bitwise_equal(a, b):
    for name in a:
        for statistic, t in a[name].arrays().items():
            u = b[name].arrays()[statistic]
            assert torch.equal(t.isnan(), u.isnan()) and torch.equal(t.nan_to_num(0.0, 1.0, -1.0), u.nan_to_num(0.0, 1.0, -1.0))


@settings(max_examples=60, deadline=None)
@given(corpora())
def test_batches_and_merges_equal_one_pass(corpus):
    tokens, values, shape, n, cuts, n_bootstrap = corpus
    one = accumulate(tokens, values, shape, n, n_bootstrap)
    floors = floor(tokens, values, n_bootstrap)
    batched = accumulate(tokens, values, shape, n, n_bootstrap, cuts)
    assert_same(batched.stats, one.stats, floors)
    bounds = [0, *cuts, len(tokens)]
    parts = [accumulate(tokens[lo:hi], values[lo:hi], shape, n, n_bootstrap) for lo, hi in zip(bounds[:-1], bounds[1:])]
    merged = parts[0]
    for p in parts[1:]:
        merged = merged.merge(p)
    assert_same(merged.stats, one.stats, floors)
    assert (merged.n_documents, merged.n_tokens) == (one.n_documents, one.n_tokens)


@settings(max_examples=60, deadline=None)
@given(corpora(), st.data())
def test_merge_is_commutative_and_associative(corpus, data):
    tokens, values, shape, n, _, n_bootstrap = corpus
    cut1 = data.draw(st.integers(0, len(tokens)))
    cut2 = data.draw(st.integers(cut1, len(tokens)))
    a, b, c = (accumulate(tokens[lo:hi], values[lo:hi], shape, n, n_bootstrap) if hi > lo else
               Accumulator(SPECS, layers=range(shape[0]), heads=range(shape[1]), n_grid=torch.arange(1, n + 1),
                           n_bootstrap=n_bootstrap, replicate_fields=["metric", "scalar"])
               for lo, hi in ((0, cut1), (cut1, cut2), (cut2, len(tokens))))
    bitwise_equal(a.merge(b).stats, b.merge(a).stats)  # float addition, fmin and fmax commute exactly
    assert_same(a.merge(b).merge(c).stats, a.merge(b.merge(c)).stats, floor(tokens, values, n_bootstrap))
    ra, rb = (GeometryResult.from_accumulator(x, config=GeometryConfig(), model_name="m") for x in (a, b))
    assert GeometryResult.merge(ra, rb).equals(GeometryResult.merge(rb, ra))


@settings(max_examples=25, deadline=None)
@given(corpora())
def test_halves_saved_and_merged_later_equal_one_pass(corpus):
    tokens, values, shape, n, cuts, n_bootstrap = corpus
    cut = cuts[0] if cuts else len(tokens)
    config = GeometryConfig()
    one = GeometryResult.from_accumulator(accumulate(tokens, values, shape, n, n_bootstrap), config=config, model_name="m")
    halves = [accumulate(tokens[lo:hi], values[lo:hi], shape, n, n_bootstrap) for lo, hi in ((0, cut), (cut, len(tokens)))
              if hi > lo]
    with tempfile.TemporaryDirectory() as folder:
        loaded = []
        for i, acc in enumerate(halves):
            GeometryResult.from_accumulator(acc, config=config, model_name="m").save(Path(folder) / str(i))
            loaded.append(GeometryResult.load(Path(folder) / str(i)))
    merged = GeometryResult.merge(loaded)
    assert merged.n_documents == one.n_documents and merged.n_tokens == one.n_tokens
    assert_same(merged.stats, one.stats, floor(tokens, values, n_bootstrap))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2**40), min_size=1, max_size=6), min_size=1, max_size=8), st.data())
def test_document_weights_do_not_depend_on_batch_or_order(documents, data):
    tokens = [torch.tensor(d) for d in documents]
    together = document_weights(tokens, 6, seed=11)
    order = data.draw(st.permutations(range(len(tokens))))
    cut = data.draw(st.integers(0, len(tokens)))
    shuffled = [tokens[i] for i in order]
    pieces = torch.cat([document_weights(shuffled[:cut], 6, seed=11), document_weights(shuffled[cut:], 6, seed=11)])
    assert torch.equal(pieces, together[list(order)])
