"""Deprecated: ``mm.chat`` moved to :mod:`multimodal.pipelines.chat`. Importing this module
warns; it is removed in 0.2.

``mm.chat`` is unchanged.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

# name -> the module that defines it now (resolved on first use)
MOVED: dict[str, str] = {
    **dict.fromkeys(["chat"], "multimodal.pipelines.chat"),
}

warnings.warn("multimodal.chat is deprecated and will be removed in 0.2: use multimodal.chat "
              "(defined in multimodal.pipelines.chat)",
              DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    if name in MOVED:
        return getattr(importlib.import_module(MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
