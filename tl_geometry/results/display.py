"""Short summaries of results: what a shell prints (``__repr__``) and a notebook shows (``_repr_html_``).

A result holds tensors of every layer, head and N; printing them all (the
dataclass default) gave about 180,000 characters for one prompt. A summary
is a title and a few labelled lines instead (model, sample, layers x heads,
N grid, fields, where to look next), the same in text and as an HTML table,
long values wrapped at `WIDTH` characters and the whole cut at `MAX_LINES`
lines, so that no list of fields or labels can grow it.
"""

import html
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tl_geometry._wording import plural  # noqa: F401 (read from here by the summaries; lives below corpus input)

WIDTH = 100
"""Longest line of a text summary (longer values wrap onto the next lines)."""
MAX_LINES = 25
"""At most this many lines in any summary (the title included)."""


def head_name(layer: int, head: int) -> str:
    """A head as readers see it everywhere: ``"L16H0"`` (``"16.0"`` read as a number)."""
    return f"L{layer}H{head}"


def ranges(values: Iterable[int]) -> str:
    """Integers as runs: ``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"`` (in the given order)."""
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def short_list(items: Sequence[object], keep: int = 6) -> str:
    """The first ``keep`` and last item of a long list: ``"1, 2, 3, 4, 5, 6, ..., 1024"``."""
    text = [str(i) for i in items]
    if len(text) <= keep + 1:
        return ", ".join(text)
    return ", ".join(text[:keep]) + ", ..., " + text[-1]


def names(items: Sequence[str], keep: int = 8, more: str = "") -> str:
    """The first ``keep`` names and how many are left out (``more``: where to see them all)."""
    if len(items) <= keep:
        return ", ".join(items)
    return ", ".join(items[:keep]) + f", ... (+{len(items) - keep} more{'; ' + more if more else ''})"


@dataclass(frozen=True)
class Summary:
    """A title and labelled lines, shown as text or as an HTML table."""

    title: str
    rows: tuple[tuple[str, str], ...]

    def text(self) -> str:
        """At most `MAX_LINES` lines, none longer than `WIDTH` characters."""
        # Line breaks inside a value (\r, \x85, \u2028, ...) would add lines: every run of whitespace is one space.
        rows = [(" ".join(label.split()), " ".join(value.split())) for label, value in self.rows]
        label_width = max((len(label) for label, _ in rows), default=0)
        indent = " " * (label_width + 4)
        lines = textwrap.wrap(" ".join(self.title.split()), WIDTH) or [""]
        for label, value in rows:
            lines += textwrap.wrap(value, WIDTH, initial_indent=f"  {label.ljust(label_width)}  ",
                                   subsequent_indent=indent, break_on_hyphens=False) or [f"  {label}"]
        if len(lines) > MAX_LINES:  # a guard: the summaries are written to fit
            lines = lines[: MAX_LINES - 1] + [f"{indent}... (cut at {MAX_LINES} lines)"]
        return "\n".join(lines)

    def html(self) -> str:
        """The same lines as a two-column table (values escaped; a notebook wraps them)."""
        body = "".join(
            f"<tr><th style='text-align:left;vertical-align:top'>{html.escape(label)}</th>"
            f"<td style='text-align:left'>{html.escape(value)}</td></tr>"
            for label, value in self.rows
        )
        return (f"<table><caption style='text-align:left'><b>{html.escape(self.title)}</b></caption>"
                f"{body}</table>")


def _value(x: object) -> str:
    """One field of a result in a few words: a tensor's shape and first values, a tuple's length, else the value."""
    if hasattr(x, "shape") and hasattr(x, "flatten"):
        flat = x.flatten().tolist()
        shape = "x".join(map(str, x.shape)) or "scalar"
        values = short_list([f"{v:.3g}" if isinstance(v, float) else v for v in flat], keep=4)
        return f"[{shape}] {values}"
    if isinstance(x, (tuple, list)) and len(x) > 8:
        return f"{len(x)} items: {short_list([type(i).__name__ if hasattr(i, '__dataclass_fields__') else i for i in x], 3)}"
    if isinstance(x, (tuple, list)) and any(hasattr(i, "__dataclass_fields__") for i in x):
        return f"{len(x)} {type(x[0]).__name__}" + ("" if len(x) == 1 else "s")
    return repr(x)


def field_summary(obj: object, hint: str) -> Summary:
    """Every dataclass field of ``obj`` on one line (`_value`), and ``hint``: the short repr of a small result."""
    import dataclasses

    rows = tuple((f.name, _value(getattr(obj, f.name))) for f in dataclasses.fields(obj))  # type: ignore[arg-type]
    return Summary(type(obj).__name__, rows[: MAX_LINES - 3] + (("read", hint),))
