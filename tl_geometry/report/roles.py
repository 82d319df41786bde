"""The report's "What kind of head is each one?" section: roles, their probabilities, the known mechanisms, and
what ablating each role costs the model (the test of the roles, placed beside them)."""

import html
from collections.abc import Mapping, Sequence

from tl_geometry.analysis.role_ablation import RoleAblation
from tl_geometry.analysis.detector_agreement import DetectorAgreement, PromptSetCheck
from tl_geometry.analysis.head_roles import LITERAL_ROLES, ROLE_LABELS, HeadRoles, SensitivityRow, role_counts
from tl_geometry.report.ablation_figure import ablation_figure
from tl_geometry.results.display import head_name, plural

INTRO = (
    "Each head's role is read from its output o = sum of alpha_i v_i over a seeded sample of query positions: "
    "<b>retriever</b> (its own token dominates o and s(N) is aligned with v_L beyond random sets of the same "
    "weights), <b>mixer</b> (its own token between the sink and the rest, alignment shifting from v_0 to v_L as "
    "N grows), <b>reset</b> (the sink dominates, or the rest dominates but is broadly spread), and <b>content</b> "
    "(not in the paper: the rest dominates and is concentrated on a specific earlier token; previous-token, "
    "induction and copy heads). A sub-type names the key: previous-token, a fixed lag, or a secondary sink (a fixed "
    "early position that wins most rows, read as a sink: Reset), only where that key is the top rest key of a "
    "quarter of the rows and carries a stated weight and output share. The probability of each role is its share of bootstrap replicates over "
    "documents and query positions; a head is <b>uncertain</b> where the most probable role does not beat the "
    "runner-up by {margin}."
)
TOP_K = 10
ABLATIONS_ID = "role-ablations"
"""The anchor of the roles' ablations, inside the roles section (the page's contents link to it)."""
ABLATIONS_TITLE = "Do the roles matter to the model? Ablating each role against random heads"
NO_ABLATIONS = (
    "Not run: ablations run the model many times, so the report leaves them out. "
    "<code>tl-geometry intervene --ablate-roles</code> writes them beside the roles of its windows "
    "(<code>interventions/ablation.html</code>); in Python, "
    "<code>tl_geometry.report.html.write_report(result, out, ablation=ablation)</code> puts them here, with "
    "<code>ablation = tl_geometry.interventions.ablate_roles(model, tl_geometry.classify_heads(result), tokens=...)</code>."
)


def _cross_tab(check: PromptSetCheck, detector: str, roles: HeadRoles, what: str) -> str:
    rows = []
    for row in check.cross_tab(detector, TOP_K):
        layer, head = row["layer"], row["head"]
        here = roles.label_names()[roles.layers.index(layer)][roles.heads.index(head)]
        sub = roles.subtype_text(layer, head)
        cells = [head_name(layer, head), f"{row['score']:.2f}", row["label"], row["subtype"] or "-", f"{row['p_content']:.2f}",
                 here + (f" ({sub})" if sub else "")]
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{c}</th>" for c in ("head", "score", "role on these prompts", "sub-type", "p(content)",
                                                   "role on the analysed text"))
    expected, shown = check.matches(detector, TOP_K), len(rows)
    here, there = check.agreement(detector), check.agreement(detector, roles)
    return (f"<h3>{html.escape(what)}</h3><p class='how'>The {plural(shown, 'head')} with the highest score; {expected} of "
            f"{shown} come out as expected on these prompts (Content, {'previous-token' if detector == 'previous_token' else 'top key at the induction lag'}). "
            f"Recall: {_recall(here)}. "
            f"Precision: {_precision(here, 'on these prompts')}; {_precision(there, 'on the analysed text')}.</p>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def _recall(found: DetectorAgreement) -> str:
    detected = len(found.detected)
    if not detected:
        return f"no head scores at least {found.threshold:g} on these prompts"
    return (f"{len(found.confirmed)} of the {plural(detected, 'head')} scoring at least "
            f"{found.threshold:g} {'are' if detected != 1 else 'is'} named {found.subtype}")


def _precision(found: DetectorAgreement, where: str) -> str:
    named = len(found.named)
    if not named:
        return f"no head is named {found.subtype} {where}"
    return (f"{len(found.confirmed)} of the {plural(named, 'head')} named {found.subtype} {where} "
            f"score{'s' if len(found.confirmed) == 1 else ''} at least {found.threshold:g}")


def _prompt_count(check: PromptSetCheck) -> str:
    return "" if check.n_prompts is None else f", {plural(check.n_prompts, 'prompt')}"


def _literal(roles: HeadRoles) -> str:
    """Our labels against the paper's rules read literally (norms, raw cosines), as counts."""
    ours = [name for row in roles.label_names() for name in row]
    literal = [name for row in roles.literal_names() for name in row]
    head = "".join(f"<th>{c}</th>" for c in ("ours \\ read literally", *LITERAL_ROLES))
    body = "".join(
        f"<tr><td>{label}</td>" + "".join(f"<td>{sum(o == label and t == lit for o, t in zip(ours, literal))}</td>"
                                          for lit in LITERAL_ROLES) + "</tr>"
        for label in ROLE_LABELS
    )
    return (f"<details><summary>The paper's rules read literally, beside ours ({sum(o != t for o, t in zip(ours, literal))} "
            f"of {plural(len(ours), 'head')} differ)</summary><p class='how'>Read literally, the paper's magnitudes are the norms "
            f"||alpha_i v_i|| (not our shares) and its alignments the raw cosines; \"none\" is a head no rule of the "
            f"paper fits. Rows: our label; columns: the literal one.</p><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table></details>")


def _f(x: float) -> str:
    return f"{x:+.3f}"


def ablations_html(ablation: RoleAblation | None) -> str:
    """The roles' ablations: each group's change in loss against random head sets of its shape (figure and
    table), or a note saying how to run them."""
    title = f"<h3>{ABLATIONS_TITLE}</h3>"
    if ablation is None:
        return f"<section id='{ABLATIONS_ID}' class='not-drawn'>{title}<p class='note'>{NO_ABLATIONS}</p></section>"
    head = "".join(f"<th>{c}</th>" for c in ("group", "heads", "task", "ablation", "ΔNLL [95 % CI]",
                                               "random band 5-95 %", "excess [95 % CI]", "verdict"))
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in (
            row.group, str(row.n_heads), row.task, row.ablation, f"{_f(row.dnll)} [{_f(row.low)}, {_f(row.high)}]",
            f"{_f(row.random_low)} to {_f(row.random_high)}",
            f"{_f(row.excess)} [{_f(row.excess_low)}, {_f(row.excess_high)}]", row.verdict)) + "</tr>"
        for row in ablation.rows
    )
    n_random = max((row.n_random for row in ablation.rows), default=0)
    how = (f"A role says what a head's output is made of, not whether the model needs it. Each group of heads (a "
           f"role, a sub-type, a detector's heads) is ablated at once (zero: its output set to 0; mean: to its mean "
           f"output) and the change in loss (ΔNLL, nats; natural: next-token NLL on text, repeated: the second copy "
           f"of repeated random tokens) is set against {plural(n_random, 'random head set')} of the same size and "
           f"layers (the band: their 5-95 % range). Above band: the group costs the model more than random heads "
           f"of its shape.")
    figure = ablation_figure(ablation).to_html(full_html=False, include_plotlyjs=False, div_id=f"{ABLATIONS_ID}-figure")
    return (f"<section id='{ABLATIONS_ID}'>{title}<p class='how'>{html.escape(how)}</p>{figure}"
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></section>")


def _sensitivity(rows: Sequence[SensitivityRow]) -> str:
    head = "".join(f"<th>{c}</th>" for c in ("threshold", "moved to", "labels changed", *ROLE_LABELS))
    body = "".join(
        f"<tr><td>{row.threshold}</td><td>{row.value:.3g}</td><td>{row.changed}</td>"
        + "".join(f"<td>{n}</td>" for n in row.counts) + "</tr>"
        for row in rows
    )
    return (f"<details><summary>How the roles move when each threshold moves by 10 % (RoleConfig)</summary>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></details>")


def roles_html(
    roles: HeadRoles | None,
    checks: Mapping[str, PromptSetCheck] | None = None,
    sensitivity: Sequence[SensitivityRow] = (),
    ablation: RoleAblation | None = None,
) -> str:
    """The section, or a note saying which option adds it (no roles features); the roles' ablations (or how to
    run them) inside it, after the roles and their check against known mechanisms."""
    if roles is None:
        return ("<section id='head-roles'><h2>What kind of head is each one?</h2><p class='note'>No roles: analyse with "
                "the 'roles' diagnostic (the tl-geometry default).</p>"
                + (ablations_html(ablation) if ablation is not None else "") + "</section>")
    counts = role_counts(roles)
    n_heads = roles.labels.numel()
    count_row = "".join(f"<td>{counts[r]}</td>" for r in ROLE_LABELS)
    parts = [
        "<section id='head-roles'><h2>What kind of head is each one?</h2>",
        f"<p class='how'>{INTRO.format(margin=roles.config.margin)}</p>",
        "<table><thead><tr>" + "".join(f"<th>{r}</th>" for r in ROLE_LABELS) + f"</tr></thead><tbody><tr>{count_row}"
        f"</tr></tbody></table><p class='how'>{plural(n_heads, 'head')}. The head panel below describes the head you pick; "
        "every head is listed at the end of this section.</p>",
        _literal(roles),
    ]
    if checks:
        parts.append("<p class='how'>Checked against mechanisms the field already knows: detector scores written "
                     "from their definitions on the attention pattern alone, on prompts where the mechanism acts.</p>")
        parts.append(_cross_tab(checks["natural"], "previous_token", roles,
                                "Previous-token score (weight on the key just before the query), natural text"
                                + _prompt_count(checks["natural"])))
        period = checks["repeated"].period
        parts.append(_cross_tab(checks["repeated"], "induction", roles,
                                f"Induction score (weight on the key after the previous occurrence of the query's "
                                f"token, lag {period - 1 if period else '?'}), random tokens repeated twice"
                                + _prompt_count(checks["repeated"])))
    else:
        parts.append("<p class='note'>No detector cross-tab: it runs the model on its own prompts, which "
                     "tl-geometry report does (unless --mechanism-prompts 0) and tl-geometry plot (saved results "
                     "only) cannot.</p>")
    parts.append(ablations_html(ablation))
    if sensitivity:
        parts.append(_sensitivity(sensitivity))
    lines = "".join(f"<li>{html.escape(roles.describe(layer, head))}</li>" for layer in roles.layers for head in roles.heads)
    parts.append(f"<details><summary>Every head</summary><ul>{lines}</ul></details></section>")
    return "\n".join(parts)
