"""The HTML report: one self-contained page, every figure, a summary table; atomic writes."""

import dataclasses
import html
import os
import stat
import shutil
import sys

import pytest

from tests import tiny_models as tm
from tests.fixtures import inject
from tl_geometry import GeometryError, GeometryResult, run_with_geometry_hooks
from tl_geometry.report import html as report
from tl_geometry.results.result import REQUIRED_FIELDS


@pytest.fixture(scope="module")
def result():
    model = tm.make_model("bridge-llama")
    tokens = tm.with_bos(tm.random_tokens(2, 20))
    return run_with_geometry_hooks(model, tokens, n_grid=[1, 2, 4, 21], diagnostics="all")


def _not_drawn(page: str) -> set[str]:
    return {f.key for f in report.FIGURES if f'<section id="section-{f.key}" class="not-drawn">' in page}


def test_without_diagnostics_their_figures_leave_a_note_naming_the_option(result):
    unasked = dataclasses.replace(
        result,
        config=dataclasses.replace(result.config, diagnostics=()),
        stats={k: v for k, v in result.stats.items() if k in REQUIRED_FIELDS},
    )
    assert set(unasked.fields) == set(REQUIRED_FIELDS)
    page = report.render_html(unasked)
    for figure in report.FIGURES:
        drawn = figure.draw is not None and figure.needs is None
        assert (f'id="{figure.key}"' in page) == drawn
        assert (figure.key in _not_drawn(page)) == (not drawn)
        if figure.needs is not None:
            assert html.escape(f"did not compute the '{figure.needs}' diagnostic") in page
            assert html.escape(f"Analyse with diagnostics including '{figure.needs}'") in page


def test_the_report_reads_which_diagnostics_ran_from_the_config(result):
    needing = {f.key for f in report.FIGURES if f.needs is not None}
    # Every field there, but the config names no diagnostic: the figures that need one are not drawn.
    unnamed = dataclasses.replace(result, config=dataclasses.replace(result.config, diagnostics=()))
    assert report.render_figures(unnamed).roles is None
    assert _not_drawn(report.render_html(unnamed)) >= needing
    # Named, but the fields are gone (an older version's result, or stripped): the note says that instead.
    stripped = dataclasses.replace(result, stats={k: v for k, v in result.stats.items() if k in REQUIRED_FIELDS})
    page = report.render_html(stripped)
    assert _not_drawn(page) >= needing
    for name in {f.needs for f in report.FIGURES if f.needs is not None}:
        assert html.escape(f"the run asked for the '{name}' diagnostic, but this result does not carry") in page
    assert "did not compute" not in page


def test_figure_numbers_follow_the_paper_and_figure_9_says_why_it_is_not_drawn(result):
    numbers = [int(f.key.split("-")[1]) for f in report.FIGURES if f.key.startswith("figure-")]
    assert numbers == list(range(1, 12))
    page = report.render_html(result)
    assert page.index('id="section-figure-8"') < page.index('id="section-figure-9"') < page.index('id="section-figure-10"')
    assert "conceptual illustration" in page


def test_the_scorecard_sits_between_the_summary_and_the_explorer(result):
    page = report.render_html(result)
    assert (page.index('<table id="summary">') < page.index('<section id="claims-scorecard">')
            < page.index('<section id="explorer">') < page.index('<h2 id="figures">Figures</h2>'))


def test_the_first_screen_says_the_sample_is_too_small(result):
    """Two documents: the warning comes before the summary table (the first screen), and names the count."""
    page = report.render_html(result)
    assert result.n_documents == 2
    assert 0 <= page.index("Too few documents to trust: this result has 2") < page.index('<table id="summary">')


def test_page_embeds_plotly_once_and_shows_every_figure(result):
    page = report.render_html(result, {"text": "random tokens"})
    assert "<th>head roles</th>" in page
    assert page.count("<script") >= 1 and page.count("plotly.js v") == 1  # the library, embedded once
    for figure in report.FIGURES:
        assert html.escape(figure.how_to_read[:40]) in page
        assert (f'id="{figure.key}"' in page) == (figure.draw is not None)
    assert page.count('<script type="application/json" id="explorer-data">') == 1
    assert page.count(report.explorer_script()) == 1  # the explorer's one script
    assert "<th>text</th><td>random tokens</td>" in page
    assert "<script src=" not in page  # nothing fetched from the network


def test_write_report_writes_page_and_reloadable_result(result, tmp_path):
    index = report.write_report(result, tmp_path / "out")
    assert index.read_text().startswith("<!DOCTYPE html>")
    assert GeometryResult.load(tmp_path / "out" / "result").equals(result)
    assert not list((tmp_path / "out").glob(".*tmp"))  # no temporary files left behind


def test_a_failed_write_keeps_the_previous_report(result, tmp_path, monkeypatch):
    index = report.write_report(result, tmp_path)
    before = index.read_text()

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(report, "render_html", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        report.write_report(result, tmp_path)
    assert index.read_text() == before


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Chromium (make test installs it where it can)")
def test_png_of_every_figure(result, tmp_path):
    report.write_report(result, tmp_path, png=True)
    for figure, _ in report.render_figures(result).figures:
        assert (tmp_path / f"{figure.key}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*"))


def test_png_without_a_browser_says_how_to_install_one(result, tmp_path, monkeypatch):
    monkeypatch.delenv("BROWSER_PATH", raising=False)
    monkeypatch.setattr(report.shutil, "which", lambda name: None)
    with pytest.raises(GeometryError, match="apt-get install chromium"):
        report.write_report(result, tmp_path / "out", png=True)
    assert not (tmp_path / "out").exists()  # nothing written


def test_png_without_kaleido_says_how_to_install_it(result, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "kaleido", None)  # import fails
    with pytest.raises(GeometryError, match=r"pip install 'tl_geometry\[png\]'"):
        report.write_report(result, tmp_path, png=True)


def test_written_files_get_ordinary_permissions(result, tmp_path):
    mask = os.umask(0o022)
    try:
        report.write_report(result, tmp_path)
    finally:
        os.umask(mask)
    for name in ("index.html", "result.npz", "result.json"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644, name


def test_a_figure_that_fails_to_render_is_named(result, tmp_path, monkeypatch):
    import plotly.io

    def broken(*args, **kwargs):
        raise RuntimeError("renderer crashed")

    inject(monkeypatch, "browser_for_png", lambda: "chromium")
    monkeypatch.setattr(plotly.io, "write_images", broken)  # the batch fails: each figure alone says which
    monkeypatch.setattr(report.go.Figure, "write_image", broken)
    first = report.render_figures(result).figures[0][0].key
    with pytest.raises(GeometryError, match=f"--png: could not render {first} with chromium: renderer crashed"):
        report.write_report(result, tmp_path / "out", png=True)
    assert not list((tmp_path / "out").iterdir())  # nothing committed, no staged file left


def test_png_whose_browser_session_stops_answering_ends_in_an_error(result, tmp_path, monkeypatch):
    import threading

    import plotly.io

    released = threading.Event()

    def hangs(*args, **kwargs):  # a session whose browser has gone: kaleido waits for it
        released.wait(30)

    inject(monkeypatch, "browser_for_png", lambda: "chromium")
    monkeypatch.setattr(plotly.io, "write_images", hangs)
    monkeypatch.setattr(report.go.Figure, "write_image", hangs)
    monkeypatch.setattr(report, "PNG_SECONDS_BASE", 0.2)
    monkeypatch.setattr(report, "PNG_SECONDS_PER_FIGURE", 0.0)
    try:
        with pytest.raises(GeometryError, match=r"--png: chromium did not render the \d+ figures within 0 s"):
            report.write_report(result, tmp_path / "out", png=True)
    finally:
        released.set()
    assert not list((tmp_path / "out").iterdir())  # nothing committed, no staged file left


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Chromium (make test installs it where it can)")
def test_png_when_the_one_session_fails_each_figure_is_rendered_alone(result, tmp_path, monkeypatch):
    import plotly.io

    def broken(*args, **kwargs):
        raise RuntimeError("session lost")

    def two_figures(result):  # one browser start per figure on this path: two show it
        rendered = render_figures(result)
        return rendered._replace(figures=rendered.figures[:2])

    render_figures = report.render_figures
    monkeypatch.setattr(report, "render_figures", two_figures)
    monkeypatch.setattr(plotly.io, "write_images", broken)
    report.write_report(result, tmp_path, png=True)
    written = sorted(path.name for path in tmp_path.glob("*.png"))
    assert written == sorted(f"{figure.key}.png" for figure, _ in two_figures(result).figures)
    for name in written:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- where the interventions sit, and the page's contents

def _role_ablation():
    from tl_geometry.analysis.role_ablation import AblationRow, HeadGroup, RoleAblation

    def row(group, ablation, dnll):
        return AblationRow(group=group, kind="role", task="natural", ablation=ablation, n_heads=2, layers="0:1, 1:1",
                           clean=3.0, dnll=dnll, low=dnll - 0.01, high=dnll + 0.01, random_mean=0.02, random_sd=0.01,
                           random_low=0.0, random_high=0.04, excess=dnll - 0.02, excess_low=dnll - 0.03,
                           excess_high=dnll - 0.01, above_random=0.0, n_random=4)

    groups = (HeadGroup("role reset", "role", ((0, 0), (1, 1))), HeadGroup("role content", "role", ((0, 1), (1, 2))))
    rows = tuple(row(g.name, a, d) for g, d in zip(groups, (0.5, 0.01)) for a in ("zero", "mean"))
    return RoleAblation(rows=rows, groups=groups, model="tiny")


def _sweep_figures():
    import plotly.graph_objects as go

    return [(report.Figure(f"interventions-{k}", f"Intervention figure {k}", "how", None), go.Figure()) for k in "ab"]


def _ids_and_links(page: str) -> tuple[set[str], list[str]]:
    import re

    nav = page[page.index('<nav id="contents">'):page.index("</nav>")]
    return set(re.findall(r"""id=["']([^"']+)["']""", page)), re.findall(r'href="#([^"]+)"', nav)


def test_the_page_lists_every_part_first_and_every_link_lands(result):
    page = report.render_html(result)
    ids, links = _ids_and_links(page)
    assert links and all(link in ids for link in links), [link for link in links if link not in ids]
    assert links[:2] == ["head-roles", "role-ablations"] and "interventions" not in links  # no sweep, no section
    assert (page.index('<table id="summary">') < page.index('<nav id="contents">') < page.index("<section id='head-roles'>")
            < page.index("<section id='role-ablations' class='not-drawn'>") < page.index("<summary>Every head</summary>")
            < page.index('<section id="claims-scorecard">') < page.index('<h2 id="figures">'))
    assert "tl-geometry intervene --ablate-roles" in page  # how to put the ablations beside the roles


def test_interventions_come_after_the_summary_and_role_ablations_beside_the_roles(result):
    """A sweep's figures open the page (linked first in its contents), not after Figure 11; each role ablation
    row sits in the roles section, between the roles and the list of every head."""
    figures, ablation = _sweep_figures(), _role_ablation()
    page = report.render_html(result, extra_figures=figures, ablation=ablation)
    ids, links = _ids_and_links(page)
    assert all(link in ids for link in links)
    assert links[:3] == ["interventions", "section-interventions-a", "section-interventions-b"]
    places = [page.index('<nav id="contents">'), page.index('<section id="interventions">'),
              page.index('id="section-interventions-a"'), page.index('id="section-interventions-b"'),
              page.index("<section id='head-roles'>"), page.index("<section id='role-ablations'>"),
              page.index("<summary>Every head</summary>"), page.index('<section id="claims-scorecard">'),
              page.index('<h2 id="figures">'), page.index('id="section-figure-11"')]
    assert places == sorted(places)
    figures_list = page[page.index('<h2 id="figures">'):]
    assert "Intervention figure a" not in figures_list[:figures_list.index("</ul>")]  # listed once, at the top
    start = page.index("<section id='role-ablations'>")
    roles = page[start:page.index("</section>", start)]
    for row in ablation.rows:
        assert f"<td>{row.group}</td><td>2</td><td>natural</td><td>{row.ablation}</td><td>{row.dnll:+.3f}" in roles
    assert roles.count("<tr><td>") == len(ablation.rows) and 'id="role-ablations-figure"' in roles
    assert page.count("plotly.js v") == 1


def test_the_ablation_page_shows_the_roles_with_their_ablations(result):
    from tl_geometry.analysis.head_roles import roles_from_result

    ablation = _role_ablation()
    page = report.ablation_page(roles_from_result(result), ablation, {"windows": "2 x 16 tokens"})
    ids, links = _ids_and_links(page)
    assert links == ["head-roles", "role-ablations"] and set(links) <= ids
    assert page.index("<section id='head-roles'>") < page.index("<section id='role-ablations'>") < page.index(
        "<summary>Every head</summary>")
    assert "<th>windows</th><td>2 x 16 tokens</td>" in page and page.count("plotly.js v") == 1
