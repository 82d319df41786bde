"""tl_geometry.compare and `tl-geometry compare OUT A B`: two results side by side, one figure per claim."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from tests import tiny_models as tm
from tl_geometry import GeometryError, claims, compare, run_with_geometry_hooks
from tl_geometry.analysis.claims import CLAIMS
from tl_geometry.cli import main
from tl_geometry.results.result import REQUIRED_FIELDS


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Two saved results of different tiny models: A with every diagnostic, B with P and R only."""
    folder = tmp_path_factory.mktemp("results")
    tokens = tm.with_bos(tm.random_tokens(3, 30))
    a = run_with_geometry_hooks(tm.make_model("bridge-llama"), tokens, diagnostics="all")
    b = run_with_geometry_hooks(tm.make_model("bridge-llama", seed=1), tokens, diagnostics="all")
    b = dataclasses.replace(b, model_name="other", stats={k: v for k, v in b.stats.items() if k in REQUIRED_FIELDS})
    a.save(folder / "a" / "result")
    b.save(folder / "b.npz")
    return folder, a, b


def test_compare_writes_one_figure_per_claim_and_both_tables(saved, tmp_path):
    folder, a, b = saved
    index = compare(folder / "a", folder / "b.npz", tmp_path / "out").path
    page = index.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("plotly.js v") == 1 and "<script src=" not in page
    for key in CLAIMS:
        assert f'id="compare-{key}"' in page
    assert "not measured" in page  # B lacks the assumptions
    import html as html_module

    for (key, row), spec in zip(claims(a).iterrows(), CLAIMS.values()):  # the paper's value, ours, the flip
        assert html_module.escape(spec.paper_value) in page and html_module.escape(row.flip) in page
        if not np.isnan(row.low):
            assert f"{row.value:.3g} [{row.low:.3g}, {row.high:.3g}]" in page
    tables = sorted(p.name for p in (tmp_path / "out").glob("claims_*.csv"))
    assert len(tables) == 2
    read = pd.read_csv(tmp_path / "out" / f"claims_{b.model_name}.csv", index_col="key")
    expected = claims(b)
    assert list(read.index) == list(expected.index) and list(read.verdict) == list(expected.verdict)


def test_compare_keeps_other_files_in_out(saved, tmp_path):
    folder, a, b = saved
    (tmp_path / "notes.txt").write_text("mine")
    compare(a, b, tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine" and (tmp_path / "compare.html").is_file()


def test_compare_names_a_missing_result(saved, tmp_path):
    folder, a, b = saved
    with pytest.raises(GeometryError, match=r"b: .*missing\.npz and .*missing\.json not found"):
        compare(a, folder / "missing", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(GeometryError, match="a: expected a GeometryResult or the path of a saved result"):
        compare(42, b, tmp_path / "out")


def test_cli_compare_writes_the_page(saved, tmp_path, capsys):
    folder, a, b = saved
    assert main(["compare", str(tmp_path / "out"), str(folder / "a"), str(folder / "b")]) == 0
    assert "compare.html" in capsys.readouterr().out
    assert (tmp_path / "out" / "compare.html").is_file()


def test_cli_compare_errors_before_any_work(saved, tmp_path, capsys):
    folder, a, b = saved
    out = tmp_path / "out"
    assert main(["compare", str(out), str(folder / "a"), str(folder / "nothing")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tl-geometry: error: compare: ") and "nothing.npz" in err and "not found" in err
    assert not out.exists()  # nothing created
    afile = tmp_path / "afile"
    afile.write_text("keep")
    assert main(["compare", str(afile), str(folder / "a"), str(folder / "b")]) == 1
    assert "is a file, not a folder" in capsys.readouterr().err and afile.read_text() == "keep"
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", str(out), str(folder / "a")])
    assert exit_info.value.code == 2  # B missing on the command line


def test_compare_without_a_folder_writes_nothing_and_prints_the_verdicts(saved, tmp_path, monkeypatch):
    import os
    from pathlib import Path

    from tl_geometry.results.display import MAX_LINES, WIDTH

    folder, a, b = saved
    monkeypatch.chdir(tmp_path)
    comparison = compare(a, folder / "b.npz")
    assert comparison.path is None and list(tmp_path.iterdir()) == []
    text = repr(comparison)
    lines = text.splitlines()
    assert len(lines) <= MAX_LINES and max(map(len, lines)) <= WIDTH, text
    verdicts_a, verdicts_b = claims(a).verdict, claims(b).verdict
    for key in CLAIMS:  # one line per claim: A's verdict / B's verdict, as the claims tables give them
        assert f"{key}  " in text and f"{verdicts_a[key]} / {verdicts_b[key]}" in text
    same = int((verdicts_a == verdicts_b).sum())
    assert f"the same on {same} of {len(CLAIMS)} claims" in text
    assert comparison._repr_html_().count("<tr>") == len(CLAIMS) + 4
    table = comparison.table()
    assert list(table.index) == list(CLAIMS) and list(table[f"verdict {comparison.names[1]}"]) == list(verdicts_b)
    with pytest.raises(TypeError, match="not saved"):
        os.fspath(comparison)
    saved_later = comparison.save(tmp_path / "later")
    assert Path(saved_later) == tmp_path / "later" / "compare.html" == saved_later.path
    assert saved_later.path.read_text() == compare(a, folder / "b.npz", tmp_path / "now").path.read_text()
    assert "written to" in repr(saved_later)
