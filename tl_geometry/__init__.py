"""tl_geometry: geometric analysis of token selection in multi-head attention.

A TransformerLens plugin implementing "Geometric Analysis of Token Selection in
Multi-Head Attention": top-N selection metrics (Precision, Recall, F-scores)
in value-state space, per layer and head.
"""

from tl_geometry.errors import GeometryError
from tl_geometry.metrics import SelectionMetrics, selection_metrics

__version__ = "0.1.0"

__all__ = [
    "GeometryError",
    "SelectionMetrics",
    "selection_metrics",
    "__version__",
]
