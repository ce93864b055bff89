"""Deprecated: speech recognition moved to :mod:`multimodal.pipelines.transcribe`. Importing
this module warns; it is removed in 0.2.

``mm.transcribe(model_path, files)`` is unchanged; ``load_transcriber``, ``read_speech`` ...
are defined in :mod:`multimodal.pipelines.transcribe`.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

# name -> the module that defines it now (resolved on first use)
MOVED: dict[str, str] = {
    **dict.fromkeys([
        "load_transcriber", "SAMPLE_RATE", "SILENCE_PEAK", "Transcript", "read_speech",
        "transcribe", "write_transcripts", "prompt_languages"
    ], "multimodal.pipelines.transcribe"),
}

warnings.warn("multimodal.asr is deprecated and will be removed in 0.2: use "
              "multimodal.transcribe, or import from multimodal.pipelines.transcribe",
              DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    if name in MOVED:
        return getattr(importlib.import_module(MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
