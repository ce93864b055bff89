"""Moved to :mod:`multimodal.data.readers.audio` (the readers of your own files are one
package); this module warns on import and answers its old names for one release (removed
in 0.2)."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_NEW = "multimodal.data.readers.audio"
warnings.warn(f"{__name__} moved to {_NEW}; import from there (the old module goes in 0.2)",
              DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    return getattr(importlib.import_module(_NEW), name)
