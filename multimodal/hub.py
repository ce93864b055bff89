"""Our own weight format: ``config.json`` + ``model.safetensors``; no pickle anywhere.

>>> model.save_pretrained("out/vit")
>>> same = multimodal.from_pretrained("out/vit")
"""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from multimodal.registry import MODEL_CLASSES, _import_models

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
FORMAT_VERSION = 1

M = TypeVar("M", bound="PretrainedMixin")


def config_to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def config_from_dict(cls: type, data: dict[str, Any]) -> Any:
    """Rebuild a (possibly nested) dataclass config from JSON; unknown keys are an error.

    JSON has no tuples, so lists come back as tuples (configs hold no mutable lists).
    """
    hints = typing.get_type_hints(cls)
    unknown = set(data) - set(hints)
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


class PretrainedMixin:
    """Adds ``save_pretrained`` / ``from_pretrained`` to a model built from ``self.config``."""

    config_class: type

    def save_pretrained(self, path: str | Path) -> Path:
        """Write ``config.json`` and ``model.safetensors`` into the folder ``path``."""
        from safetensors.torch import save_model

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
        model = from_pretrained(path, strict=strict)
        if not isinstance(model, cls):
            raise ValueError(f"{path} holds a {type(model).__name__}, not a {cls.__name__}")
        return model


def read_config(path: str | Path) -> tuple[type[nn.Module], Any]:
    path = Path(path)
    cfg_file = path / CONFIG_NAME if path.is_dir() else path
    if not cfg_file.is_file():
        raise FileNotFoundError(f"no {CONFIG_NAME} in {path}: expected a folder written by "
                                "save_pretrained")
    try:
        meta = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{cfg_file} is not valid JSON: {err}") from None
    _import_models()
    kind = meta.get("model_type")
    if kind not in MODEL_CLASSES:
        raise ValueError(f"{cfg_file}: unknown model_type {kind!r}; "
                         f"known: {', '.join(sorted(MODEL_CLASSES))}")
    model_cls = MODEL_CLASSES[kind]
    return model_cls, config_from_dict(model_cls.config_class, meta["config"])


def load_safetensors(file: str | Path) -> dict[str, torch.Tensor]:
    """Read a safetensors file; anything else (a pickle, say) is refused, never executed."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    file = Path(file)
    if not file.is_file():
        raise FileNotFoundError(f"weights file {file} not found")
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"{file} is not a safetensors file ({err}); pickled checkpoints are "
                         "refused because loading them can execute code") from None


def load_state_dict_checked(model: nn.Module, state: dict[str, torch.Tensor],
                            strict: bool = True) -> None:
    """``load_state_dict`` with an error that lists every missing, unexpected or
    mis-shaped key at once."""
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
    model.load_state_dict(state, strict=False)


def _is_tied_alias(model: nn.Module, key: str, state: dict[str, torch.Tensor]) -> bool:
    params = dict(model.named_parameters(remove_duplicate=False))
    if key not in params:
        return False
    return any(params[key] is p and k in state for k, p in params.items() if k != key)


def from_pretrained(path: str | Path, *, strict: bool = True) -> nn.Module:
    """Rebuild any model written by ``save_pretrained`` (safetensors + JSON config)."""
    model_cls, config = read_config(path)
    model = model_cls(config)
    load_state_dict_checked(model, load_safetensors(Path(path) / WEIGHTS_NAME), strict=strict)
    return model.eval()
