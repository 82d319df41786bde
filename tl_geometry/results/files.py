"""Deprecated: the atomic writes, folder locks and strict JSON text moved to `tl_geometry.atomic_io`.

``from tl_geometry.results.files import commit_unit`` still works, with a DeprecationWarning naming the new home.
"""

import warnings
from typing import Any

import tl_geometry.atomic_io as atomic_io

MOVED = ("JOURNAL_NAME", "LOCK_NAME", "Unit", "atomic_path", "commit_unit", "committed_path", "folder_lock",
         "json_text", "pid_alive", "recover", "temp_path")
"""The public names this module had, each now in `tl_geometry.atomic_io`."""


def __getattr__(name: str) -> Any:
    if name not in MOVED:
        raise AttributeError(f"module 'tl_geometry.results.files' has no attribute {name!r}")
    warnings.warn(f"tl_geometry.results.files is deprecated; import {name} from tl_geometry.atomic_io "
                  f"(from tl_geometry.atomic_io import {name})", DeprecationWarning, stacklevel=2)
    return getattr(atomic_io, name)
