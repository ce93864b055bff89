"""What a served path holds, loaded with today's loaders.

:func:`kind_of` maps what :mod:`multimodal.loading` says a path holds to the endpoint that
serves it, and :func:`load_served` loads it:

* a whole Whisper (:func:`multimodal.loading.is_whisper`: a CTranslate2 directory, a
  ``WhisperForConditionalGeneration`` folder with its tokenizer, a saved Whisper) ->
  ``"transcribe"`` (:func:`multimodal.pipelines.transcribe.load_transcriber`);
* a ``.gguf`` file (SmolLM2 and other Llama-family decoders) -> ``"chat"``
  (:func:`multimodal.load_encoder` reads model, tokenizer and chat template);
* a task ``.ckpt`` that recorded class names (a classifier) -> ``"classify"``
  (:func:`load_classifier`: model, tokenizer, class names);
* anything else :func:`multimodal.load_encoder` reads (``save_pretrained`` folder, Hugging
  Face folder, task ``.ckpt``) -> ``"embed"``; a CLIP / SigLIP (image+text) is served with
  ``/v1/zero-shot`` beside ``/v1/embeddings`` (:mod:`multimodal.serve.zero_shot`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Kind = Literal["embed", "chat", "transcribe", "classify"]
KINDS: tuple[str, ...] = ("embed", "chat", "transcribe", "classify")


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
    the encoder paths of :mod:`multimodal.optimize` (embed); for chat, ``quantize`` ("int8"
    / "int4") loads the decoder packed (a GGUF file's blocks kept as they are). A classifier
    comes back as the model with ``tokenizer`` = (Encoder for tokenisation, class names)."""
    kind = kind or kind_of(path)
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if kind == "classify":
        encoder, model, names = load_classifier(str(path))
        return Served(kind, model, (encoder, names))
    if kind == "transcribe":
        from multimodal.pipelines.transcribe import load_transcriber

        model, tokenizer = load_transcriber(path)
        return Served(kind, model.eval(), tokenizer)
    from multimodal.encoder import load_encoder

    if kind == "chat":
        if quantize not in (None, "int8", "int4"):
            raise ValueError(f"--quantize {quantize} applies to encoders; a chat model decodes "
                             "with weight-only int8 or int4 (--quantize int8 | int4)")
        encoder = load_encoder(path, quantize=quantize)
        if not hasattr(encoder.tokenizer, "apply_chat_template") \
                or not hasattr(encoder.backbone, "generate"):
            raise ValueError(f"{path} is not a chat model: it needs a decoder with a chat "
                             "template (a GGUF file such as SmolLM2-Instruct)")
        return Served(kind, encoder, encoder.tokenizer)
    encoder = load_encoder(path, compile=compile, quantize=quantize)
    if encoder.preprocessor is None and encoder.modality in ("image", "image+text") \
            and Path(path).is_file():
        # a task checkpoint that recorded no image normalisation: the one its data module
        # measures, as `multimodal embed` / `zero-shot` use
        from multimodal.pipelines.embed import load_model_encoder

        encoder.preprocessor = load_model_encoder(path).preprocessor
    return Served(kind, encoder, encoder.tokenizer)
