"""tl_geometry: geometric analysis of token selection in multi-head attention.

A TransformerLens plugin implementing "Geometric Analysis of Token Selection in
Multi-Head Attention": top-N selection metrics (Precision, Recall, F-scores)
in value-state space, per layer and head, from hooks on
``blocks.{l}.attn.hook_v`` and ``blocks.{l}.attn.hook_pattern``.

The top level holds what a run needs: load a model, run the hooks (or read
a cache), the result and its config, text and corpora, the head roles, the
claims and the comparison of two results. The rest lives in
`tl_geometry.corpus`, `tl_geometry.analysis`, `tl_geometry.diagnostics`,
`tl_geometry.theory`, `tl_geometry.interventions`, `tl_geometry.roles` and
`tl_geometry.plots` (every figure, from a result); names and module paths that
used to be here still import, with a DeprecationWarning naming their home.

Importing the package is cheap: transformers and the models load only when
asked for.
"""

from typing import Any

from tl_geometry._compat import keep_old_module_paths, moved
from tl_geometry._version import __version__
from tl_geometry.analysis.claims import claims
from tl_geometry.analysis.sink import sink_recall_correlation
from tl_geometry.capture.cache import selection_metrics_from_cache
from tl_geometry.capture.hooks import run_with_geometry_hooks
from tl_geometry.config import GeometryConfig
from tl_geometry.corpus_input.plain_text import default_text
from tl_geometry.corpus_input.token_windows import read_corpus, text_windows
from tl_geometry.engine.metrics import SelectionMetrics, selection_metrics
from tl_geometry.errors import GeometryError
from tl_geometry.models import load_model
from tl_geometry.report.compare import compare
from tl_geometry.results.result import GeometryResult
from tl_geometry.roles.classify import classify_heads
from tl_geometry.runs.corpus_run import analyze_corpus

from tl_geometry import analysis, corpus, diagnostics, interventions, plots, theory  # noqa: E402, F401 (the second tier)

__all__ = [
    "GeometryConfig",
    "GeometryError",
    "GeometryResult",
    "SelectionMetrics",
    "analyze_corpus",
    "claims",
    "classify_heads",
    "compare",
    "default_text",
    "load_model",
    "read_corpus",
    "run_with_geometry_hooks",
    "selection_metrics",
    "selection_metrics_from_cache",
    "sink_recall_correlation",
    "text_windows",
]


keep_old_module_paths()  # tl_geometry.capture.corpus and the other old module paths still import, with a warning


def __getattr__(name: str) -> Any:
    return moved(name)
