"""The report opened in a real browser: headless Chromium, from disk, with the network cut, driven over DevTools.

`tests.browser` talks the Chrome DevTools protocol over a pipe (stdlib only).
Every figure must render with an empty console, and the head explorer must
answer a click on a heatmap cell, the N slider, the table and the head list.
"""

import dataclasses
import json
import math
import time

import pytest

from tests import tiny_models as tm
from tests.browser import CHROMIUM, Browser, open_page
from tl_geometry import run_with_geometry_hooks
from tl_geometry.analysis.summaries import effective_n
from tl_geometry.report.html import FIGURES, PICTURE_KEY, write_report
from tl_geometry.results.result import REQUIRED_FIELDS

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (make test installs it where apt-get is root)")
GRID = [1, 2, 4, 21]


@pytest.fixture(scope="module")
def result():
    model = tm.make_model("bridge-llama")
    tokens = tm.with_bos(tm.random_tokens(2, 20))
    return run_with_geometry_hooks(model, tokens, n_grid=GRID, diagnostics="all", keep_queries=True, query_positions="all",
                                   picture_heads=[(1, 2)])


@pytest.fixture(scope="module")
def page(result, tmp_path_factory):
    """One browser on the report of ``result``; yields the browser (the page is open and the explorer ready)."""
    folder = tmp_path_factory.mktemp("browser")
    index = write_report(result, folder / "report")
    browser = Browser(folder / "profile")
    try:
        seconds = open_page(browser, index.as_uri())
        print(f"tiny report opened in {seconds:.2f} s")
        yield browser
    finally:
        browser.close()


def _value(browser: Browser, expression: str):
    return browser.evaluate(f"(() => {{ {expression} }})()")


def _panel(browser: Browser) -> tuple[int, int]:
    got = _value(browser, "const d = document.getElementById('head-panel').dataset; return [d.layer, d.head];")
    return int(got[0]), int(got[1])


def _click_cell(browser: Browser, figure: str, layer: int, head: int) -> None:
    """Scroll the heatmap into view and click the centre of cell (layer, head) with the mouse."""
    x, y = _value(browser, f"""
        const div = document.getElementById('{figure}');
        div.scrollIntoView({{block: 'center'}});
        const full = div._fullLayout, box = div.getBoundingClientRect();
        return [box.left + full.xaxis._offset + full.xaxis.l2p({head}), box.top + full.yaxis._offset + full.yaxis.l2p({layer})];
    """)
    browser.call("Input.dispatchMouseEvent", session=True, type="mouseMoved", x=x, y=y)
    time.sleep(0.2)  # plotly computes the hovered point on mouse move; the click uses it
    browser.click(x, y)


def test_every_figure_renders_offline_with_an_empty_console(page):
    drawn = [f.key for f in FIGURES if f.draw is not None]
    rendered = _value(page, "return [...document.querySelectorAll('.js-plotly-plot')].filter("
                            "d => d.querySelector('.main-svg') && d._fullLayout).map(d => d.id);")
    assert set(drawn) | {"head-curves", "head-rows", "head-queries", f"{PICTURE_KEY}-1-2"} <= set(rendered), rendered
    assert _value(page, "return document.querySelector('#section-figure-9.not-drawn p.note').textContent;").startswith(
        "The paper's Figure 9 is a conceptual illustration")
    # The picture's N slider: each step's update applies cleanly (the discs follow N).
    discs = _value(page, f"""const d = document.getElementById('{PICTURE_KEY}-1-2'), out = [];
        for (const step of d.layout.sliders[0].steps) {{ Plotly.update(d, step.args[0], step.args[1]);
            out.push(d.layout.shapes.length); }}
        return out;""")
    assert discs == [2, 2, 2]  # N = 1, 2, 4 (the grid up to 16): both discs each time
    assert page.console() == []


def test_clicking_a_heatmap_cell_shows_that_head(page, result):
    start = _panel(page)
    target = (1, 3) if start != (1, 3) else (0, 2)
    _click_cell(page, "heatmap-precision", *target)
    assert _panel(page) == target
    assert _value(page, "return document.getElementById('head-title').textContent;") == f"Layer {target[0]}, head {target[1]}"
    assert _value(page, "return document.getElementById('head-select').value;") == f"{target[0]},{target[1]}"
    eff = effective_n(result)[result.layers.index(target[0]), result.heads.index(target[1])].item()
    assert f"Effective N = {int(eff)}" in _value(page, "return document.getElementById('head-info').textContent;")
    # The panel's curve is that head's Precision.
    curve = _value(page, "return document.getElementById('head-curves').data.find(t => t.name === 'measured').y;")
    want = result.per_head("precision")[target].tolist()
    assert curve == pytest.approx(want, abs=1e-3)
    _click_cell(page, "heatmap-recall", 0, 1)
    assert _panel(page) == (0, 1)
    assert page.console() == []


def test_the_n_slider_drives_the_heatmaps(page, result):
    index = GRID.index(2)
    _value(page, f"const s = document.getElementById('n-slider'); s.value = {index};"
                 "s.dispatchEvent(new Event('input')); return null;")
    for metric in ("precision", "recall"):
        z = _value(page, f"return document.getElementById('heatmap-{metric}').data[0].z;")
        want = result.per_head(metric)[..., index].tolist()
        for got_row, want_row in zip(z, want):
            assert [g if g is not None else math.nan for g in got_row] == pytest.approx(want_row, abs=1e-3, nan_ok=True)
        title = _value(page, f"return document.getElementById('heatmap-{metric}')._fullLayout.title.text;")
        assert title == f"{metric} at N = 2, per layer and head"
    assert _value(page, "return document.getElementById('n-value').textContent;") == "2"
    assert "at N = 2" in _value(page, "return document.getElementById('head-queries')._fullLayout.title.text;")
    assert page.console() == []


def test_the_heads_table_sorts_and_selects(page, result):
    columns = _value(page, "return [...document.querySelectorAll('#heads-table th')].map(th => th.textContent);")
    assert columns[:5] == ["layer", "head", "role", "probability", "runner-up"] and "P at eff. N" in columns
    k = columns.index("P at eff. N")
    _value(page, f"document.querySelectorAll('#heads-table th')[{k}].click(); return null;")
    values = _value(page, f"return [...document.querySelectorAll('#heads-table tbody tr')].map(tr => tr.cells[{k}].dataset.value);")
    numbers = [float(v) for v in values if v != ""]
    assert numbers == sorted(numbers, reverse=True) and len(values) == len(result.layers) * len(result.heads)
    _value(page, f"document.querySelectorAll('#heads-table th')[{k}].click(); return null;")  # again: ascending
    values = _value(page, f"return [...document.querySelectorAll('#heads-table tbody tr')].map(tr => tr.cells[{k}].dataset.value);")
    assert [float(v) for v in values if v != ""] == sorted(numbers)
    first = _value(page, "const tr = document.querySelector('#heads-table tbody tr'); tr.click(); return tr.dataset.key;")
    assert _panel(page) == tuple(result.layers[i] if n == 0 else result.heads[i] for n, i in enumerate(map(int, first.split(","))))
    _value(page, "const s = document.getElementById('head-select'); s.value = '0,0'; s.dispatchEvent(new Event('change')); return null;")
    assert _panel(page) == (0, 0)
    assert page.console() == []


def test_a_result_without_diagnostics_shows_notes_instead(result, tmp_path):
    plain = dataclasses.replace(result, stats={k: v for k, v in result.stats.items() if k in REQUIRED_FIELDS},
                                queries=None, query_positions=None, pictures=())  # fmt: skip
    index = write_report(plain, tmp_path / "report")
    browser = Browser(tmp_path / "profile")
    try:
        open_page(browser, index.as_uri())
        notes = _value(browser, "return document.getElementById('head-notes').textContent;")
        for option in ("'chance'", "'bounds'", "'assumptions'", "'roles'", "keep_queries=True"):
            assert option in notes
        missing = _value(browser, "return [...document.querySelectorAll('section.not-drawn')].map(s => s.id);")
        expected = {f"section-{f.key}" for f in FIGURES if f.needs is not None or f.draw is None}
        assert set(missing) == expected | {f"section-{PICTURE_KEY}"}  # no picture_heads: the note naming --picture
        _click_cell(browser, "heatmap-recall", 1, 2)
        assert _panel(browser) == (1, 2)
        assert browser.console() == []
    finally:
        browser.close()


@pytest.mark.slow
def test_the_default_report_stays_under_10_mb(default_report, tmp_path):
    """The default command on one window (the page's size does not grow with the windows); prints its open time."""
    index = default_report.folder / "report" / "index.html"
    size = index.stat().st_size
    browser = Browser(tmp_path / "profile", timeout=120)
    try:
        seconds = open_page(browser, index.as_uri())
        assert browser.console() == []
    finally:
        browser.close()
    print(json.dumps({"default report MB": round(size / 1e6, 2), "open seconds (headless Chromium)": round(seconds, 2)}))
    assert size < 10e6
