"""No test reaches a private name of the package outside the two named lists of tests/fixtures.py.

A test that reads ``module._helper`` breaks when the module is refactored and
tests a detail instead of what a user sees. The few private names a test may
reach are listed with their reason in ``tests/fixtures.py``: `FAULT_SEAMS`
(where faults are injected) and `PRIVATE_UNITS` (a private helper that is the
right unit for a statistical test). Read from the source with ``ast``: every
``import``/``from ... import`` of the package, every attribute read through a
name bound to the package, every string naming a private dotted path or given
to ``setattr``/``getattr`` with a name bound to the package, and the code of a
subprocess's script held in a string. Reading a name inside
``pytest.raises(AttributeError)`` asserts that it is gone, so it is no reach.
"""

import ast
import importlib
import re
from pathlib import Path

import pytest

from tests.fixtures import FAULT_SEAMS, PRIVATE_UNITS

TESTS = Path(__file__).resolve().parent
PACKAGE = "tl_geometry"
ATTRIBUTE_CALLS = {"setattr", "getattr", "delattr", "hasattr"}
DOTTED = re.compile(rf"^{PACKAGE}(\.\w+)+$")


def private_prefix(path: str) -> str | None:
    """``tl_geometry.a._b.c`` -> ``tl_geometry.a._b`` (up to its first private part); None if nothing is private."""
    parts = path.split(".")
    for i, part in enumerate(parts[1:], start=1):
        if part.startswith("_") and not (part.startswith("__") and part.endswith("__")):
            return ".".join(parts[: i + 1])
    return None


def _dotted(node: ast.expr, bound: dict[str, str]) -> str | None:
    """The package path an expression names (``claims_module._cv`` -> ``tl_geometry.analysis.claims._cv``)."""
    attributes = []
    while isinstance(node, ast.Attribute):
        attributes.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in bound:
        return ".".join([bound[node.id], *reversed(attributes)])
    return None


def _expects_attribute_error(node: ast.With) -> bool:
    """``with pytest.raises(AttributeError, ...)``: what the block reads is asserted to be gone."""
    return any(isinstance(item.context_expr, ast.Call) and ast.unparse(item.context_expr.func) == "pytest.raises"
               and item.context_expr.args and ast.unparse(item.context_expr.args[0]) == "AttributeError"
               for item in node.items)


def private_reaches(source: str) -> set[str]:
    """Every private package path a piece of test code reaches (see the module docstring for what counts)."""
    tree = ast.parse(source)
    bound: dict[str, str] = {}  # local name -> the package path it stands for
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    bound[alias.asname or PACKAGE] = alias.name if alias.asname else PACKAGE
                    found.add(private_prefix(alias.name))
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == PACKAGE:
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                found.add(private_prefix(f"{node.module}.{alias.name}"))
    skipped = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.With) and _expects_attribute_error(node)
               for statement in node.body for inner in ast.walk(statement)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Attribute) and (path := _dotted(node, bound)):
            found.add(private_prefix(path))
        elif isinstance(node, ast.Call) and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
            name = ast.unparse(node.func).split(".")[-1]
            owner = _dotted(node.args[0], bound)
            if name in ATTRIBUTE_CALLS and isinstance(node.args[1].value, str) and owner:
                found.add(private_prefix(f"{owner}.{node.args[1].value}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and PACKAGE in node.value:
            if DOTTED.match(node.value):
                found.add(private_prefix(node.value))
            else:  # perhaps a script run in a subprocess
                try:
                    found |= private_reaches(node.value)
                except (SyntaxError, ValueError):
                    pass  # prose, not code
    return found - {None}


def allowed() -> set[str]:
    return {f"{module}.{attribute}" for module, attribute in [*FAULT_SEAMS.values(), *PRIVATE_UNITS]}


def reaches_by_file() -> dict[str, set[str]]:
    return {str(path.relative_to(TESTS.parent)): private_reaches(path.read_text())
            for path in sorted(TESTS.rglob("*.py")) if path.name != Path(__file__).name}


def test_no_test_reaches_a_private_name_outside_the_named_lists():
    stray = {file: sorted(reaches - allowed()) for file, reaches in reaches_by_file().items() if reaches - allowed()}
    assert not stray, (
        f"tests reach private names of the package: {stray}; test through the public behaviour (a public function, "
        "the command line's main([...]), the page's HTML), inject faults through a seam of tests/fixtures.py's "
        "FAULT_SEAMS, or, where a private helper is the right unit, list it in PRIVATE_UNITS with the reason")


def test_every_listed_private_name_exists_and_each_unit_is_reached():
    """A refactor that renames a listed name fails here with that name; a unit no test reads any more is dropped."""
    for module, attribute in [*FAULT_SEAMS.values(), *PRIVATE_UNITS]:
        assert hasattr(importlib.import_module(module), attribute), f"{module}.{attribute} is gone: update the list"
    for (module, attribute), reason in PRIVATE_UNITS.items():
        assert attribute.startswith("_") and len(reason.split()) >= 5, (module, attribute, reason)
    reached = set().union(*reaches_by_file().values())
    unused = {f"{module}.{attribute}" for module, attribute in PRIVATE_UNITS} - reached
    assert not unused, f"PRIVATE_UNITS lists names no test reads: {sorted(unused)}; drop them"


@pytest.mark.parametrize(("code", "reaches"), [
    ("from tl_geometry.cli import _check, main", {"tl_geometry.cli._check"}),
    ("from tl_geometry.analysis import claims as c\nc._cv(1)\nc.public(2)", {"tl_geometry.analysis.claims._cv"}),
    ("import tl_geometry.report.explorer as e\ne._json(1)", {"tl_geometry.report.explorer._json"}),
    ("import tl_geometry\ntl_geometry.models._names.x", {"tl_geometry.models._names"}),
    ("from tl_geometry.results.result import GeometryResult as G\nG._same(1)",
     {"tl_geometry.results.result.GeometryResult._same"}),
    ("import tl_geometry.cli as cli\nmonkeypatch.setattr(cli, '_analyse', f)", {"tl_geometry.cli._analyse"}),
    ("monkeypatch.setattr('tl_geometry.cli._analyse', f)", {"tl_geometry.cli._analyse"}),
    ("script = '''\nfrom tl_geometry.cli import _summary\n'''", {"tl_geometry.cli._summary"}),
    ("from tl_geometry import __version__, _compat", {"tl_geometry._compat"}),
    ("from tl_geometry.results import files\nwith pytest.raises(AttributeError):\n    files._gone", set()),
    ("import tl_geometry\ntl_geometry.__all__\nx._private\nfrom tests.fixtures import _helper", set()),
    ("text = 'tl_geometry._private is mentioned in prose, not read'", set()),
])  # fmt: skip
def test_the_checker_finds_each_kind_of_reach(code, reaches):
    """The checker against hand-written snippets: each way a test could reach a private name, and the non-reaches."""
    assert private_reaches(code) == reaches
