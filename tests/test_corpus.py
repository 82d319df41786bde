"""analyze_corpus: batch after batch equals everything at once."""

import pytest
import torch

from tests import tiny_models as tm
from tl_geometry.capture.corpus import analyze_corpus
from tl_geometry.errors import GeometryError
from tl_geometry.capture.hooks import run_with_geometry_hooks

# Model-facing: also run in the transformer-lens 3.9 environment (make test-tl3).
pytestmark = pytest.mark.model

TEXTS = [
    "the cat sat on the mat",
    "a dog ran",
    "one two three four five six seven eight nine ten",
    "big red sun and blue moon",
    "fish",
]


@pytest.fixture(scope="module", params=["bridge-llama", "bridge-gpt2"])
def model(request):
    return tm.make_model(request.param)


def assert_same(a, b):
    """Same documents and tokens, every statistic of every field, and the same per-query rows."""
    assert torch.equal(a.n_grid, b.n_grid)
    assert (a.n_documents, a.n_tokens) == (b.n_documents, b.n_tokens)
    assert a.fields == b.fields
    for name in a.fields:
        assert torch.equal(a.count(name), b.count(name)), name
        torch.testing.assert_close(a.per_head(name), b.per_head(name), equal_nan=True, msg=name)
        torch.testing.assert_close(a.std(name), b.std(name), equal_nan=True, msg=name)
        torch.testing.assert_close(a.min(name), b.min(name), equal_nan=True, msg=name)
        torch.testing.assert_close(a.max(name), b.max(name), equal_nan=True, msg=name)
    replicated = [name for name in a.fields if a.has_replicates(name)]
    assert "recall" in replicated and replicated == [name for name in b.fields if b.has_replicates(name)]
    for name in replicated:  # the bootstrap weights follow the documents, not the batches
        torch.testing.assert_close(a.replicates(name), b.replicates(name), equal_nan=True, msg=name)
    assert torch.equal(a.query_positions, b.query_positions)
    assert set(a.queries) == set(b.queries)
    for name, t in a.queries.items():
        torch.testing.assert_close(t, b.queries[name], equal_nan=True, msg=name)


@pytest.mark.parametrize("batch_size", [1, 2, 5])
def test_texts_in_batches_equal_one_shot(model, batch_size):
    at_once = run_with_geometry_hooks(model, TEXTS, query_positions="all", keep_queries=True)
    batched = analyze_corpus(model, TEXTS, batch_size=batch_size, progress=False, query_positions="all", keep_queries=True)
    assert_same(batched, at_once)
    assert at_once.n_grid[-1] == 11  # one grid for the whole corpus, from its longest sequence


def test_token_tensor_and_token_batches(model):
    tokens = tm.with_bos(tm.random_tokens(5, 12))
    at_once = run_with_geometry_hooks(model, tokens, keep_queries=True)
    assert_same(analyze_corpus(model, tokens, batch_size=2, progress=False, keep_queries=True), at_once)
    assert_same(analyze_corpus(model, iter(tokens.split(3)), progress=False, keep_queries=True), at_once)


def test_progress_bar_is_shown(model, capsys):
    analyze_corpus(model, TEXTS[:2], batch_size=1, progress=True, n_grid=[1])
    assert "tl_geometry" in capsys.readouterr().err


@pytest.mark.parametrize(
    "corpus, kwargs, message",
    [
        ([], {}, "the corpus is empty"),
        (["a", torch.zeros(1, 2, dtype=torch.long)], {}, "mixes or holds unsupported items"),
        (TEXTS, {"batch_size": 0}, "batch_size: expected a positive integer, got 0"),
        (TEXTS, {"layerz": [0]}, "unknown config field"),
    ],
)
def test_bad_corpus(model, corpus, kwargs, message):
    with pytest.raises(GeometryError, match=message):
        analyze_corpus(model, corpus, progress=False, **kwargs)
