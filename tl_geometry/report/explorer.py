"""The report's head explorer: pick a head (a heatmap cell, the list or the table) and read it.

Everything the panel shows was measured by the run and is read from the
result: `explorer_data` gathers it and says which diagnostic or option would
add what is missing. Curves against N are JSON numbers with 4 significant
digits; the long per-position arrays are packed (`pack`: 16-bit codes,
base64) so that the default report stays a few MB; `explorer_html`
lays out the controls, and `explorer_script` is the one small script that
draws the panel with the plotly.js already on the page. The browser only
chooses which measured numbers to show.
"""

import base64
import json
import math
from typing import Any

import torch
from torch import Tensor

from tl_geometry.analysis.envelopes import upper_envelope_facts
from tl_geometry.analysis.summaries import EFFECTIVE_MASS, at_each_head, by_query_position, effective_n
from tl_geometry.analysis.head_roles import NAMED, ROLE_LABELS, ROLES, HeadRoles
from tl_geometry.diagnostics.assumptions import ATTENTION_PROFILE
from tl_geometry.diagnostics.bounds import (
    BOUND_PRECISION_LOWER,
    BOUND_PRECISION_UPPER,
    BOUND_RECALL_LOWER,
    BOUND_PRECISION_REALISED,
    BOUND_RECALL_REALISED,
    BOUND_RECALL_UPPER,
)
from tl_geometry.diagnostics.chance import (
    CHANCE_PRECISION,
    CHANCE_PRECISION_FLOOR,
    CHANCE_RECALL,
    EXCESS_PRECISION,
    EXCESS_RECALL,
)
from tl_geometry.diagnostics.selection import ATTENTION_MASS, PRECISION, RECALL
from tl_geometry.diagnostics.role_features import CONTRIBUTION_BY_POSITION, COS_LAST_BY_POSITION
from tl_geometry.results.result import GeometryResult

HEATMAPS = ("heatmap-precision", "heatmap-recall")
"""The report's figures that the N slider drives and whose cells select a head."""
# Curves against N the panel draws when the result has them.
CURVES = (
    PRECISION, RECALL, CHANCE_PRECISION, CHANCE_RECALL, CHANCE_PRECISION_FLOOR,
    BOUND_PRECISION_UPPER, BOUND_PRECISION_LOWER, BOUND_RECALL_UPPER, BOUND_RECALL_LOWER,
    BOUND_PRECISION_REALISED, BOUND_RECALL_REALISED,
)  # fmt: skip
# Per-position views of each sequence's last analysed query (mean over documents), and their diagnostic.
ROWS = {ATTENTION_PROFILE: "assumptions", CONTRIBUTION_BY_POSITION: "roles", COS_LAST_BY_POSITION: "roles"}
# The per-head table's columns, each read at the head's effective N.
AT_EFFECTIVE_N = (PRECISION, RECALL, EXCESS_PRECISION, EXCESS_RECALL, CHANCE_PRECISION, CHANCE_RECALL)
DIGITS = 4
# Packed arrays: code 0 is NaN, 1 is zero on a log scale, 2..65535 spread evenly over [lo, hi] (of log10 x if log).
LOG_RANGE = (-12.0, 4.0)  # attention weights and contributions below 1e-12 show as 1e-12
LEVELS = 65533
QUERY_BUDGET = 2_000_000  # P and R by query position: values kept at most (the first N shown and its neighbours)


def pack(t: Tensor, lo: float, hi: float, log: bool = False) -> dict[str, Any]:
    """``t`` as 16-bit codes (little-endian, base64) with what decodes them.

    A code c >= 2 stands for ``lo + (c - 2) / LEVELS * (hi - lo)`` (of log10 x
    when ``log``); 0 is NaN, 1 is x <= 0 on a log scale. Values outside
    [lo, hi] are clipped. The step is (hi - lo) / 65533: 0.06 % relative on
    the log scale of ``LOG_RANGE``, 1.5e-5 on [0, 1].
    """
    x = t.detach().double().cpu().flatten()
    nan, nonpositive = x.isnan(), (x <= 0) if log else torch.zeros_like(x, dtype=torch.bool)
    v = torch.log10(x.clamp(min=1e-300)) if log else x
    codes = 2 + torch.round((v.clamp(lo, hi) - lo) / (hi - lo) * LEVELS)
    codes = torch.where(nan, 0, torch.where(nonpositive, 1, codes)).to(torch.int32)
    raw = codes.numpy().astype("<u2").tobytes()
    return {"b64": base64.b64encode(raw).decode("ascii"), "shape": list(t.shape), "lo": lo, "hi": hi, "log": log}


def _rounded(x: Any) -> Any:
    """Nested lists of floats with ``DIGITS`` significant digits; None for NaN and infinities (JSON has neither)."""
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    if isinstance(x, float):
        return float(f"{x:.{DIGITS}g}") if math.isfinite(x) else None
    return x


def _nested(t: Tensor) -> Any:
    return _rounded(t.double().tolist())


def _trim_positions(t: Tensor) -> Tensor:
    """Drop the trailing positions that no head has (NaN everywhere: beyond the longest sequence)."""
    seen = (~t.isnan()).flatten(0, -2).any(0).nonzero()
    return t[..., : int(seen.max()) + 1] if len(seen) else t[..., :0]


def _note(diagnostic: str) -> str:
    return f"needs the {diagnostic!r} diagnostic: analyse with diagnostics including {diagnostic!r} (the tl-geometry default)"


def default_head(result: GeometryResult, roles: HeadRoles | None) -> tuple[int, int]:
    """Indices of the head shown first: the example head of the first role that has one, else the first head."""
    if roles is not None:
        examples = roles.example_heads()
        for role in NAMED:
            where = examples[role]
            if where is not None:
                return result.layers.index(where[0]), result.heads.index(where[1])
    return 0, 0


def default_n_index(result: GeometryResult) -> int:
    """The heatmaps' first N: 4 (the paper's operating regime) if on the grid, else the smallest."""
    grid = result.n_grid.tolist()
    return grid.index(4) if 4 in grid else 0


def explorer_data(result: GeometryResult, roles: HeadRoles | None = None) -> dict[str, Any]:
    """What the head panel and the table show, as JSON-ready nested lists ``[layer][head_index]...``.

    Returns:
        ``layers``, ``heads``, ``grid``; ``curves`` (fields against N, with
        ``precision_low/high`` and ``recall_low/high`` where the result keeps
        bootstrap replicates), ``rows`` (per-position fields), ``table``
        (per-head scalars: role, its probabilities and runner-up, effective N, P and R and their
        excess over chance at the effective N), ``queries`` (P and R by query
        position, or None), ``notes`` (why a part is missing and which option
        adds it), ``selected`` and ``n_index`` (the first head and N shown).
    """
    fields = result.fields
    notes: dict[str, str] = {}
    curves = {spec.name: _nested(result.per_head(spec)) for spec in CURVES if spec.name in fields}
    for metric in (PRECISION, RECALL):
        if result.has_replicates(metric):
            low, high = result.ci(metric)
            curves[f"{metric.name}_low"], curves[f"{metric.name}_high"] = _nested(low), _nested(high)
    if CHANCE_PRECISION.name not in fields:
        notes["chance"] = "No chance levels: " + _note("chance") + "."
    if BOUND_PRECISION_UPPER.name not in fields:
        notes["bounds"] = "No envelopes: " + _note("bounds") + " (Euclidean distance only)."
        envelope_facts = None
    else:  # what the theorem's upper envelope bounds, said where it is drawn
        envelope_facts = upper_envelope_facts(result)
        notes["envelopes"] = envelope_facts.summary()
    rows = {}
    for spec in ROWS:
        if spec.name in fields:
            values = _trim_positions(result.per_head(spec))
            cosine = spec == COS_LAST_BY_POSITION
            rows[spec.name] = pack(values, -1.0, 1.0) if cosine else pack(values, *LOG_RANGE, log=True)
    if ATTENTION_PROFILE.name not in fields:
        notes["attention"] = "No attention row: it " + _note("assumptions") + "."
    if CONTRIBUTION_BY_POSITION.name not in fields:
        notes["contributions"] = "No contributions by position: they " + _note("roles") + "."

    shape = (len(result.layers), len(result.heads))
    nan = torch.full(shape, math.nan, dtype=torch.float64)
    table: dict[str, Any] = {}
    if ATTENTION_MASS.name in fields:
        eff = effective_n(result)
        table["effective_n"] = _nested(eff)
        for spec in AT_EFFECTIVE_N:
            values = at_each_head(result.per_head(spec), result.n_grid, eff) if spec.name in fields else nan
            table[f"{spec.name}_at_effective_n"] = _nested(values)
    else:
        notes["effective_n"] = ("No effective N: this result has no field 'attention_mass' (saved by an older "
                                "version); analyse again to record it.")
    if envelope_facts is not None:  # per head: the share of measured rows above the theorem's upper envelope
        table["precision_upper_exceeded"] = _nested(envelope_facts.precision_exceeded)
        table["recall_upper_exceeded"] = _nested(envelope_facts.recall_exceeded)
    if roles is not None:
        table["role"] = roles.label_names()
        table["probabilities"] = _nested(roles.probabilities)
        table["runner_up"] = [[ROLES[i] for i in row] for row in roles.runner_up.tolist()]
        table["confidence"] = _nested(roles.probabilities.nan_to_num(-1).amax(-1).clamp(min=0))
        table["describe"] = [[roles.describe(layer, head) for head in roles.heads] for layer in roles.layers]
        if bool(roles.probabilities.isnan().all()):
            notes["confidence"] = ("No role probabilities: the run kept no bootstrap replicates (n_bootstrap=0); "
                                   "analyse with the default n_bootstrap=200 (tl-geometry --bootstrap 200).")
    else:
        notes["role"] = "No role: it " + _note("roles") + "."

    queries = None
    if result.queries is not None and PRECISION.name in result.queries:
        positions, precision = by_query_position(result, PRECISION)
        _, recall = by_query_position(result, RECALL)
        if len(positions) > 1:
            per_n = 2 * precision[..., 0].numel()
            room = max(1, min(len(result.n_grid), QUERY_BUDGET // per_n))
            start = default_n_index(result)  # the N the page opens at, then its neighbours on the grid
            kept = sorted(sorted(range(len(result.n_grid)), key=lambda k: (abs(k - start), k))[:room])
            queries = {"positions": positions, "n_index": kept, PRECISION.name: pack(precision[..., kept], 0.0, 1.0),
                       RECALL.name: pack(recall[..., kept], 0.0, 1.0)}
            if room < len(result.n_grid):
                notes["queries"] = (f"P and R by query position are kept for N in {result.n_grid[kept].tolist()} only "
                                    "(the page stays small); analyse fewer positions or heads to see every N.")
        else:
            notes["queries"] = (f"P and R by query position: this run kept one query position ({positions}); analyse "
                                "with query_positions='all' or a list, and keep_queries=True "
                                "(--queries all --keep-queries).")
    else:
        notes["queries"] = ("P and R by query position need per-query rows: analyse with keep_queries=True and "
                            "query_positions='all' or a list (tl-geometry --keep-queries --queries all).")
    return {
        "layers": list(result.layers), "heads": list(result.heads), "grid": result.n_grid.tolist(),
        "mass": EFFECTIVE_MASS, "named": list(NAMED), "roles": list(ROLES), "role_labels": list(ROLE_LABELS),
        "curves": curves, "rows": rows, "table": table, "queries": queries, "notes": notes,
        "selected": list(default_head(result, roles)), "n_index": default_n_index(result),
    }  # fmt: skip


def _json_for_script(data: dict[str, Any]) -> str:
    """JSON safe inside a ``<script>`` element: no ``<`` at all (written ``\\u003c``, the same string to JSON).

    Escaping ``</`` alone is not enough: ``<!--<script>`` in a string puts the
    HTML parser in the script's double-escaped state, where the element's own
    ``</script>`` no longer ends it and the rest of the page becomes its text.
    """
    return json.dumps(data, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")


def explorer_html(result: GeometryResult, roles: HeadRoles | None, heatmaps: str) -> str:
    """The explorer section: the N slider, the heatmaps (``heatmaps``: their drawn HTML), the head panel, the table."""
    data = explorer_data(result, roles)
    options = "\n".join(
        f'<option value="{i},{j}">layer {layer}, head {head}'
        + (f" ({data['table']['role'][i][j]})" if "role" in data["table"] else "") + "</option>"
        for i, layer in enumerate(result.layers) for j, head in enumerate(result.heads)
    )  # fmt: skip
    grid = data["grid"]
    return f"""<section id="explorer">
<h2>Head explorer</h2>
<p class="how">Choose a head by clicking a heatmap cell, from the list or from the table; the panel shows what the run
measured for it. A head's <b>effective N</b> is the smallest N of the grid whose top-N set holds at least
{100 * EFFECTIVE_MASS:.0f} % of its attention (field <code>attention_mass</code>, the sum of alpha_i over the top-N set,
averaged over the analysed queries and documents): read P and R near it, and against their chance level.</p>
<p><label for="n-slider">N for the heatmaps and the query-position plot:
<input type="range" id="n-slider" min="0" max="{len(grid) - 1}" step="1" value="{data['n_index']}">
<output id="n-value">{grid[data['n_index']]}</output></label></p>
{heatmaps}
<p><label for="head-select">Head: <select id="head-select">{options}</select></label></p>
<div id="head-panel">
<h3 id="head-title"></h3>
<p id="head-info"></p>
<div id="head-curves" class="panel-plot"></div>
<div id="head-rows" class="panel-plot"></div>
<div id="head-queries" class="panel-plot"></div>
<p id="head-notes" class="how"></p>
</div>
<h3>All heads</h3>
<p class="how">Click a column title to sort, a row to show that head. P and R are read at each head's effective N;
"excess" is the measured value minus the mean of random top-N sets of the same size (chance diagnostic).</p>
<table id="heads-table" class="sortable"><thead></thead><tbody></tbody></table>
<script type="application/json" id="explorer-data">{_json_for_script(data)}</script>
</section>"""


def explorer_script() -> str:
    """The explorer's one inline script (plain JavaScript; plotly.js is loaded before it)."""
    return "<script>\n" + _SCRIPT + "\n</script>"


_SCRIPT = r"""
window.addEventListener("load", function () {
  "use strict";
  const D = JSON.parse(document.getElementById("explorer-data").textContent);
  const G = D.grid, C = D.curves, T = D.table, Q = D.queries;
  function unpack(p) {  // see pack() in tl_geometry/report/explorer.py
    const bin = atob(p.b64), out = new Array(bin.length / 2), step = (p.hi - p.lo) / 65533;
    for (let i = 0; i < out.length; i++) {
      const c = bin.charCodeAt(2 * i) | (bin.charCodeAt(2 * i + 1) << 8), v = p.lo + (c - 2) * step;
      out[i] = c < 2 ? null : (p.log ? Math.pow(10, v) : v);
    }
    return {values: out, shape: p.shape};
  }
  const R = {};
  for (const name in D.rows) R[name] = unpack(D.rows[name]);
  const QP = Q ? unpack(Q.precision) : null, QR = Q ? unpack(Q.recall) : null;
  const headRow = (a, i, j) => { const n = a.shape[2], at = (i * a.shape[1] + j) * n; return a.values.slice(at, at + n); };
  let layer = D.selected[0], head = D.selected[1], nAt = D.n_index;
  const byId = (id) => document.getElementById(id);
  const num = (v, d) => (v === null || v === undefined) ? "n/a" : Number(v).toFixed(d === undefined ? 3 : d);
  const signed = (v) => (v === null || v === undefined) ? "n/a" : (v >= 0 ? "+" : "") + Number(v).toFixed(3);
  const nAxis = (title) => ({type: "log", title: {text: title},
                             range: [Math.log10(G[0]), Math.log10(G[G.length - 1]) * 1.02 + 0.01]});
  const at = (name) => (C[name] ? C[name][layer][head] : null);
  const line = (x, y, name, color, dash, axes, extra) => Object.assign(
    {x: x, y: y, name: name, mode: "lines", line: {color: color, dash: dash || "solid"},
     xaxis: axes[0], yaxis: axes[1]}, extra || {});

  function curveTraces(metric, axes, legend) {
    const out = [];
    if (C[metric + "_low"]) {
      out.push(line(G, C[metric + "_high"][layer][head], "", "rgba(0,0,0,0)", "solid", axes,
                    {showlegend: false, hoverinfo: "skip", line: {width: 0}}));
      out.push(line(G, C[metric + "_low"][layer][head], "95 % bootstrap interval", "rgba(0,0,0,0)", "solid", axes,
                    {fill: "tonexty", fillcolor: "rgba(0,114,178,0.15)", line: {width: 0}, hoverinfo: "skip",
                     showlegend: legend && metric === "recall", legendgroup: "ci"}));
    }
    out.push(line(G, at(metric), "measured", "#0072B2", "solid", axes,
                  {mode: "lines+markers", showlegend: legend, legendgroup: "m"}));
    if (C["chance_" + metric]) out.push(line(G, at("chance_" + metric), "chance: random top-N sets", "#7F7F7F",
                                             "solid", axes, {showlegend: legend, legendgroup: "c"}));
    if (metric === "precision" && C.chance_precision_floor) out.push(line(G, at("chance_precision_floor"),
      "floor N / L", "#7F7F7F", "dot", axes, {showlegend: legend, legendgroup: "f"}));
    const exceeded = T[metric + "_upper_exceeded"] ? T[metric + "_upper_exceeded"][layer][head] : null;
    const upperName = "Theorems 1-2 upper envelope (bounds re-drawn rows, not the measured ones" +
      (exceeded === null ? "" : "; measured rows above it: " + (100 * exceeded).toFixed(1) + " %") + ")";
    for (const [side, dash, color, label] of [["upper", "dot", "#E69F00", upperName],
                                              ["lower", "dash", "#009E73", "Theorems 1-2 lower envelope"]]) {
      const name = "bound_" + metric + "_" + side;
      if (C[name]) out.push(line(G, at(name), label, color, dash, axes,
                                 {showlegend: side === "upper" || legend, legendgroup: side + metric}));
    }
    const realised = "bound_" + metric + "_realised";
    if (C[realised]) out.push(line(G, at(realised), "bound on the measured rows: 1 - 1{r_min <= r_max}/(N+1) (P), /N (R)",
                                   "#D55E00", "dashdot", axes, {showlegend: legend, legendgroup: "realised"}));
    return out;
  }

  function marks() {  // vertical lines at the effective N (solid) and the slider's N (dotted)
    const shapes = [];
    const eff = T.effective_n ? T.effective_n[layer][head] : null;
    for (const [x, dash] of [[eff, "solid"], [G[nAt], "dot"]]) {
      if (x === null) continue;
      for (const ref of ["x", "x2"]) shapes.push({type: "line", xref: ref, yref: "paper", x0: x, x1: x, y0: 0, y1: 1,
                                                   line: {color: "#D55E00", width: 1, dash: dash}});
    }
    return shapes;
  }

  function drawCurves() {
    const traces = curveTraces("precision", ["x", "y"], true).concat(curveTraces("recall", ["x2", "y2"], false));
    Plotly.react("head-curves", traces, {
      template: "plotly_white", height: 380, margin: {t: 60},
      title: {text: "P(r_max, N) and R(r_min, N); red: effective N (solid), slider N (dotted)"},
      xaxis: Object.assign(nAxis("N (selected keys)"), {domain: [0, 0.45]}),
      xaxis2: Object.assign(nAxis("N (selected keys)"), {domain: [0.55, 1], anchor: "y2"}),
      yaxis: {title: {text: "Precision"}, range: [0, 1.05]},
      yaxis2: {title: {text: "Recall"}, range: [0, 1.05], anchor: "x2"},
      legend: {orientation: "h", y: -0.25}, shapes: marks()});
  }

  function drawRows() {
    const traces = [], layout = {template: "plotly_white", height: 340, margin: {t: 60}, showlegend: false,
      title: {text: "Last analysed query, mean over documents: attention row (left), ||alpha_i v_i|| (right)"},
      xaxis: {domain: [0, 0.45], title: {text: "key position (0 = sink)"}},
      yaxis: {type: "log", title: {text: "alpha_i"}},
      xaxis2: {domain: [0.55, 1], anchor: "y2", title: {text: "key position (0 = sink)"}},
      yaxis2: {type: "log", anchor: "x2", title: {text: "||alpha_i v_i||"}}};
    if (R.attention_profile) {
      const y = headRow(R.attention_profile, layer, head);
      traces.push({x: y.map((_, i) => i), y: y, mode: "markers", marker: {color: "#0072B2", size: 4},
                   name: "attention", hovertemplate: "position %{x}: alpha = %{y:.3g}<extra></extra>"});
    }
    if (R.contribution_by_position) {
      const y = headRow(R.contribution_by_position, layer, head);
      traces.push({x: y.map((_, i) => i), y: y, xaxis: "x2", yaxis: "y2", mode: "markers", name: "contribution",
                   marker: {color: headRow(R.cos_last_by_position, layer, head), colorscale: "RdBu", cmin: -1, cmax: 1, size: 5,
                            showscale: true, colorbar: {title: {text: "cos(v_i, v_L)"}}},
                   hovertemplate: "position %{x}: ||alpha_i v_i|| = %{y:.3g}<extra></extra>"});
    }
    Plotly.react("head-rows", traces, layout);
  }

  function drawQueries() {
    const div = byId("head-queries");
    if (!Q) { div.style.display = "none"; return; }
    const k = Q.n_index.indexOf(nAt), kept = Q.n_index.length, positions = Q.positions.length;
    const pick = (a) => Q.positions.map((_, q) => k < 0 ? null : a.values[((layer * D.heads.length + head) * positions + q) * kept + k]);
    Plotly.react(div, [
      {x: Q.positions, y: pick(QP), name: "Precision", mode: "lines+markers", line: {color: "#0072B2"}},
      {x: Q.positions, y: pick(QR), name: "Recall", mode: "lines+markers", line: {color: "#E69F00", dash: "dash"}},
    ], {template: "plotly_white", height: 320, margin: {t: 60}, legend: {orientation: "h", y: -0.3},
        title: {text: k < 0 ? "P and R by query position: not kept at N = " + G[nAt] + " (see the note below)"
                            : "P and R by query position at N = " + G[nAt] + " (mean over documents)"},
        xaxis: {title: {text: "query position (0 = sink)"}}, yaxis: {range: [0, 1.05]}});
  }

  function describe() {
    const parts = [];
    if (T.role) {
      parts.push("<b>What kind of head is this?</b> " + T.describe[layer][head] + ".");
    }
    if (T.effective_n) {
      const eff = T.effective_n[layer][head];
      if (eff === null) parts.push("<b>Effective N:</b> no N of the grid holds " + 100 * D.mass + " % of the attention.");
      else parts.push("<b>Effective N = " + eff + "</b> (the top-" + eff + " keys hold at least " + 100 * D.mass +
        " % of the attention). There: P = " + num(T.precision_at_effective_n[layer][head]) + " (chance " +
        num(T.chance_precision_at_effective_n[layer][head]) + ", excess " + signed(T.excess_precision_at_effective_n[layer][head]) +
        "), R = " + num(T.recall_at_effective_n[layer][head]) + " (chance " + num(T.chance_recall_at_effective_n[layer][head]) +
        ", excess " + signed(T.excess_recall_at_effective_n[layer][head]) + ").");
    }
    return parts.join("<br>");
  }

  function highlight() {  // a frame around the chosen cell of each heatmap, and the chosen table row
    // The heatmaps' axes are categories (plots.fit_cells): a cell's coordinates are its indices, not its labels.
    for (const id of HEATMAPS) if (byId(id)) Plotly.relayout(id, {shapes: [{type: "rect", x0: head - 0.5, x1: head + 0.5,
      y0: layer - 0.5, y1: layer + 0.5, line: {color: "#D55E00", width: 3}}]});
    for (const tr of byId("heads-table").tBodies[0].rows) tr.classList.toggle("chosen", tr.dataset.key === layer + "," + head);
  }

  function show(i, j) {
    if (i < 0 || j < 0) return;
    layer = i; head = j;
    const panel = byId("head-panel");
    panel.dataset.layer = D.layers[i]; panel.dataset.head = D.heads[j];
    byId("head-title").textContent = "Layer " + D.layers[i] + ", head " + D.heads[j];
    byId("head-select").value = i + "," + j;
    byId("head-info").innerHTML = describe();
    byId("head-notes").textContent = Object.values(D.notes).join(" ");
    drawCurves(); drawRows(); drawQueries(); highlight();
  }

  const HEATMAPS = ["heatmap-precision", "heatmap-recall"];
  function setN(index) {
    nAt = index;
    byId("n-value").textContent = G[nAt];
    for (const id of HEATMAPS) {
      if (!byId(id) || !C[id.slice(8)]) continue;
      const metric = id.slice(8);
      Plotly.restyle(id, {z: [C[metric].map((row) => row.map((curve) => curve[nAt]))]}, [0]);
      Plotly.relayout(id, {"title.text": metric + " at N = " + G[nAt] + ", per layer and head"});
    }
    drawCurves(); drawQueries();
  }

  function buildTable() {
    const columns = [["layer", (i, j) => D.layers[i]], ["head", (i, j) => D.heads[j]]];
    if (T.role) columns.push(["role", (i, j) => T.role[i][j]], ["probability", (i, j) => T.confidence[i][j]],
                                 ["runner-up", (i, j) => T.runner_up[i][j]]);
    if (T.effective_n) columns.push(
      ["effective N", (i, j) => T.effective_n[i][j]], ["P at eff. N", (i, j) => T.precision_at_effective_n[i][j]],
      ["R at eff. N", (i, j) => T.recall_at_effective_n[i][j]],
      ["P excess", (i, j) => T.excess_precision_at_effective_n[i][j]],
      ["R excess", (i, j) => T.excess_recall_at_effective_n[i][j]]);
    const table = byId("heads-table"), body = table.tBodies[0];
    table.tHead.innerHTML = "<tr>" + columns.map((c) => "<th>" + c[0] + "</th>").join("") + "</tr>";
    D.layers.forEach((_, i) => D.heads.forEach((_, j) => {
      const tr = body.insertRow();
      tr.dataset.key = i + "," + j;
      for (const [name, value] of columns) {
        const v = value(i, j), td = tr.insertCell();
        td.dataset.value = v === null ? "" : v;
        td.textContent = typeof v === "number" && !Number.isInteger(v) ? num(v) : (v === null ? "n/a" : v);
      }
      tr.addEventListener("click", () => show(i, j));
    }));
    Array.from(table.tHead.rows[0].cells).forEach((th, k) => th.addEventListener("click", () => {
      const down = th.dataset.order !== "descending";
      const key = (tr) => { const v = tr.cells[k].dataset.value; return v === "" || isNaN(v) ? v : Number(v); };
      const rows = Array.from(body.rows).sort((a, b) => {
        const x = key(a), y = key(b);
        if (x === "" || y === "") return (x === "") - (y === "");  // missing values last
        return (x < y ? -1 : x > y ? 1 : 0) * (down ? -1 : 1);
      });
      rows.forEach((tr) => body.appendChild(tr));
      for (const other of table.tHead.rows[0].cells) delete other.dataset.order;
      th.dataset.order = down ? "descending" : "ascending";
    }));
  }

  buildTable();
  byId("head-select").addEventListener("change", (e) => show(...e.target.value.split(",").map(Number)));
  byId("n-slider").addEventListener("input", (e) => setN(Number(e.target.value)));
  for (const id of HEATMAPS) {
    if (byId(id)) byId(id).on("plotly_click",
                              (e) => show(D.layers.indexOf(Number(e.points[0].y)), D.heads.indexOf(Number(e.points[0].x))));
  }
  show(layer, head);
  document.body.dataset.explorer = "ready";
});
"""
