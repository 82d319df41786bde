"""The public API is tiered: a short top level, curated second-tier modules, and every old name still importing."""

import importlib
import re
import warnings
from pathlib import Path

import pytest

import tl_geometry

# The top level before its API was tiered (tl_geometry 0.1.0's __all__, written out here as the promise kept).
BEFORE_TIERS = [
    "CorpusReport", "Diagnostic", "EffectiveSetSize", "FieldSpec", "GeometryConfig", "GeometryError",
    "GeometryResult", "HeadTaxonomy", "HookableModel", "InterventionResult", "ProfileFit", "REGIMES", "REGISTRY",
    "ROLES", "Regime", "SelectionMetrics", "SelectionPicture", "SinkRecallCorrelation", "TaxonomyConfig", "Window",
    "WindowStream", "__version__", "analyze_corpus", "attention_windows", "claims", "classify_heads",
    "classify_queries", "compare", "default_n_grid", "default_text", "detect_regime", "effective_set_size",
    "envelopes", "fit_attention_profile", "geometry_vs_dnll", "intervention_sweep", "load_model", "read_corpus",
    "read_text_files", "run_with_geometry_hooks", "selection_margins", "selection_metrics",
    "selection_metrics_from_cache", "sink_recall_correlation", "text_windows", "threshold_sensitivity",
    "topn_hooks", "topn_pattern_hook", "window_documents",
]  # fmt: skip
TIERS = ["tl_geometry.corpus", "tl_geometry.analysis", "tl_geometry.diagnostics", "tl_geometry.theory",
         "tl_geometry.interventions", "tl_geometry.roles", "tl_geometry.plots"]


def test_the_top_level_is_short_and_imports_without_warnings():
    assert len(tl_geometry.__all__) <= 16
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        namespace: dict = {}
        exec("from tl_geometry import *", namespace)
    assert set(tl_geometry.__all__) <= set(namespace)


@pytest.mark.parametrize("module", TIERS)
def test_every_tier_lists_names_it_has(module):
    imported = importlib.import_module(module)
    assert imported.__all__ and all(hasattr(imported, name) for name in imported.__all__)


@pytest.mark.parametrize("name", BEFORE_TIERS)
def test_an_old_top_level_name_still_imports_with_a_warning_naming_its_home(name):
    if name in tl_geometry.__all__ or name == "__version__":
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert getattr(tl_geometry, name) is not None
        return
    with pytest.warns(DeprecationWarning, match=rf"^tl_geometry\.{name} is deprecated; import it from ") as caught:
        old = getattr(tl_geometry, name)
    home, now = re.search(r"import it from ([\w.]+) \(from [\w.]+ import (\w+)\)", str(caught[0].message)).groups()
    assert old is getattr(importlib.import_module(home), now)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        tl_geometry.nothing_here  # noqa: B018


# Module paths before capture/ was split by workflow and module names were made unique, written out here as the
# promise kept (not read from tl_geometry._compat, so that a path dropped from its table fails here).
OLD_MODULE_PATHS = [
    "tl_geometry.text", "tl_geometry.capture.readers", "tl_geometry.capture.sources", "tl_geometry.capture.corpus",
    "tl_geometry.capture.checkpoint", "tl_geometry.capture.distributed", "tl_geometry.capture.device_check",
    "tl_geometry.capture.provenance", "tl_geometry.capture.roles", "tl_geometry.capture.published",
    "tl_geometry.capture.interventions", "tl_geometry.capture.sweep", "tl_geometry.capture.ablation",
    # module names repeated across packages, renamed to say what they hold
    "tl_geometry.analysis.taxonomy", "tl_geometry.analysis.taxonomy_summary",
    "tl_geometry.diagnostics.taxonomy", "tl_geometry.report.plots", "tl_geometry.results.pictures",
    "tl_geometry.capture.pictures", "tl_geometry.results.interventions", "tl_geometry.analysis.interventions",
    "tl_geometry.analysis.chance", "tl_geometry.theory.bounds", "tl_geometry.analysis.ablation",
    "tl_geometry.report.ablation", "tl_geometry.analysis.mechanisms",
]  # fmt: skip


@pytest.mark.parametrize("old", OLD_MODULE_PATHS)
def test_an_old_module_path_still_imports_with_a_warning_naming_its_home(old, monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, old, raising=False)  # imported earlier in this process: import it afresh
    with pytest.warns(DeprecationWarning, match=rf"^{re.escape(old)} is deprecated; import from ") as caught:
        module = importlib.import_module(old)
    home = re.search(r"import from ([\w.]+)", str(caught[0].message)).group(1)
    assert home != old and module is importlib.import_module(home)
    assert module.__spec__.name == home  # the module keeps its own name and spec
    assert sys.modules[old] is module


def test_the_architecture_page_lists_each_old_module_path_with_its_home():
    """docs/architecture.md's table of old paths: every one, beside the home its DeprecationWarning names."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text()
    rows = dict(re.findall(r"^\| `(tl_geometry[\w.]*)` \| `(tl_geometry[\w.]*)`", page, re.M))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        homes = {old: importlib.import_module(old).__spec__.name for old in OLD_MODULE_PATHS}
    assert rows == homes


def test_old_paths_expose_the_names_they_had():
    """A few names users imported from the old paths (scripts, demos and the docs of 0.1.0 use them)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from tl_geometry.capture.corpus import analyze_corpus
        from tl_geometry.capture.roles import check_known_mechanisms, classify_heads
        from tl_geometry.capture.sources import text_windows
        from tl_geometry.capture.sweep import intervention_sweep
        from tl_geometry.text import default_text
    assert analyze_corpus is tl_geometry.analyze_corpus and classify_heads is tl_geometry.classify_heads
    assert text_windows is tl_geometry.text_windows and default_text is tl_geometry.default_text
    assert intervention_sweep is tl_geometry.interventions.intervention_sweep
    assert callable(check_known_mechanisms)


def test_a_module_path_that_never_existed_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("tl_geometry.capture.nothing_here")


def test_the_old_text_module_read_as_an_attribute_warns(monkeypatch):
    if "text" in vars(tl_geometry):  # set by an import of tl_geometry.text earlier on
        monkeypatch.delattr(tl_geometry, "text")
    with pytest.warns(DeprecationWarning, match=r"^tl_geometry\.text is deprecated; import from "):
        text = tl_geometry.text
    assert text.default_text is tl_geometry.default_text


@pytest.mark.parametrize("package", ["tl_geometry.interventions", "tl_geometry.roles", "tl_geometry.runs",
                                     "tl_geometry.corpus_input", "tl_geometry.capture"])
def test_no_public_name_hides_a_module_of_its_package(package):
    """``import tl_geometry.interventions.X as m`` reads the package's attribute X: a function of that name would
    be what it gets."""
    imported = importlib.import_module(package)
    modules = {p.stem for p in Path(imported.__file__).parent.glob("*.py")} - {"__init__"}
    assert not modules & set(getattr(imported, "__all__", ()))
