"""Tests for tl_geometry.corpus_input.plain_text: the default text, reading files, token windows."""

import pytest
import torch

from tl_geometry.errors import GeometryError
from tl_geometry import default_text, text_windows
from tl_geometry.corpus import read_text_files

BOS_ID = 1


@pytest.fixture(scope="module")
def word_tokenizer():
    """A tiny whitespace tokenizer with a BOS token: fast and offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = sorted({w for w in "the quick brown fox jumps over a lazy dog".split()})
    vocab = {"<unk>": 0, "<bos>": BOS_ID, **{w: i + 2 for i, w in enumerate(words)}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<bos>", unk_token="<unk>")


def _words(n: int) -> str:
    """A text of exactly n tokens for the word tokenizer."""
    cycle = "the quick brown fox jumps over a lazy dog".split()
    return " ".join(cycle[i % len(cycle)] for i in range(n))


def test_default_text_is_long_and_deterministic():
    from pydoc_data.topics import topics

    text = default_text()
    assert len(text) > 100_000
    assert text == default_text()
    assert topics["for"].strip() in text


def test_windows_shape_bos_and_consecutive(word_tokenizer):
    text = _words(100)
    windows = text_windows(word_tokenizer, text, context=10)
    ids = word_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert windows.shape == (100 // 9, 10)
    assert windows.dtype == torch.long
    assert torch.all(windows[:, 0] == BOS_ID)
    # The text tokens run on from one window to the next, nothing skipped or repeated.
    assert windows[:, 1:].reshape(-1).tolist() == ids[: (100 // 9) * 9]


def test_windows_without_bos(word_tokenizer):
    text = _words(25)
    windows = text_windows(word_tokenizer, text, context=5, prepend_bos=False)
    ids = word_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert windows.shape == (5, 5)
    assert windows.reshape(-1).tolist() == ids


def test_windows_are_deterministic_and_n_windows_takes_a_prefix(word_tokenizer):
    text = _words(200)
    all_windows = text_windows(word_tokenizer, text, context=16)
    first_three = text_windows(word_tokenizer, text, context=16, n_windows=3)
    assert torch.equal(all_windows, text_windows(word_tokenizer, text, context=16))
    assert torch.equal(first_three, all_windows[:3])


def test_too_short_text_says_how_many_tokens(word_tokenizer):
    with pytest.raises(GeometryError, match=r"the text has 5 tokens, enough for 0 windows"):
        text_windows(word_tokenizer, _words(5), context=10)


def test_too_many_windows_is_an_error_not_a_clip(word_tokenizer):
    with pytest.raises(GeometryError, match=r"enough for 2 windows .* but 3 were asked for"):
        text_windows(word_tokenizer, _words(20), context=10, n_windows=3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"context": 1}, r"context=1 is too small; it must be at least 2"),
        ({"context": 0, "prepend_bos": False}, r"context=0 is too small; it must be at least 1"),
        ({"context": 4, "n_windows": 0}, r"n_windows=0 must be at least 1"),
    ],
)
def test_bad_arguments(word_tokenizer, kwargs, message):
    with pytest.raises(GeometryError, match=message):
        text_windows(word_tokenizer, _words(50), **kwargs)


def test_tokenizer_without_bos(word_tokenizer):
    import copy

    no_bos = copy.deepcopy(word_tokenizer)
    no_bos.bos_token = None
    with pytest.raises(GeometryError, match="has no BOS token; pass prepend_bos=False"):
        text_windows(no_bos, _words(50), context=4)
    assert text_windows(no_bos, _words(8), context=4, prepend_bos=False).shape == (2, 4)


def test_not_a_tokenizer():
    with pytest.raises(GeometryError, match="expected a TransformerLens model or a Hugging Face tokenizer, got int"):
        text_windows(3, "some text", context=4)


def test_read_text_files(tmp_path):
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("alpha", encoding="utf-8")
    second.write_text("beta", encoding="utf-8")
    assert read_text_files([first, second]) == "alpha\n\nbeta"
    assert read_text_files(str(first)) == "alpha"


def test_read_text_files_errors(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n", encoding="utf-8")
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00\x81")
    with pytest.raises(GeometryError, match=r"empty\.txt' is empty"):
        read_text_files([empty])
    with pytest.raises(GeometryError, match=r"cannot read .*missing\.txt' as UTF-8 text \(FileNotFoundError"):
        read_text_files([tmp_path / "missing.txt"])
    with pytest.raises(GeometryError, match=r"binary\.txt' as UTF-8 text \(UnicodeDecodeError"):
        read_text_files([binary])
    with pytest.raises(GeometryError, match="empty list of paths"):
        read_text_files([])


@pytest.mark.slow
def test_windows_of_the_default_model(smollm2):
    windows = text_windows(smollm2, default_text(), context=1024, n_windows=2)
    assert windows.shape == (2, 1024)
    assert torch.all(windows[:, 0] == smollm2.tokenizer.bos_token_id)
    # The model's own tokenizer agrees with ours on the text tokens.
    assert torch.equal(windows[0, :8], smollm2.to_tokens(default_text(), prepend_bos=True)[0, :8])


@pytest.mark.slow
def test_context_longer_than_the_model(smollm2):
    n_ctx = smollm2.cfg.n_ctx
    with pytest.raises(GeometryError, match=rf"longer than the model's n_ctx={n_ctx}"):
        text_windows(smollm2, "x", context=n_ctx + 1)


def test_n_windows_tokenises_only_a_prefix_with_the_same_ids():
    """A real BPE tokenizer (SmolLM2's, from the model cache): n_windows=2 of the default text tokenises a few
    kB, not the whole text, and gives the windows the whole text's tokenisation gives."""
    from transformers import AutoTokenizer

    from tl_geometry.models import model_cache_dir

    export = model_cache_dir() / "models" / "smollm2-135m"
    if not export.is_dir():
        pytest.skip("the SmolLM2 export is not cached yet")
    tokenizer = AutoTokenizer.from_pretrained(export)
    seen = []

    def recording(text, **kwargs):
        seen.append(len(text))
        return tokenizer(text, **kwargs)

    recording.bos_token_id = tokenizer.bos_token_id
    text = default_text()
    for context, n in ((64, 1), (128, 2), (512, 3)):
        seen.clear()
        windows = text_windows(recording, text, context=context, n_windows=n)
        assert max(seen) < 64 * context * n < len(text)
        everything = text_windows(tokenizer, text, context=context)
        assert torch.equal(windows, everything[:n])
