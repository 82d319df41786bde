"""Diagnostics: declared components that read a layer's selection context and return named fields."""

from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.diagnostics.profile_fit import ProfileFit, fit_attention_profile
from tl_geometry.diagnostics.registry import REGISTRY, Diagnostic

__all__ = ["REGISTRY", "Diagnostic", "FieldSpec", "ProfileFit", "fit_attention_profile"]
