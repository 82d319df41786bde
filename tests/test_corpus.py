"""analyze_corpus: batch after batch equals everything at once."""

import pytest
import torch

from tests import tiny_models as tm
from tests.fixtures import TEXTS
from tl_geometry.capture.hooks import run_with_geometry_hooks
from tl_geometry.errors import GeometryError
from tl_geometry.runs.corpus_run import analyze_corpus

# Model-facing: also run in the transformer-lens 3.9 environment (make test-tl3).
pytestmark = pytest.mark.model


@pytest.fixture(scope="module", params=["bridge-llama", "bridge-gpt2"])
def model(request):
    return tm.make_model(request.param)


def assert_same(a, b, model):
    """Same documents and tokens, every statistic of every field, and the same per-query rows (to the
    tolerances of ``model`` on differently padded batches)."""
    close = {"equal_nan": True, **tm.padding_close(model)}
    assert torch.equal(a.n_grid, b.n_grid)
    assert (a.n_documents, a.n_tokens) == (b.n_documents, b.n_tokens)
    assert a.fields == b.fields
    for name in a.fields:
        assert torch.equal(a.count(name), b.count(name)), name
        torch.testing.assert_close(a.per_head(name), b.per_head(name), msg=name, **close)
        torch.testing.assert_close(a.std(name), b.std(name), msg=name, **close)
        torch.testing.assert_close(a.min(name), b.min(name), msg=name, **close)
        torch.testing.assert_close(a.max(name), b.max(name), msg=name, **close)
    replicated = [name for name in a.fields if a.has_replicates(name)]
    assert "recall" in replicated and replicated == [name for name in b.fields if b.has_replicates(name)]
    for name in replicated:  # the bootstrap weights follow the documents, not the batches
        torch.testing.assert_close(a.replicates(name), b.replicates(name), msg=name, **close)
    assert torch.equal(a.query_positions, b.query_positions)
    assert set(a.queries) == set(b.queries)
    for name, t in a.queries.items():
        torch.testing.assert_close(t, b.queries[name], msg=name, **close)


@pytest.mark.parametrize("batch_size", [1, 2, 5])
def test_texts_in_batches_equal_one_shot(model, batch_size):
    at_once = run_with_geometry_hooks(model, TEXTS, query_positions="all", keep_queries=True)
    batched = analyze_corpus(model, TEXTS, batch_size=batch_size, progress=False, query_positions="all", keep_queries=True)
    assert_same(batched, at_once, model)
    assert at_once.n_grid[-1] == 11  # one grid for the whole corpus, from its longest sequence


def test_token_tensor_and_token_batches(model):
    tokens = tm.with_bos(tm.random_tokens(5, 12))
    at_once = run_with_geometry_hooks(model, tokens, keep_queries=True)
    assert_same(analyze_corpus(model, tokens, batch_size=2, progress=False, keep_queries=True), at_once, model)
    assert_same(analyze_corpus(model, iter(tokens.split(3)), progress=False, keep_queries=True), at_once, model)


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


# ---- windows read lazily (tl_geometry.corpus_input.token_windows) ----

def _windows(model, n_docs=4, length=23, context=8, **kwargs):
    from tl_geometry.corpus_input.token_windows import window_documents

    docs = [" ".join(tm.WORDS[(i * 7 + j) % len(tm.WORDS)] for j in range(length + i)) for i in range(n_docs)]
    return window_documents(model, docs, context=context, **kwargs)


def test_a_window_stream_equals_its_windows_as_one_tensor(model):
    stream = _windows(model)
    tokens = torch.stack([w.tokens for w in stream])
    batched = analyze_corpus(model, stream, batch_size=3, progress=False, keep_queries=True, n_bootstrap=30)
    at_once = run_with_geometry_hooks(model, tokens, keep_queries=True, n_bootstrap=30)
    assert_same(batched, at_once, model)
    corpus = batched.provenance["corpus"]
    assert corpus["windows"] == len(tokens) == batched.n_documents and corpus["context"] == 8
    assert corpus["documents"] == 4 and corpus["exhausted"] is True
    assert batched.provenance["model"]["name"] == model.cfg.model_name
    # Any iterable of windows works too (e.g. one rank's share); its grid comes from its first batch.
    share = (w for w in stream if w.position % 2 == 0)
    half = analyze_corpus(model, share, batch_size=2, progress=False, keep_queries=True, n_bootstrap=30)
    assert_same(half, run_with_geometry_hooks(model, tokens[::2], keep_queries=True, n_bootstrap=30), model)


def test_ragged_windows_are_padded(model):
    stream = _windows(model, n_docs=3, length=10, context=8, min_context=4)
    windows = list(stream)
    assert sorted({len(w.tokens) for w in windows}) == [4, 5, 6, 8]
    result = analyze_corpus(model, stream, batch_size=4, progress=False, keep_queries=True, n_grid=[1, 2, 3])
    one_by_one = analyze_corpus(model, [w.tokens[None] for w in windows], progress=False, keep_queries=True,
                                n_grid=[1, 2, 3])
    assert_same(result, one_by_one, model)


def test_the_progress_bar_counts_windows_and_tokens(model, capsys):
    analyze_corpus(model, _windows(model, n_windows=4), batch_size=2, progress=True, n_grid=[1])
    err = capsys.readouterr().err
    assert "4/4" in err and "window" in err and "tok/s" in err


def test_skips_are_reported_at_the_end(model, capsys):
    from tl_geometry.corpus_input.token_windows import window_documents

    result = analyze_corpus(model, window_documents(model, ["the cat sat on the mat and ran", "a dog"], context=5),
                            progress=True, n_grid=[1])
    assert result.provenance["corpus"]["skipped"] == {"documents shorter than the minimum window": 1}
    assert "skipped 1 document shorter than the minimum window (e.g. document 1)" in capsys.readouterr().err


def test_no_windows_is_a_one_line_error(model):
    from tl_geometry.corpus_input.token_windows import window_documents

    with pytest.raises(GeometryError, match=r"no windows to analyse \(2 documents read, 0 windows used.*skipped 2 "):
        analyze_corpus(model, window_documents(model, ["a dog", "a cat"], context=8), progress=False)
