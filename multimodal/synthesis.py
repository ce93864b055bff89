"""The text-to-speech bundle of a :class:`~multimodal.tasks.tts.TTSTask` checkpoint:
:class:`TTSBundle` (the CodecLM, its phoneme tokenizer and codec, the prompt settings),
picked from :func:`multimodal.load` by :func:`load_tts`. The checkpoint entry itself
(``checkpoint["tts"]``, plain values read with ``torch.load(weights_only=True)``) is written
and read in :mod:`multimodal.checkpoints`; synthesis runs in
:mod:`multimodal.pipelines.speak` (``synthesize`` ... are still importable from here for
one release).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multimodal.checkpoints import BUNDLE_KEY
from multimodal.models.codec_lm import CodecLM
from multimodal.tokenizers.codec import MelRVQCodec
from multimodal.tokenizers.phonemes import PhonemeTokenizer

__all__ = ["TTSBundle", "load_tts"]


@dataclass
class TTSBundle:
    """What synthesis needs: the model, its phoneme tokenizer and codec, the prompt length
    used in training (``max_prompt_frames``) and the mean number of frames per phoneme of
    the training speech (``frames_per_phoneme``, to bound the length of new speech)."""

    model: CodecLM
    tokenizer: PhonemeTokenizer
    codec: MelRVQCodec
    max_prompt_frames: int
    frames_per_phoneme: float

    @property
    def frame_rate(self) -> float:
        """Codec frames (token columns) per second."""
        return self.codec.frame_rate


def load_tts(path: str | Path) -> TTSBundle:
    """The :class:`TTSBundle` of a :class:`~multimodal.tasks.tts.TTSTask` checkpoint: the
    parts of :func:`multimodal.load` (its model, its phoneme tokenizer, its codec as the
    preprocessor, the prompt settings)."""
    from multimodal.loading import load

    loaded = load(path)
    if not isinstance(loaded.model, CodecLM):
        raise ValueError(f"{loaded.path} holds a {type(loaded.model).__name__}, not a "
                         "text-to-speech CodecLM")
    settings = loaded.settings
    if not isinstance(loaded.preprocessor, MelRVQCodec) \
            or not isinstance(loaded.tokenizer, PhonemeTokenizer) \
            or not {"max_prompt_frames", "frames_per_phoneme"} <= set(settings):
        raise ValueError(f"{loaded.path} has no '{BUNDLE_KEY}' entry (phoneme tokenizer + "
                         "codec): was it written by TTSTask after setup?")
    return TTSBundle(loaded.model, loaded.tokenizer, loaded.preprocessor,
                     int(settings["max_prompt_frames"]), float(settings["frames_per_phoneme"]))


# name -> the module it moved to (the pipeline sits above this module: resolved on use)
MOVED: dict[str, str] = {name: "multimodal.pipelines.speak" for name in (
    "MIN_SPEECH_SECONDS", "check_readable", "encode_prompt", "load_prompt", "split_sentences",
    "synthesize", "_budget", "_chunks")}


def __getattr__(name: str) -> Any:
    if name in MOVED:
        return getattr(importlib.import_module(MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
