"""One mutant harness for the suite: a mutant changes what the package does at a public seam, never its source text.

A mutant is a named, plausible bug (a dropped term, a zeroed bound, a claim
reading the wrong curve) applied for the length of a check by patching
behaviour: a public constant or function of a module, looked up when the
package runs (`replace_attribute`, `wrap_function`), or a claim's
declaration in the claims registry (`replace_claim`). Each mutant names the
checks that must catch it; `assert_caught` runs each check under the mutant
and requires it to fail. A refactor that keeps the public names keeps the
mutants working; one that removes a name fails here with that name, instead
of a mutation site silently gone from the source.
"""

import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tl_geometry.analysis.claims import CLAIMS

Patch = Callable[[pytest.MonkeyPatch], None]


@dataclass(frozen=True)
class Mutant:
    """A bug applied by ``apply`` (a monkeypatch) and the checks (no arguments) that must fail under it."""

    name: str
    apply: Patch
    catchers: tuple[Callable[[], Any], ...]


def _public(module: types.ModuleType, name: str) -> None:
    if name.startswith("_") or not hasattr(module, name):
        raise AssertionError(f"mutant seam {module.__name__}.{name}: a mutant patches a public name the package "
                             "looks up when it runs; this one is private or gone (update the mutant)")


def replace_attribute(module: types.ModuleType, name: str, value: Any) -> Patch:
    """A mutant that puts ``value`` in place of the public ``module.name`` (a constant or a function)."""
    _public(module, name)
    return lambda patch: patch.setattr(module, name, value)


def wrap_function(module: types.ModuleType, name: str, wrapper: Callable[[Callable], Callable]) -> Patch:
    """A mutant that replaces the public function ``module.name`` by ``wrapper(the real function)``."""
    _public(module, name)
    return lambda patch: patch.setattr(module, name, wrapper(getattr(module, name)))


def replace_claim(key: str, **changes: Any) -> Patch:
    """A mutant that declares claim ``key`` otherwise (``changes`` to its `PaperClaim`) in the claims registry."""
    return lambda patch: patch.setitem(CLAIMS, key, CLAIMS[key].replace(**changes))


def assert_caught(mutant: Mutant) -> None:
    """Every check of ``mutant`` fails (AssertionError) with the mutant applied, each check on its own."""
    assert mutant.catchers, f"mutant {mutant.name!r} names no check that catches it"
    for check in mutant.catchers:
        with pytest.MonkeyPatch.context() as patch:
            mutant.apply(patch)
            with pytest.raises(AssertionError):
                check()
