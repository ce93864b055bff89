"""Reading the Lightning checkpoints of our tasks: the model, and what the run recorded
beside it (its tokenizer, its data module's arguments and image normalisation, LoRA).

A checkpoint is read once with ``torch.load(weights_only=True)`` (:func:`read_checkpoint`:
tensors and plain Python values only), then each part is taken from the dict:
:func:`model_from_checkpoint` (``multimodal_model``: ``model_type`` + ``model_config``, the
weights under the task's ``model.`` prefix, LoRA adapters merged), :func:`checkpoint_tokenizer`,
:func:`checkpoint_image_preprocessor`, :func:`datamodule_arguments`.
:func:`multimodal.loading.load` is the one caller that decides a path is a checkpoint.
"""

from __future__ import annotations

import json
import pickle
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

import multimodal.models  # noqa: F401  (registers every model class)
from multimodal.convert.hf_preprocess import data_image_preprocessor
from multimodal.files import sniff_torch_file
from multimodal.models.codec_lm import CodecLM
from multimodal.registry import model_class
from multimodal.tokenizers.codec import CodecConfig, MelRVQCodec
from multimodal.tokenizers.io import TOKENIZER_NAME, read_tokenizer, tokenizer_from_json
from multimodal.tokenizers.phonemes import PhonemeTokenizer
from multimodal.weights import (
    build_model,
    check_depth,
    compare_shapes,
    load_state_dict_checked,
    meta_model,
)

__all__ = [
    "BUNDLE_KEY", "CHECKPOINT_HINT", "TTSBundle", "bundle_state", "checkpoint_codec",
    "checkpoint_image_preprocessor", "checkpoint_parts", "checkpoint_settings",
    "checkpoint_tokenizer",
    "codec_from_state", "datamodule_arguments", "model_from_checkpoint", "read_checkpoint",
    "tokenizer_from_state",  # load_checkpoint: deprecated (mm.from_pretrained of a file)
]

BUNDLE_KEY = "tts"
"""Where :class:`~multimodal.tasks.tts.TTSTask` records its phoneme tokenizer, codec and
prompt settings (:func:`bundle_state`)."""


CHECKPOINT_HINT = ("expected a Lightning .ckpt of one of multimodal's tasks, which record "
                   "'model_type' (the class name) and 'model_config' (its config as a dict) "
                   "under checkpoint['multimodal_model']")


def datamodule_arguments(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The data module's init arguments that Lightning saved in a loaded checkpoint dict,
    without LightningCLI's private keys (``_class_path``, ...): ``DataModule(**args)``
    rebuilds the run's data."""
    saved = checkpoint.get("datamodule_hyper_parameters") or {}
    return {k: v for k, v in saved.items() if not k.startswith("_")}


def load_checkpoint(path: str | Path) -> nn.Module:
    """Deprecated (removed in 0.2): ``multimodal.from_pretrained(path)`` (or
    ``multimodal.load(path).model``) rebuilds the model of a Lightning checkpoint written by
    one of our tasks; this is :func:`model_from_checkpoint` of :func:`read_checkpoint`."""
    warnings.warn("load_checkpoint is deprecated and will be removed in 0.2: use "
                  "multimodal.from_pretrained(path) or multimodal.load(path).model",
                  DeprecationWarning, stacklevel=2)
    return model_from_checkpoint(read_checkpoint(path), path)


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """A checkpoint file as its dict, read with ``torch.load(weights_only=True)``: tensors
    and plain Python values only, so a checkpoint that would run code when unpickled is
    refused. Read once where both the model and other entries (tokenizer, data arguments)
    are wanted."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder, not a checkpoint file (a .ckpt)")
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} not found")
    what = sniff_torch_file(path)
    if what is not None:
        raise ValueError(f"{path} is not a checkpoint file: {what}; {CHECKPOINT_HINT}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(f"{path} was refused: it holds objects other than tensors and plain "
                         f"Python values, and unpickling them could execute code ({err})"
                         ) from None
    except Exception as err:
        raise ValueError(f"{path} is not a readable checkpoint ({type(err).__name__}: {err}); "
                         f"{CHECKPOINT_HINT}") from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("state_dict"), dict):
        raise ValueError(f"{path} has no 'state_dict'; {CHECKPOINT_HINT}")
    return ckpt


def model_from_checkpoint(ckpt: dict[str, Any], path: str | Path = "checkpoint") -> nn.Module:
    """The model of a checkpoint dict of :func:`read_checkpoint` (``path`` names it in
    errors), in eval mode. It is built from ``ckpt["multimodal_model"]`` (``model_type``,
    ``model_config``: :class:`multimodal.tasks.base.ModelTask` writes it; older checkpoints
    kept them in ``hyper_parameters``) and its weights are found in ``state_dict`` under the
    task's prefix (``model.``)."""
    model_cls, cfg, state, lora = checkpoint_parts(ckpt, path)
    model = build_model(model_cls, cfg)
    if isinstance(lora, dict):
        from multimodal.nn.lora import merge_lora

        _wrap_lora(model, lora)
        load_state_dict_checked(model, _submodule_state(state, model))
        return merge_lora(model, inplace=True).eval()
    load_state_dict_checked(model, state)
    return model.eval()


def checkpoint_parts(ckpt: dict[str, Any], path: str | Path = "checkpoint") -> tuple[
        type[nn.Module], dict[str, Any], dict[str, torch.Tensor], dict[str, Any] | None]:
    """``(model class, config dict, the model's own weights, LoRA settings or None)`` of a
    checkpoint dict, the recorded config checked against the tensors' shapes on ``meta``
    (nothing allocated, nothing built): a fine-tune changes the config first and builds the
    model once. With LoRA the weights are the task's whole state (base weights and
    adapters, :func:`model_from_checkpoint` merges them)."""
    about = ckpt.get("multimodal_model") or ckpt.get("hyper_parameters") or {}
    kind, cfg = about.get("model_type"), about.get("model_config")
    if not isinstance(kind, str) or not isinstance(cfg, dict):
        raise ValueError(f"{path}: no model_type/model_config recorded "
                         f"(top-level keys {sorted(ckpt)}); {CHECKPOINT_HINT}")
    model_cls = model_class(kind, Path(path))
    # the recorded config against the tensors' shapes, before anything is allocated
    shapes = {k: (v.dtype, tuple(v.shape)) for k, v in ckpt["state_dict"].items()
              if isinstance(v, torch.Tensor)}
    where = f"{path}: model_config"
    check_depth(Path(where), cfg, shapes, Path(path).name)
    lora = about.get("lora")  # a LoRA run: the state holds base weights and adapters
    shadow = meta_model(model_cls, cfg, where)
    if isinstance(lora, dict):
        _wrap_lora(shadow, lora)
    compare_shapes(shadow, _submodule_state(shapes, shadow), cfg, where, path)
    if isinstance(lora, dict):
        return model_cls, cfg, ckpt["state_dict"], lora
    return model_cls, cfg, _submodule_state(ckpt["state_dict"], shadow), None


def _wrap_lora(model: nn.Module, settings: dict[str, Any]) -> None:
    """The LoRA layers a fine-tuning run recorded (``multimodal_model["lora"]``)."""
    from multimodal.nn.lora import apply_lora

    apply_lora(model, settings["rank"], settings["alpha"], tuple(settings["targets"]),
               dropout=settings.get("dropout", 0.0),
               trainable=tuple(settings.get("trainable", ())))


def _submodule_state(state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """The entries of a task's ``state_dict`` that belong to ``model``: the prefix
    (``"model."``, or ``""`` for a bare model) under which most of its keys appear."""
    own = set(model.state_dict())
    counts: dict[str, int] = {}
    for key in state:
        cuts = [0] + [i + 1 for i, ch in enumerate(key) if ch == "."]
        for cut in cuts:
            if key[cut:] in own:
                counts[key[:cut]] = counts.get(key[:cut], 0) + 1
    if not counts:
        return dict(state)  # nothing fits: let load_state_dict_checked list the keys
    best = max(counts, key=lambda p: (counts[p], p == "model."))
    return {k[len(best):]: v for k, v in state.items() if k.startswith(best)}


def checkpoint_tokenizer(ckpt: dict[str, Any]) -> Any:
    """The tokenizer a task checkpoint's run used, or None: the task's own entry
    (``ckpt["tokenizer"]``, captioning / contrastive; a TTS run's phoneme tokenizer under
    ``ckpt["tts"]``), a tokenizer a text data module trained
    and saved in its state (Lightning keeps it under the data module's class name), or the
    ``tokenizer`` file / folder the data module was given (a fine-tuned text classifier from
    a Hugging Face folder), when that path still exists."""
    if isinstance(ckpt.get("tokenizer"), str):
        return tokenizer_from_json(ckpt["tokenizer"])
    tts = ckpt.get(BUNDLE_KEY)
    if isinstance(tts, dict) and isinstance(tts.get("phoneme_tokenizer"), str):
        return tokenizer_from_state(tts)
    for value in ckpt.values():
        if isinstance(value, dict) and isinstance(value.get("tokenizer"), str) \
                and value["tokenizer"].lstrip().startswith("{"):
            return tokenizer_from_json(value["tokenizer"])
    given = datamodule_arguments(ckpt).get("tokenizer")
    if isinstance(given, str) and given:
        file = Path(given)
        file = file / TOKENIZER_NAME if file.is_dir() else file
        if file.is_file():
            return read_tokenizer(file)
    return None


def checkpoint_image_preprocessor(ckpt: dict[str, Any], model: nn.Module) -> Any:
    """The ``ImagePreprocessor`` of a task checkpoint's data module (its recorded
    arguments through :func:`~multimodal.convert.hf_preprocess.data_image_preprocessor`:
    size, resize + centre crop, interpolation, mean, std), the model's image size and
    channels where the data do not say; None when the data recorded no mean / std."""
    config = getattr(model, "config", None)
    vision = getattr(config, "vision", None) or getattr(config, "encoder", None) or config
    return data_image_preprocessor(datamodule_arguments(ckpt),
                                   channels=int(getattr(vision, "in_channels", 3)),
                                   image_size=getattr(vision, "image_size", None))



# -- text-to-speech: the phoneme tokenizer, the codec and the prompt settings -------------

@dataclass
class TTSBundle:
    """What synthesis needs: the model, its phoneme tokenizer and codec, the prompt length
    used in training (``max_prompt_frames``) and the mean number of frames per phoneme of
    the training speech (``frames_per_phoneme``, to bound the length of new speech). A
    :class:`~multimodal.tasks.tts.TTSTask` gives its own (``task.bundle()``);
    ``multimodal.synthesize`` reads one from a checkpoint (or what :func:`multimodal.load`
    returned for it)."""

    model: CodecLM
    tokenizer: PhonemeTokenizer
    codec: MelRVQCodec
    max_prompt_frames: int
    frames_per_phoneme: float

    @property
    def frame_rate(self) -> float:
        """Codec frames (token columns) per second."""
        return self.codec.frame_rate


def bundle_state(tokenizer: PhonemeTokenizer, codec: MelRVQCodec, max_prompt_frames: int,
                 frames_per_phoneme: float) -> dict[str, Any]:
    """Plain values (strings, numbers, one tensor) that a TTS run records under
    ``ckpt["tts"]`` and :func:`multimodal.load` reads back."""
    vocab = {"type": tokenizer.kind, **tokenizer._to_dict()}
    return {"phoneme_tokenizer": json.dumps(vocab, ensure_ascii=False),
            "codec_config": json.dumps(codec.config.to_dict()),
            "codec_codebooks": codec.rvq.codebooks.detach().cpu().clone(),
            "max_prompt_frames": int(max_prompt_frames),
            "frames_per_phoneme": float(frames_per_phoneme)}


def tokenizer_from_state(state: dict[str, Any]) -> PhonemeTokenizer:
    return PhonemeTokenizer._from_dict(json.loads(state["phoneme_tokenizer"]))


def codec_from_state(state: dict[str, Any]) -> MelRVQCodec:
    codec = MelRVQCodec(CodecConfig.from_dict(json.loads(state["codec_config"])))
    codec.rvq.codebooks.copy_(state["codec_codebooks"])
    codec.fitted.fill_(True)
    return codec


def checkpoint_codec(ckpt: dict[str, Any]) -> MelRVQCodec | None:
    """The fitted codec a TTS run recorded (``ckpt["tts"]``), or None."""
    tts = ckpt.get(BUNDLE_KEY)
    return codec_from_state(tts) if isinstance(tts, dict) and "codec_config" in tts else None


def checkpoint_settings(ckpt: dict[str, Any]) -> dict[str, Any]:
    """Plain settings a run recorded for using its model: a TTS run's
    ``max_prompt_frames`` and ``frames_per_phoneme``; empty otherwise."""
    tts = ckpt.get(BUNDLE_KEY)
    if not isinstance(tts, dict):
        return {}
    return {key: tts[key] for key in ("max_prompt_frames", "frames_per_phoneme") if key in tts}
