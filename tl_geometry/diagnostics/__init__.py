"""Diagnostics: declared components that read a layer's selection context and return named fields."""
