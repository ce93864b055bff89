"""What a served path holds, loaded with today's loaders.

:func:`kind_of` maps what :mod:`multimodal.loading` says a path holds to the endpoint that
serves it, and :func:`multimodal.pipelines._loaders.served` (internal) loads it:

* a whole Whisper (:func:`multimodal.loading.is_whisper`: a CTranslate2 directory, a
  ``WhisperForConditionalGeneration`` folder with its tokenizer, a saved Whisper) ->
  ``"transcribe"`` (the Whisper and its tokenizer);
* a ``.gguf`` file (SmolLM2 and other Llama-family decoders) -> ``"chat"``
  (:func:`multimodal.load_encoder` reads model, tokenizer and chat template);
* a task ``.ckpt`` that recorded class names (a classifier) -> ``"classify"``
  (model, tokenizer, class names);
* anything else :func:`multimodal.load_encoder` reads (``save_pretrained`` folder, Hugging
  Face folder, task ``.ckpt``) -> ``"embed"``; a CLIP / SigLIP (image+text) is served with
  ``/v1/zero-shot`` beside ``/v1/embeddings`` (:mod:`multimodal.serve.zero_shot`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from multimodal.moved import old_names
from multimodal.pipelines._loaders import SERVED_KINDS, classifier, served

Kind = Literal["embed", "chat", "transcribe", "classify"]
KINDS: tuple[str, ...] = SERVED_KINDS


@dataclass
class Served:
    """A loaded model: its kind, the model (an :class:`~multimodal.encoder.Encoder` for embed and
    chat, a Whisper for transcribe) and its tokenizer."""

    kind: str
    model: Any
    tokenizer: Any = None


def kind_of(path: str | Path) -> str:
    """The kind of model at ``path`` (module docstring), without loading weights: what the
    path holds is :mod:`multimodal.loading`'s answer (:func:`~multimodal.loading.is_whisper`,
    :func:`~multimodal.loading.model_kind`)."""
    from multimodal.installed import resolve_weights
    from multimodal.loading import is_whisper, model_kind

    path = Path(resolve_weights(path))  # an installed model's name: its path
    files_kind = model_kind(path)  # FileNotFoundError / ValueError naming what path is
    if is_whisper(path):
        return "transcribe"
    if files_kind == "gguf":
        return "chat"
    if files_kind == "checkpoint":
        from multimodal.checkpoints import read_checkpoint

        if read_checkpoint(path).get("class_names"):
            return "classify"
    return "embed"


def _load_served(path: str | Path, kind: str | None = None, *, compile: bool = False,
                 quantize: str | None = None) -> Served:
    """What the deprecated ``load_served`` gives: ``path`` loaded as ``kind`` (default:
    :func:`kind_of`)."""
    kind = kind or kind_of(path)
    return Served(kind, *served(path, kind, compile=compile, quantize=quantize))


# the old loaders, removed in 0.2: the package uses multimodal.pipelines._loaders
__getattr__ = old_names(__name__, {
    "load_served": (lambda: _load_served,
                    "multimodal.load(path) (or the verb that runs it: multimodal.embed / chat / "
                    "transcribe)"),
    "load_classifier": (lambda: classifier,
                        "multimodal.load(path) (.model, .tokenizer, .class_names)")})
