"""What a served path holds, loaded with today's loaders.

:func:`load_served` is the one place that decides which kind of model a path is and loads
it; when ``mm.load(path)`` lands it becomes a call to that.

* a CTranslate2 Whisper directory, a ``WhisperForConditionalGeneration`` folder or a saved
  Whisper -> ``"transcribe"`` (:func:`multimodal.asr.load_transcriber`);
* a ``.gguf`` file (SmolLM2 and other Llama-family decoders) -> ``"chat"``
  (:func:`multimodal.load_encoder` reads model, tokenizer and chat template);
* a task ``.ckpt`` that recorded class names (a classifier) -> ``"classify"``
  (:func:`load_classifier`: model, tokenizer, class names);
* anything else :func:`multimodal.load_encoder` reads (``save_pretrained`` folder, Hugging
  Face folder, task ``.ckpt``) -> ``"embed"``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Kind = Literal["embed", "chat", "transcribe", "classify"]
KINDS: tuple[str, ...] = ("embed", "chat", "transcribe", "classify")


@dataclass
class Served:
    """A loaded model: its kind, the model (an :class:`~multimodal.hub.Encoder` for embed and
    chat, a Whisper for transcribe) and its tokenizer."""

    kind: str
    model: Any
    tokenizer: Any = None


def _is_whisper_folder(path: Path) -> bool:
    """A folder whose config.json names a Whisper with its decoder (transformers' or ours)."""
    try:
        meta = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return "WhisperForConditionalGeneration" in (meta.get("architectures") or []) \
        or meta.get("model_type") == "Whisper"


def kind_of(path: str | Path) -> str:
    """The kind of model at ``path`` (module docstring), without loading weights; the kind
    of path is :func:`multimodal.files.path_kind`'s answer."""
    from multimodal.files import path_kind
    from multimodal.installed import resolve_weights

    path = Path(resolve_weights(path))  # an installed model's name: its path
    files_kind = path_kind(path)  # FileNotFoundError / ValueError naming what path is
    if files_kind == "ctranslate2" or (files_kind in ("hf", "save_pretrained")
                                       and _is_whisper_folder(path)):
        return "transcribe"
    if files_kind == "gguf":
        return "chat"
    if files_kind == "checkpoint":
        from multimodal.checkpoints import read_checkpoint

        if read_checkpoint(path).get("class_names"):
            return "classify"
    return "embed"


def load_classifier(path: str) -> tuple[Any, Any, list[str]]:
    """(Encoder for tokenisation around the model, model, class names) of a classifier
    checkpoint, the parts of :func:`multimodal.loading.load`; an error naming the file when
    it holds no text classifier."""
    from multimodal.encoder import Encoder
    from multimodal.loading import load

    loaded = load(path)
    model = loaded.model
    n = int(getattr(model.config, "num_classes", 0) or 0)
    if n < 1 or not hasattr(model, "classify") or getattr(model, "modality", None) != "text":
        raise ValueError(f"{path} holds no text classifier (a TextEncoder with a "
                         "classification head, saved by the classification task)")
    if loaded.tokenizer is None:
        raise ValueError(f"{path} records no tokenizer: texts cannot be classified")
    names = loaded.class_names or []
    if len(names) != n:
        names = [str(i) for i in range(n)]
    return Encoder(model, loaded.tokenizer), model, names


def load_served(path: str | Path, kind: str | None = None, *, compile: bool = False,
                quantize: str | None = None) -> Served:
    """Load ``path`` as ``kind`` (default: :func:`kind_of`). ``compile`` / ``quantize`` select
    the encoder paths of :mod:`multimodal.optimize` (embed only). A classifier comes back
    as the model with ``tokenizer`` = (Encoder for tokenisation, class names)."""
    kind = kind or kind_of(path)
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if kind == "classify":
        encoder, model, names = load_classifier(str(path))
        return Served(kind, model, (encoder, names))
    if kind == "transcribe":
        from multimodal.asr import load_transcriber

        model, tokenizer = load_transcriber(path)
        return Served(kind, model.eval(), tokenizer)
    from multimodal.encoder import load_encoder

    if kind == "chat":
        encoder = load_encoder(path)
        if not hasattr(encoder.tokenizer, "apply_chat_template") \
                or not hasattr(encoder.backbone, "generate"):
            raise ValueError(f"{path} is not a chat model: it needs a decoder with a chat "
                             "template (a GGUF file such as SmolLM2-Instruct)")
        return Served(kind, encoder, encoder.tokenizer)
    encoder = load_encoder(path, compile=compile, quantize=quantize)
    return Served(kind, encoder, encoder.tokenizer)
