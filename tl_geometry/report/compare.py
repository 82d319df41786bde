"""Two results side by side (e.g. SmolLM2 and Gemma-3): one figure per claim of the paper, and both claims tables.

The figures only draw the evidence `tl_geometry.analysis.claims` gathered for
each claim; `compare` returns a `Comparison` (printed as the verdicts side by
side) and, given a folder or on ``.save``, writes ``OUT/compare.html``
(self-contained, plotly.js embedded once, opens offline) and
``OUT/claims_<name>.csv`` for each result, committed together so that an
interrupted write leaves OUT as it was.
"""

import html
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tl_geometry.analysis.claims import CLAIMS, Claim, claim_list, claims_table
from tl_geometry.atomic_io import commit_unit
from tl_geometry.diagnostics.selection import PRECISION, RECALL
from tl_geometry.errors import GeometryError
from tl_geometry.report.scorecard import VERDICT_COLOURS
from tl_geometry.results.display import Summary, plural
from tl_geometry.results.result import GeometryResult

# plotly is imported where a figure is drawn: `tl_geometry.compare` is exported and the package imports cheaply.

COLOURS = ("#0072B2", "#D55E00")  # result A, result B (Okabe-Ito)


def _label(claim: Claim, name: str) -> str:
    value = "not measured" if math.isnan(claim.value) else f"{claim.value:.3g}"
    return f"{name}: {value} ({claim.verdict})"


def _histogram(key: str, pair: list[tuple[str, Claim]]) -> Any:
    """The claim's per-head values (its one piece of evidence) of both results, overlaid."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for (name, claim), colour in zip(pair, COLOURS):
        for _, values in claim.evidence.values():
            fig.add_trace(go.Histogram(x=values[~values.isnan()].tolist(), name=_label(claim, name),
                                       marker_color=colour, opacity=0.6, histnorm="percent"))
    fig.update_layout(barmode="overlay", xaxis_title=CLAIMS[key].figure_axis, yaxis_title="% of heads")
    return fig


def _share(key: str, pair: list[tuple[str, Claim]]) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    for (name, claim), colour in zip(pair, COLOURS):
        fig.add_trace(go.Bar(x=[name], y=[None if math.isnan(claim.value) else claim.value],
                             name=_label(claim, name), marker_color=colour))
    fig.update_layout(yaxis_title=CLAIMS[key].statistic, yaxis_range=[0, 1])
    return fig


def _curves(key: str, pair: list[tuple[str, Claim]], names: tuple[str, ...], dashes: dict[str, str]) -> Any:
    """One panel per metric: each result's curves of the claim's evidence against N."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    metrics = [m.name for m in (PRECISION, RECALL) if any(k.startswith(m.name) for _, c in pair for k in c.evidence)]
    metrics = metrics or ["pearson"]
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=metrics)
    for col, metric in enumerate(metrics, start=1):
        for (name, claim), colour in zip(pair, COLOURS):
            for suffix in names:
                series = claim.evidence.get(metric + suffix)
                if series is None:
                    continue
                x, y = series
                what = suffix.strip("_") or "measured"
                fig.add_trace(
                    go.Scatter(x=x.tolist(), y=[None if math.isnan(v) else v for v in y.tolist()], mode="lines",
                               line={"color": colour, "dash": dashes[suffix]},
                               name=f"{_label(claim, name)}, {what}" if suffix == "" else f"{name}: {what}",
                               showlegend=col == 1),
                    row=1, col=col,
                )
        fig.update_xaxes(type="log", title="N (selected keys)", row=1, col=col)
    return fig


def _roles_by_depth(pair: list[tuple[str, Claim]]) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    dashes = {"retriever": "solid", "reset": "dot", "mixer": "dash"}
    for (name, claim), colour in zip(pair, COLOURS):
        for role, dash in dashes.items():
            if role not in claim.evidence:
                continue
            layers, counts = claim.evidence[role]
            depth = [(i / max(1, len(layers) - 1)) for i in range(len(layers))]
            fig.add_trace(go.Scatter(x=depth, y=counts.tolist(), mode="lines", line={"color": colour, "dash": dash},
                                     name=f"{name}: {role}"))
    fig.update_layout(xaxis_title="depth (0 first analysed layer, 1 last)", yaxis_title="heads with the label")
    return fig


def _draw(key: str, pair: list[tuple[str, Claim]]) -> Any:
    """The figure the claim's declaration says its evidence needs (`PaperClaim.figure`)."""
    figure = CLAIMS[key].figure
    if figure == "per_head":
        return _histogram(key, pair)
    if figure == "share":
        return _share(key, pair)
    if figure == "curves":
        return _curves(key, pair, ("",), {"": "solid"})
    if figure == "role_curves":
        return _curves(key, pair, ("_retriever", "_reset", "_mixer"),
                       {"_retriever": "solid", "_reset": "dot", "_mixer": "dash"})
    if figure == "roles_by_depth":
        return _roles_by_depth(pair)
    return _curves(key, pair, ("", "_lower", "_upper"), {"": "solid", "_lower": "dash", "_upper": "dot"})


def _with_interval(claim: Claim) -> str:
    """The value with its interval, e.g. ``0.534 [0.413, 0.6]``."""
    if math.isnan(claim.value):
        return "no value"
    interval = "" if math.isnan(claim.low) else f" [{claim.low:.3g}, {claim.high:.3g}]"
    return f"{claim.value:.3g}{interval}"


def _names(a: GeometryResult, b: GeometryResult) -> tuple[str, str]:
    if a.model_name != b.model_name:
        return a.model_name, b.model_name
    return f"{a.model_name} (A)", f"{b.model_name} (B)"


def compare_html(a: GeometryResult, b: GeometryResult) -> str:
    """The comparison page of two results: per claim, both verdicts and one figure (plotly.js embedded once)."""
    return _page(_names(a, b), claim_list(a), claim_list(b))


def _page(names: tuple[str, str], claims_a: list[Claim], claims_b: list[Claim]) -> str:
    sections = []
    for index, (ca, cb) in enumerate(zip(claims_a, claims_b)):
        fig = _draw(ca.key, [(names[0], ca), (names[1], cb)])
        fig.update_layout(title=f"{ca.claim} ({ca.paper_ref})", template="plotly_white", height=420)
        cells = "".join(
            f'<td><b style="color:{VERDICT_COLOURS[c.verdict][0]}">{html.escape(c.verdict)}</b>, '
            f"{html.escape(_with_interval(c))}: {html.escape(c.measured)}<br><i>Would change: "
            f"{html.escape(c.flip)}</i></td>"
            for c in (ca, cb)
        )
        div = fig.to_html(full_html=False, include_plotlyjs=index == 0, div_id=f"compare-{ca.key}")
        sections.append(
            f'<section id="section-{ca.key}"><h2>{html.escape(ca.claim)}</h2>'
            f"<p>The paper ({html.escape(ca.paper_ref)}): {html.escape(ca.paper_value)}. "
            f"Statistic: {html.escape(ca.statistic)}; {html.escape(ca.rule)}.</p>"
            f"<table><tr><th>{html.escape(names[0])}</th><th>{html.escape(names[1])}</th></tr><tr>{cells}</tr>"
            f"</table>{div}</section>"
        )
    title = f"{names[0]} and {names[1]}: the paper's claims side by side"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }}
table {{ border-collapse: collapse; width: 100%; }} th, td {{ text-align: left; padding: 0.3em 0.8em 0.3em 0;
vertical-align: top; width: 50%; }}
</style></head><body><h1>{html.escape(title)}</h1>
<p>Each claim of "Geometric Analysis of Token Selection in Multi-Head Attention" measured on both results
(tl_geometry.analysis.claims states the statistics and the verdict rule).</p>
{"".join(sections)}
</body></html>
"""


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "result"


def _load(source: object, which: str) -> GeometryResult:
    if isinstance(source, GeometryResult):
        return source
    if not isinstance(source, (str, os.PathLike)):
        raise GeometryError(f"{which}: expected a GeometryResult or the path of a saved result, got "
                            f"{type(source).__name__}")
    path = Path(source)
    stem = path / "result" if path.is_dir() else path
    npz, json_path = GeometryResult.paths(stem)
    missing = [str(p) for p in (npz, json_path) if not p.is_file()]
    if missing:
        raise GeometryError(f"{which}: {' and '.join(missing)} not found; pass a result saved by "
                            "GeometryResult.save or written by tl-geometry analyze / report (or its folder)")
    return GeometryResult.load(stem)


@dataclass(frozen=True, repr=False)
class Comparison:
    """Two results' claims side by side: printed as a summary, shown as a table in a notebook, saved as a page.

    Attributes:
        a, b: the two results.
        names: how the page and the tables name them (the model names, with
            " (A)" and " (B)" when they are the same).
        claims_a, claims_b: `tl_geometry.analysis.claims.Claim` of each, in the paper's order.
        path: ``compare.html`` once written (`save`, or ``compare(a, b, out)``), else None.
    """

    a: GeometryResult
    b: GeometryResult
    names: tuple[str, str]
    claims_a: tuple[Claim, ...]
    claims_b: tuple[Claim, ...]
    path: Path | None = None

    def table(self) -> Any:
        """One row per claim (index: its key): the claim and each result's verdict and value with its interval."""
        import pandas as pd

        rows = [{"claim": ca.claim, f"verdict {self.names[0]}": ca.verdict, f"value {self.names[0]}": _with_interval(ca),
                 f"verdict {self.names[1]}": cb.verdict, f"value {self.names[1]}": _with_interval(cb)}
                for ca, cb in zip(self.claims_a, self.claims_b)]
        return pd.DataFrame(rows, index=pd.Index([c.key for c in self.claims_a], name="key"))

    def html(self) -> str:
        """The comparison page: per claim, both verdicts and one figure (plotly.js embedded once)."""
        return _page(self.names, list(self.claims_a), list(self.claims_b))

    def save(self, out: str | os.PathLike) -> "Comparison":
        """Write ``out/compare.html`` and ``out/claims_<name>.csv`` for each result, committed together (files
        already in ``out`` are kept); the comparison with `path` set."""
        out = Path(out)
        if out.exists() and not out.is_dir():
            raise GeometryError(f"out: {out} is a file, not a folder; pass a folder for the comparison (it is created)")
        page = self.html()  # everything is drawn before anything is written
        tables = {f"claims_{_slug(name)}.csv": claims_table(rows).to_csv().encode("utf-8")
                  for name, rows in zip(self.names, (self.claims_a, self.claims_b))}
        out.mkdir(parents=True, exist_ok=True)
        index = out / "compare.html"
        with commit_unit(out) as unit:
            unit.write(index, lambda f: f.write(page.encode("utf-8")))
            for filename, data in tables.items():
                unit.write(out / filename, _writer(data))
        return replace(self, path=index)

    def __fspath__(self) -> str:
        # compare(a, b, out) returned the page's path before it returned a Comparison: open(...) still works.
        if self.path is None:
            raise TypeError("this comparison is not saved; call comparison.save(folder) first")
        return str(self.path)

    def _summary(self) -> Summary:
        same = sum(ca.verdict == cb.verdict for ca, cb in zip(self.claims_a, self.claims_b))
        rows = [(f"{label}", f"{name}: {plural(r.n_documents, 'document')}, {plural(len(r.layers), 'layer')} x "
                             f"{plural(len(r.heads), 'head')}, {len(r.n_grid)} N")
                for label, name, r in (("A", self.names[0], self.a), ("B", self.names[1], self.b))]
        rows.append(("verdicts", f"the same on {same} of {len(self.claims_a)} claims (A / B below)"))
        rows += [(ca.key, f"{ca.verdict} / {cb.verdict}") for ca, cb in zip(self.claims_a, self.claims_b)]
        rows.append(("next", f"written to {self.path}" if self.path else
                     "comparison.table() (values and intervals); comparison.save(folder) writes compare.html "
                     "and both claims tables"))
        return Summary(f"Comparison of {self.names[0]} and {self.names[1]}", tuple(rows))

    def __repr__(self) -> str:
        return self._summary().text()

    def _repr_html_(self) -> str:
        return self._summary().html()


def compare(a: object, b: object, out: str | os.PathLike | None = None) -> Comparison:
    """The side-by-side comparison of two results' claims; with ``out``, also written there.

    Args:
        a: a result, or the path of a saved result (a stem, ``.npz`` file, or a folder holding ``result``).
        b: the second result, likewise.
        out: an output folder (created; files already in it other than the
            ones written are kept): ``out/compare.html`` and ``claims_<model
            A>.csv`` and ``claims_<model B>.csv`` (`tl_geometry.claims` of
            each, ``evidence`` left out). None (default): nothing is written;
            call ``.save(folder)`` later.

    Returns:
        A `Comparison`: print it for the verdicts side by side, ``.table()``
        for the values, ``.html()`` for the page; ``.path`` is the page once
        written (and the comparison reads as that path, ``open(compare(a, b, out))``).

    Raises:
        GeometryError: a missing or unreadable result, or ``out`` is a file.
    """
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        raise GeometryError(f"out: {out} is a file, not a folder; pass a folder for the comparison (it is created)")
    first, second = _load(a, "a"), _load(b, "b")
    comparison = Comparison(first, second, _names(first, second), tuple(claim_list(first)), tuple(claim_list(second)))
    return comparison if out is None else comparison.save(out)


def _writer(data: bytes) -> Callable:
    return lambda f: f.write(data)
