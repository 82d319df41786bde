"""The docs site builds strictly, documents every public name, and its examples run."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tl_geometry

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built with ``mkdocs build --strict`` (a broken reference, link or anchor fails)."""
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def test_site_has_every_page(site):
    for page in ("index", "installation/index", "quickstart/index", "concepts/index", "api/index",
                 "changelog/index", "tutorials/index"):
        assert (site / f"{page}.html").is_file(), page
    for demo in sorted((ROOT / "demos").glob("[0-9][0-9]_*.py")):
        page = site / "tutorials" / demo.stem / "index.html"
        assert page.is_file(), f"the demo {demo.name} is not rendered into the site"
        assert "Run it yourself" in page.read_text()


def test_api_page_documents_every_public_name(site):
    html = (site / "api" / "index.html").read_text()
    anchors = set(re.findall(r'id="([^"]+)"', html))
    missing = [name for name in tl_geometry.__all__ if name != "__version__" and f"tl_geometry.{name}" not in anchors]
    assert not missing, f"the API page has no entry for {missing}"
    assert "__version__" in html


def test_tutorials_render_code_and_prose(site):
    for demo in sorted((ROOT / "demos").glob("[0-9][0-9]_*.py")):
        html = (site / "tutorials" / demo.stem / "index.html").read_text()
        assert "<h1" in html and html.count('class="highlight"') >= 3 and "tl_geometry" in html, demo.name


def test_docs_name_only_real_commands():
    """The Installation page shows the README's two commands, and make has those targets."""
    text = (DOCS / "installation.md").read_text()
    assert "make report" in text and "make test" in text
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^report:", makefile, re.M) and re.search(r"^test:", makefile, re.M)


@pytest.mark.slow
def test_quickstart_runs(shared_default_model):
    """The Quickstart's code runs on the default model as written."""
    blocks = re.findall(r"```python\n(.*?)```", (DOCS / "quickstart.md").read_text(), flags=re.DOTALL)
    assert blocks
    for block in blocks:
        exec(compile(block, "docs/quickstart.md", "exec"), {"__name__": "quickstart"})


def test_the_docs_agree_that_the_tutorial_outputs_are_stored():
    """The tutorials show stored outputs (demos/outputs), rendered by ``make tutorials``; no page says otherwise."""
    index = (DOCS / "tutorials" / "index.md").read_text()
    assert "demos/outputs/" in index and "make tutorials" in index
    assert re.search(r"^tutorials:", (ROOT / "Makefile").read_text(), re.M)
    for path in (ROOT / "README.md", ROOT / "mkdocs.yml", DOCS / "tutorials" / "index.md", DOCS / "hooks.py"):
        text = " ".join(path.read_text().split())
        assert not re.search(r"outputs? (are|is) not (stored|committed|kept)", text), path.name


def test_tutorials_show_their_pre_rendered_outputs(site):
    """Each demo with outputs in demos/outputs shows them under its code cells, figures included."""
    import json

    for saved in sorted((ROOT / "demos" / "outputs").glob("*.json")):
        outputs = json.loads(saved.read_text())["cells"]
        html = (site / "tutorials" / saved.stem / "index.html").read_text()
        assert html.count(">output<") >= sum(1 for o in outputs.values() if o["text"]), saved.name
        for output in outputs.values():
            for name in output["images"]:
                assert (site / "assets" / "tutorials" / name).is_file() and f"assets/tutorials/{name}" in html


def test_api_page_documents_every_public_module(site):
    html = (site / "api" / "index.html").read_text()
    anchors = set(re.findall(r'id="([^"]+)"', html))
    modules = [
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for folder in ("analysis", "capture", "diagnostics", "engine", "models", "report", "results", "theory")
        for path in sorted((ROOT / "tl_geometry" / folder).glob("[a-z]*.py"))
    ]
    missing = [module for module in modules if module not in anchors]
    assert not missing, f"the API page has no section for {missing}"


def test_docs_pages_for_reading_a_head_and_the_claims(site):
    head = (site / "reading-a-head" / "index.html").read_text()
    assert "effective N" in head and "layer 18, head 6" in head and "N / L" in head
    claims_page = (site / "claims" / "index.html").read_text()
    assert "The verdict rule" in claims_page and "tl-geometry compare" in claims_page


def _claims_docs_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("claims_docs", ROOT / "scripts" / "claims_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_claims_numbers_in_the_docs_are_the_recorded_runs():
    """Every claims block of the docs is the table its recorded run renders (scripts/claims_docs.py writes
    both), and every recorded run has a block on the claims page."""
    script = _claims_docs_script()
    found = 0
    for page in script.PAGES:
        text = page.read_text()
        for name in script.MODELS:
            for match in script.block(name).finditer(text):
                assert match.group(2) == script.rendered(name), f"{page.name}: the {name} block is stale; run " \
                    "PYTHONPATH=. python scripts/claims_docs.py"
                found += 1
    assert all(script.block(name).search(script.PAGES[0].read_text()) for name in script.MODELS)
    assert found >= len(script.MODELS) + 1  # both models on the claims page, SmolLM2 on the concepts page


def test_the_claims_table_of_the_docs_is_the_declared_claims():
    """The claims page's table of statistics and thresholds is what the claims' declarations render."""
    script = _claims_docs_script()
    match = script.block(script.DECLARED).search(script.PAGES[0].read_text())
    assert match, "docs/claims.md has no claims:declared block"
    assert match.group(2) == script.declared_table(), "the declared claims' table is stale; run " \
        "PYTHONPATH=. python scripts/claims_docs.py --declared-only"
