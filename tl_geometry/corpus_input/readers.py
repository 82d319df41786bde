"""Documents from files, read lazily: text, JSONL, CSV, Parquet, saved Hugging Face datasets, ``.npy`` token ids.

Nothing here holds a corpus whole. A text file is one document, handed on in
pieces of `PIECE_CHARS` characters; JSONL, CSV and Parquet files give one
document per record (the ``text_column`` of each), read a record or a small
batch at a time; a dataset saved with ``datasets``' ``save_to_disk`` is
memory-mapped and read a batch at a time; a ``.npy`` array of integer token
ids is memory-mapped: a 1-d array is one document (a token stream), each row
of a 2-d array another. A directory is read in sorted path order (hidden
entries left out), so the order of documents is the same on every machine.

What cannot be used is said, never dropped in silence: a file named
explicitly that cannot be read, a table without the text column, or a
damaged array raise a one-line `GeometryError` naming the file; inside a
directory, unreadable files and files of unknown kind are skipped and
counted, as are empty records, in the run's `CorpusReport`.

The Hugging Face hub is never contacted (``HF_DATASETS_OFFLINE`` is set
before ``datasets`` is imported).
"""

import codecs
import csv
import hashlib
import json
import os
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tl_geometry._wording import plural
from tl_geometry.errors import GeometryError

PIECE_CHARS = 1 << 16
"""Characters of a text document handed to the tokenizer at a time."""
TEXT_SUFFIXES = frozenset({"", ".txt", ".text", ".md", ".rst"})
TABLE_SUFFIXES = frozenset({".jsonl", ".ndjson", ".csv", ".parquet"})
TOKEN_SUFFIXES = frozenset({".npy"})
_BATCH_ROWS = 64  # records read from a Parquet file or a dataset at a time
_HASH_BLOCK = 1 << 20
_EXAMPLES = 3  # origins kept per skip reason, for the report

SKIP_EMPTY = "empty documents"
SKIP_SHORT = "documents shorter than the minimum window"
SKIP_NO_COLUMN = "records without the text column"
SKIP_NOT_TEXT = "records whose text column holds neither text nor token ids"
SKIP_BAD_RECORD = "records that are not valid JSON objects"
SKIP_UNREADABLE = "files that could not be read"
SKIP_UNKNOWN_KIND = "files of an unknown kind"
# Each reason for one skip, so that the summary reads "1 empty document", not "1 empty documents".
_ONE = {SKIP_EMPTY: "empty document", SKIP_SHORT: "document shorter than the minimum window",
        SKIP_NO_COLUMN: "record without the text column",
        SKIP_NOT_TEXT: "record whose text column holds neither text nor token ids",
        SKIP_BAD_RECORD: "record that is not a valid JSON object", SKIP_UNREADABLE: "file that could not be read",
        SKIP_UNKNOWN_KIND: "file of an unknown kind"}


@dataclass
class CorpusReport:
    """What a pass over a corpus read, used and skipped; filled in as the windows are drawn.

    Attributes:
        sources: every file or dataset opened, in order: ``{"path", "kind",
            "sha256", "bytes"}`` for files, ``{"path", "kind", "fingerprint",
            "rows"}`` for datasets.
        documents: documents read (skipped ones included).
        windows: windows handed out.
        skipped: reason -> how many documents, records or files were skipped.
        examples: reason -> the first few origins skipped for it.
        tail_tokens: tokens at the ends of documents too short for one more window.
        exhausted: whether the corpus ran out (False: stopped at ``n_windows``).
    """

    sources: list[dict[str, Any]] = field(default_factory=list)
    documents: int = 0
    windows: int = 0
    skipped: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    tail_tokens: int = 0
    exhausted: bool = False

    def skip(self, reason: str, origin: str) -> None:
        """Count one skip, keeping the first few origins as examples."""
        self.skipped[reason] += 1
        kept = self.examples.setdefault(reason, [])
        if len(kept) < _EXAMPLES:
            kept.append(origin)

    def summary(self) -> str:
        """One line: documents, windows and what was skipped, with examples."""
        line = f"{plural(self.documents, 'document')} read, {plural(self.windows, 'window')} used"
        if self.tail_tokens:
            line += f", {plural(self.tail_tokens, 'token')} at document ends too few for a window"
        if self.skipped:
            parts = [f"{n} {_ONE.get(reason, reason) if n == 1 else reason} (e.g. "
                     f"{', '.join(self.examples.get(reason, []))})"
                     for reason, n in sorted(self.skipped.items())]
            line += "; skipped " + "; ".join(parts)
        return line

    def to_json(self) -> dict[str, Any]:
        return {"sources": self.sources, "documents": self.documents, "windows": self.windows,
                "skipped": dict(sorted(self.skipped.items())), "skipped_examples": dict(sorted(self.examples.items())),
                "tail_tokens": self.tail_tokens, "exhausted": self.exhausted}


@dataclass(frozen=True)
class Document:
    """One document: text in pieces (read on demand) or integer token ids (a possibly memory-mapped array)."""

    origin: str  # where it came from, e.g. "data/a.jsonl:12" (line 12)
    pieces: Iterable[str] | None = None
    tokens: np.ndarray | None = None


def file_sha256(path: Path) -> str:
    """SHA-256 of a file, read in blocks (constant memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _datasets() -> Any:
    """The ``datasets`` package, imported offline."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        import datasets
    except ImportError:
        raise GeometryError("reading a Hugging Face dataset needs the datasets package: pip install datasets") from None
    return datasets


def is_saved_dataset(path: Path) -> bool:
    """Whether ``path`` is a directory written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``."""
    return path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file())


def read_documents(sources: Iterable[Any], text_column: str, report: CorpusReport) -> Iterator[Document]:
    """The documents of files, directories and ``datasets`` objects, in the given order.

    Args:
        sources: paths (files or directories) and ``datasets.Dataset`` /
            ``IterableDataset`` objects.
        text_column: the column (key) holding each record's text, for JSONL,
            CSV, Parquet and datasets. A record whose column holds a list of
            integers is taken as token ids.
        report: where opened files and skips are recorded.

    Raises:
        GeometryError: a missing path; a named file that cannot be read; a
            table or dataset without ``text_column``; an array that is not of
            integer token ids.
    """
    for source in sources:
        if isinstance(source, (str, os.PathLike)):
            path = Path(source)
            if not path.exists():
                raise GeometryError(f"corpus: {str(path)!r} does not exist; check the path")
            if path.is_dir():
                yield from _directory(path, text_column, report)
            else:
                yield from _file(path, text_column, report, explicit=True)
        elif _is_dataset(source):
            yield from _dataset(source, str(getattr(source, "_fingerprint", type(source).__name__)), text_column,
                                report)
        else:
            raise GeometryError(
                f"corpus: expected paths (files or directories) or a datasets.Dataset, got {type(source).__name__}"
            )


def _is_dataset(obj: Any) -> bool:
    module = type(obj).__module__ or ""
    return module.startswith("datasets.") and hasattr(obj, "column_names")


def holds_readable_files(root: Path) -> bool:
    """Whether the folder is a saved dataset or holds (at any depth) a file of a kind the readers take."""
    if is_saved_dataset(root):
        return True
    for entry in root.iterdir():
        if entry.name.startswith("."):
            continue
        if entry.is_dir() and holds_readable_files(entry):
            return True
        if entry.is_file() and entry.suffix.lower() in TEXT_SUFFIXES | TABLE_SUFFIXES | TOKEN_SUFFIXES:
            return True
    return False


def _directory(root: Path, text_column: str, report: CorpusReport) -> Iterator[Document]:
    """Every readable file under ``root`` in sorted order; saved datasets are read whole, not walked into."""
    if is_saved_dataset(root):
        yield from _saved_dataset(root, text_column, report)
        return
    for entry in sorted(root.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            yield from _directory(entry, text_column, report)
        elif entry.suffix.lower() in TEXT_SUFFIXES | TABLE_SUFFIXES | TOKEN_SUFFIXES:
            yield from _file(entry, text_column, report, explicit=False)
        else:
            report.skip(SKIP_UNKNOWN_KIND, str(entry))


def _file(path: Path, text_column: str, report: CorpusReport, *, explicit: bool) -> Iterator[Document]:
    """The documents of one file, by its suffix (anything not a table or array is text)."""
    suffix = path.suffix.lower()
    kind = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet", ".npy": "npy"}.get(suffix,
                                                                                                          "text")
    try:
        digest, size = file_sha256(path), path.stat().st_size
        if kind == "text":
            _check_utf8(path)
    except (OSError, GeometryError) as error:
        if explicit:
            message = str(error) if isinstance(error, GeometryError) else f"{type(error).__name__}: {error}"
            raise GeometryError(f"corpus: cannot read {str(path)!r} ({message}); check the file") from None
        report.skip(SKIP_UNREADABLE, str(path))
        return
    report.sources.append({"path": str(path), "kind": kind, "sha256": digest, "bytes": size})
    reader = {"text": _text_file, "jsonl": _jsonl_file, "csv": _csv_file, "parquet": _parquet_file,
              "npy": _npy_file}[kind]
    yield from reader(path, text_column, report)


def _check_utf8(path: Path) -> None:
    """Raise GeometryError unless the file is UTF-8 (read in blocks)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    with open(path, "rb") as f:
        try:
            while block := f.read(_HASH_BLOCK):
                decoder.decode(block)
            decoder.decode(b"", final=True)
        except UnicodeDecodeError as error:
            raise GeometryError(f"not UTF-8 text: {error}") from None


def _text_pieces(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        while piece := f.read(PIECE_CHARS):
            yield piece


def _text_file(path: Path, text_column: str, report: CorpusReport) -> Iterator[Document]:
    report.documents += 1
    with open(path, encoding="utf-8") as f:
        empty = not f.read(PIECE_CHARS).strip()
    if empty and path.stat().st_size <= PIECE_CHARS:
        report.skip(SKIP_EMPTY, str(path))
        return
    yield Document(origin=str(path), pieces=_text_pieces(path))


def _record(value: Any, origin: str, report: CorpusReport) -> Document | None:
    """The document of one record's text-column value, or None (counted) if it has none."""
    if isinstance(value, str):
        if not value.strip():
            report.skip(SKIP_EMPTY, origin)
            return None
        return Document(origin=origin, pieces=(value[i : i + PIECE_CHARS] for i in range(0, len(value), PIECE_CHARS)))
    if isinstance(value, (list, tuple, np.ndarray)) and all(
        isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in value
    ):
        if len(value) == 0:
            report.skip(SKIP_EMPTY, origin)
            return None
        return Document(origin=origin, tokens=np.asarray(value, dtype=np.int64))
    if value is None:
        report.skip(SKIP_EMPTY, origin)
    else:
        report.skip(SKIP_NOT_TEXT, origin)
    return None


def _records(values: Iterable[tuple[str, Any]], report: CorpusReport) -> Iterator[Document]:
    for origin, value in values:
        report.documents += 1
        document = _record(value, origin, report)
        if document is not None:
            yield document


def _missing_column(path: Any, text_column: str, columns: Iterable[str]) -> GeometryError:
    return GeometryError(
        f"corpus: {str(path)!r} has no column {text_column!r}; its columns are {sorted(columns)}; "
        "pass the right one with text_column= (--text-column)"
    )


def _jsonl_file(path: Path, text_column: str, report: CorpusReport) -> Iterator[Document]:
    def values() -> Iterator[tuple[str, Any]]:
        seen_column = False
        with open(path, encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                origin = f"{path}:{number}"
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    record = None
                if not isinstance(record, dict):
                    report.documents += 1
                    report.skip(SKIP_BAD_RECORD, origin)
                    continue
                if text_column not in record:
                    if not seen_column:  # the first record decides: a wrong column name, not a ragged file
                        raise _missing_column(path, text_column, record)
                    report.documents += 1
                    report.skip(SKIP_NO_COLUMN, origin)
                    continue
                seen_column = True
                yield origin, record[text_column]

    yield from _records(values(), report)


def _csv_file(path: Path, text_column: str, report: CorpusReport) -> Iterator[Document]:
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # documents are longer than csv's 128 KiB default
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None:
            raise GeometryError(f"corpus: {str(path)!r} is an empty CSV file (no header row); remove it")
        if text_column not in reader.fieldnames:
            raise _missing_column(path, text_column, reader.fieldnames)
        # Rows are numbered as lines of the file: the header is line 1.
        yield from _records(((f"{path}:{i}", row.get(text_column)) for i, row in enumerate(reader, start=2)), report)


def _parquet_file(path: Path, text_column: str, report: CorpusReport) -> Iterator[Document]:
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
    except Exception as error:  # pyarrow raises its own ArrowInvalid / OSError family
        raise GeometryError(f"corpus: cannot read {str(path)!r} as Parquet ({error})") from None
    if text_column not in table.schema_arrow.names:
        raise _missing_column(path, text_column, table.schema_arrow.names)

    def values() -> Iterator[tuple[str, Any]]:
        row = 0
        for batch in table.iter_batches(batch_size=_BATCH_ROWS, columns=[text_column]):
            for value in batch.column(0).to_pylist():
                yield f"{path}[row {row}]", value
                row += 1

    yield from _records(values(), report)


def _npy_file(path: Path, text_column: str, report: CorpusReport) -> Iterator[Document]:
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as error:
        raise GeometryError(f"corpus: cannot read {str(path)!r} as a .npy array without pickle ({error})") from None
    if not np.issubdtype(array.dtype, np.integer) or array.ndim not in (1, 2):
        raise GeometryError(
            f"corpus: {str(path)!r} holds a {array.dtype} array of shape {list(array.shape)}; expected integer "
            "token ids, 1-d (one document) or 2-d (one document per row)"
        )
    rows = [array] if array.ndim == 1 else (array[i] for i in range(array.shape[0]))
    for i, row in enumerate(rows):
        report.documents += 1
        origin = str(path) if array.ndim == 1 else f"{path}[row {i}]"
        if row.shape[0] == 0:
            report.skip(SKIP_EMPTY, origin)
            continue
        yield Document(origin=origin, tokens=row)


def _saved_dataset(path: Path, text_column: str, report: CorpusReport) -> Iterator[Document]:
    datasets = _datasets()
    try:
        loaded = datasets.load_from_disk(str(path), keep_in_memory=False)
    except Exception as error:  # datasets raises FileNotFoundError, ValueError, its own errors
        raise GeometryError(f"corpus: cannot load the saved dataset {str(path)!r} ({error})") from None
    if isinstance(loaded, datasets.DatasetDict):
        splits = list(loaded)
        if len(splits) != 1:
            raise GeometryError(
                f"corpus: {str(path)!r} holds the splits {splits}; pass one of them, e.g. {str(path / splits[0])!r}"
            )
        loaded = loaded[splits[0]]
    yield from _dataset(loaded, str(path), text_column, report)


def _dataset(dataset: Any, name: str, text_column: str, report: CorpusReport) -> Iterator[Document]:
    """Records of a ``datasets.Dataset`` (a batch at a time) or ``IterableDataset`` (a row at a time)."""
    columns = list(dataset.column_names or [])
    if columns and text_column not in columns:
        raise _missing_column(name, text_column, columns)
    entry: dict[str, Any] = {"path": name, "kind": "dataset", "fingerprint": getattr(dataset, "_fingerprint", None)}
    if hasattr(dataset, "num_rows"):
        entry["rows"] = int(dataset.num_rows)
    report.sources.append(entry)

    def values() -> Iterator[tuple[str, Any]]:
        if hasattr(dataset, "iter") and hasattr(dataset, "num_rows"):
            row = 0
            for batch in dataset.select_columns([text_column]).iter(batch_size=_BATCH_ROWS):
                for value in batch[text_column]:
                    yield f"{name}[row {row}]", value
                    row += 1
        else:
            for row, record in enumerate(dataset):
                if text_column not in record:
                    raise _missing_column(name, text_column, record)
                yield f"{name}[row {row}]", record[text_column]

    yield from _records(values(), report)
