"""Corpus input that never runs a model: the default text, documents read from files, token windows with stable ids.

The public names are in `tl_geometry.corpus` (with the corpus run beside them).
"""
