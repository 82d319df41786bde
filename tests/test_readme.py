"""The README stays true: its commands exist and its Python examples run."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_shows_the_two_set_up_commands():
    text = README.read_text()
    assert "make report" in text and "make test" in text
    makefile = README.with_name("Makefile").read_text()
    assert re.search(r"^report:", makefile, re.M) and re.search(r"^test:", makefile, re.M)


def test_readme_python_examples_run(shared_default_model):
    blocks = python_blocks()
    assert blocks, "the README has no Python example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {"__name__": "readme"})
