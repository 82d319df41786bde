"""The package's one exception type."""


class GeometryError(ValueError):
    """Bad input to a tl_geometry function.

    Every message names what was wrong (the argument, hook or layer), what was
    expected and what was found, and how to fix it. Subclasses ``ValueError``
    so that generic input-error handling keeps working.
    """
