"""The self-contained HTML report: a summary table, the head explorer, then every figure with how to read it.

The page's contents come first, after the summary, and link to every part.
Interventions sit where a reader looks for them: a sweep's figures (the page
of ``tl-geometry intervene``) in their own section right after the summary,
the role ablations inside the roles section, beside the roles they test.

plotly.js is embedded once, so the page opens offline. A figure the result
cannot draw leaves a short note saying which option would draw it. The page, the result
files and the PNGs are committed as one unit (`tl_geometry.atomic_io`), so
an interrupted run or a full disk never leaves a new result beside an old page
or damages the earlier report.
"""

import html
import math
import os
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from tl_geometry.analysis.role_ablation import RoleAblation
from tl_geometry.analysis.claims import sample_warning
from tl_geometry.analysis.detector_agreement import PromptSetCheck
from tl_geometry.analysis.sink import sink_recall_correlation
from tl_geometry.analysis.summaries import effective_n, mean_over_heads
from tl_geometry.analysis.head_roles import ROLE_LABELS, HeadRoles, roles_from_result, threshold_sensitivity
from tl_geometry.atomic_io import Unit, commit_unit
from tl_geometry.diagnostics.registry import REGISTRY
from tl_geometry.diagnostics.selection import ATTENTION_MASS, PRECISION, RECALL
from tl_geometry.errors import GeometryError
from tl_geometry.report import paper_figures as plots
from tl_geometry.report.explorer import HEATMAPS, default_n_index, explorer_html, explorer_script
from tl_geometry.report.roles import ABLATIONS_ID, ABLATIONS_TITLE, roles_html
from tl_geometry.report.scorecard import scorecard_html
from tl_geometry.results import fileformat
from tl_geometry.results.display import plural
from tl_geometry.results.result import GeometryResult
from tl_geometry.theory.synthetic import toy_2d


@dataclass(frozen=True)
class Figure:
    """One figure of the report: an anchor id, a title, how to read it, and how to draw it.

    ``draw`` None: a figure of the paper with nothing to measure (its
    ``how_to_read`` says why), kept so that the numbering follows the paper.
    """

    key: str
    title: str
    how_to_read: str
    draw: Callable[[GeometryResult, HeadRoles | None], go.Figure] | None
    needs: str | None = None  # the diagnostic whose fields the figure draws


def available(result: GeometryResult) -> set[str]:
    """The diagnostics the run asked for (its config; the always-on ones implied) whose declared fields it carries.

    One the config names without all its fields (a result saved by an older version of that
    diagnostic, or stripped of its fields) is not drawn, and `missing_note` says so.
    """
    return {
        diagnostic.name
        for diagnostic in REGISTRY.active(result.config.diagnostics)
        if all(spec.name in result.fields for spec in diagnostic.fields)
    }


def _names(roles: HeadRoles | None) -> list[list[str]] | None:
    return None if roles is None else roles.label_names()


def _small_n(result: GeometryResult) -> int:
    """The N the heatmaps open at (the explorer's N slider moves it)."""
    return result.n_grid.tolist()[default_n_index(result)]


FIGURES: tuple[Figure, ...] = (
    Figure(
        "figure-1",
        "Figure 1: top-N selection in a 2-D toy example",
        "Tokens on a circle (left) are scaled by their attention weights (middle); the selected ones (stars) "
        "sum to s(N). Precision counts non-selected tokens inside the r_max ball around s(N), Recall the "
        "selected ones inside the r_min ball (right). Drawn from tl_geometry.theory.synthetic.toy_2d, not the model; "
        "the same picture on the model's data follows when the run kept pictures of chosen heads.",
        lambda result, roles: plots.toy_selection(toy_2d()),
    ),
    Figure(
        "figure-2",
        "Figure 2: value-state norms (Assumption 1)",
        "Left: mean ||v_i|| by position over all layers and heads; the paper finds a much smaller norm at the "
        "sink (position 0) and stable norms after it. Right: the coefficient of variation of the non-sink norms "
        "per head (the paper: mostly 0.02-0.03).",
        lambda result, roles: plots.value_norms(result),
        needs="assumptions",
    ),
    Figure(
        "figure-3",
        "Figure 3: cosine similarity against lag (Assumption 2)",
        "Left: the mean absolute error of fitting exp(-beta |i - j|) to each head's mean cosine similarity by "
        "lag (the paper: about 0.09 on average). Right: one head's curve and its fit.",
        lambda result, roles: plots.cosine_decay(result),
        needs="assumptions",
    ),
    Figure(
        "figure-4",
        "Figure 4: attention profile (Assumption 3)",
        "One head's attention weights over the keys of the final query, on a log scale, with the fitted "
        "four-phase profile: sink, plateau up to T1, oscillation up to T2, exponential recency after.",
        lambda result, roles: plots.attention_profile(result),
        needs="assumptions",
    ),
    Figure(
        "figure-5",
        "Figure 5: Precision and Recall against N",
        "Global means over layers and heads (band: interquartile range). The paper finds separability "
        "strongest at small N and weakest at intermediate N; both metrics return to 1 when every key is selected.",
        lambda result, roles: plots.precision_recall_vs_n(result),
    ),
    Figure(
        "heatmap-precision",
        "Precision per layer and head",
        "Each cell is one head's Precision(r_max) at a small N: how few non-selected tokens fall inside the "
        "ball around s(N) that holds the selected ones. Bright cells are heads that separate their top keys well.",
        lambda result, roles: plots.metric_heatmap(result, PRECISION, _small_n(result), _names(roles)),
    ),
    Figure(
        "heatmap-recall",
        "Recall per layer and head",
        "Each cell is one head's Recall(r_min) at a small N: the share of selected tokens closer to s(N) than "
        "any non-selected one.",
        lambda result, roles: plots.metric_heatmap(result, RECALL, _small_n(result), _names(roles)),
    ),
    Figure(
        "figure-6",
        "Figure 6: sink similarity and Recall",
        "The correlation across heads between Recall(r_min, N) and rho_0, the mean cosine of the sink's value "
        "with the others, for every N, with a bootstrap interval over sequences. The dotted curve corrects it "
        "for the noise of each head's means over a few documents, which pulls a correlation towards 0 (the "
        "claims judge that one at N = 3). The paper finds it strongest at small N (peaking near N = 3 for "
        "Gemma and Mistral).",
        lambda result, roles: plots.sink_recall(sink_recall_correlation(result)),
        needs="assumptions",
    ),
    Figure(
        "figure-7",
        "Figure 7: role diagnostics",
        "One example head per role (colour: the most probable head of each), line styles in the legend. Top: "
        "||s(N)|| and the norms left when the sink or the last token is removed; a Retriever drops without the last "
        "token, a sink-dominated Reset head without the sink. Bottom: alignment of s(N) with the sink v_0 and the "
        "last token v_L over random sets of the same weights; in a Mixer it moves from v_0 to v_L as N grows.",
        lambda result, roles: plots.role_diagnostics(roles),
        needs="roles",
    ),
    Figure(
        "figure-8",
        "Figure 8: roles by depth",
        "How many heads of each layer have each role, by the rules of tl_geometry.analysis.head_roles; green is "
        "Content (not in the paper: a specific earlier token), grey is uncertain (the most probable role does not "
        "beat the runner-up by the margin). The paper (Llama-2-7B) finds Retrievers in the first two layers, Reset "
        "heads early and Mixers from the lower-middle layers on.",
        lambda result, roles: plots.roles_by_layer(roles),
        needs="roles",
    ),
    Figure(
        "figure-9",
        "Figure 9: multi-head spherical geometry (not drawn)",
        "The paper's Figure 9 is a conceptual illustration (each head as a sphere in three dimensions), not a "
        "measurement, so the report has nothing to draw for it; the numbers of the other figures follow the paper.",
        None,
    ),
    Figure(
        "figure-10",
        "Figure 10: contributions by role",
        "||alpha_i v_i|| of every key for the final query of the example heads, coloured by the cosine of v_i "
        "with the last token's value: Retrievers are dominated by the last token, Reset heads by the sink or by "
        "many keys at once, Content heads by a few earlier keys.",
        lambda result, roles: plots.contributions_by_role(roles),
        needs="roles",
    ),
    Figure(
        "figure-11",
        "Figure 11: Precision and Recall by role",
        "Mean Precision(r_max) and Recall(r_min) against N over the heads of each role.",
        lambda result, roles: plots.precision_recall_by_role(roles, result),
        needs="roles",
    ),
)


def summary_rows(
    result: GeometryResult, details: Mapping[str, str], roles: HeadRoles | None = None
) -> list[tuple[str, str]]:
    """The summary table: model, text, settings, versions and key figures."""
    precision, recall = mean_over_heads(result, PRECISION), mean_over_heads(result, RECALL)
    grid = result.n_grid.tolist()
    small = [i for i, n in enumerate(grid) if n <= 4]
    config = result.config
    rows = [
        ("model", result.model_name),
        *details.items(),
        ("sequences analysed", str(result.n_sequences)),
        ("tokens analysed", str(result.n_tokens)),
        ("layers x heads", f"{len(result.layers)} x {len(result.heads)}"),
        ("queries", str(config.query_positions)),
        ("ranking / distance", f"{config.ranking} / {config.distance}"),
        ("N grid", f"{len(grid)} values from {grid[0]} to {grid[-1]}"),
        ("mean Precision at N <= 4", ", ".join(f"N={grid[i]}: {precision[i].item():.3f}" for i in small)),
        ("mean Recall at N <= 4", ", ".join(f"N={grid[i]}: {recall[i].item():.3f}" for i in small)),
    ]
    if roles is not None:
        counts = roles.counts_by_layer().sum(0).tolist()
        rows.append(("head roles", ", ".join(f"{role}: {count}" for role, count in zip(ROLE_LABELS, counts))))
    rows.append(("versions", ", ".join(f"{k} {v}" for k, v in result.versions.items())))
    return rows


class Rendered(NamedTuple):
    """The figures drawn for a result, its roles when the result carries the features, and
    a note for every figure not drawn (which option would draw it)."""

    roles: HeadRoles | None
    figures: list[tuple[Figure, go.Figure]]
    notes: Sequence[tuple[Figure, str]] = ()


def missing_note(figure: Figure, asked: Sequence[str] = ()) -> str:
    """Why ``figure`` is not drawn and which option would draw it; ``asked``: the diagnostics the run named."""
    if figure.draw is None:
        return figure.how_to_read
    if figure.needs in asked:
        return (f"Not drawn: the run asked for the {figure.needs!r} diagnostic, but this result does not carry all "
                "its fields (saved by an older version of that diagnostic, or some fields removed). Analyse the "
                "model again to draw it.")
    return (f"Not drawn: this run did not compute the {figure.needs!r} diagnostic. Analyse with diagnostics "
            f"including {figure.needs!r} (the tl-geometry default; in Python diagnostics='all' or "
            f"diagnostics=[{figure.needs!r}, ...]) to draw it.")


def render_figures(result: GeometryResult) -> Rendered:
    """Every figure the result supports, drawn (some need the fields of a diagnostic), and notes for the rest."""
    present = available(result)
    roles = roles_from_result(result) if "roles" in present else None
    drawable = [f for f in FIGURES if f.draw is not None and (f.needs is None or f.needs in present)]
    figures = [(f, f.draw(result, roles)) for f in drawable]
    notes = [(f, missing_note(f, result.config.diagnostics)) for f in FIGURES if f not in drawable]
    pictures = picture_figures(result)
    if pictures:
        figures += pictures
    else:
        notes.append((PICTURE_NOTE, PICTURE_NOTE.how_to_read))
    return Rendered(roles, figures, notes)


# Figure 1 on the model's data: one entry per kept picture, right after the toy.
PICTURE_KEY = "figure-1-model"
PICTURE_NOTE = Figure(
    PICTURE_KEY,
    "Figure 1 on the model: one head's selection in value space",
    "Not drawn: this run kept no selection pictures. Name heads to keep one query row each (y_i, s(N) and both "
    "balls for every N): tl-geometry --picture L.H (e.g. --picture 18.6, repeatable), or in Python "
    "GeometryConfig(picture_heads=[(L, H)]).",
    None,
)


def picture_figures(result: GeometryResult) -> list[tuple[Figure, go.Figure]]:
    """Figure 1 on the model's data for every picture the result keeps, opened at the head's effective N.

    The slider offers every N of the grid up to 16 and the effective N; where
    the head has no effective N (or the picture's query sees fewer keys), the
    largest such N the picture has.
    """
    out = []
    effective = effective_n(result) if ATTENTION_MASS.name in result.fields else None
    for picture in result.pictures:
        offered = [n for n in picture.n_grid.tolist() if n <= min(16, picture.n_keys)]
        n = math.nan if effective is None else float(
            effective[result.layers.index(picture.layer), result.heads.index(picture.head)])
        has_effective = not math.isnan(n) and int(n) <= picture.n_keys
        chosen = int(n) if has_effective else offered[-1]
        opened = ("the head's effective N (the smallest N whose top-N set holds 90 % of its attention)" if has_effective
                  else "the largest N up to 16 (the head has no effective N on this grid or this query sees fewer keys)")
        figure = Figure(
            f"{PICTURE_KEY}-{picture.layer}-{picture.head}",
            f"Figure 1 on the model: layer {picture.layer}, head {picture.head}",
            f"The toy's picture on the model's data: the last analysed query of one document (the one of the smallest "
            f"token hash), opened at N = {chosen}, {opened}; the slider changes N. {plots.PICTURE_CAPTION}",
            None,
        )
        out.append((figure, plots.selection_picture(picture, chosen, slider=offered)))
    return out


def _position(key: str) -> float:
    """Where a figure goes in the page: the paper's order, the pictures right after the toy Figure 1."""
    keys = [f.key for f in FIGURES]
    if key.startswith(PICTURE_KEY):
        return keys.index("figure-1") + 0.5
    return float(keys.index(key) if key in keys else len(keys))


def _figure_section(figure: Figure, drawn: go.Figure, level: int = 2) -> str:
    div = drawn.to_html(full_html=False, include_plotlyjs=False, div_id=figure.key)
    return (f'<section id="section-{figure.key}"><h{level}>{html.escape(figure.title)}</h{level}>'
            f'<p class="how">{html.escape(figure.how_to_read)}</p>{div}</section>')


INTERVENTIONS_ID = "interventions"
INTERVENTIONS_TITLE = "Interventions: what the model needs"


def _interventions_section(figures: Sequence[tuple[Figure, go.Figure]]) -> str:
    """The figures of an intervention run, first after the summary ("" without any)."""
    if not figures:
        return ""
    how = ("What the model loses when attention keeps only its top-N keys, measured beside the geometry of the same "
           "windows: the geometry of selection (roles, claims, the head explorer and the paper's figures) follows.")
    return (f'<section id="{INTERVENTIONS_ID}"><h2>{INTERVENTIONS_TITLE}</h2><p class="how">{html.escape(how)}</p>'
            + "".join(_figure_section(f, d, level=3) for f, d in figures) + "</section>")


def _link(anchor: str, title: str, inner: Sequence[tuple[str, str]] = ()) -> str:
    sub = "".join(f'<li><a href="#{a}">{html.escape(t)}</a></li>' for a, t in inner)
    return f'<li><a href="#{anchor}">{html.escape(title)}</a>' + (f"<ul>{sub}</ul>" if sub else "") + "</li>"


def _page_contents(extra_figures: Sequence[tuple[Figure, go.Figure]], figures: Sequence[Figure]) -> str:
    """The page's table of contents: every part in page order, the interventions and the roles' ablations included."""
    links = []
    if extra_figures:
        links.append(_link(INTERVENTIONS_ID, INTERVENTIONS_TITLE, [(f"section-{f.key}", f.title) for f, _ in extra_figures]))
    links += [
        _link("head-roles", "What kind of head is each one?", [(ABLATIONS_ID, ABLATIONS_TITLE)]),
        _link("claims-scorecard", "The paper's claims on this model"),
        _link("explorer", "Head explorer: every head's curves and heatmaps"),
        _link("figures", f"Figures ({plural(len(figures), 'section')}, in the paper's order)"),
    ]
    return f'<nav id="contents"><h2>On this page</h2><ul>{"".join(links)}</ul></nav>'


def _note_section(figure: Figure, note: str) -> str:
    return (f'<section id="section-{figure.key}" class="not-drawn"><h2>{html.escape(figure.title)}</h2>'
            f'<p class="note">{html.escape(note)}</p></section>')


PAGE_STYLE = """<style>
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; } th, td { text-align: left; padding: 0.25em 1em 0.25em 0; }
th { font-weight: 600; } p.how { color: #444; max-width: 70em; }
p.note { color: #444; background: #f4f4f4; padding: 0.6em 1em; max-width: 70em; }
table.sortable th { cursor: pointer; } table.sortable tbody tr { cursor: pointer; }
table.sortable tbody tr:hover, table.sortable tr.chosen { background: #fdebd9; }
table.sortable td { font-variant-numeric: tabular-nums; }
th[data-order=descending]::after { content: " \\25BC"; } th[data-order=ascending]::after { content: " \\25B2"; }
</style>"""
"""The pages' CSS (the report and the roles' ablation page)."""


def _sample_banner(result: GeometryResult) -> str:
    """The first screen's warning when the result has fewer documents than some claims need ("" otherwise)."""
    warning = sample_warning(result.n_documents)
    return (f'<p class="note sample-warning" style="color:#5e3c99;background:#ece6f5"><b>{html.escape(warning)}</b></p>'
            if warning else "")


def render_html(
    result: GeometryResult,
    details: Mapping[str, str] | None = None,
    rendered: Rendered | None = None,
    extra_figures: Sequence[tuple[Figure, go.Figure]] = (),
    mechanisms: Mapping[str, PromptSetCheck] | None = None,
    ablation: RoleAblation | None = None,
) -> str:
    """The whole report as one HTML document (plotly.js embedded once).

    Figures that need a diagnostic (roles, assumptions) are drawn when the
    result carries its fields. ``rendered`` reuses figures already drawn.
    ``extra_figures`` (e.g. `intervention_figures` of a sweep) get a section
    of their own right after the summary. ``mechanisms``
    (`tl_geometry.roles.check_known_mechanisms`) adds the detector
    cross-tab to the head roles' section, and ``ablation``
    (`tl_geometry.interventions.ablate_roles`) the roles' ablations.
    """
    details = details or {}
    roles, figures, notes = render_figures(result) if rendered is None else rendered
    table = "\n".join(
        f"<tr><th>{html.escape(key)}</th><td>{html.escape(value)}</td></tr>"
        for key, value in summary_rows(result, details, roles)
    )
    # The heatmaps live in the explorer (its N slider drives them); the other figures follow in the paper's order.
    heatmaps = "".join(_figure_section(f, d) for f, d in figures if f.key in HEATMAPS)
    body: dict[str, str] = {f.key: _figure_section(f, d) for f, d in figures if f.key not in HEATMAPS}
    body.update({f.key: _note_section(f, note) for f, note in notes})
    shown = [f for f, _ in figures if f.key not in HEATMAPS] + [f for f, _ in notes]
    order = sorted(shown, key=lambda f: _position(f.key))
    contents = "\n".join(f'<li><a href="#section-{f.key}">{html.escape(f.title)}</a></li>' for f in order)
    sections = [body[f.key] for f in order]
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>tl_geometry report: {html.escape(result.model_name)}</title>
{PAGE_STYLE}
<script>{get_plotlyjs()}</script></head>
<body>
<h1>Geometry of token selection: {html.escape(result.model_name)}</h1>
<p>Precision, Recall and the geometry of top-N selection in value-state space, per layer and head
(tl_geometry, after "Geometric Analysis of Token Selection in Multi-Head Attention").</p>
{_sample_banner(result)}
<table id="summary">
{table}
</table>
{_page_contents(extra_figures, order)}
{_interventions_section(extra_figures)}
{roles_html(roles, mechanisms, threshold_sensitivity(result, roles.config) if roles else (), ablation)}
{scorecard_html(result)}
{explorer_html(result, roles, heatmaps)}
<h2 id="figures">Figures</h2><ul>{contents}</ul>
{"".join(sections)}
{explorer_script()}
</body></html>
"""


def ablation_page(roles: HeadRoles, ablation: RoleAblation, details: Mapping[str, str] | None = None) -> str:
    """A page of the roles and, inside their section, what ablating each costs the model (plotly.js embedded once):
    ``tl-geometry intervene --ablate-roles`` writes it as ``ablation.html``."""
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                   for k, v in {"model": ablation.model or "-", **(details or {})}.items())
    name = html.escape(ablation.model or "the model")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>tl_geometry: head roles and their ablations, {name}</title>
{PAGE_STYLE}
<script>{get_plotlyjs()}</script></head>
<body>
<h1>Head roles and what they cost the model: {name}</h1>
<table id="summary">{rows}</table>
<nav id="contents"><ul>{_link("head-roles", "What kind of head is each one?", [(ABLATIONS_ID, ABLATIONS_TITLE)])}</ul></nav>
{roles_html(roles, None, (), ablation)}
</body></html>
"""


def _browser_for_png() -> str:
    """The Chromium or Chrome that kaleido will drive, or GeometryError saying how to get one."""
    try:
        import kaleido  # noqa: F401
    except ImportError:
        raise GeometryError(
            "--png: static images need the kaleido package: pip install 'tl_geometry[png]' (or pip install kaleido)"
        ) from None
    found = os.environ.get("BROWSER_PATH") or next(
        (path for name in ("chromium", "chromium-browser", "google-chrome") if (path := shutil.which(name))), None
    )
    if found is None:
        raise GeometryError(
            "--png: kaleido renders with a Chromium or Chrome installed on this machine, and none was found; "
            "install one (Debian/Ubuntu: apt-get install chromium) or set BROWSER_PATH to its executable"
        )
    return found


# How long the PNGs may take: kaleido's own timeout covers each render, not the browser session around them,
# which has been seen to wait forever once its browser had gone.
PNG_SECONDS_BASE = 120.0
PNG_SECONDS_PER_FIGURE = 15.0


class _Unfinished(Exception):
    """The rendering did not finish within its time."""


def _within(seconds: float, render: Callable[[], None]) -> None:
    """Run ``render`` in a daemon thread; raise its error, or `_Unfinished` when it is not done within ``seconds``."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            render()
        except BaseException as error:  # handed to the caller's thread
            failure.append(error)

    worker = threading.Thread(target=run, name="tl_geometry-png", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise _Unfinished
    if failure:
        raise failure[0]


def write_png(figures: list[tuple[Figure, go.Figure]], out_dir: Path, unit: Unit) -> list[Path]:
    """Stage one PNG per figure, ``out_dir/<figure key>.png``, in the report's commit."""
    import plotly.io

    browser = _browser_for_png()
    os.environ.setdefault("BROWSER_PATH", browser)  # where kaleido's choreographer looks first
    paths = [out_dir / f"{figure.key}.png" for figure, _ in figures]
    drawn = [d for _, d in figures]
    staged = [unit.stage(path) for path in paths]
    heights = [d.layout.height or 500 for d in drawn]
    seconds = PNG_SECONDS_BASE + PNG_SECONDS_PER_FIGURE * len(figures)
    unfinished = GeometryError(
        f"--png: {browser} did not render the {len(figures)} figures within {seconds:.0f} s (kaleido's browser "
        "session stopped answering); nothing was written: run again, or leave out --png for the HTML report alone"
    )
    try:  # one browser session for every figure: several times faster than one each
        _within(seconds, lambda: plotly.io.write_images(drawn, staged, format="png", width=1100, height=heights))
    except _Unfinished:
        raise unfinished from None
    except Exception:  # one at a time: the figure that fails is named; if none does, every PNG is written
        for (figure, one), path, height in zip(figures, staged, heights):
            try:
                _within(seconds, lambda: one.write_image(path, format="png", width=1100, height=height))
            except _Unfinished:
                raise unfinished from None
            except Exception as error:
                raise GeometryError(f"--png: could not render {figure.key} with {browser}: {error}") from None
    return paths


def write_report(
    result: GeometryResult,
    out_dir: str | os.PathLike,
    details: Mapping[str, str] | None = None,
    *,
    png: bool = False,
    extra_figures: Sequence[tuple[Figure, go.Figure]] = (),
    mechanisms: Mapping[str, PromptSetCheck] | None = None,
    ablation: RoleAblation | None = None,
) -> Path:
    """Write ``out_dir/index.html`` and the result files ``out_dir/result.npz`` + ``.json``.

    Args:
        result: the analysis to report.
        out_dir: the report folder (created if needed).
        details: extra rows for the summary table, e.g. the text analysed.
        png: also write a PNG of every figure (needs kaleido and a Chromium).
        extra_figures: drawn figures of an intervention run (`intervention_figures` of a sweep), in a section
            of their own right after the summary.
        mechanisms: detector scores and roles on known-mechanism prompts (the head roles' cross-tab).
        ablation: the roles' ablations (`tl_geometry.interventions.ablate_roles`), shown in the roles section.

    Returns:
        The path of ``index.html``.

    Raises:
        GeometryError: ``png`` without kaleido or a browser to render with;
            another run writing to ``out_dir``.
    """
    out = Path(out_dir)
    if png:
        _browser_for_png()  # fail before writing anything
    rendered = render_figures(result)
    page = render_html(result, details, rendered, extra_figures, mechanisms, ablation)  # everything is drawn before anything is written
    index = out / "index.html"
    # One commit: a reader sees the old page with the old result or the new page with the new one.
    with commit_unit(out) as unit:
        fileformat.stage(unit, result, out / "result")
        unit.write(index, lambda f: f.write(page.encode("utf-8")))
        if png:
            write_png([*rendered.figures, *extra_figures], out, unit)
    return index


def intervention_figures(sweep=None, n_star=None, correlation=None, tau: float = 0.05) -> list[tuple[Figure, go.Figure]]:
    """The report's figures of a top-N sweep (`tl_geometry.interventions.intervention_sweep`), its N*_tau and its correlation."""
    from tl_geometry.report import intervention_plots as ip

    def entry(key: str, title: str, how: str, drawn: go.Figure) -> tuple[Figure, go.Figure]:
        return Figure(key, title, how, lambda result, roles: drawn), drawn

    out = []
    if sweep is not None:
        out.append(entry("interventions-dnll", "Top-N interventions: dNLL against N",
                         "Each row of attention keeps only its N highest-weighted visible keys (renormalise: rescaled "
                         "to sum to 1; delete: as they were). The curve is the change in next-token NLL relative to the "
                         "clean pass, with its document-bootstrap interval; the grey band spans the random rankings "
                         "of the same N. Far below the band: the ranking picks the keys the model needs.",
                         ip.dnll_vs_n_figure(sweep)))
    if n_star is not None:
        out.append(entry("interventions-nstar", f"Effective set size N*_{tau:g}",
                         f"The smallest N whose relative dNLL stays within {tau:g} (powers of two, bisection, then "
                         "+-3), per unit; hover for the bootstrap interval.", ip.n_star_figure(n_star, tau)))
    if correlation is not None:
        out.append(entry("interventions-geometry", "Geometry against function",
                         "Per layer or head, the geometric score at N against the NLL increase when only the top N "
                         "keys are kept; Spearman's rho across units with its bootstrap interval in each title.",
                         ip.geometry_scatter_figure(correlation)))
    return out
