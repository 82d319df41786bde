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
    assert torch.equal(a.n_grid, b.n_grid) and torch.equal(a.sequence_lengths, b.sequence_lengths)
    for name, t in a.per_sequence.items():
        torch.testing.assert_close(t, b.per_sequence[name], equal_nan=True, msg=name)


@pytest.mark.parametrize("batch_size", [1, 2, 5])
def test_texts_in_batches_equal_one_shot(model, batch_size):
    at_once = run_with_geometry_hooks(model, TEXTS, query_positions="all")
    batched = analyze_corpus(model, TEXTS, batch_size=batch_size, progress=False, query_positions="all")
    assert_same(batched, at_once)
    assert at_once.n_grid[-1] == 11  # one grid for the whole corpus, from its longest sequence


def test_token_tensor_and_token_batches(model):
    tokens = tm.with_bos(tm.random_tokens(5, 12))
    at_once = run_with_geometry_hooks(model, tokens)
    assert_same(analyze_corpus(model, tokens, batch_size=2, progress=False), at_once)
    assert_same(analyze_corpus(model, iter(tokens.split(3)), progress=False), at_once)


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
