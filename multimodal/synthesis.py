"""Deprecated: text-to-speech moved to :mod:`multimodal.pipelines.speak`. Importing this module
warns; it is removed in 0.2.

``mm.synthesize(checkpoint, text, prompt)`` is unchanged; ``load_tts`` ... are defined in
:mod:`multimodal.pipelines.speak`, ``TTSBundle`` in :mod:`multimodal.checkpoints`.
"""

from __future__ import annotations

from multimodal.moved import deprecated, moved_names

# name -> the module that defines it now (resolved on first use)
MOVED: dict[str, str] = {
    **dict.fromkeys(["TTSBundle"], "multimodal.checkpoints"),
    **dict.fromkeys([
        "load_tts", "MIN_SPEECH_SECONDS", "check_readable", "encode_prompt", "load_prompt",
        "split_sentences", "synthesize"
    ], "multimodal.pipelines.speak"),
}

deprecated("multimodal.synthesis",
           "multimodal.synthesize, or import from multimodal.pipelines.speak (TTSBundle: "
           "multimodal.checkpoints)")

__getattr__ = moved_names(__name__, MOVED)
