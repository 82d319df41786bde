"""``tl-geometry intervene`` on the real default model, at a tiny size."""

import json
import math

import pytest

from tests.fixtures import spy
from tl_geometry.cli import main
from tl_geometry.results.intervention_result import InterventionResult

pytestmark = [pytest.mark.slow, pytest.mark.model, pytest.mark.usefixtures("shared_default_model")]


def test_intervene_writes_the_sweep_n_star_and_the_page(tmp_path, capsys, monkeypatch):
    from tl_geometry.interventions import sweep as sweeps

    calls = {name: spy(monkeypatch, sweeps, name) for name in ("intervention_sweep", "effective_set_size")}
    out = tmp_path / "run"
    code = main(["intervene", "--windows", "2", "--context", "12", "--n-grid", "1,4", "--controls", "1",
                 "--scope", "layer", "--layers", "0,1,2", "--n-star", "--taus", "0.05", "--bootstrap", "4",
                 "--settings-per-pass", "8", "--quiet", "--out", str(out)])
    assert code == 0
    # The stacked settings are passed on to the sweep and to the N*_tau search.
    assert {name: [k.get("settings_per_pass") for _, k in c] for name, c in calls.items()} == {
        "intervention_sweep": [8], "effective_set_size": [8]}
    sweep = InterventionResult.load(out / "sweep")
    assert sweep.layers == (0, 1, 2) and sweep.n_grid.tolist() == [1, 4] and sweep.n_documents == 2
    n_star = strict_json(out / "n_star.json")
    assert n_star["layers"] == [0, 1, 2] and len(n_star["taus"]["0.05"]["n_star"]) == 3
    correlation = strict_json(out / "correlation.json")
    assert correlation["n_grid"] == [1, 4] and correlation["units"] == [[0, -1], [1, -1], [2, -1]]
    # The saved dNLL is the sweep's, and each saved rho is the Spearman of the saved columns.
    nan = lambda v: math.nan if v is None else v  # noqa: E731 (strict JSON writes a missing value as null)
    correlation = {key: [[nan(v) for v in row] for row in correlation[key]] if key in ("geometry", "dnll") else
                   [nan(v) for v in correlation[key]] if key == "spearman" else value
                   for key, value in correlation.items()}
    saved = [value for row in correlation["dnll"] for value in row]
    assert saved == pytest.approx(sweep.dnll("renormalise").reshape(-1).tolist(), rel=1e-6)
    assert all(0 <= value <= 1 for row in correlation["geometry"] for value in row)  # F_N, a layer's mean over heads
    for column, rho in enumerate(correlation["spearman"]):
        want = reference_spearman([row[column] for row in correlation["geometry"]],
                                  [row[column] for row in correlation["dnll"]])
        assert (math.isnan(want) and math.isnan(rho)) or rho == pytest.approx(want, abs=1e-6)
    page = (out / "interventions.html").read_text()
    for key in ("interventions-dnll", "interventions-nstar", "interventions-geometry"):
        assert f'id="section-{key}"' in page
    printed = capsys.readouterr().out
    assert "relative dNLL (renormalise)" in printed and "correlation.json" in printed


def strict_json(path) -> dict:
    """The file parsed as strict JSON: a bare NaN or Infinity (Python's extension) fails the test."""
    def refuse(constant: str) -> None:
        raise AssertionError(f"{path.name} holds {constant}, which is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


def reference_spearman(xs: list[float], ys: list[float]) -> float:
    """Pearson correlation of average ranks over the pairs with no NaN (NaN when a side is constant)."""
    pairs = [(x, y) for x, y in zip(xs, ys) if not (math.isnan(x) or math.isnan(y))]

    def ranks(values: list[float]) -> list[float]:
        return [sum(v < w for v in values) + (sum(v == w for v in values) + 1) / 2 for w in values]

    rx, ry = ranks([x for x, _ in pairs]), ranks([y for _, y in pairs])
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return cov / var if var > 0 else math.nan


def test_intervene_refuses_every_n(tmp_path, capsys):
    code = main(["intervene", "--n-grid", "all", "--windows", "1", "--context", "8", "--quiet", "--out", str(tmp_path)])
    assert code == 1
    assert "--n-grid: intervene needs a list of N like 1,2,4,8 (each N is a forward pass), not 'all'" in capsys.readouterr().err
