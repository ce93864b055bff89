"""Deprecated: ``mm.chat`` moved to :mod:`multimodal.pipelines.chat`. Importing this module
warns; it is removed in 0.2.

``mm.chat`` is unchanged.
"""

from __future__ import annotations

from multimodal.moved import deprecated, moved_names

# name -> the module that defines it now (resolved on first use)
MOVED: dict[str, str] = {
    **dict.fromkeys(["chat"], "multimodal.pipelines.chat"),
}

deprecated("multimodal.chat", "multimodal.chat (defined in multimodal.pipelines.chat)")


__getattr__ = moved_names(__name__, MOVED)
