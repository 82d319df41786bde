"""The claims scorecard: the paper's claims, measured on a result, as a self-contained HTML block or Markdown.

Only draws `tl_geometry.analysis.claims.claim_list` (or its table): no
computation here. The HTML block carries its own CSS (scoped under
``#claims-scorecard``) and no script or external resource, so it can sit at
the top of any page; the Markdown table is what the docs' claims page shows.
"""

import html
import math
from typing import Any

from tl_geometry.analysis.claims import Claim, claim_list, sample_warning
from tl_geometry.results.display import plural
from tl_geometry.results.result import GeometryResult

VERDICT_COLOURS = {
    "holds": ("#1b7837", "#e6f4ea"),
    "partly": ("#8c6d00", "#fff4ce"),
    "does not hold": ("#b2182b", "#fde0dd"),
    "too few documents": ("#5e3c99", "#ece6f5"),
    "not measured": ("#555555", "#eeeeee"),
}

STYLE = """<style>
#claims-scorecard table { border-collapse: collapse; width: 100%; font-size: 0.92em; }
#claims-scorecard th, #claims-scorecard td { border-bottom: 1px solid #ddd; padding: 0.35em 0.6em; text-align: left;
  vertical-align: top; }
#claims-scorecard th { background: #f6f6f6; font-weight: 600; }
#claims-scorecard .verdict { font-weight: 600; border-radius: 0.3em; padding: 0.1em 0.45em; white-space: nowrap; }
#claims-scorecard .small { color: #555; font-size: 0.88em; }
#claims-scorecard .warning, p.sample-warning { color: #5e3c99; background: #ece6f5; padding: 0.5em 0.8em; }
</style>"""


def _number(x: float) -> str:
    return "&ndash;" if math.isnan(x) else f"{x:.3g}"


def _value_cell(claim: Claim) -> str:
    if math.isnan(claim.value):
        return f'<td class="value">&ndash;<div class="small">{html.escape(claim.measured)}</div></td>'
    interval = (f" [{_number(claim.low)}, {_number(claim.high)}]" if not math.isnan(claim.low) else "")
    return (
        f'<td class="value"><b>{_number(claim.value)}</b>{interval}'
        f'<div class="small">{html.escape(claim.statistic)}; {html.escape(claim.measured)}</div>'
        f'<div class="small">interval: {html.escape(claim.interval)}</div></td>'
    )


def _badge(verdict: str) -> str:
    colour, background = VERDICT_COLOURS[verdict]
    return f'<span class="verdict" style="color:{colour};background:{background}">{html.escape(verdict)}</span>'


def _literal(claim: Claim) -> str:
    """The other reading of the claim (the paper's, where ours reinterprets it), with its own verdict."""
    if not claim.literal_verdict:
        return ""
    interval = (f" [{_number(claim.literal_low)}, {_number(claim.literal_high)}]"
                if not math.isnan(claim.literal_low) else "")
    return (f'<div class="small literal">read {html.escape(claim.literal)}: <b>{_number(claim.literal_value)}</b>'
            f"{interval} {_badge(claim.literal_verdict)}</div>")


def _verdict_cell(claim: Claim) -> str:
    extra = (f'<div class="small">measure it with {html.escape(claim.option)}</div>' if claim.option else
             f'<div class="small">{html.escape(claim.rule)}</div>'
             f'<div class="small">would change: {html.escape(claim.flip)}</div>')
    return f"<td>{_badge(claim.verdict)}{extra}{_literal(claim)}</td>"


def scorecard_html(result: GeometryResult) -> str:
    """The claims scorecard of ``result`` as an HTML ``<section id="claims-scorecard">`` (own CSS, no script).

    One row per claim of `tl_geometry.analysis.claims`: the claim and where
    the paper makes it, the paper's value, the measured value with its
    bootstrap interval (the claim's own method), and the verdict with its rule and what
    would change it (or, when not measured, the option that would measure it).
    """
    rows = []
    claims = claim_list(result)
    refused = [c.key for c in claims if c.verdict == "too few documents"]
    warning = sample_warning(result.n_documents)
    if refused and not warning:  # enough documents, but an estimate outside its own interval
        warning = (f"Too few documents to trust {plural(len(refused), 'claim')} ({', '.join(refused)}): the estimate "
                   f"lies outside its own bootstrap interval on {plural(result.n_documents, 'document')}.")
    banner = f'<p class="warning"><b>{html.escape(warning)}</b></p>' if warning else ""
    for claim in claims:
        rows.append(
            f'<tr id="claim-{claim.key}"><td>{html.escape(claim.claim)}'
            f'<div class="small">{html.escape(claim.paper_ref)}</div></td>'
            f"<td>{html.escape(claim.paper_value)}</td>{_value_cell(claim)}{_verdict_cell(claim)}</tr>"
        )
    return (
        f'<section id="claims-scorecard">{STYLE}<h2>The paper\'s claims on this model</h2>{banner}'
        "<p>Each claim of the paper reduced to one statistic of this result, with its bootstrap interval over "
        "documents where the fields kept replicates (each claim's method chosen on simulated studies; an interval "
        "that did not hold on simulated populations it was not chosen on says 'uncertain'). Verdict: <i>holds</i> when the statistic reaches the "
        "claim's threshold (and so does its whole interval), <i>partly</i> when it reaches the weaker one, "
        "<i>too few documents</i> when the sample is below what the claim's bootstrap needs to resolve a verdict "
        "(or the estimate lies outside its own interval), "
        "<i>not measured</i> when the run lacks the diagnostic (tl_geometry.analysis.claims states every "
        "rule).</p>"
        "<table><thead><tr><th>claim (paper)</th><th>paper's value</th><th>measured [95% interval]</th>"
        f"<th>verdict</th></tr></thead><tbody>{''.join(rows)}</tbody></table></section>"
    )


def _cell(text: str) -> str:
    return str(text).replace("|", "&#124;").replace("\n", " ")


def scorecard_markdown(table: Any) -> str:
    """A claims table (`tl_geometry.claims`, or read back from its CSV) as a Markdown table, one row per claim:
    the claim and where the paper makes it, the paper's value, ours with its interval, the verdict and its rule,
    and what would change the verdict."""
    lines = ["| claim | the paper | measured [95 % interval] | verdict (rule) | would change if |",
             "|---|---|---|---|---|"]
    for _, row in table.iterrows():
        value = "&ndash;" if math.isnan(row.value) else f"**{row.value:.3g}**"
        if not math.isnan(row.low):
            value += f" [{row.low:.3g}, {row.high:.3g}]"
        verdict = f"{_cell(row.verdict)} ({_cell(row.rule)})"
        literal = getattr(row, "literal_verdict", "")
        if isinstance(literal, str) and literal:  # the other reading (tables saved before it have none)
            verdict += f"; read {_cell(row.literal)}: {row.literal_value:.3g}, {_cell(literal)}"
        lines.append(
            f"| {_cell(row.claim)} ({_cell(row.paper_ref)}) | {_cell(row.paper_value)} | {value}: "
            f"{_cell(row.measured)} | {verdict} | {_cell(row.flip)} |"
        )
    return "\n".join(lines) + "\n"
