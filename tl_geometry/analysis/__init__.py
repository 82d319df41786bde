"""Analysis from a result only: the claims, head roles, the sink correlation, summaries.

(`tl_geometry.claims` is at the top level; ``tl_geometry.analysis.claims`` is its module.)
"""

from tl_geometry._renamed import old_names
from tl_geometry.analysis.head_roles import (
    ROLE_LABELS,
    ROLES,
    HeadRoles,
    RoleConfig,
    RoleLabel,
    classify_queries,
    threshold_sensitivity,
)
from tl_geometry.analysis.sink import SinkRecallCorrelation, sink_recall_correlation

__all__ = [
    "ROLES",
    "ROLE_LABELS",
    "HeadRoles",
    "RoleConfig",
    "RoleLabel",
    "SinkRecallCorrelation",
    "classify_queries",
    "sink_recall_correlation",
    "threshold_sensitivity",
]

__getattr__ = old_names(__name__, globals())  # the names they had before (tl_geometry._renamed)
