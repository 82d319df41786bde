"""Capture: tokens and windows in, one hooked forward pass, per-layer selection contexts out."""
