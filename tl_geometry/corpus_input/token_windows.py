"""Token windows from a corpus: documents tokenised one at a time and cut into windows with stable ids.

A window is BOS followed by ``context - 1`` consecutive tokens of one
document (``context`` tokens without BOS when ``prepend_bos=False``); a
document gives as many windows as it fills, its tail shorter than a window is
dropped (or kept as a shorter last window of at least ``min_context``
tokens), and a document too short for any window is skipped and counted.

Reading is lazy: documents come one at a time from `tl_geometry.corpus_input.readers`,
a text is tokenised a piece at a time (`PIECE_CHARS` characters, the last few
tokens of each piece re-tokenised with the next one so that the ids equal
those of the whole text; tokenizers for which a probe shows a difference are
given each document whole), and reading stops as soon as ``n_windows``
windows are out. Neither the corpus nor its tokens are held whole.

Each window has a stable id, ``"<document>:<window in document>:<hash>"``
(the hash: the first 16 hex digits of the SHA-256 of its int64 token ids), and
its ``position`` in the stream: the order is the same on every machine, so
ranks can take ``position % world_size == rank`` and a resumed run can skip
the windows already done. The bootstrap weights follow the tokens
(`tl_geometry.results.bootstrap`), so they agree with the id.
"""

import hashlib
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from tl_geometry.corpus_input.readers import PIECE_CHARS, SKIP_SHORT, CorpusReport, Document, read_documents
from tl_geometry.errors import GeometryError

CARRY_TOKENS = 8
"""Tokens at the end of a piece that are tokenised again with the next piece."""
_PROBE = "Attention heads select tokens.\n\n  Indented  code = [1, 22, 333]  # comment\n\u00e9t\u00e9 \u4f60\u597d \U0001f600 "


@dataclass(frozen=True)
class Window:
    """One window of a corpus.

    Attributes:
        id: ``"<document>:<index>:<hash>"``, stable across runs and machines.
        position: its place in the stream (0, 1, 2, ...).
        document: the place of its document in the corpus (skipped ones counted).
        index: its place among its document's windows.
        tokens: token ids, BOS first, ``[pos]`` int64 on the CPU.
    """

    id: str
    position: int
    document: int
    index: int
    tokens: Int[Tensor, " pos"]


def window_id(document: int, index: int, tokens: Tensor) -> str:
    """The stable id of a window: document, index, and a hash of its int64 token ids (little-endian)."""
    digest = hashlib.sha256(tokens.to(torch.int64).numpy().astype("<i8").tobytes()).hexdigest()[:16]
    return f"{document}:{index}:{digest}"


class WindowStream:
    """An iterable of `Window` read lazily from a corpus; each iteration reads it again from the start.

    Build one with `read_corpus` (files, directories, datasets) or
    `window_documents` (texts or token arrays in memory); `analyze_corpus`
    takes it as is.

    Attributes:
        context: tokens per window, BOS included.
        n_windows: the most windows handed out (None: all).
        report: the `CorpusReport` of the latest (or current) iteration.
    """

    def __init__(
        self,
        model_or_tokenizer: Any,
        documents: Callable[[CorpusReport], Iterable[Document]],
        *,
        context: int = 1024,
        n_windows: int | None = None,
        prepend_bos: bool = True,
        min_context: int | None = None,
        who: str = "corpus",
    ) -> None:
        self._tokenizer = tokenizer_of(model_or_tokenizer, who)
        check_context(model_or_tokenizer, context, prepend_bos, who)
        if n_windows is not None and (isinstance(n_windows, bool) or not isinstance(n_windows, int) or n_windows < 1):
            raise GeometryError(f"{who}: n_windows={n_windows!r} must be a positive integer (or None for all)")
        min_context = context if min_context is None else min_context
        if isinstance(min_context, bool) or not isinstance(min_context, int) or not (
            (2 if prepend_bos else 1) <= min_context <= context
        ):
            raise GeometryError(
                f"{who}: min_context={min_context!r} must be an integer between {2 if prepend_bos else 1} and "
                f"context={context}"
            )
        self.context, self.n_windows, self.min_context, self.prepend_bos = context, n_windows, min_context, prepend_bos
        self._documents = documents
        self._bos = bos_token_id(self._tokenizer, who) if prepend_bos else None
        self._vocab = _vocab_size(model_or_tokenizer)
        self._exact: bool | None = None  # chunking_is_exact, checked once on first use
        self.report = CorpusReport()

    def __iter__(self) -> Iterator[Window]:
        report = self.report = CorpusReport()
        if self.n_windows == 0:
            return
        position = 0
        for number, document in enumerate(self._documents(report)):
            produced = 0
            for tokens in self._cut(document, report):
                yield Window(window_id(number, produced, tokens), position, number, produced, tokens)
                produced += 1
                position += 1
                report.windows = position
                if position == self.n_windows:
                    return  # before reading anything more
            if produced == 0:
                report.skip(SKIP_SHORT, document.origin)
        report.exhausted = True

    def _cut(self, document: Document, report: CorpusReport) -> Iterator[Tensor]:
        """The windows of one document, read piece by piece."""
        body = self.context - (self._bos is not None)
        shortest_body = self.min_context - (self._bos is not None)
        buffer: list[int] = []
        for ids in self._token_pieces(document):
            buffer.extend(ids)
            while len(buffer) >= body:
                yield self._window(buffer[:body])
                del buffer[:body]
        if buffer and shortest_body < body and len(buffer) >= shortest_body:
            yield self._window(buffer)
        else:
            report.tail_tokens += len(buffer)

    def _window(self, ids: list[int]) -> Tensor:
        head = [self._bos] if self._bos is not None else []
        return torch.tensor(head + ids, dtype=torch.int64)

    def _token_pieces(self, document: Document) -> Iterator[list[int]]:
        if document.tokens is not None:
            yield from _array_pieces(document, self._vocab)
        else:
            if self._exact is None:
                self._exact = chunking_is_exact(self._tokenizer)
            yield from encode_lazily(self._tokenizer, document.pieces, self._exact)


def _array_pieces(document: Document, vocab: int | None) -> Iterator[list[int]]:
    """A token array in slices (it may be memory-mapped), each checked against the vocabulary."""
    tokens = document.tokens
    step = PIECE_CHARS
    for start in range(0, tokens.shape[0], step):
        piece = np.asarray(tokens[start : start + step], dtype=np.int64)
        low, high = int(piece.min()), int(piece.max())
        if low < 0 or (vocab is not None and high >= vocab):
            raise GeometryError(
                f"corpus: {document.origin} holds token ids from {low} to {high}, outside the model's "
                f"vocabulary 0..{vocab - 1 if vocab else '?'}; were the ids made with another tokenizer?"
            )
        yield piece.tolist()


def _vocab_size(model_or_tokenizer: Any) -> int | None:
    vocab = getattr(getattr(model_or_tokenizer, "cfg", None), "d_vocab", None)
    return vocab if isinstance(vocab, int) and vocab > 0 else None


def read_corpus(
    model_or_tokenizer: Any,
    sources: str | os.PathLike | Any | Sequence[Any],
    *,
    context: int = 1024,
    n_windows: int | None = None,
    text_column: str = "text",
    prepend_bos: bool = True,
    min_context: int | None = None,
) -> WindowStream:
    """Windows of a corpus on disk, read lazily (see `tl_geometry.corpus_input.readers` for the formats).

    Args:
        model_or_tokenizer: a TransformerLens model (its tokenizer, and its
            vocabulary for checking token ids) or a Hugging Face tokenizer.
        sources: a path or a list of paths: text files (one document each),
            ``.jsonl``, ``.csv`` and ``.parquet`` files (one document per
            record), ``.npy`` token-id arrays, directories of them, a
            directory written by ``datasets``' ``save_to_disk``; or
            ``datasets.Dataset`` objects (e.g. built with
            ``load_dataset("json", data_files=...)`` from local files).
        context: tokens per window, BOS included.
        n_windows: stop after this many windows (None: the whole corpus).
        text_column: the column holding the text of each record.
        prepend_bos: start each window with BOS (the attention sink).
        min_context: also keep a document's last, shorter window when it has
            at least this many tokens (default ``context``: full windows only).

    Returns:
        A `WindowStream`; iterate it, or pass it to `analyze_corpus`. Its
        ``report`` counts what was read and skipped.

    Raises:
        GeometryError: bad arguments; while iterating, a source that cannot be read.

    >>> windows = read_corpus(tokenizer, ["data/"], context=512, n_windows=100)  # doctest: +SKIP
    >>> next(iter(windows)).id  # doctest: +SKIP
    '0:0:3f2a9c0e8b1d4e7a'
    """
    if isinstance(sources, (str, os.PathLike)) or not isinstance(sources, (list, tuple)):
        sources = [sources]
    if not sources:
        raise GeometryError("corpus: got no sources; pass at least one file, directory or dataset")
    if not isinstance(text_column, str) or not text_column:
        raise GeometryError(f"text_column: expected a column name, got {text_column!r}")
    chosen = list(sources)
    return WindowStream(
        model_or_tokenizer,
        lambda report: read_documents(chosen, text_column, report),
        context=context, n_windows=n_windows, prepend_bos=prepend_bos, min_context=min_context,
    )


def window_documents(
    model_or_tokenizer: Any,
    documents: Iterable[str | Sequence[int] | np.ndarray | Tensor] | Callable[[], Iterable[Any]],
    *,
    context: int = 1024,
    n_windows: int | None = None,
    prepend_bos: bool = True,
    min_context: int | None = None,
) -> WindowStream:
    """Windows of documents given in Python: texts or 1-d token ids, drawn one at a time.

    Args:
        documents: an iterable of texts or token-id sequences (a generator is
            read once, lazily), or a function returning a fresh one (so the
            stream can be iterated again).
        context: tokens per window, BOS included.
        n_windows: stop after this many windows (None: all).
        prepend_bos: start each window with BOS.
        min_context: keep a shorter last window of at least this many tokens
            (default ``context``: full windows only).

    >>> stream = window_documents(tokenizer, (line for line in open("big.txt")), context=128)  # doctest: +SKIP
    """

    def read(report: CorpusReport) -> Iterator[Document]:
        for i, item in enumerate(documents() if callable(documents) else documents):
            report.documents += 1
            origin = f"document {i}"
            if isinstance(item, str):
                yield Document(origin, pieces=(item[j : j + PIECE_CHARS] for j in range(0, len(item), PIECE_CHARS)))
                continue
            array = item.detach().cpu().numpy() if isinstance(item, Tensor) else np.asarray(item)
            if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
                raise GeometryError(
                    f"documents: {origin} is a {type(item).__name__} {array.dtype} {list(array.shape)}; expected a "
                    "string or 1-d integer token ids"
                )
            yield Document(origin, tokens=array)

    return WindowStream(model_or_tokenizer, read, context=context, n_windows=n_windows, prepend_bos=prepend_bos,
                        min_context=min_context, who="documents")


def encode_lazily(tokenizer: Any, pieces: Iterable[str], exact: bool | None = None) -> Iterator[list[int]]:
    """Token ids of the concatenated ``pieces``, a piece at a time, equal to encoding the whole text.

    The last `CARRY_TOKENS` tokens (or more, up to a clean boundary between
    characters) of each piece are encoded again with the next piece, so that
    merges across the cut are the tokenizer's own; a tokenizer without
    character offsets, or one for which `chunking_is_exact` fails, gets the
    whole text at once instead (``exact``: that check's answer, if known).
    """
    if not (chunking_is_exact(tokenizer) if exact is None else exact):
        yield encode(tokenizer, "".join(pieces))
        return
    yield from _piecewise(tokenizer, pieces, PIECE_CHARS)


def _piecewise(tokenizer: Any, pieces: Iterable[str], min_chars: int) -> Iterator[list[int]]:
    carry = ""
    for piece in pieces:
        carry += piece
        if len(carry) < min_chars:
            continue
        encoded = tokenizer(carry, add_special_tokens=False, verbose=False, return_offsets_mapping=True)
        ids, offsets = list(encoded["input_ids"]), list(encoded["offset_mapping"])
        keep = len(ids) - CARRY_TOKENS
        # Never cut inside a character (the byte tokens of one character share its offsets); the text after
        # the last kept token (whitespace included) goes with the carry.
        while keep > 0 and offsets[keep - 1][1] > offsets[keep][0]:
            keep -= 1
        if keep <= 0:
            continue
        yield ids[:keep]
        carry = carry[offsets[keep - 1][1] :]
    if carry:
        yield encode(tokenizer, carry)


def chunking_is_exact(tokenizer: Any) -> bool:
    """Whether piecewise encoding (`encode_lazily`) gives this tokenizer's ids of a probe text."""
    text = _PROBE * 40
    try:
        # Many small pieces: cuts at every kind of place in the probe.
        pieces = _piecewise(tokenizer, (text[i : i + 97] for i in range(0, len(text), 97)), 0)
        return [i for ids in pieces for i in ids] == encode(tokenizer, text)
    except (NotImplementedError, KeyError, TypeError, ValueError):
        return False  # slow tokenizers have no offsets


def text_windows(
    model_or_tokenizer: Any,
    text: str,
    *,
    context: int = 1024,
    n_windows: int | None = None,
    prepend_bos: bool = True,
) -> Int[Tensor, "window pos"]:
    """Tokenize ``text`` (only as much of it as ``n_windows`` needs) and cut it into consecutive windows.

    With ``prepend_bos`` each window is the BOS token followed by ``context - 1`` text
    tokens, so every window is exactly ``context`` tokens long, as the model sees it
    (BOS is the attention sink at key position 0). The text tokens are consecutive
    across windows; the incomplete tail of the text is dropped. For corpora larger
    than memory use `read_corpus` or `window_documents`.

    Args:
        model_or_tokenizer: a TransformerLens model (its ``.tokenizer`` is used) or a
            Hugging Face tokenizer.
        text: the text to cut up.
        context: tokens per window, BOS included.
        n_windows: how many windows to return, from the start of the text; ``None``
            for as many as the text fills.
        prepend_bos: start each window with the tokenizer's BOS token.

    Returns:
        Token ids, ``[window, pos]`` with ``pos == context``, dtype int64 on the CPU.

    Raises:
        GeometryError: a bad ``context`` or ``n_windows``, a context longer than the
            model's, a tokenizer without a BOS token while ``prepend_bos``, or a text
            too short for the windows asked for.

    >>> from transformers import AutoTokenizer  # doctest: +SKIP
    >>> text_windows(tokenizer, default_text(), context=8, n_windows=2).shape  # doctest: +SKIP
    torch.Size([2, 8])
    """
    tokenizer = tokenizer_of(model_or_tokenizer)
    check_context(model_or_tokenizer, context, prepend_bos)
    if n_windows is not None and n_windows < 1:
        raise GeometryError(f"text_windows: n_windows={n_windows} must be at least 1 (or None for all).")
    bos = bos_token_id(tokenizer) if prepend_bos else None
    body = context - 1 if prepend_bos else context
    ids = torch.tensor(encode_prefix(tokenizer, text, None if n_windows is None else n_windows * body), dtype=torch.long)
    available = ids.numel() // body
    wanted = available if n_windows is None else n_windows
    if available == 0 or wanted > available:
        raise GeometryError(
            f"text_windows: the text has {ids.numel()} tokens, enough for {available} windows of "
            f"{body} text tokens (context={context}, prepend_bos={prepend_bos}), but "
            f"{max(wanted, 1)} were asked for; pass a longer text, a smaller context or fewer n_windows."
        )
    windows = ids[: wanted * body].reshape(wanted, body)
    if bos is not None:
        windows = torch.cat([torch.full((wanted, 1), bos, dtype=torch.long), windows], dim=1)
    return windows


def tokenizer_of(model_or_tokenizer: Any, who: str = "text_windows") -> Any:
    """The tokenizer itself, or the one attached to a TransformerLens model."""
    if isinstance(model_or_tokenizer, torch.nn.Module):
        tokenizer = getattr(model_or_tokenizer, "tokenizer", None)
        if tokenizer is None:
            raise GeometryError(
                f"{who}: the {type(model_or_tokenizer).__name__} has no tokenizer; "
                "pass a Hugging Face tokenizer instead of the model."
            )
        return tokenizer
    if not callable(model_or_tokenizer):
        raise GeometryError(
            f"{who}: expected a TransformerLens model or a Hugging Face tokenizer, "
            f"got {type(model_or_tokenizer).__name__}."
        )
    return model_or_tokenizer


def check_context(model_or_tokenizer: Any, context: int, prepend_bos: bool, who: str = "text_windows") -> None:
    """Raise unless ``context`` leaves room for text and fits the model."""
    smallest = 2 if prepend_bos else 1
    if isinstance(context, bool) or not isinstance(context, int) or context < smallest:
        raise GeometryError(
            f"{who}: context={context} is too small; it must be at least {smallest} "
            f"(prepend_bos={prepend_bos} and at least one text token per window)."
        )
    n_ctx = getattr(getattr(model_or_tokenizer, "cfg", None), "n_ctx", None)
    if isinstance(n_ctx, int) and context > n_ctx:
        raise GeometryError(
            f"{who}: context={context} is longer than the model's n_ctx={n_ctx}; "
            f"pass context<={n_ctx}."
        )


def bos_token_id(tokenizer: Any, who: str = "text_windows") -> int:
    """The tokenizer's BOS id, or an error saying how to do without it."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        raise GeometryError(
            f"{who}: the tokenizer {type(tokenizer).__name__} has no BOS token; "
            "pass prepend_bos=False."
        )
    return int(bos)


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` with no special tokens (BOS is added per window instead)."""
    # verbose=False: the text is longer than the model's context on purpose.
    return list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


# Tokens compared past the cut of a prefix: the last few tokens of a prefix can differ from the
# whole text's (a word or a run of spaces cut in two), far fewer than this.
_PREFIX_MARGIN = 64


def encode_prefix(tokenizer: Any, text: str, needed: int | None) -> list[int]:
    """The first ``needed`` token ids of ``text`` (all if None or the text has fewer), tokenising a prefix.

    The prefix grows (doubling, cut at a line break or space) until it gives
    ``needed`` tokens plus a margin, so that ``n_windows=1`` of a 16 MB text
    tokenises a few kB; the ids equal those of the whole text's tokenisation.
    """
    if needed is None:
        return encode(tokenizer, text)
    chars = 8 * (needed + _PREFIX_MARGIN)
    while chars < len(text):
        cut = max(text.rfind("\n", 0, chars), text.rfind(" ", 0, chars))
        if cut > 0:
            ids = encode(tokenizer, text[:cut])
            if len(ids) >= needed + _PREFIX_MARGIN:
                return ids[:needed]
        chars *= 2
    return encode(tokenizer, text)
