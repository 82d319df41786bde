"""The default text, and reading whole text files into one string.

The default text is the English reference documentation that ships with every CPython
(``pydoc_data.topics``): real, varied English prose and code, always available offline,
identical on every machine with the same Python version. Cutting text into token
windows is `tl_geometry.corpus_input.token_windows.text_windows` (``tl_geometry.text_windows``).
"""

import os
from collections.abc import Sequence
from pathlib import Path

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
