"""The public API is tiered: a short top level, curated second-tier modules, and every old name still importing."""

import importlib
import warnings

import pytest

import tl_geometry
from tl_geometry._compat import MOVED

TIERS = ["tl_geometry.corpus", "tl_geometry.analysis", "tl_geometry.diagnostics", "tl_geometry.theory",
         "tl_geometry.interventions"]


def test_the_top_level_is_short_and_imports_without_warnings():
    assert len(tl_geometry.__all__) <= 16
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        namespace: dict = {}
        exec("from tl_geometry import *", namespace)
    assert set(tl_geometry.__all__) <= set(namespace)


@pytest.mark.parametrize("module", TIERS)
def test_every_tier_lists_names_it_has(module):
    imported = importlib.import_module(module)
    assert imported.__all__ and all(hasattr(imported, name) for name in imported.__all__)


@pytest.mark.parametrize("name", sorted(MOVED))
def test_an_old_top_level_name_still_imports_with_a_warning_naming_its_home(name):
    home = importlib.import_module(MOVED[name])
    with pytest.warns(DeprecationWarning, match=f"import it from {MOVED[name]}"):
        old = getattr(tl_geometry, name)
    assert old is getattr(home, name)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        tl_geometry.nothing_here  # noqa: B018
