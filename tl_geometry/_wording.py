"""Words for counts, shared by messages and summaries on every floor (no imports from the package)."""


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``"1 document"``, ``"2 documents"`` (``nouns`` for an irregular plural)."""
    return f"{count} {noun if count == 1 else (nouns or noun + 's')}"
