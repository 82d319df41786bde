"""The package's one exception type."""


class GeometryError(ValueError):
    """Bad input to a tl_geometry function.

    Every message names what was wrong (the argument, hook or layer), what was
    expected and what was found, and how to fix it. Subclasses ``ValueError``
    so that generic input-error handling keeps working.
    """


def first_line(error: BaseException, limit: int = 300) -> str:
    """The first line of another library's error (its type's name if it has no message), cut to ``limit``
    characters: what a GeometryError quotes of the failure it replaces."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:limit]
