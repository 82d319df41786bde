"""The default text and how it is cut into fixed-length token windows.

The default text is the English reference documentation that ships with every CPython
(``pydoc_data.topics``): real, varied English prose and code, always available offline,
identical on every machine with the same Python version.
"""

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from tl_geometry.errors import GeometryError


def default_text() -> str:
    """The reference documentation bundled with CPython, as one string.

    Returns:
        Every ``pydoc_data.topics.topics`` entry, joined in sorted key order (so the text
        is deterministic) with blank lines between entries.

    Raises:
        GeometryError: if this Python was built without ``pydoc_data``.

    >>> text = default_text()
    >>> len(text) > 100_000
    True
    """
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise GeometryError(
            "default_text: this Python has no pydoc_data module (some distributions split "
            "it out); pass your own text, e.g. read_text_files([...])."
        ) from None
    return "\n\n".join(topics[key].strip() for key in sorted(topics))


def read_text_files(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> str:
    """Read UTF-8 text files and join them, for use as a corpus.

    Args:
        paths: one path or a sequence of paths.

    Returns:
        The files' contents in the given order, separated by blank lines.

    Raises:
        GeometryError: no paths, or a file that is missing, unreadable, not UTF-8 or empty.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if len(paths) == 0:
        raise GeometryError("read_text_files: got an empty list of paths; pass at least one file.")
    return "\n\n".join(_read_one_text_file(Path(path)) for path in paths)


def _read_one_text_file(path: Path) -> str:
    """Contents of one non-empty UTF-8 text file."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise GeometryError(
            f"read_text_files: cannot read {str(path)!r} as UTF-8 text "
            f"({type(error).__name__}: {error}); check the path and the file's encoding."
        ) from None
    if not text.strip():
        raise GeometryError(
            f"read_text_files: {str(path)!r} is empty (expected some text); remove it from the list."
        )
    return text


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
    across windows; the incomplete tail of the text is dropped.

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
    tokenizer = _tokenizer_of(model_or_tokenizer)
    _check_context(model_or_tokenizer, context, prepend_bos)
    if n_windows is not None and n_windows < 1:
        raise GeometryError(f"text_windows: n_windows={n_windows} must be at least 1 (or None for all).")
    bos = _bos_token_id(tokenizer) if prepend_bos else None
    body = context - 1 if prepend_bos else context
    needed = None if n_windows is None else n_windows * body
    ids = torch.tensor(_encode_prefix(tokenizer, text, needed), dtype=torch.long)
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


def _tokenizer_of(model_or_tokenizer: Any) -> Any:
    """The tokenizer itself, or the one attached to a TransformerLens model."""
    if isinstance(model_or_tokenizer, torch.nn.Module):
        tokenizer = getattr(model_or_tokenizer, "tokenizer", None)
        if tokenizer is None:
            raise GeometryError(
                f"text_windows: the {type(model_or_tokenizer).__name__} has no tokenizer; "
                "pass a Hugging Face tokenizer instead of the model."
            )
        return tokenizer
    if not callable(model_or_tokenizer):
        raise GeometryError(
            f"text_windows: expected a TransformerLens model or a Hugging Face tokenizer, "
            f"got {type(model_or_tokenizer).__name__}."
        )
    return model_or_tokenizer


def _check_context(model_or_tokenizer: Any, context: int, prepend_bos: bool) -> None:
    """Raise unless ``context`` leaves room for text and fits the model."""
    smallest = 2 if prepend_bos else 1
    if context < smallest:
        raise GeometryError(
            f"text_windows: context={context} is too small; it must be at least {smallest} "
            f"(prepend_bos={prepend_bos} and at least one text token per window)."
        )
    n_ctx = getattr(getattr(model_or_tokenizer, "cfg", None), "n_ctx", None)
    if isinstance(n_ctx, int) and context > n_ctx:
        raise GeometryError(
            f"text_windows: context={context} is longer than the model's n_ctx={n_ctx}; "
            f"pass context<={n_ctx}."
        )


def _bos_token_id(tokenizer: Any) -> int:
    """The tokenizer's BOS id, or an error saying how to do without it."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        raise GeometryError(
            f"text_windows: the tokenizer {type(tokenizer).__name__} has no BOS token; "
            "pass prepend_bos=False."
        )
    return int(bos)


def _encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` with no special tokens (BOS is added per window instead)."""
    # verbose=False: the text is longer than the model's context on purpose.
    return list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


# Tokens compared past the cut of a prefix: the last few tokens of a prefix can differ from the
# whole text's (a word or a run of spaces cut in two), far fewer than this.
_PREFIX_MARGIN = 64


def _encode_prefix(tokenizer: Any, text: str, needed: int | None) -> list[int]:
    """The first ``needed`` token ids of ``text`` (all if None or the text has fewer), tokenising a prefix.

    The prefix grows (doubling, cut at a line break or space) until it gives
    ``needed`` tokens plus a margin, so that ``n_windows=1`` of a 16 MB text
    tokenises a few kB; the ids equal those of the whole text's tokenisation.
    """
    if needed is None:
        return _encode(tokenizer, text)
    chars = 8 * (needed + _PREFIX_MARGIN)
    while chars < len(text):
        cut = max(text.rfind("\n", 0, chars), text.rfind(" ", 0, chars))
        if cut > 0:
            ids = _encode(tokenizer, text[:cut])
            if len(ids) >= needed + _PREFIX_MARGIN:
                return ids[:needed]
        chars *= 2
    return _encode(tokenizer, text)
