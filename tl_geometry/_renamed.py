"""Names renamed when the head-role feature took one word, *roles*: each old name still reads, with a warning.

The feature went by four words (taxonomy, roles, regime, mechanisms); a user now meets one. A module whose
public names were renamed sets ``__getattr__ = old_names(__name__, globals())``: an old name (a key of `RENAMED`)
then reads as the same object as its new name, with a DeprecationWarning naming the new one; a class whose methods
were renamed does the same with `old_attribute`, and a function whose keywords were with `renamed_keyword`.
Imports nothing from the package, so every floor can use it.
"""

import warnings
from collections.abc import Callable
from typing import Any

RENAMED = {
    "Regime": "RoleLabel",
    "REGIMES": "ROLE_LABELS",
    "HeadTaxonomy": "HeadRoles",
    "QueryTaxonomy": "QueryRoles",
    "TaxonomyConfig": "RoleConfig",
    "taxonomy_from_result": "roles_from_result",
    "detect_regime": "detect_role",
    "with_taxonomy": "with_roles",
    "TaxonomySettings": "RoleSettings",
    "TaxonomyDiagnostic": "RoleDiagnostic",
    "TAXONOMY_ATTENTION_SINK": "ROLE_ATTENTION_SINK",
    "TAXONOMY_ATTENTION_LAST": "ROLE_ATTENTION_LAST",
    "TAXONOMY_FEATURES": "ROLE_DIAGNOSTIC_FIELDS",
    "TAXONOMY_OPTION": "ROLES_OPTION",
    "regime_diagnostics": "role_diagnostics",
    "regimes_by_layer": "roles_by_layer",
    "contributions_by_regime": "contributions_by_role",
    "precision_recall_by_regime": "precision_recall_by_role",
    "chance_by_regime": "chance_by_role",
    "curves_by_regime": "curves_by_role",
    "taxonomy_summary": "roles_summary",
}
"""Old public name -> its name now (the same object, in the same module)."""


def renamed_warning(where: str, old: str) -> str:
    """The DeprecationWarning's text for ``where.old``: the new name and how to import it."""
    new = RENAMED[old]
    return f"{where}.{old} is deprecated; it is now {new} (from {where} import {new})"


def old_names(module: str, namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that answers the old names of the names ``namespace`` holds, with a warning."""

    def __getattr__(name: str) -> Any:
        if RENAMED.get(name) in namespace:
            warnings.warn(renamed_warning(module, name), DeprecationWarning, stacklevel=2)
            return namespace[RENAMED[name]]
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


def old_attribute(owner: Any, name: str) -> Any:
    """For a class's ``__getattr__``: the attribute once called ``name`` (a method renamed), with a warning."""
    new = RENAMED.get(name)
    if new is None or not hasattr(type(owner), new):
        raise AttributeError(f"{type(owner).__name__!r} object has no attribute {name!r}")
    kind = type(owner).__name__
    warnings.warn(f"{kind}.{name} is deprecated; it is now {kind}.{new}", DeprecationWarning, stacklevel=3)
    return getattr(owner, new)


def renamed_keyword(function: str, old: str, new: str, old_value: Any, new_value: Any,
                    error: Callable[[str], Exception]) -> Any:
    """The value of keyword ``new``, or of ``old`` (its former name) with a DeprecationWarning naming ``new``.

    None where neither was given; ``error`` (the caller's exception type: this module imports nothing of the
    package) is raised where both were.
    """
    if old_value is None:
        return new_value
    if new_value is not None:
        raise error(f"{function}: pass {new}= alone ({old}= is its former name)")
    warnings.warn(f"{function}({old}=...) is deprecated; the keyword is now {new} ({function}({new}=...))",
                  DeprecationWarning, stacklevel=3)
    return old_value
