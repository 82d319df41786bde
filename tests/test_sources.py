"""Corpus readers and lazy windows: every format, stable ids, laziness, skips and one-line errors."""

import csv
import hashlib
import json
import tracemalloc

import numpy as np
import pytest
import torch

from tests import tiny_models as tm
from tl_geometry.corpus_input import readers
from tl_geometry.corpus_input import token_windows as sources
from tl_geometry.corpus_input.readers import SKIP_BAD_RECORD, SKIP_EMPTY, SKIP_NO_COLUMN, SKIP_SHORT, SKIP_UNKNOWN_KIND, SKIP_UNREADABLE
from tl_geometry.corpus_input.token_windows import Window, read_corpus, text_windows, window_documents
from tl_geometry.errors import GeometryError

BOS = tm.BOS_ID


@pytest.fixture(scope="module")
def tok():
    return tm.tiny_tokenizer()


def words(n: int, start: int = 0) -> str:
    """n words of the tiny vocabulary (one token each), starting at word ``start``."""
    return " ".join(tm.WORDS[(start + i) % len(tm.WORDS)] for i in range(n))


def ids_of(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def reference_windows(tok, texts: list[str], context: int) -> list[list[int]]:
    """From the definition: per document, BOS + consecutive runs of context - 1 tokens, the short tail dropped."""
    out = []
    for text in texts:
        ids = ids_of(tok, text)
        body = context - 1
        out += [[BOS, *ids[i : i + body]] for i in range(0, len(ids) - body + 1, body)]
    return out


def token_lists(stream) -> list[list[int]]:
    return [w.tokens.tolist() for w in stream]


# ---- formats ----

def test_text_files_and_directories(tmp_path, tok):
    (tmp_path / "b").mkdir()
    (tmp_path / "a.txt").write_text(words(20))
    (tmp_path / "b" / "c.md").write_text(words(13, 3))
    (tmp_path / ".hidden.txt").write_text(words(50))
    (tmp_path / "notes.docx").write_bytes(b"PK\x03\x04")
    stream = read_corpus(tok, tmp_path, context=6)
    assert token_lists(stream) == reference_windows(tok, [words(20), words(13, 3)], 6)
    assert stream.report.documents == 2 and stream.report.windows == 4 + 2
    assert stream.report.skipped == {SKIP_UNKNOWN_KIND: 1}
    assert [s["path"] for s in stream.report.sources] == [str(tmp_path / "a.txt"), str(tmp_path / "b" / "c.md")]
    assert stream.report.sources[0]["sha256"] == hashlib.sha256((tmp_path / "a.txt").read_bytes()).hexdigest()
    assert stream.report.tail_tokens == 20 - 4 * 5 + 13 - 2 * 5


def test_long_text_read_in_pieces_equals_tokenising_it_whole(tmp_path, tok, monkeypatch):
    monkeypatch.setattr(readers, "PIECE_CHARS", 37)  # cuts fall inside words
    monkeypatch.setattr(sources, "PIECE_CHARS", 37)
    text = words(500)
    (tmp_path / "long.txt").write_text(text)
    expected = text_windows(tok, text, context=16)
    assert torch.equal(torch.stack([w.tokens for w in read_corpus(tok, tmp_path / "long.txt", context=16)]), expected)
    assert torch.equal(torch.stack([w.tokens for w in window_documents(tok, [text], context=16)]), expected)
    # ... and really piece by piece: many pieces come out, each a few pieces' worth of tokens.
    pieces = list(sources.encode_lazily(tok, (text[i : i + 37] for i in range(0, len(text), 37))))
    assert len(pieces) > 50 and max(len(p) for p in pieces) < 30


@pytest.mark.slow
def test_pieces_equal_whole_on_smollm2(smollm2, monkeypatch):
    """The byte-level tokenizer of the default model: multi-byte characters, whitespace runs, code."""
    from tl_geometry.corpus_input.plain_text import default_text

    monkeypatch.setattr(sources, "PIECE_CHARS", 997)  # a cut every 997 characters or so: about 200 of them
    text = default_text()[:200_000] + " été 你好 😀\n\n    x = 1  "
    pieces = (text[i : i + 997] for i in range(0, len(text), 997))
    assert sources.chunking_is_exact(smollm2.tokenizer)
    got = list(sources.encode_lazily(smollm2.tokenizer, pieces, exact=True))  # piece by piece, as the check allows
    assert len(got) > 100
    assert [i for ids in got for i in ids] == sources.encode(smollm2.tokenizer, text)


def test_jsonl_records_skips_and_missing_column(tmp_path, tok):
    path = tmp_path / "d.jsonl"
    lines = [{"text": words(11)}, {"text": ""}, "not json", {"other": 1}, {"text": words(5, 2)}, {"text": None},
             {"text": [4, 7, 8, 9, 10, 11]}, {"text": 3.5}]
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n\n")
    stream = read_corpus(tok, path, context=6)
    assert token_lists(stream) == [*reference_windows(tok, [words(11), words(5, 2)], 6), [BOS, 4, 7, 8, 9, 10]]
    report = stream.report
    assert report.documents == 8
    assert dict(report.skipped) == {SKIP_EMPTY: 2, SKIP_BAD_RECORD: 1, SKIP_NO_COLUMN: 1,
                                    readers.SKIP_NOT_TEXT: 1}
    assert report.examples[SKIP_BAD_RECORD] == [f"{path}:3"]
    assert "1 record that is not a valid JSON object (e.g. " in report.summary()
    (tmp_path / "e.jsonl").write_text(json.dumps({"body": "x", "id": 1}) + "\n")
    with pytest.raises(GeometryError, match=r"has no column 'text'; its columns are \['body', 'id'\]; .*--text-column"):
        list(read_corpus(tok, tmp_path / "e.jsonl", context=6))


def test_csv_and_parquet(tmp_path, tok):
    texts = [words(12), words(7, 5), "", words(6, 1)]
    with open(tmp_path / "d.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "body"])
        writer.writerows([[i, text] for i, text in enumerate(texts)])
    expected = reference_windows(tok, [t for t in texts if t], 6)
    stream = read_corpus(tok, tmp_path / "d.csv", context=6, text_column="body")
    assert token_lists(stream) == expected
    assert stream.report.skipped[SKIP_EMPTY] == 1 and stream.report.examples[SKIP_EMPTY] == [f"{tmp_path / 'd.csv'}:4"]
    with pytest.raises(GeometryError, match=r"d.csv' has no column 'text'; its columns are \['body', 'id'\]"):
        list(read_corpus(tok, tmp_path / "d.csv", context=6))
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(GeometryError, match="empty CSV file"):
        list(read_corpus(tok, tmp_path / "empty.csv", context=6))

    import pandas as pd

    pd.DataFrame({"body": texts, "n": range(4)}).to_parquet(tmp_path / "d.parquet")
    stream = read_corpus(tok, tmp_path / "d.parquet", context=6, text_column="body")
    assert token_lists(stream) == expected and stream.report.sources[0]["kind"] == "parquet"
    with pytest.raises(GeometryError, match=r"has no column 'text'; its columns are \['body', 'n'\]"):
        list(read_corpus(tok, tmp_path / "d.parquet", context=6))
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(GeometryError, match="cannot read .*bad.parquet' as Parquet"):
        list(read_corpus(tok, tmp_path / "bad.parquet", context=6))


def test_saved_and_local_datasets(tmp_path, tok, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    texts = [words(12), words(3), words(8, 4)]
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"text": texts, "label": [0, 1, 2]}).save_to_disk(str(saved))
    stream = read_corpus(tok, saved, context=6)
    assert token_lists(stream) == reference_windows(tok, texts, 6)
    assert stream.report.skipped == {SKIP_SHORT: 1} and stream.report.sources[0]["rows"] == 3
    # A directory that holds a saved dataset is read as one, not walked into.
    assert token_lists(read_corpus(tok, tmp_path, context=6)) == reference_windows(tok, texts, 6)
    with pytest.raises(GeometryError, match=r"has no column 'body'; its columns are \['label', 'text'\]"):
        list(read_corpus(tok, saved, context=6, text_column="body"))

    two = tmp_path / "two"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": texts}),
                          "test": datasets.Dataset.from_dict({"text": texts})}).save_to_disk(str(two))
    with pytest.raises(GeometryError, match=r"holds the splits \['train', 'test'\]; pass one of them, e.g. .*two/train"):
        list(read_corpus(tok, two, context=6))
    assert token_lists(read_corpus(tok, two / "test", context=6)) == reference_windows(tok, texts, 6)

    (tmp_path / "local.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in texts))
    local = datasets.load_dataset("json", data_files=str(tmp_path / "local.jsonl"), split="train",
                                  cache_dir=str(tmp_path / "cache"))
    assert token_lists(read_corpus(tok, local, context=6)) == reference_windows(tok, texts, 6)
    streaming = datasets.load_dataset("json", data_files=str(tmp_path / "local.jsonl"), split="train", streaming=True)
    assert token_lists(read_corpus(tok, streaming, context=6)) == reference_windows(tok, texts, 6)


def test_npy_token_ids(tmp_path, tok):
    flat = np.arange(3, 3 + 23, dtype=np.int32)
    np.save(tmp_path / "flat.npy", flat)
    rows = np.arange(3, 3 + 30, dtype=np.int64).reshape(3, 10)
    np.save(tmp_path / "rows.npy", rows)
    got = token_lists(read_corpus(tok, [tmp_path / "flat.npy", tmp_path / "rows.npy"], context=5))
    expected = [[BOS, *flat[i : i + 4].tolist()] for i in range(0, 20, 4)]
    expected += [[BOS, *row[i : i + 4].tolist()] for row in rows for i in (0, 4)]
    assert got == expected
    np.save(tmp_path / "float.npy", np.zeros(8))
    with pytest.raises(GeometryError, match=r"float.npy' holds a float64 array of shape \[8\]; expected integer token"):
        list(read_corpus(tok, tmp_path / "float.npy", context=5))
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(GeometryError, match="objects.npy' as a .npy array without pickle"):
        list(read_corpus(tok, tmp_path / "objects.npy", context=5))


def test_token_ids_outside_the_vocabulary(tmp_path):
    model = tm.make_model("bridge-llama")
    np.save(tmp_path / "ids.npy", np.array([5, 6, model.cfg.d_vocab + 3, 7], dtype=np.int64))
    with pytest.raises(GeometryError, match=rf"ids.npy holds token ids from 5 to {model.cfg.d_vocab + 3}, outside"):
        list(read_corpus(model, tmp_path / "ids.npy", context=3))


# ---- ids, order, skips, laziness ----

def test_window_ids_positions_and_documents(tok):
    texts = [words(9), words(2), words(14, 3)]
    stream = window_documents(tok, texts, context=5)
    first, again = list(stream), list(stream)
    assert [w.id for w in first] == [w.id for w in again]
    assert [(w.position, w.document, w.index) for w in first] == [(0, 0, 0), (1, 0, 1), (2, 2, 0), (3, 2, 1),
                                                                   (4, 2, 2)]
    for w in first:  # the id from its definition: document, index, SHA-256 of the int64 ids (little-endian)
        digest = hashlib.sha256(np.asarray(w.tokens.tolist(), dtype="<i8").tobytes()).hexdigest()[:16]
        assert w.id == f"{w.document}:{w.index}:{digest}"
        assert isinstance(w, Window) and w.tokens.dtype == torch.int64
    assert stream.report.skipped == {SKIP_SHORT: 1} and stream.report.examples[SKIP_SHORT] == ["document 1"]


def test_min_context_keeps_a_shorter_last_window(tok):
    stream = window_documents(tok, [words(10), words(2)], context=5, min_context=3)
    assert [len(t) for t in token_lists(stream)] == [5, 5, 3, 3]
    assert stream.report.skipped == {} and stream.report.tail_tokens == 0
    with pytest.raises(GeometryError, match=r"min_context=1 must be an integer between 2 and context=5"):
        window_documents(tok, [], context=5, min_context=1)


def test_documents_are_read_only_as_far_as_needed(tok):
    def documents():
        for i in range(3):
            yield words(8, i)  # two windows of 5 each
        raise AssertionError("read past the windows asked for")

    stream = window_documents(tok, documents(), context=5, n_windows=6)
    assert len(list(stream)) == 6 and stream.report.documents == 3 and not stream.report.exhausted


def test_a_large_file_is_not_held_whole(tmp_path, tok):
    path = tmp_path / "big.txt"
    path.write_text(words(3_000_000))  # about 13 MB
    stream = read_corpus(tok, path, context=64, n_windows=3)
    tracemalloc.start()
    try:
        windows = list(stream)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(windows) == 3
    assert peak < 4 * 2**20, f"{peak / 2**20:.1f} MiB traced while drawing 3 windows from a 13 MB file"


def test_errors_are_one_line_geometry_errors(tmp_path, tok):
    with pytest.raises(GeometryError, match="corpus: .*missing.txt' does not exist"):
        list(read_corpus(tok, tmp_path / "missing.txt", context=5))
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(GeometryError, match=r"cannot read .*bin.txt' \(not UTF-8 text"):
        list(read_corpus(tok, tmp_path / "bin.txt", context=5))
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "bin.txt").write_bytes(b"\xff\xfe\x00binary")
    (tmp_path / "dir" / "ok.txt").write_text(words(8))
    (tmp_path / "dir" / "empty.txt").write_text("  \n")
    stream = read_corpus(tok, tmp_path / "dir", context=5)
    assert len(list(stream)) == 2
    assert stream.report.skipped == {SKIP_UNREADABLE: 1, SKIP_EMPTY: 1}
    with pytest.raises(GeometryError, match="got no sources"):
        read_corpus(tok, [], context=5)
    with pytest.raises(GeometryError, match="expected paths .* or a datasets.Dataset, got int"):
        list(read_corpus(tok, [3], context=5))
    with pytest.raises(GeometryError, match=r"n_windows=0 must be a positive integer"):
        window_documents(tok, [], context=5, n_windows=0)
    with pytest.raises(GeometryError, match=r"documents: document 0 is a ndarray float64 \[2\]"):
        list(window_documents(tok, [np.zeros(2)], context=5))
