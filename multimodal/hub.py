"""Models by name and by folder: :func:`from_pretrained` (any ``save_pretrained`` folder,
by its ``model_type``), :func:`read_config`, presets (:func:`create_model`,
:func:`list_presets`).

This module sits above the models (it imports them all, so every class and preset is
registered). The weight format itself (``config.json`` + ``model.safetensors``,
``PretrainedMixin``, safe loading) is :mod:`multimodal.weights`, below the models; Lightning
checkpoints are :mod:`multimodal.checkpoints`, ``load(path)`` for every kind of model path
:mod:`multimodal.loading`, encoders :mod:`multimodal.encoder`.

>>> model.save_pretrained("out/vit")
>>> same = multimodal.from_pretrained("out/vit")

The names that lived here before that split (``load_checkpoint``, ``read_checkpoint``,
``Encoder``, ``load_encoder``, ...) are still importable from here for one release.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from torch import nn

import multimodal.models  # noqa: F401  (registers every model class and preset)
from multimodal.checkpoints import load_checkpoint as _load_checkpoint
from multimodal.registry import PRESETS, model_class
from multimodal.weights import (
    config_from_dict,
    load_state_dict_checked,
    read_meta,
    saved_parts,
)


def read_config(path: str | Path) -> tuple[type[nn.Module], Any]:
    """``(model class, config)`` of a folder written by ``save_pretrained``."""
    cfg_file, meta = read_meta(path)
    model_cls = model_class(meta.get("model_type"), cfg_file)
    return model_cls, config_from_dict(model_cls.config_class, meta["config"])


def from_pretrained(path: str | Path, *, strict: bool = True) -> nn.Module:
    """Rebuild any model written by ``save_pretrained`` (safetensors + JSON config), or
    the model of a Lightning ``.ckpt`` of one of our tasks (a file: see
    :func:`multimodal.checkpoints.load_checkpoint`, whose errors say what a file that is
    no checkpoint is instead). Every other kind of model path: :func:`multimodal.load`."""
    if Path(path).is_file():
        return _load_checkpoint(path)
    cfg_file, meta = read_meta(path)  # config.json parsed once
    model_cls, config, state = saved_parts(cfg_file, meta, strict=strict)
    model = model_cls(config)
    load_state_dict_checked(model, state, strict=strict)
    return model.eval()


def list_presets() -> list[str]:
    """Names accepted by :func:`create_model`."""
    return sorted(PRESETS)


def create_model(name: str, **overrides: Any) -> nn.Module:
    """Build the preset ``name``; keyword arguments override its config fields."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; available: {', '.join(sorted(PRESETS))}")
    return PRESETS[name](**overrides)


# name -> the module it moved to (hub held them until the checkpoints / loading / encoder
# split). Resolved on first use, like the package's own lazy names: encoder and loading sit
# above this module, so importing them here would make a cycle.
MOVED: dict[str, str] = {
    "load_checkpoint": "multimodal.checkpoints",
    "CHECKPOINT_HINT": "multimodal.checkpoints",
    "checkpoint_image_preprocessor": "multimodal.checkpoints",
    "checkpoint_tokenizer": "multimodal.checkpoints",
    "datamodule_arguments": "multimodal.checkpoints",
    "model_from_checkpoint": "multimodal.checkpoints",
    "read_checkpoint": "multimodal.checkpoints",
    "folder_preprocessor": "multimodal.loading",
    "Encoder": "multimodal.encoder",
    "TokenFeatures": "multimodal.encoder",
    "load_encoder": "multimodal.encoder",
}


def __getattr__(name: str) -> Any:
    if name in MOVED:
        return getattr(importlib.import_module(MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["create_model", "from_pretrained", "list_presets", "read_config"]
