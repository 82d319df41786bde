"""``tl-geometry intervene`` on the real default model, at a tiny size."""

import json

import pytest

from tl_geometry.cli import main
from tl_geometry.results.interventions import InterventionResult

pytestmark = [pytest.mark.slow, pytest.mark.model]


def test_intervene_writes_the_sweep_n_star_and_the_page(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["intervene", "--windows", "2", "--context", "12", "--n-grid", "1,4", "--controls", "1",
                 "--scope", "layer", "--layers", "0,1", "--n-star", "--taus", "0.05", "--bootstrap", "4",
                 "--quiet", "--out", str(out)])
    assert code == 0
    sweep = InterventionResult.load(out / "sweep")
    assert sweep.layers == (0, 1) and sweep.n_grid.tolist() == [1, 4] and sweep.n_documents == 2
    n_star = json.loads((out / "n_star.json").read_text())
    assert n_star["layers"] == [0, 1] and len(n_star["taus"]["0.05"]["n_star"]) == 2
    page = (out / "interventions.html").read_text()
    for key in ("interventions-dnll", "interventions-nstar", "interventions-geometry"):
        assert f'id="section-{key}"' in page
    assert "relative dNLL (renormalise)" in capsys.readouterr().out


def test_intervene_refuses_every_n(tmp_path, capsys):
    code = main(["intervene", "--n-grid", "all", "--windows", "1", "--context", "8", "--quiet", "--out", str(tmp_path)])
    assert code == 1
    assert "--n-grid: intervene needs a list of N like 1,2,4,8 (each N is a forward pass), not 'all'" in capsys.readouterr().err
