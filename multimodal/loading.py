"""``load(path)``: what is at a path, and everything that comes with it.

One dispatch over the five kinds of model path (:func:`multimodal.files.path_kind`):

=================  ===================================================================
kind               what :class:`Loaded` holds
=================  ===================================================================
``checkpoint``     a Lightning ``.ckpt`` of one of our tasks: the model, the run's
                   tokenizer, its image preprocessing, class names, the task class and
                   the data module's arguments
``hf``             a Hugging Face folder: the converted model (a Whisper whole, encoder
                   and decoder), ``tokenizer.json``, ``preprocessor_config.json``, a
                   sentence-transformers folder's pooling
``ctranslate2``    faster-whisper's layout: the whole Whisper and its tokenizer
``save_pretrained`` ours: the model, ``tokenizer.json`` and pooling when written beside it
``gguf``           llama.cpp's one file: the decoder and the tokenizer in its metadata
=================  ===================================================================

The model is always the whole model; a caller takes the part it needs with
:meth:`Loaded.part` (:func:`select_part`: a CLIP's vision tower, a Whisper's encoder).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from multimodal.convert import from_hf_folder
from multimodal.convert.gguf import load_gguf
from multimodal.convert.hf_pooling import FolderPooling, read_folder_pooling
from multimodal.files import CONFIG_NAME, PathKind, path_kind
from multimodal.hub import (
    checkpoint_image_preprocessor,
    checkpoint_tokenizer,
    datamodule_arguments,
    folder_preprocessor,
    from_pretrained,
    model_from_checkpoint,
    read_checkpoint,
)
from multimodal.installed import resolve_weights
from multimodal.tokenizers.io import TOKENIZER_NAME, read_tokenizer

__all__ = ["Loaded", "is_whisper", "load", "model_parts", "select_part"]

WHISPER_ARCHITECTURE = "WhisperForConditionalGeneration"


@dataclass
class Loaded:
    """What :func:`load` found at ``path``.

    ``model``: the whole model, in eval mode; ``kind``: :data:`multimodal.files.PathKind`;
    ``tokenizer``: the text tokenizer that came with it (or None); ``preprocessor``: the
    image pipeline (:class:`~multimodal.convert.hf_preprocess.ImagePreprocessor`) a folder or
    checkpoint recorded (an audio front end's settings are applied to the model itself);
    ``pooling``: a sentence-transformers folder's pooling; ``class_names`` and
    ``task_class`` (``"multimodal.tasks.ClassificationTask"`` ...) from a checkpoint;
    ``data_arguments`` and ``data_class``: the checkpoint's data module arguments and class
    path (``DataModule(**data_arguments)`` rebuilds the run's data)."""

    model: nn.Module
    kind: PathKind
    path: Path
    tokenizer: Any = None
    preprocessor: Any = None
    pooling: FolderPooling | None = None
    class_names: list[str] | None = None
    task_class: str | None = None
    data_arguments: dict[str, Any] = field(default_factory=dict)
    data_class: str | None = None

    def part(self, modality: str | None, accept: tuple[type, ...] = (nn.Module,),
             task: str = "this task") -> nn.Module:
        """The part of :attr:`model` of ``modality`` that is one of ``accept``
        (:func:`select_part`)."""
        return select_part(self.model, modality, accept, self.path, task)


def load(path: str | Path) -> Loaded:
    """Read whatever model ``path`` holds (module docstring); ``FileNotFoundError`` /
    ``ValueError`` naming the path and what it is instead when it holds none."""
    path = Path(resolve_weights(path)).expanduser()  # an installed model's name: its path
    kind = path_kind(path)
    if kind == "checkpoint":
        return _from_checkpoint(path)
    if kind == "gguf":
        model, tokenizer = load_gguf(path)
        return Loaded(model.eval(), kind, path, tokenizer)
    if kind == "ctranslate2" or _is_whisper_folder(path):
        from multimodal.asr import load_transcriber  # whole Whisper + its tokenizer

        model, tokenizer = load_transcriber(path)
        return Loaded(model.eval(), kind, path, tokenizer)
    model = from_hf_folder(path) if kind == "hf" else from_pretrained(path)
    tokenizer = read_tokenizer(path / TOKENIZER_NAME) if (path / TOKENIZER_NAME).is_file() \
        else None
    preprocessor = folder_preprocessor(path, model)  # ours too: written by save_pretrained
    return Loaded(model.eval(), kind, path, tokenizer, preprocessor,
                  read_folder_pooling(path))


def _from_checkpoint(path: Path) -> Loaded:
    ckpt = read_checkpoint(path)
    model = model_from_checkpoint(ckpt, path)
    preprocessor = checkpoint_image_preprocessor(ckpt, model) \
        if getattr(model, "modality", None) in ("image", "image+text", "image-text") else None
    names = ckpt.get("class_names")
    hp = ckpt.get("hyper_parameters") or {}
    task = hp.get("_class_path") if isinstance(hp, dict) else None
    data_class = (ckpt.get("datamodule_hyper_parameters") or {}).get("_class_path")
    return Loaded(model, "checkpoint", path, checkpoint_tokenizer(ckpt), preprocessor,
                  class_names=[str(n) for n in names] if isinstance(names, (list, tuple))
                  else None,
                  task_class=task if isinstance(task, str) else None,
                  data_arguments=datamodule_arguments(ckpt),
                  data_class=data_class if isinstance(data_class, str) else None)


def _is_whisper_folder(path: Path) -> bool:
    """A transformers ``WhisperForConditionalGeneration`` folder with its tokenizer (read
    whole, encoder and decoder, rather than as the encoder ``from_hf_folder`` gives)."""
    try:
        meta = json.loads((path / CONFIG_NAME).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    # the decoder's special tokens are read from tokenizer.json: without it, the encoder
    return isinstance(meta, dict) and WHISPER_ARCHITECTURE in (meta.get("architectures") or []) \
        and (path / TOKENIZER_NAME).is_file()


def is_whisper(path: str | Path) -> bool:
    """Whether :func:`load` reads ``path`` as a whole Whisper (encoder and decoder: a speech
    recogniser), without reading weights: a CTranslate2 folder, a transformers
    ``WhisperForConditionalGeneration`` folder with its ``tokenizer.json``, or a Whisper
    written by ``save_pretrained``. ``FileNotFoundError`` / ``ValueError`` as
    :func:`multimodal.files.path_kind` for a path that holds no model."""
    path = Path(resolve_weights(path)).expanduser()
    kind = path_kind(path)
    if kind == "ctranslate2" or (kind == "hf" and _is_whisper_folder(path)):
        return True
    if kind != "save_pretrained":
        return False
    try:
        meta = json.loads((path / CONFIG_NAME).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return isinstance(meta, dict) and meta.get("model_type") == "Whisper"


def model_parts(model: nn.Module) -> dict[str, nn.Module]:
    """The single-modality parts of ``model`` by modality (the model itself included): a
    CLIP's towers, an encoder-decoder's encoder."""
    parts: dict[str, nn.Module] = {}
    modality = getattr(model, "modality", None)
    if modality in ("image", "text", "audio"):
        parts[modality] = model
    for attr in ("vision_model", "text_model", "encoder"):
        sub = getattr(model, attr, None)
        kind = getattr(sub, "modality", None)
        if kind in ("image", "text", "audio") and kind not in parts:
            parts[kind] = sub
    return parts


def select_part(model: nn.Module, modality: str | None, accept: tuple[type, ...],
                path: Path | str, task: str) -> nn.Module:
    """The part of ``model`` (from ``path``) that ``task`` uses: ``model`` itself when it is
    one of ``accept``, else its part of ``modality`` (CLIP's vision / text tower, a
    captioner's image encoder, a Whisper's encoder) when that is one of ``accept``. Anything
    else is a ValueError naming what the path holds and what the task needs."""
    if isinstance(model, accept) and (modality is None
                                      or getattr(model, "modality", modality) == modality):
        return model
    parts = model_parts(model)
    if modality is None:
        usable = [m for m in parts.values() if isinstance(m, accept)]
        if len(usable) == 1:
            return usable[0]
        if len(usable) > 1:
            raise ValueError(f"pretrained: {path} holds a {type(model).__name__} with "
                             f"{' and '.join(sorted(parts))} parts; set the task's modality "
                             f"to one of {sorted(parts)}")
    elif modality in parts and isinstance(parts[modality], accept):
        return parts[modality]
    held = type(model).__name__
    kind = getattr(model, "modality", "?")
    wanted = " or ".join(c.__name__ for c in accept)
    what = f" as {'an' if modality in ('image', 'audio') else 'a'} {modality} model" \
        if modality else ""
    raise ValueError(f"pretrained: {path} holds a {held} ({kind} model): it has no part "
                     f"{task} can train{what} (needs a {wanted})")
