"""The head-role feature has one word, *roles*: every name it had before still works, with a DeprecationWarning.

The old names are written out here as the promise kept (not read from the package's table, so that a name dropped
from it fails here): Python names in the modules that had them, the diagnostic ``"taxonomy"`` in a config and on
the command line, results and their fields saved under the old names, and the claims' old keys.
"""

import hashlib
import importlib
import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from tests import tiny_models as tm
from tests.fixtures import cli_config
from tl_geometry import GeometryConfig, GeometryResult, run_with_geometry_hooks
from tl_geometry.analysis.claims import CLAIMS

RENAMED = [
    ("tl_geometry.analysis", "HeadTaxonomy", "HeadRoles"),
    ("tl_geometry.analysis", "TaxonomyConfig", "RoleConfig"),
    ("tl_geometry.analysis", "Regime", "RoleLabel"),
    ("tl_geometry.analysis", "REGIMES", "ROLE_LABELS"),
    ("tl_geometry.analysis.head_roles", "HeadTaxonomy", "HeadRoles"),
    ("tl_geometry.analysis.head_roles", "QueryTaxonomy", "QueryRoles"),
    ("tl_geometry.analysis.head_roles", "TaxonomyConfig", "RoleConfig"),
    ("tl_geometry.analysis.head_roles", "taxonomy_from_result", "roles_from_result"),
    ("tl_geometry.analysis.head_roles", "Regime", "RoleLabel"),
    ("tl_geometry.analysis.head_roles", "REGIMES", "ROLE_LABELS"),
    ("tl_geometry.analysis.head_roles_summary", "taxonomy_summary", "roles_summary"),
    ("tl_geometry.analysis.chance_excess", "chance_by_regime", "chance_by_role"),
    ("tl_geometry.analysis.claims", "TAXONOMY_OPTION", "ROLES_OPTION"),
    ("tl_geometry.roles", "detect_regime", "detect_role"),
    ("tl_geometry.roles.classify", "detect_regime", "detect_role"),
    ("tl_geometry.roles.classify", "with_taxonomy", "with_roles"),
    ("tl_geometry.diagnostics.role_features", "TaxonomySettings", "RoleSettings"),
    ("tl_geometry.diagnostics.role_features", "TaxonomyDiagnostic", "RoleDiagnostic"),
    ("tl_geometry.diagnostics.role_features", "TAXONOMY_ATTENTION_SINK", "ROLE_ATTENTION_SINK"),
    ("tl_geometry.diagnostics.role_features", "TAXONOMY_ATTENTION_LAST", "ROLE_ATTENTION_LAST"),
    ("tl_geometry.diagnostics.role_features", "TAXONOMY_FEATURES", "ROLE_DIAGNOSTIC_FIELDS"),
    ("tl_geometry.plots", "regime_diagnostics", "role_diagnostics"),
    ("tl_geometry.plots", "regimes_by_layer", "roles_by_layer"),
    ("tl_geometry.plots", "contributions_by_regime", "contributions_by_role"),
    ("tl_geometry.plots", "precision_recall_by_regime", "precision_recall_by_role"),
    ("tl_geometry.report.paper_figures", "regime_diagnostics", "role_diagnostics"),
    ("tl_geometry.report.paper_figures", "chance_by_regime", "chance_by_role"),
]  # fmt: skip


@pytest.mark.parametrize(("module", "old", "new"), RENAMED)
def test_an_old_name_is_the_new_object_with_a_warning_naming_it(module, old, new):
    imported = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=rf"^{module}\.{old} is deprecated; it is now {new} \(from {module} "
                                                rf"import {new}\)$"):
        value = getattr(imported, old)
    assert value is getattr(imported, new)


def test_an_old_name_imports_from_its_old_module_path(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "tl_geometry.analysis.taxonomy", raising=False)  # imported earlier: afresh
    with pytest.warns(DeprecationWarning) as caught:
        from tl_geometry.analysis.taxonomy import HeadTaxonomy, taxonomy_from_result
    from tl_geometry.analysis.head_roles import HeadRoles, roles_from_result

    assert HeadTaxonomy is HeadRoles and taxonomy_from_result is roles_from_result
    messages = [str(w.message) for w in caught]
    assert any(m.startswith("tl_geometry.analysis.taxonomy is deprecated; import from tl_geometry.analysis.head_roles")
               for m in messages)
    assert any("HeadTaxonomy is deprecated; it is now HeadRoles" in m for m in messages)


def test_a_name_that_never_existed_is_still_an_attribute_error():
    import tl_geometry.analysis.head_roles as head_roles

    with pytest.raises(AttributeError, match="has no attribute 'NoSuchTaxonomy'"):
        head_roles.NoSuchTaxonomy  # noqa: B018


@pytest.mark.model
def test_old_keywords_methods_and_attributes_read_as_the_new_ones_with_a_warning():
    from tl_geometry import GeometryError, classify_heads
    from tl_geometry.analysis.detector_agreement import PromptSetCheck
    from tl_geometry.analysis.head_roles import RoleConfig
    from tl_geometry.plots import metric_heatmap

    result = roles_result(seed=0)
    rules = RoleConfig(margin=0.2)
    with pytest.warns(DeprecationWarning, match=r"^classify_heads\(taxonomy=\.\.\.\) is deprecated; the keyword is now "
                                                r"role_config \(classify_heads\(role_config=\.\.\.\)\)$"):
        old = classify_heads(result, taxonomy=rules)
    new = classify_heads(result, role_config=rules)
    assert old.config == new.config == rules and torch.equal(old.labels, new.labels)
    with pytest.raises(GeometryError, match=r"^classify_heads: pass role_config= alone \(taxonomy= is its former name\)$"):
        classify_heads(result, taxonomy=rules, role_config=rules)
    with pytest.warns(DeprecationWarning, match=r"^HeadRoles\.curves_by_regime is deprecated; it is now "
                                                r"HeadRoles\.curves_by_role$"):
        curves = new.curves_by_regime("recall")
    assert torch.equal(curves.nan_to_num(-7.0), new.curves_by_role("recall").nan_to_num(-7.0))
    with pytest.raises(AttributeError, match="'HeadRoles' object has no attribute 'curves_by_nothing'"):
        new.curves_by_nothing  # noqa: B018
    names = new.label_names()
    with pytest.warns(DeprecationWarning, match=r"^metric_heatmap\(regimes=\.\.\.\) is deprecated"):
        old_figure = metric_heatmap(result, "recall", 1, regimes=names)
    assert old_figure.data[0].customdata == metric_heatmap(result, "recall", 1, roles=names).data[0].customdata
    check = PromptSetCheck("natural", {}, new, None)
    with pytest.warns(DeprecationWarning, match=r"^PromptSetCheck\.taxonomy is deprecated; it is now PromptSetCheck\.roles$"):
        assert check.taxonomy is check.roles is new


# ---- the diagnostic "taxonomy" is "roles" ----


@pytest.mark.parametrize("given", [{"diagnostics": ["taxonomy"]}, {"diagnostics": "taxonomy"},
                                   {"diagnostics": ["roles"], "settings": {"taxonomy": {"n_queries": 3}}}])
def test_the_diagnostic_by_its_old_name_warns_and_is_roles(given):
    with pytest.warns(DeprecationWarning, match=r"the diagnostic 'taxonomy' is now called 'roles'"):
        config = GeometryConfig(**given)
    assert config.diagnostics == ("roles",)
    if "settings" in given:
        assert config == GeometryConfig(diagnostics=["roles"], settings={"roles": {"n_queries": 3}})


def test_a_config_recorded_with_the_old_name_reads_as_roles_without_a_warning():
    config = GeometryConfig(diagnostics=["roles", "chance"], settings={"roles": {"n_queries": 3}})
    recorded = config.to_json()
    recorded["diagnostics"] = ["chance", "taxonomy"]
    recorded["settings"] = {"taxonomy": recorded["settings"]["roles"]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a saved file cannot be changed by its reader: no warning
        assert GeometryConfig.from_json(recorded) == config


def test_the_command_line_takes_the_old_name_with_a_notice(capsys):
    assert cli_config("--diagnostics", "taxonomy,assumptions").diagnostics == ("assumptions", "roles")
    assert capsys.readouterr().err == ("tl-geometry: warning: --diagnostics taxonomy is deprecated; it is now called "
                                       "roles\n")


# ---- results saved under the old names ----

BEFORE = {"role_attention_sink": "taxonomy_attention_sink", "role_attention_last": "taxonomy_attention_last"}


def roles_result(seed: int) -> GeometryResult:
    model = tm.make_model("bridge-gpt2")
    tokens = tm.with_bos(tm.random_tokens(3, 10, seed=seed))
    return run_with_geometry_hooks(model, tokens, diagnostics=["roles"], settings={"roles": {"n_queries": 3}},
                                   keep_queries=True, query_positions="all", n_bootstrap=20, capture="pattern")


def save_in_the_old_form(result: GeometryResult, stem: Path) -> None:
    """Save, then rewrite the pair as a version before "roles" wrote it: the diagnostic, its settings and its two
    attention fields under their old names (the arrays renamed, the checksum recomputed)."""
    result.save(stem)
    with np.load(f"{stem}.npz") as saved:
        arrays = {_old_array_name(key): saved[key] for key in saved.files}
    np.savez(f"{stem}.npz", **arrays)
    meta = json.loads(Path(f"{stem}.json").read_text())
    config = meta["config"]
    config["diagnostics"] = ["taxonomy" if name == "roles" else name for name in config["diagnostics"]]
    config["settings"] = {"taxonomy" if name == "roles" else name: s for name, s in config["settings"].items()}
    for entry in meta["fields"]:
        entry["name"] = BEFORE.get(entry["name"], entry["name"])
    meta["queries"] = [BEFORE.get(name, name) for name in meta["queries"]]
    meta["npz_sha256"] = hashlib.sha256(Path(f"{stem}.npz").read_bytes()).hexdigest()
    Path(f"{stem}.json").write_text(json.dumps(meta))


def _old_array_name(key: str) -> str:
    for now, before in BEFORE.items():
        if key.startswith(f"{now}/") or key == f"queries/{now}":
            return key.replace(now, before, 1)
    return key


@pytest.mark.model
def test_a_result_saved_under_the_old_names_loads_and_merges_with_a_new_one(tmp_path):
    first, second = roles_result(seed=0), roles_result(seed=1)
    save_in_the_old_form(first, tmp_path / "old")
    meta = json.loads((tmp_path / "old.json").read_text())
    assert "taxonomy_attention_sink" in {entry["name"] for entry in meta["fields"]}
    assert meta["config"]["diagnostics"] == ["taxonomy"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        loaded = GeometryResult.load(tmp_path / "old")
    assert loaded.config == first.config and loaded.fields == first.fields
    assert "role_attention_sink" in loaded.fields and "taxonomy_attention_sink" not in loaded.fields
    assert loaded.equals(first)
    assert GeometryResult.merge(loaded, second).equals(GeometryResult.merge(first, second))


# ---- the claims' old keys ----


@pytest.mark.parametrize(("old", "new"), [("regimes_by_depth", "roles_by_depth"), ("regime_tradeoffs", "role_tradeoffs")])
def test_a_claim_by_its_old_key_warns_and_is_the_claim(old, new):
    with pytest.warns(DeprecationWarning, match=rf"^claim '{old}' is now called '{new}'; '{old}' is deprecated$"):
        declared = CLAIMS[old]
    assert declared is CLAIMS[new] and CLAIMS.current_key(old) == new and CLAIMS.current_key(new) == new
    assert old not in list(CLAIMS)  # listed once, under its key now


def test_the_keys_of_a_saved_claims_table_read_as_the_keys_now():
    """docs/data keeps claims tables saved before the rename: each key reads as a claim registered now."""
    for path in sorted((Path(__file__).resolve().parents[1] / "docs" / "data").glob("claims-*.csv")):
        keys = pd.read_csv(path)["key"].tolist()
        assert all(CLAIMS.current_key(key) in CLAIMS for key in keys), path.name
