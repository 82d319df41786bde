"""Head roles on a model: `classify_heads`, prompt sets whose mechanism is known, and two published measures.

The roles are read from a result by `tl_geometry.analysis.head_roles`; this package runs the model for them.
"""

from tl_geometry._renamed import old_names
from tl_geometry.roles.classify import classify_heads, detect_role
from tl_geometry.roles.prompt_sets import check_known_mechanisms, detector_scores, natural_text, repeated_random_tokens
from tl_geometry.roles.published import published_measures

__all__ = [
    "check_known_mechanisms",
    "classify_heads",
    "detect_role",
    "detector_scores",
    "natural_text",
    "published_measures",
    "repeated_random_tokens",
]

__getattr__ = old_names(__name__, globals())  # the names they had before (tl_geometry._renamed)
