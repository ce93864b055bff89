"""``load(path)``: what is at a path, and everything that comes with it.

One dispatch over the five kinds of model path (:func:`multimodal.files.path_kind`):

=================  ===================================================================
kind               what :class:`Loaded` holds
=================  ===================================================================
``checkpoint``     a Lightning ``.ckpt`` of one of our tasks: the model, the run's
                   tokenizer, its image preprocessing (a TTS run: its codec), class
                   names, the task class and the data module's arguments
``hf``             a Hugging Face folder: the converted model (a Whisper whole, encoder
                   and decoder), ``tokenizer.json``, ``preprocessor_config.json``, a
                   sentence-transformers folder's pooling
``ctranslate2``    faster-whisper's layout: the whole Whisper and its tokenizer
``save_pretrained`` ours: the model, ``tokenizer.json`` and pooling when written beside it
``gguf``           llama.cpp's one file: the decoder and the tokenizer in its metadata
=================  ===================================================================

The model is always the whole model; a caller takes the part it needs with
:meth:`Loaded.part` (:func:`select_part`: a CLIP's vision tower, a Whisper's encoder).
:func:`from_pretrained` (``mm.from_pretrained``: the model alone of a ``save_pretrained``
folder or a ``.ckpt``) and :func:`read_config` live here too (they were in ``hub.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from multimodal.checkpoints import (
    checkpoint_codec,
    checkpoint_image_preprocessor,
    checkpoint_settings,
    checkpoint_tokenizer,
    datamodule_arguments,
    model_from_checkpoint,
    read_checkpoint,
)
from multimodal.convert.hf_folder import from_hf_folder
from multimodal.convert.hf_pooling import FolderPooling, read_folder_pooling
from multimodal.convert.hf_preprocess import (
    PREPROCESSOR_NAME,
    ImagePreprocessor,
    apply_audio_preprocessor,
    read_preprocessor_config,
)
from multimodal.files import CONFIG_NAME, PathKind, path_kind, read_path_kind
from multimodal.installed import resolve_weights
from multimodal.registry import model_class
from multimodal.tokenizers.io import TOKENIZER_NAME, read_tokenizer
from multimodal.weights import (
    config_from_dict,
    load_state_dict_checked,
    read_meta,
    saved_parts,
)

__all__ = ["Loaded", "folder_preprocessor", "from_pretrained", "is_whisper", "load", "load_located",
           "locate", "model_kind", "model_parts", "read_config", "select_part"]

WHISPER_ARCHITECTURE = "WhisperForConditionalGeneration"

@dataclass
class Loaded:
    """What :func:`load` found at ``path``.

    ``model``: the whole model, in eval mode; ``kind``: :data:`multimodal.files.PathKind`;
    ``tokenizer``: the tokenizer that came with it (or None; a TTS checkpoint's phoneme
    tokenizer); ``preprocessor``: what turns raw inputs into the model's: the image pipeline
    (:class:`~multimodal.convert.hf_preprocess.ImagePreprocessor`) a folder or checkpoint
    recorded, or a TTS checkpoint's fitted codec (an audio front end's settings are applied
    to the model itself);
    ``pooling``: a sentence-transformers folder's pooling; ``class_names`` and
    ``task_class`` (``"multimodal.tasks.ClassificationTask"`` ...) from a checkpoint;
    ``data_arguments`` and ``data_class``: the checkpoint's data module arguments and class
    path (``DataModule(**data_arguments)`` rebuilds the run's data); ``settings``: what else
    the run recorded for using the model (a TTS run: ``max_prompt_frames``,
    ``frames_per_phoneme``)."""

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
    settings: dict[str, Any] = field(default_factory=dict)

    def part(self, modality: str | None, accept: tuple[type, ...] = (nn.Module,),
             task: str = "this task") -> nn.Module:
        """The part of :attr:`model` of ``modality`` that is one of ``accept``
        (:func:`select_part`)."""
        return select_part(self.model, modality, accept, self.path, task)


def model_kind(path: str | Path) -> PathKind:
    """What :func:`load` reads ``path`` as (:data:`Loaded.kind`), without reading weights:
    the question callers ask before deciding what to load (an installed model's name is its
    path). ``FileNotFoundError`` / ``ValueError`` naming the path and what it is instead
    when it holds no model."""
    return path_kind(Path(resolve_weights(path)).expanduser())


def locate(path: str | Path) -> tuple[Path, PathKind, dict[str, Any] | None]:
    """The one resolution of a model path: ``(path, kind, config)``: an installed model's
    name becomes its folder, the kind is what :func:`load` reads it as
    (:data:`Loaded.kind`), and a Hugging Face or ``save_pretrained`` folder's
    ``config.json`` comes parsed (None for other kinds), so a caller that goes on to build
    the model reads it once. Errors as :func:`model_kind`."""
    resolved = Path(resolve_weights(path)).expanduser()
    kind, meta = read_path_kind(resolved)
    return resolved, kind, meta


def load(path: str | Path, *, tokenizer: bool = True, quantize: str | None = None) -> Loaded:
    """Read whatever model ``path`` holds (module docstring); ``FileNotFoundError`` /
    ``ValueError`` naming the path and what it is instead when it holds none.
    ``tokenizer=False``: the tokenizer is not read (a caller brings its own; a GGUF file
    whose tokenizer is not rebuilt still gives its model). ``quantize="int8" | "int4"``: a
    GGUF file's Linears stay packed (see :mod:`multimodal.convert.gguf`); other kinds are
    read as stored."""
    return load_located(locate(path), tokenizer=tokenizer, quantize=quantize)


def load_located(located: tuple[Path, PathKind, dict[str, Any] | None], *,
                 tokenizer: bool = True, quantize: str | None = None) -> Loaded:
    """:func:`load` of what :func:`locate` found (``(path, kind, config)``): a caller that
    located the path already does not resolve it or parse its ``config.json`` again."""
    path, kind, meta = located
    if kind == "checkpoint":
        loaded = _from_checkpoint(path)
        if not tokenizer:
            loaded.tokenizer = None
        return loaded
    if kind == "gguf":
        from multimodal.convert.gguf import load_gguf  # the GGUF reader: only for such a file

        model, tok = load_gguf(path, tokenizer=tokenizer, quantize=quantize)
        return Loaded(model.eval(), kind, path, tok)
    if kind == "save_pretrained":
        model_cls, config, state = saved_parts(path / CONFIG_NAME, meta or {})
        model = model_cls(config)
        load_state_dict_checked(model, state)
    elif kind == "hf":
        model = from_hf_folder(path, config=meta)
    else:
        model = from_hf_folder(path)
    tok = None
    if not tokenizer:
        pass
    elif kind == "ctranslate2":  # vocabulary.txt / .json when there is no tokenizer.json
        from multimodal.convert.ctranslate2 import whisper_tokenizer

        tok = whisper_tokenizer(path)
    elif (path / TOKENIZER_NAME).is_file():
        tok = read_tokenizer(path / TOKENIZER_NAME)
    preprocessor = folder_preprocessor(path, model)  # ours too: written by save_pretrained
    return Loaded(model.eval(), kind, path, tok, preprocessor, read_folder_pooling(path))


def read_config(path: str | Path) -> tuple[type[nn.Module], Any]:
    """``(model class, config)`` of a folder written by ``save_pretrained``."""
    cfg_file, meta = read_meta(path)
    model_cls = model_class(meta.get("model_type"), cfg_file)
    return model_cls, config_from_dict(model_cls.config_class, meta["config"])


def from_pretrained(path: str | Path, *, strict: bool = True) -> nn.Module:
    """Rebuild any model written by ``save_pretrained`` (safetensors + JSON config), or
    the model of a Lightning ``.ckpt`` of one of our tasks (a file: see
    :func:`multimodal.checkpoints.read_checkpoint`, whose errors say what a file that is
    no checkpoint is instead). Every other kind of model path: :func:`load`."""
    if Path(path).is_file():
        return model_from_checkpoint(read_checkpoint(path), path)
    cfg_file, meta = read_meta(path)  # config.json parsed once
    model_cls, config, state = saved_parts(cfg_file, meta, strict=strict)
    model = model_cls(config)
    load_state_dict_checked(model, state, strict=strict)
    return model.eval()


def _from_checkpoint(path: Path) -> Loaded:
    ckpt = read_checkpoint(path)
    model = model_from_checkpoint(ckpt, path)
    preprocessor = checkpoint_image_preprocessor(ckpt, model) \
        if getattr(model, "modality", None) in ("image", "image+text", "image-text") \
        else checkpoint_codec(ckpt)
    names = ckpt.get("class_names")
    hp = ckpt.get("hyper_parameters") or {}
    task = hp.get("_class_path") if isinstance(hp, dict) else None
    data_class = (ckpt.get("datamodule_hyper_parameters") or {}).get("_class_path")
    return Loaded(model, "checkpoint", path, checkpoint_tokenizer(ckpt), preprocessor,
                  class_names=[str(n) for n in names] if isinstance(names, (list, tuple))
                  else None,
                  task_class=task if isinstance(task, str) else None,
                  data_arguments=datamodule_arguments(ckpt),
                  data_class=data_class if isinstance(data_class, str) else None,
                  settings=checkpoint_settings(ckpt))


def folder_preprocessor(path: str | Path, model: nn.Module) -> ImagePreprocessor | None:
    """From a Hugging Face folder's ``preprocessor_config.json`` (when present): the image
    preprocessor of an image model, or, for an audio model (a whole Whisper: its encoder),
    its front end's settings checked and applied to the model (then None)."""
    path = Path(path)
    pre = read_preprocessor_config(path)
    if pre is None:
        return None
    file = str(path / PREPROCESSOR_NAME)
    modality = getattr(model, "modality", None)
    audio = model_parts(model).get("audio")
    if audio is not None:  # an audio model, or a whole Whisper's encoder
        apply_audio_preprocessor(audio, pre, file)
        return None
    if modality in ("image", "image+text", "image-text"):  # a captioner reads images too
        if "feature_extractor_type" in pre and "image_processor_type" not in pre \
                and "image_mean" not in pre:
            raise ValueError(f"{file} describes {pre['feature_extractor_type']}, not an image "
                             "processor")
        try:
            return ImagePreprocessor.from_dict(pre)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{file}: {err}") from None
    return None



def is_whisper(path: str | Path) -> bool:
    """Whether :func:`load` reads ``path`` as a whole Whisper (encoder and decoder: a speech
    recogniser), without reading weights: a CTranslate2 folder, a transformers
    ``WhisperForConditionalGeneration`` folder, or a Whisper
    written by ``save_pretrained``. ``FileNotFoundError`` / ``ValueError`` as
    :func:`multimodal.files.path_kind` for a path that holds no model."""
    path = Path(resolve_weights(path)).expanduser()
    kind = model_kind(path)
    if kind == "ctranslate2":
        return True
    if kind not in ("hf", "save_pretrained"):
        return False
    try:
        meta = json.loads((path / CONFIG_NAME).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    if not isinstance(meta, dict):
        return False
    if kind == "save_pretrained":
        return meta.get("model_type") == "Whisper"
    # transformers: from_hf_folder reads WhisperForConditionalGeneration whole
    return WHISPER_ARCHITECTURE in (meta.get("architectures") or [])


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
    # the parts of the modality asked for (an image task refuses a TextEncoder: not "needs a
    # ViT or AudioClassifier or TextEncoder")
    fitting = [c for c in accept if modality is None or getattr(c, "modality", None) in
               (None, modality)]
    wanted = " or ".join(c.__name__ for c in fitting or accept)
    what = f" as {'an' if modality in ('image', 'audio') else 'a'} {modality} model" \
        if modality else ""
    raise ValueError(f"pretrained: {path} holds a {held} ({kind} model): it has no part "
                     f"{task} can train{what} (needs a {wanted})")
