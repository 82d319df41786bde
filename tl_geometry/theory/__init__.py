"""Theory: the margins and envelopes of Theorems 1-2, and the simulator under Assumptions 1-3."""

from tl_geometry.theory.theorem_bounds import assumption_margins, envelopes, lower_envelopes, selection_margins
from tl_geometry.theory.synthetic import SimulationSettings, simulate

__all__ = ["SimulationSettings", "assumption_margins", "envelopes", "lower_envelopes", "selection_margins", "simulate"]
