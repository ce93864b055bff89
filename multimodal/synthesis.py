"""Deprecated: text-to-speech moved to :mod:`multimodal.pipelines.speak`. Importing this module
warns; it is removed in 0.2.

``mm.synthesize(checkpoint, text, prompt)`` is unchanged; ``load_tts`` ... are defined in
:mod:`multimodal.pipelines.speak`, ``TTSBundle`` in :mod:`multimodal.checkpoints`.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

# name -> the module that defines it now (resolved on first use)
MOVED: dict[str, str] = {
    **dict.fromkeys(["TTSBundle"], "multimodal.checkpoints"),
    **dict.fromkeys([
        "load_tts", "MIN_SPEECH_SECONDS", "check_readable", "encode_prompt", "load_prompt",
        "split_sentences", "synthesize"
    ], "multimodal.pipelines.speak"),
}

warnings.warn("multimodal.synthesis is deprecated and will be removed in 0.2: use "
              "multimodal.synthesize, or import from multimodal.pipelines.speak (TTSBundle: "
              "multimodal.checkpoints)",
              DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    if name in MOVED:
        return getattr(importlib.import_module(MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
