"""Where old names and old module paths went: each still imports, with a DeprecationWarning naming its home.

`tl_geometry.__getattr__` calls `moved` for any name it does not have; `keep_old_module_paths` (called once
by ``import tl_geometry``) lets ``import tl_geometry.capture.corpus`` and the other paths in `OLD_MODULES`
find the module that now lives elsewhere.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any

from tl_geometry._renamed import RENAMED

MOVED = {
    **dict.fromkeys(["CorpusReport", "Window", "WindowStream", "read_text_files", "window_documents"],
                    "tl_geometry.corpus"),
    **dict.fromkeys(["Diagnostic", "FieldSpec", "ProfileFit", "REGISTRY", "fit_attention_profile"],
                    "tl_geometry.diagnostics"),
    **dict.fromkeys(["envelopes", "selection_margins"], "tl_geometry.theory"),
    **dict.fromkeys(["EffectiveSetSize", "InterventionResult", "effective_set_size", "geometry_vs_dnll",
                     "intervention_sweep", "topn_hooks", "topn_pattern_hook"], "tl_geometry.interventions"),
    **dict.fromkeys(["HeadTaxonomy", "REGIMES", "ROLES", "Regime", "SinkRecallCorrelation", "TaxonomyConfig",
                     "classify_queries", "threshold_sensitivity"], "tl_geometry.analysis"),
    "HookableModel": "tl_geometry.capture.tokens",
    "attention_windows": "tl_geometry.capture.windows",
    "detect_regime": "tl_geometry.roles",
    "default_n_grid": "tl_geometry.engine.grid",
    "SelectionPicture": "tl_geometry.results.selection_picture",
}  # fmt: skip
"""Old top-level name -> the module it is imported from now (under its name in `RENAMED` where it was renamed)."""


OLD_MODULES = {
    "tl_geometry.text": "tl_geometry.corpus_input.plain_text",
    "tl_geometry.capture.readers": "tl_geometry.corpus_input.readers",
    "tl_geometry.capture.sources": "tl_geometry.corpus_input.token_windows",
    "tl_geometry.capture.corpus": "tl_geometry.runs.corpus_run",
    "tl_geometry.capture.checkpoint": "tl_geometry.runs.checkpoint",
    "tl_geometry.capture.distributed": "tl_geometry.runs.distributed",
    "tl_geometry.capture.device_check": "tl_geometry.runs.device_check",
    "tl_geometry.capture.provenance": "tl_geometry.runs.model_provenance",
    "tl_geometry.capture.roles": "tl_geometry.roles",
    "tl_geometry.capture.published": "tl_geometry.roles.published",
    "tl_geometry.capture.interventions": "tl_geometry.interventions.topn_attention",
    "tl_geometry.capture.sweep": "tl_geometry.interventions.sweep",
    "tl_geometry.capture.ablation": "tl_geometry.interventions.head_ablation",
    # module names made unique (a search finds one place) and the head-role feature called "roles", 0.x
    "tl_geometry.analysis.taxonomy": "tl_geometry.analysis.head_roles",
    "tl_geometry.analysis.taxonomy_summary": "tl_geometry.analysis.head_roles_summary",
    "tl_geometry.diagnostics.taxonomy": "tl_geometry.diagnostics.role_features",
    "tl_geometry.report.plots": "tl_geometry.report.paper_figures",
    "tl_geometry.results.pictures": "tl_geometry.results.selection_picture",
    "tl_geometry.capture.pictures": "tl_geometry.capture.picture_keeper",
    "tl_geometry.results.interventions": "tl_geometry.results.intervention_result",
    "tl_geometry.analysis.interventions": "tl_geometry.analysis.sweep_statistics",
    "tl_geometry.analysis.chance": "tl_geometry.analysis.chance_excess",
    "tl_geometry.theory.bounds": "tl_geometry.theory.theorem_bounds",
    "tl_geometry.analysis.ablation": "tl_geometry.analysis.role_ablation",
    "tl_geometry.report.ablation": "tl_geometry.report.ablation_figure",
    "tl_geometry.analysis.mechanisms": "tl_geometry.analysis.detector_agreement",
}
"""Old module path -> the module that holds its code now (capture/ split by workflow; module names made unique)."""


class _OldModulePaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path of `OLD_MODULES` and hands back the module at its new home (one module, two names).

    A finder, not a file under each old name: a file would keep the old names in capture/ (the name clashes
    the split removes) and would import from the floors above capture. The old name is an alias of the new
    module, so what a user patches through it is what runs.
    """

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(fullname, self) if fullname in OLD_MODULES else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        home = OLD_MODULES[spec.name]
        _warn_old_path(spec.name, stacklevel=2)  # the import system's frames are skipped: this names the importer
        module = importlib.import_module(home)
        spec.loader_state = module.__spec__  # the import system sets __spec__ to the old path's; put it back
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = module.__spec__.loader_state  # already executed at its home


def _warn_old_path(old: str, stacklevel: int) -> None:
    warnings.warn(f"{old} is deprecated; import from {OLD_MODULES[old]} (the same module, moved)",
                  DeprecationWarning, stacklevel=stacklevel + 1)


def keep_old_module_paths() -> None:
    """Let the old module paths import (once per process, however often the package is imported)."""
    if not any(isinstance(finder, _OldModulePaths) for finder in sys.meta_path):
        sys.meta_path.insert(0, _OldModulePaths())  # first: the table is exact, and no stale file may answer


def moved(name: str) -> Any:
    """The object (or module) once at ``tl_geometry.<name>``, with a DeprecationWarning naming its home."""
    if f"tl_geometry.{name}" in OLD_MODULES:  # ``tl_geometry.text`` read as an attribute
        _warn_old_path(f"tl_geometry.{name}", stacklevel=3)  # the caller of tl_geometry.__getattr__
        return importlib.import_module(OLD_MODULES[f"tl_geometry.{name}"])
    if name not in MOVED:
        raise AttributeError(f"module 'tl_geometry' has no attribute {name!r}")
    home, now = MOVED[name], RENAMED.get(name, name)  # a head-role name was renamed as well as moved
    warnings.warn(f"tl_geometry.{name} is deprecated; import it from {home} (from {home} import {now})",
                  DeprecationWarning, stacklevel=3)
    return getattr(importlib.import_module(home), now)
