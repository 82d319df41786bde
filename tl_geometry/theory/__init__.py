"""Theory: the margins and envelopes of Theorems 1-2, and the simulator under Assumptions 1-3."""
