"""tl_geometry: geometric analysis of token selection in multi-head attention.

A TransformerLens plugin implementing "Geometric Analysis of Token Selection in
Multi-Head Attention": top-N selection metrics (Precision, Recall, F-scores)
in value-state space, per layer and head, from hooks on
``blocks.{l}.attn.hook_v`` and ``blocks.{l}.attn.hook_pattern``.

Importing the package is cheap: transformers and the models load only when
asked for.
"""

from tl_geometry.theory.bounds import envelopes, selection_margins
from tl_geometry.config import GeometryConfig
from tl_geometry.capture.corpus import analyze_corpus
from tl_geometry.errors import GeometryError
from tl_geometry.engine.grid import default_n_grid
from tl_geometry.capture.hooks import run_with_geometry_hooks
from tl_geometry.capture.tokens import HookableModel
from tl_geometry.capture.windows import attention_windows
from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.diagnostics.registry import REGISTRY, Diagnostic
from tl_geometry.engine.metrics import SelectionMetrics, selection_metrics
from tl_geometry.capture.cache import selection_metrics_from_cache
from tl_geometry.models import load_model
from tl_geometry.diagnostics.profile_fit import ProfileFit, fit_attention_profile
from tl_geometry.results.result import GeometryResult
from tl_geometry.analysis.sink import SinkRecallCorrelation, sink_recall_correlation
from tl_geometry.analysis.taxonomy import REGIMES, ROLES, HeadTaxonomy, Regime, TaxonomyConfig
from tl_geometry.analysis.taxonomy import classify_queries, threshold_sensitivity
from tl_geometry.capture.roles import classify_heads, detect_regime
from tl_geometry.text import default_text, read_text_files
from tl_geometry.capture.readers import CorpusReport
from tl_geometry.capture.sources import Window, WindowStream, read_corpus, text_windows, window_documents
# Top-N interventions
from tl_geometry.capture.interventions import topn_hooks, topn_pattern_hook
from tl_geometry.capture.sweep import effective_set_size, intervention_sweep
from tl_geometry.results.interventions import InterventionResult
from tl_geometry.analysis.interventions import EffectiveSetSize, geometry_vs_dnll
# The paper's claims on a result, and two results side by side
from tl_geometry.analysis.claims import claims
from tl_geometry.report.compare import compare
# Figure 1 on the model's data: one head's kept selection (draw with tl_geometry.report.plots.selection_picture)
from tl_geometry.results.pictures import SelectionPicture

from tl_geometry._version import __version__

__all__ = [
    "CorpusReport",
    "Diagnostic",
    "FieldSpec",
    "GeometryConfig",
    "GeometryError",
    "GeometryResult",
    "HeadTaxonomy",
    "HookableModel",
    "ProfileFit",
    "REGIMES",
    "ROLES",
    "REGISTRY",
    "Regime",
    "SelectionMetrics",
    "SinkRecallCorrelation",
    "TaxonomyConfig",
    "Window",
    "WindowStream",
    "analyze_corpus",
    "attention_windows",
    "classify_heads",
    "classify_queries",
    "default_n_grid",
    "default_text",
    "detect_regime",
    "envelopes",
    "fit_attention_profile",
    "load_model",
    "read_corpus",
    "read_text_files",
    "run_with_geometry_hooks",
    "selection_margins",
    "selection_metrics",
    "selection_metrics_from_cache",
    "sink_recall_correlation",
    "text_windows",
    "threshold_sensitivity",
    "window_documents",
    "__version__",
    # Top-N interventions
    "EffectiveSetSize",
    "InterventionResult",
    "effective_set_size",
    "geometry_vs_dnll",
    "intervention_sweep",
    "topn_hooks",
    "topn_pattern_hook",
    # The paper's claims on a result, and two results side by side
    "claims",
    "compare",
    # Figure 1 on the model's data
    "SelectionPicture",
]
