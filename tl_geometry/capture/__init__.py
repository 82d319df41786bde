"""Capture: the hooked pass. Tokens and windows in, one forward pass with hooks, per-layer selection contexts out."""
