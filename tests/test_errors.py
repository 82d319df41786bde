"""What a GeometryError quotes of another library's failure."""

from hypothesis import given
from hypothesis import strategies as st

from tl_geometry.errors import first_line


@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=50), max_size=4),
       st.integers(1, 400))
def test_first_line_is_the_message_s_first_non_blank_line_cut_to_the_limit(lines, limit):
    message = "\n".join(lines)
    # the reference, from the definition: strip, then split at line breaks; the type's name when nothing is left
    stripped = message.strip()
    expected = stripped.splitlines()[0] if stripped.splitlines() else "RuntimeError"
    assert first_line(RuntimeError(message), limit) == expected[:limit]


def test_first_line_of_an_error_without_a_message_is_its_type():
    assert first_line(KeyboardInterrupt()) == "KeyboardInterrupt"
    assert first_line(OSError("disk full\nerrno 28")) == "disk full"
