"""The small gaps of issue 44: misspelled options, blank text, diagnostics="none", negative indices, a cache's
layer out of range. (Row sums of `selection_metrics`: tests/test_metrics.py.)"""

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests import tiny_models as tm
from tests.fixtures import inject
from tl_geometry import GeometryConfig, GeometryError, run_with_geometry_hooks, selection_metrics_from_cache
from tl_geometry.cli import main
from tl_geometry.config import resolve_indices
from tl_geometry.interventions import intervention_sweep


@pytest.fixture(scope="module")
def model():
    return tm.make_model("bridge-llama")


# ---------------------------------------------------------------- the command line


@pytest.mark.parametrize(
    ("argv", "suggestion"),
    [
        (["report", "--contxt", "256"], "--contxt (did you mean --context?)"),
        (["analyze", "--windws=2"], "--windws=2 (did you mean --windows?)"),
        (["intervene", "--moddes", "delete"], "--moddes (did you mean --modes?)"),
        (["plot", "r", "--pgn"], "--pgn (did you mean --png?)"),
        (["reprot"], "invalid choice: 'reprot'"),
    ],
)
def test_a_misspelled_option_gets_the_closest_one(argv, suggestion, capsys, monkeypatch, tmp_path):
    import tl_geometry.models

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tl_geometry.models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and suggestion in err
    if argv[0] == "reprot":
        assert "did you mean 'report'?" in err
    else:
        assert f"usage: tl-geometry {argv[0]}" in err  # the command's usage, not the top level's


def test_an_option_with_nothing_close_is_named_without_a_guess(capsys):
    with pytest.raises(SystemExit):
        main(["analyze", "--zzzzzz"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: --zzzzzz" in err and "did you mean" not in err


# ---------------------------------------------------------------- Python


@pytest.mark.parametrize("text", ["   ", "\n\t ", ["a cat", " \n"]])
def test_whitespace_only_text_is_refused_like_the_empty_string(model, text):
    hooks = tm.hook_counts(model)
    with pytest.raises(GeometryError, match=r"are empty strings or only whitespace .*\[t for t in texts if t.strip\(\)\]"):
        run_with_geometry_hooks(model, text)
    assert tm.hook_counts(model) == hooks  # the model left as it was


def test_diagnostics_none_reads_as_on_the_command_line():
    assert GeometryConfig(diagnostics="none").diagnostics == () == GeometryConfig(diagnostics=[]).diagnostics
    from tests.fixtures import cli_config

    assert cli_config("--diagnostics", "none").diagnostics == GeometryConfig(diagnostics="none").diagnostics


@given(st.integers(1, 40), st.data())
def test_negative_indices_count_from_the_end(size, data):
    chosen = data.draw(st.lists(st.integers(-size, size - 1), unique_by=lambda i: i % size))
    assert resolve_indices("layers", chosen, size, "n_layers") == tuple(i % size for i in chosen)
    assert resolve_indices("layers", None, size, "n_layers") == tuple(range(size))
    outside = data.draw(st.one_of(st.integers(max_value=-size - 1), st.integers(min_value=size)))
    with pytest.raises(GeometryError, match=rf"layers: \[{outside}\] out of range; the model has {size} layers "
                                            rf"\(cfg.n_layers\), use indices 0..{size - 1} \(or -{size}..-1"):
        resolve_indices("layers", [outside], size, "n_layers")


def test_layer_minus_one_is_the_last_layer(model):
    tokens = tm.with_bos(tm.random_tokens(2, 10))
    last, head = model.cfg.n_layers - 1, model.cfg.n_heads - 1
    by_negative = run_with_geometry_hooks(model, tokens, layers=[-1], heads=[0, -1], n_grid=[1, 2, 4])
    by_number = run_with_geometry_hooks(model, tokens, layers=[last], heads=[0, head], n_grid=[1, 2, 4])
    assert by_negative.layers == (last,) and by_negative.heads == (0, head)
    assert by_negative.config.layers == (last,) and by_negative.config.heads == (0, head)  # recorded resolved
    assert by_negative.equals(by_number)
    by_negative.merge(by_number)  # one config: the two merge


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"layers": [-3]}, r"layers: \[-3\] out of range; the model has 2 layers .*or -2..-1, counted from the end"),
        ({"heads": [-5]}, r"heads: \[-5\] out of range; the model has 4 heads"),
        ({"layers": [1, -1]}, r"layers: \[1, -1\] name the same index twice .*read as \[1, 1\]"),
    ],
)
def test_negative_indices_outside_the_model_are_refused(model, overrides, message):
    hooks = tm.hook_counts(model)
    with pytest.raises(GeometryError, match=message):
        run_with_geometry_hooks(model, "the cat sat", **overrides)
    assert tm.hook_counts(model) == hooks


def test_a_sweep_reads_negative_layers_and_heads(model):
    tokens = tm.with_bos(tm.random_tokens(2, 10))
    kwargs = dict(scope="head", controls=0, n_bootstrap=0, progress=False, modes=("delete",))
    by_negative = intervention_sweep(model, tokens, [1, 2], layers=[-1], heads=[-1], **kwargs)
    last, head = model.cfg.n_layers - 1, model.cfg.n_heads - 1
    by_number = intervention_sweep(model, tokens, [1, 2], layers=[last], heads=[head], **kwargs)
    assert by_negative.equals(by_number) and by_negative.layers == (last,) and by_negative.heads == (head,)


def test_a_cache_layer_reads_as_transformer_lens_reads_it(model):
    tokens = tm.with_bos(tm.random_tokens(1, 8))
    _, cache = model.run_with_cache(tokens)
    last = model.cfg.n_layers - 1
    torch.testing.assert_close(selection_metrics_from_cache(cache, -1, 0).recall,
                               selection_metrics_from_cache(cache, last, 0).recall, equal_nan=True)
    for layer in (40, model.cfg.n_layers, -model.cfg.n_layers - 1):
        with pytest.raises(GeometryError) as info:
            selection_metrics_from_cache(cache, layer, 0)
        assert str(info.value) == (f"layer: {layer} is out of range; the model has {model.cfg.n_layers} layers "
                                   f"(cfg.n_layers), use 0..{last} (or -{model.cfg.n_layers}..-1, counted from the end)")
    plain = {name: cache[name] for name in cache.keys() if name.startswith("blocks.0.")}  # no model behind it
    with pytest.raises(GeometryError, match=r"layer: -1 counts from the end, but the cache has no model"):
        selection_metrics_from_cache(plain, -1, 0)
    with pytest.raises(GeometryError, match=r"no blocks.1.attn.hook_pattern .*\(it holds the patterns of layers \[0\]\)"):
        selection_metrics_from_cache(plain, 1, 0)


# ---------------------------------------------------------------- options against the model's config, before loading


@pytest.fixture
def exported_shape(tmp_path, monkeypatch):
    """A model cache whose smollm2 export holds only its config (no weights): what the command line may read."""
    import json

    import tl_geometry.models

    folder = tmp_path / "cache" / "models" / "smollm2-135m"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(
        {"num_hidden_layers": 7, "num_attention_heads": 5, "max_position_embeddings": 300, "hidden_size": 10}))
    monkeypatch.setenv("TL_GEOMETRY_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tl_geometry.models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    return tl_geometry.models.ModelShape(7, 5, 300)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["analyze", "--layers", "0,7"], "--layers: [7] out of range; the model has 7 layers (cfg.n_layers), use "
                                         "indices 0..6 (or -7..-1, counted from the end) (smollm2-135m)"),
        (["report", "--layers=-8"], "--layers: [-8] out of range; the model has 7 layers"),
        (["intervene", "--heads", "5"], "--heads: [5] out of range; the model has 5 heads (cfg.n_heads)"),
        (["analyze", "--layers=6,-1"], "--layers: [6, -1] name the same index twice"),
        (["analyze", "--context", "301"], "--context: 301 tokens is longer than smollm2-135m's context n_ctx=300; "
                                          "pass --context 300 or less"),
        (["report", "--picture", "7.0"], "--picture: 7.0 is not a head of smollm2-135m, which has 7 layers and 5 "
                                         "heads per layer"),
    ],
)
def test_layers_heads_and_context_are_checked_before_the_model_loads(exported_shape, argv, message, capsys):
    assert main([*argv, "--quiet"]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_context_one_is_refused_for_any_model(capsys, monkeypatch, tmp_path):
    import tl_geometry.models

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tl_geometry.models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main(["analyze", "--context", "1", "--quiet"]) == 1
    assert "--context: 1 token leaves no room for text after BOS; pass at least 2" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["analyze", "--layers=-7,5", "--heads", "4", "--context", "300"],
                                  ["report", "--picture", "6.4", "--context", "2"]])
def test_options_inside_the_model_pass_the_early_check(exported_shape, argv, monkeypatch, capsys):
    """Every check before loading passes: the command reaches its analysis (a stand-in that stops there)."""
    reached = []

    def stop_at_the_analysis(args):
        reached.append(args)
        raise GeometryError("the stand-in analysis was reached")

    inject(monkeypatch, "cli_analyse", stop_at_the_analysis)
    assert main([*argv, "--quiet"]) == 1
    assert capsys.readouterr().err == "tl-geometry: error: the stand-in analysis was reached\n"
    assert len(reached) == 1 and reached[0].command == argv[0]
    from tl_geometry.models import bundled_model_shape

    assert bundled_model_shape("smollm2-135m") == exported_shape
    assert bundled_model_shape("gpt2-small") is None  # other models: checked once loaded


@pytest.mark.parametrize(("argv", "message"), [
    (["analyze", "--layers", "0,99"], "--layers: [99] out of range; the model has 30 layers (cfg.n_layers)"),
    (["report", "--heads", "12"], "--heads: [12] out of range; the model has 9 heads (cfg.n_heads)"),
    (["analyze", "--model", "gemma3-270m", "--layers", "18"], "--layers: [18] out of range; the model has 18 layers"),
    (["analyze", "--context", "9000"], "--context: 9000 tokens is longer than smollm2-135m's context n_ctx=8192"),
])
def test_before_the_first_export_the_options_are_checked_against_the_pinned_packages_model(
    argv, message, tmp_path, monkeypatch, capsys
):
    import tl_geometry.models

    monkeypatch.setenv("TL_GEOMETRY_CACHE", str(tmp_path / "empty-cache"))  # no export to read
    monkeypatch.chdir(tmp_path)
    for name in ("load_model", "export_bundled_model"):
        monkeypatch.setattr(tl_geometry.models, name, lambda *a, **k: pytest.fail("the model was loaded or exported"))
    assert main([*argv, "--quiet"]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.model
def test_the_shape_read_without_weights_is_the_loaded_models(smollm2, tmp_path):
    from tl_geometry.models import bundled_model_shape

    shape = bundled_model_shape("smollm2-135m")  # the fixture's load has exported it
    assert (shape.n_layers, shape.n_heads, shape.n_ctx) == (smollm2.cfg.n_layers, smollm2.cfg.n_heads, smollm2.cfg.n_ctx)
    # Before any export: the shape declared for the pinned package, which must be the same model's.
    assert bundled_model_shape("smollm2-135m", cache_dir=tmp_path / "empty") == shape


@pytest.mark.model
def test_the_declared_shape_of_gemma3_is_its_exports(gemma3_cache, tmp_path):
    from tl_geometry.models import bundled_model_shape

    exported = bundled_model_shape("gemma3-270m", cache_dir=gemma3_cache)
    assert bundled_model_shape("gemma3-270m", cache_dir=tmp_path / "empty") == exported


# ---------------------------------------------------------------- strict JSON, plurals, output folders


def strict_loads(text: str):
    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=20,
)


def nan_as_none(x):
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: nan_as_none(v) for k, v in x.items()}
    if isinstance(x, list):
        return [nan_as_none(v) for v in x]
    return x


@given(JSON_VALUES)
def test_json_text_is_strict_json_with_null_for_what_is_not_finite(value):
    from tl_geometry.atomic_io import json_text

    assert strict_loads(json_text(value)) == nan_as_none(value)


def test_json_text_writes_tensors_as_lists():
    from tl_geometry.atomic_io import json_text

    data = {"rho": torch.tensor([0.5, math.nan, math.inf]), "n": np.array([1, 2]), "x": np.float64("nan")}
    assert strict_loads(json_text(data)) == {"rho": [0.5, None, None], "n": [1, 2], "x": None}


def test_saved_results_are_strict_json(tmp_path):
    from tests.fixtures import make_result

    make_result().save(tmp_path / "r")
    strict_loads((tmp_path / "r.json").read_text())


def test_the_corpus_summary_counts_in_words():
    from tl_geometry.corpus_input.readers import SKIP_BAD_RECORD, SKIP_EMPTY, CorpusReport

    report = CorpusReport(documents=1, windows=1, tail_tokens=1)
    report.skip(SKIP_EMPTY, "a.txt")
    report.skip(SKIP_BAD_RECORD, "b.jsonl:3")
    report.skip(SKIP_BAD_RECORD, "b.jsonl:4")
    line = report.summary()
    assert line.startswith("1 document read, 1 window used, 1 token at document ends too few for a window")
    assert "1 empty document (e.g. a.txt)" in line and "2 records that are not valid JSON objects" in line
    assert re.search(r"\b1 \w+s\b", line) is None  # no "1 documents"


def test_each_command_writes_to_its_own_folder_by_default():
    from tl_geometry.cli import build_parser

    parser = build_parser()
    folders = {command: parser.parse_args([command]).out for command in ("report", "analyze", "intervene")}
    assert folders == {"report": Path("report"), "analyze": Path("analysis"), "intervene": Path("interventions")}
    assert parser.parse_args(["analyze", "--out", "x"]).out == Path("x")
