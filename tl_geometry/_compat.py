"""Names the top level of tl_geometry offered before its API was tiered: each still imports, with a warning.

`tl_geometry.__getattr__` calls `moved` for any name it does not have.
"""

import importlib
import warnings
from typing import Any

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
    "detect_regime": "tl_geometry.capture.roles",
    "default_n_grid": "tl_geometry.engine.grid",
    "SelectionPicture": "tl_geometry.results.pictures",
}  # fmt: skip
"""Old top-level name -> the module it is imported from now."""


def moved(name: str) -> Any:
    """The object once at ``tl_geometry.<name>``, with a DeprecationWarning naming its home."""
    if name not in MOVED:
        raise AttributeError(f"module 'tl_geometry' has no attribute {name!r}")
    home = MOVED[name]
    warnings.warn(f"tl_geometry.{name} is deprecated; import it from {home} (from {home} import {name})",
                  DeprecationWarning, stacklevel=3)
    return getattr(importlib.import_module(home), name)
