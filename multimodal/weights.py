"""The weight format: ``config.json`` + ``model.safetensors``; no pickle anywhere.

This module sits below the models: it knows how a model's config and weights are written and
read, and keeps the registry of model classes (``model_type`` -> class) that models add
themselves to with :func:`register_model`. It never imports a model; what needs every model
(``multimodal.from_pretrained`` by ``model_type``, checkpoints, encoders) is in
:mod:`multimodal.hub`, above the models.

>>> model.save_pretrained("out/vit")
>>> same = type(model).from_pretrained("out/vit")     # or multimodal.from_pretrained
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import typing
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_model
from torch import nn

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
FORMAT_VERSION = 1

MODEL_CLASSES: dict[str, type[nn.Module]] = {}

M = TypeVar("M", bound="PretrainedMixin")
C = TypeVar("C", bound=type)


def register_model(cls: C) -> C:
    """Class decorator: record ``cls`` under its name, the ``model_type`` that
    ``save_pretrained`` writes, so :func:`multimodal.from_pretrained` can rebuild it."""
    MODEL_CLASSES[cls.__name__] = cls
    return cls


def config_to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def config_from_dict(cls: type, data: dict[str, Any]) -> Any:
    """Rebuild a (possibly nested) dataclass config from JSON; unknown keys are an error.

    JSON has no tuples, so lists come back as tuples (configs hold no mutable lists).
    Init-only keywords are accepted as well as fields: a model config's flat backbone
    keywords read the configs saved before the backbone was nested
    (:mod:`multimodal.models.backbone`).
    """
    hints = typing.get_type_hints(cls)
    accepted = set(inspect.signature(cls).parameters)
    unknown = set(data) - accepted
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields: {sorted(unknown)}")
    kwargs = {}
    for name, value in data.items():
        sub = _dataclass_in(hints[name])
        if sub is not None and isinstance(value, dict):
            value = config_from_dict(sub, value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    return cls(**kwargs)


def _dataclass_in(hint: Any) -> type | None:
    if dataclasses.is_dataclass(hint):
        return hint
    return next((a for a in typing.get_args(hint) if dataclasses.is_dataclass(a)), None)


def read_meta(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """``(config file, its JSON)`` of a folder written by ``save_pretrained`` (or the
    ``config.json`` itself)."""
    path = Path(path)
    cfg_file = path / CONFIG_NAME if path.is_dir() else path
    if not cfg_file.is_file():
        raise FileNotFoundError(f"no {CONFIG_NAME} in {path}: expected a folder written by "
                                "save_pretrained")
    try:
        meta = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{cfg_file} is not valid JSON: {err}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict):
        raise ValueError(f"{cfg_file}: expected an object with 'model_type' and 'config'")
    return cfg_file, meta


def build_model(model_cls: type[M], config: dict[str, Any] | Any) -> M:
    """``model_cls(config)``, the config given as a dataclass or as its JSON dict."""
    if isinstance(config, dict):
        config = config_from_dict(model_cls.config_class, config)
    return model_cls(config)


class PretrainedMixin:
    """Adds ``save_pretrained`` / ``from_pretrained`` and ``num_params`` to a model built
    from ``self.config``."""

    config_class: type

    def save_pretrained(self, path: str | Path) -> Path:
        """Write ``config.json`` and ``model.safetensors`` into the folder ``path``."""
        assert isinstance(self, nn.Module)
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        meta = {"model_type": type(self).__name__, "format_version": FORMAT_VERSION,
                "config": config_to_dict(self.config)}
        (path / CONFIG_NAME).write_text(json.dumps(meta, indent=2))
        save_model(self, str(path / WEIGHTS_NAME))  # handles tied weights
        return path

    @classmethod
    def from_pretrained(cls: type[M], path: str | Path, *, strict: bool = True) -> M:
        """Rebuild a model of this class (or a subclass) from a ``save_pretrained`` folder."""
        cfg_file, meta = read_meta(path)
        kind = meta.get("model_type")
        model_cls = cls if kind == cls.__name__ else MODEL_CLASSES.get(kind)
        if model_cls is None or not issubclass(model_cls, cls):
            raise ValueError(f"{path} holds a {kind}, not a {cls.__name__}")
        model = build_model(model_cls, meta["config"])
        load_state_dict_checked(model, load_safetensors(cfg_file.parent / WEIGHTS_NAME),
                                strict=strict)
        return model.eval()

    def num_params(self, trainable_only: bool = False) -> int:
        """Number of parameters (tied weights counted once)."""
        assert isinstance(self, nn.Module)
        return sum(p.numel() for p in self.parameters()
                   if p.requires_grad or not trainable_only)


def load_safetensors(file: str | Path) -> dict[str, torch.Tensor]:
    """Read a safetensors file; anything else (a pickle, say) is refused, never executed."""
    file = Path(file)
    if not file.is_file():
        raise FileNotFoundError(f"weights file {file} not found")
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"{file} is not a safetensors file ({err}); pickled checkpoints are "
                         "refused because loading them can execute code") from None


def load_state_dict_checked(model: nn.Module, state: dict[str, torch.Tensor],
                            strict: bool = True, assign: bool = False) -> None:
    """``load_state_dict`` with an error that lists every missing, unexpected or
    mis-shaped key at once (``assign``: the tensors become the parameters, no copy)."""
    own = model.state_dict()
    shape_errors = [f"{k}: expected {tuple(own[k].shape)}, got {tuple(v.shape)}"
                    for k, v in state.items() if k in own and own[k].shape != v.shape]
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    # tied weights are stored once by safetensors' save_model
    missing = [k for k in missing if not _is_tied_alias(model, k, state)]
    problems = []
    if shape_errors:
        problems.append("mis-shaped: " + "; ".join(shape_errors))
    if strict and missing:
        problems.append("missing: " + ", ".join(missing))
    if strict and unexpected:
        problems.append("unexpected: " + ", ".join(unexpected))
    if problems:
        raise ValueError(f"state dict does not fit {type(model).__name__}: " + " | ".join(problems))
    model.load_state_dict(state, strict=False, assign=assign)


def _is_tied_alias(model: nn.Module, key: str, state: dict[str, torch.Tensor]) -> bool:
    params = dict(model.named_parameters(remove_duplicate=False))
    if key not in params:
        return False
    return any(params[key] is p and k in state for k, p in params.items() if k != key)


__all__ = ["CONFIG_NAME", "FORMAT_VERSION", "MODEL_CLASSES", "WEIGHTS_NAME", "PretrainedMixin",
           "build_model", "config_from_dict", "config_to_dict", "load_safetensors",
           "load_state_dict_checked", "read_meta", "register_model"]
