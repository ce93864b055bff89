"""What moved or goes, said one way: the package's deprecations, each removed in
:data:`REMOVED_IN`.

- :func:`deprecated`: the one ``DeprecationWarning`` text, ``"<what> is deprecated and will be
  removed in 0.2: use <use>"``, at the user's line (frames of the import system skipped).
- :func:`moved_names`: a shim module's ``__getattr__``, answering each name from the module
  that defines it now (imported on first use, so a shim costs nothing until used).
- :func:`old_names`: a live module's ``__getattr__`` for names kept one release, each warning.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["REMOVED_IN", "deprecated", "moved_names", "old_names"]

REMOVED_IN = "0.2"
"""The release that removes every deprecated module, name and flag spelling."""


def deprecated(what: str, use: str, *, stacklevel: int = 2) -> None:
    """Warn that ``what`` goes in :data:`REMOVED_IN` and to ``use`` instead, at the line
    ``stacklevel`` frames above the caller (2: whoever called the caller; a module's top
    level: whoever imported it)."""
    warnings.warn(f"{what} is deprecated and will be removed in {REMOVED_IN}: use {use}",
                  DeprecationWarning, stacklevel=stacklevel + 1)


def moved_names(module: str, homes: Mapping[str, str] | str) -> Callable[[str], Any]:
    """``__getattr__`` of the shim ``module``: each name of ``homes`` (name -> the module
    that defines it now; a string: every name) from its new home."""

    def __getattr__(name: str) -> Any:
        home = homes if isinstance(homes, str) else homes.get(name)
        if home is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        return getattr(importlib.import_module(home), name)

    return __getattr__


def old_names(module: str, names: Mapping[str, tuple[Callable[[], Any], str]]
              ) -> Callable[[str], Any]:
    """``__getattr__`` of a live ``module`` keeping old names one release: ``name ->
    (value_of, use)``; each use warns (:func:`deprecated`, naming ``module.name`` and ``use``)
    and answers ``value_of()`` (a callable, so an answer defined below the hook, or in a
    module imported late, is fine)."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value_of, use = names[name]
        deprecated(f"{module}.{name}", use)
        return value_of()

    return __getattr__
