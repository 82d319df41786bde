"""The package keeps its layers: each part imports only the parts below it (docs/architecture.md draws them).

Read from the source with ``ast`` (every ``import`` and ``from ... import``
of the package, at module level or inside functions), so that a lazy import
cannot hide an arrow running up the layers. Parts on one layer (``corpus_input``
and ``models``, ``runs`` and ``roles``) are independent: neither imports the other.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tl_geometry"

LAYERS: tuple[frozenset[str], ...] = tuple(frozenset(layer) for layer in (
    ("__main__",),  # python -m tl_geometry: the command line
    ("cli",),
    ("__init__",),  # the public names
    ("_compat",),  # where the old names and module paths went (read by name, at import)
    ("corpus", "plots"),  # the second tier of the public names (interventions, below, is one too)
    ("interventions",),  # the one path that changes the forward pass: top-N hooks, sweeps, head ablations
    ("report",),  # figures only draw; the page reads a result
    ("runs", "roles"),  # runs: analyze_corpus, checkpoints, data parallel; roles: the role run, prompt sets
    ("capture",),  # the hooked pass: tokens, hooks, the rows path, the run plan, one layer's analysis
    ("analysis",),  # analysis from a result only
    ("results",),  # statistics tables, merge, files
    ("config",),
    ("diagnostics",),  # declared components over one selection context
    ("theory",),  # pure maths: bounds, the simulator ...
    ("engine",),  # ... over the top-N core
    ("corpus_input", "models"),  # text, files and token windows, no model run; models: loading
    ("atomic_io",),  # files written as one unit, folder locks, strict JSON
    ("errors", "_types", "_version", "_hashing", "_wording", "_renamed"),  # no imports from the package
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


# ---- a module's name finds one file ----


def repeated_module_names(package: Path = PACKAGE) -> dict[str, list[str]]:
    """File names (``__init__.py`` aside) that more than one module of the package has, with their paths."""
    paths: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        if path.name != "__init__.py":
            paths.setdefault(path.name, []).append(path.relative_to(package).as_posix())
    return {name: where for name, where in paths.items() if len(where) > 1}


def test_no_two_modules_share_a_name():
    """A search for a module's file name finds one place (docs/architecture.md, "One room per workflow")."""
    assert repeated_module_names() == {}


CAPTURE_LINES = 2500  # the hooked pass alone: corpus input, runs, interventions and roles live in their own rooms


def test_the_hooked_pass_stays_one_room():
    """``capture/`` holds the hooked pass and nothing else: a workflow moved back into it shows as its size."""
    lines = sum(len(path.read_text().splitlines()) for path in (PACKAGE / "capture").rglob("*.py"))
    assert lines <= CAPTURE_LINES, f"capture/ has {lines} lines; what does it hold besides the hooked pass?"


def test_a_repeated_module_name_is_caught(tmp_path):
    import shutil

    copy = tmp_path / "tl_geometry"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "report" / "claims.py").write_text('"""A second claims.py."""\n')
    assert repeated_module_names(copy) == {"claims.py": ["analysis/claims.py", "report/claims.py"]}


# ---- fields are named by their declarations above the diagnostics ----

NAMED_BY_DECLARATION = ("analysis", "report", "cli.py")
"""The parts that name a field by its constant (``result.per_head(RHO0)``), never by a string literal."""
# Strings that spell a field's name but mean something else: the attention-pattern detector "previous_token"
# (`tl_geometry.analysis.detector_agreement`, shown by the report's prompt-set checks), not the role feature.
NOT_FIELDS = {"analysis/detector_agreement.py": {"previous_token"}, "report/roles.py": {"previous_token"}}


def declared_names() -> set[str]:
    from tl_geometry.diagnostics.registry import REGISTRY

    return {spec.name for name in REGISTRY.names() for spec in REGISTRY.get(name).fields}


def fields_by_string(package: Path = PACKAGE) -> list[tuple[str, int, str]]:
    """Every string literal in ``NAMED_BY_DECLARATION`` that is a declared field's name, as (path, line, name).

    Docstrings (and any other bare string statement) are prose and examples, where a name shows a user that
    strings work; a message that mentions a field is a longer string, so it never equals the name.
    """
    names = declared_names()
    found = []
    for part in NAMED_BY_DECLARATION:
        paths = [package / part] if part.endswith(".py") else sorted((package / part).rglob("*.py"))
        for path in paths:
            where = path.relative_to(package).as_posix()
            tree = ast.parse(path.read_text(), str(path))
            prose = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
            found += [(where, node.lineno, node.value) for node in ast.walk(tree)
                      if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
                      and id(node) not in prose and node.value not in NOT_FIELDS.get(where, ())]
    return found


def test_fields_are_named_by_their_declarations():
    """Above the diagnostics a field is read through its FieldSpec constant, so a renamed or removed field fails
    at import, not as a string that silently no longer matches (docs: `tl_geometry.diagnostics.fields`)."""
    assert fields_by_string() == []


def test_a_field_named_by_a_string_is_caught(tmp_path):
    """The check on a copy of the package where one reader spells a field's name fails, naming the line."""
    import shutil

    copy = tmp_path / "tl_geometry"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / "analysis" / "sink.py"
    target.write_text(target.read_text() + '\n\ndef _late(result):\n    """Reads "rho0" (prose: not counted)."""\n'
                      '    return result.per_head("rho0")\n')
    [(where, line, name)] = fields_by_string(copy)
    assert (where, name) == ("analysis/sink.py", "rho0")
    assert target.read_text().splitlines()[line - 1] == '    return result.per_head("rho0")'
