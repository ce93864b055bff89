"""Deprecated: speech recognition moved to :mod:`multimodal.pipelines.transcribe`. Importing
this module warns; it is removed in 0.2.

``mm.transcribe(model_path, files)`` is unchanged; ``load_transcriber``, ``read_speech`` ...
are defined in :mod:`multimodal.pipelines.transcribe`.
"""

from __future__ import annotations

from multimodal.moved import deprecated, moved_names

# name -> the module that defines it now (resolved on first use)
MOVED: dict[str, str] = {
    **dict.fromkeys([
        "load_transcriber", "SAMPLE_RATE", "SILENCE_PEAK", "Transcript", "read_speech",
        "transcribe", "write_transcripts", "prompt_languages"
    ], "multimodal.pipelines.transcribe"),
}

deprecated("multimodal.asr",
           "multimodal.transcribe, or import from multimodal.pipelines.transcribe")

__getattr__ = moved_names(__name__, MOVED)
