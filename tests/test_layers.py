"""The package keeps its layers: each part imports only the parts below it (docs/architecture.md draws them).

Read from the source with ``ast`` (every ``import`` and ``from ... import``
of the package, at module level or inside functions), so that a lazy import
cannot hide an arrow running up the layers. Parts on one layer (``analysis``
and ``models``) are independent: neither imports the other.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tl_geometry"

LAYERS: tuple[frozenset[str], ...] = tuple(frozenset(layer) for layer in (
    ("__main__",),  # python -m tl_geometry: the command line
    ("cli",),
    ("__init__", "_compat"),  # the public names, and where the old ones went
    ("corpus", "interventions"),  # the second tier of the public names
    ("report",),  # figures only draw; the page reads a result
    ("capture",),  # models run here: hooks, corpus, sweeps, prompt sets
    ("analysis", "models"),  # analysis from a result only; models: loading
    ("results",),  # statistics tables, merge, files
    ("config",),
    ("diagnostics",),  # declared components over one selection context
    ("theory",),  # pure maths: bounds, the simulator ...
    ("engine",),  # ... over the top-N core
    ("text",),  # the default text (files every Python has)
    ("errors", "_types", "_version", "_hashing"),  # no imports from the package
))  # fmt: skip


def part_of(module: str) -> str:
    """``tl_geometry.results.result`` -> ``results``; the package itself -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def level_of(part: str) -> int:
    for level, layer in enumerate(LAYERS):
        if part in layer:
            return level
    raise AssertionError(f"tl_geometry.{part} is on no layer of tests/test_layers.py; place it there")


def imports_of(path: Path, module: str) -> list[str]:
    """Every module of the package that ``path`` imports (relative imports resolved)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + (path.name == "__init__.py")]
                found.append(".".join(base + ([node.module] if node.module else [])))
            elif node.module:
                found.append(node.module)
    return [name for name in found if name == "tl_geometry" or name.startswith("tl_geometry.")]


def violations(package: Path = PACKAGE) -> list[str]:
    """Every import that runs up the layers or across one, as ``importer -> imported``."""
    bad = []
    for path in sorted(package.rglob("*.py")):
        module = ".".join(path.relative_to(package.parent).with_suffix("").parts).removesuffix(".__init__")
        here = part_of(module)
        for imported in imports_of(path, module):
            there = part_of(imported)
            if there == here:
                continue
            if level_of(there) <= level_of(here):  # a layer above this one, or a sibling on the same layer
                bad.append(f"{module} -> {imported}")
    return bad


def test_no_import_runs_up_the_layers():
    assert violations() == []


def test_an_added_back_edge_is_caught(tmp_path):
    """The check on a copy of the package with one import running up (results importing capture) fails."""
    import shutil

    copy = tmp_path / "tl_geometry"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / "results" / "stats.py"
    target.write_text(target.read_text() + "\n\ndef _late():\n    from tl_geometry.capture import hooks  # noqa\n")
    assert violations(copy) == ["tl_geometry.results.stats -> tl_geometry.capture"]


@pytest.mark.parametrize("part", sorted({p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
                                         if (p.suffix == ".py" or (p / "__init__.py").exists())}))
def test_every_part_is_on_a_layer(part):
    level_of(part)
