"""Moved to :mod:`multimodal.data.readers.captions` (the readers of your own files are one
package); this module warns on import and answers its old names for one release (removed
in 0.2)."""

from __future__ import annotations

from multimodal.moved import deprecated, moved_names

deprecated(__name__, "multimodal.data.readers.captions")

__getattr__ = moved_names(__name__, "multimodal.data.readers.captions")
