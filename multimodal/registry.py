"""Named presets and model classes, registered by the models themselves.

This module sits below the models and the weight format (it imports nothing of the
package): a model module registers its class with :func:`register_model` (under its name,
the ``model_type`` that ``save_pretrained`` writes) and its presets with
:func:`register_preset` / :func:`register_config_preset`. Building a preset by name needs
every model imported, so ``create_model`` / ``list_presets`` live in
:mod:`multimodal.models`, which imports them all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from torch import nn

MODEL_CLASSES: dict[str, type[nn.Module]] = {}
PRESETS: dict[str, Callable[..., nn.Module]] = {}


C = TypeVar("C", bound=type)


def register_model(cls: C) -> C:
    """Class decorator: record ``cls`` under its name, the ``model_type`` that
    ``save_pretrained`` writes, so :func:`multimodal.from_pretrained` can rebuild it."""
    MODEL_CLASSES[cls.__name__] = cls
    return cls


def model_class(name: Any, where: object = "model_type") -> type[nn.Module]:
    """The class registered under ``name`` (a ``model_type``); a ValueError naming
    ``where`` (the file or checkpoint that recorded it) and the known names otherwise."""
    if name not in MODEL_CLASSES:
        raise ValueError(f"{where}: unknown model_type {name!r}; "
                         f"known: {', '.join(sorted(MODEL_CLASSES))}")
    return MODEL_CLASSES[name]


def register_preset(name: str) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Decorator: register a factory ``f(**overrides) -> model`` under ``name``."""

    def wrap(factory: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        if name in PRESETS:
            raise ValueError(f"preset {name!r} is already registered")
        PRESETS[name] = factory
        return factory

    return wrap


def register_config_preset(name: str, model_cls: Callable[[Any], nn.Module],
                           config_cls: Callable[..., Any], **defaults: Any) -> None:
    """Register ``name`` as ``model_cls(config_cls(**{**defaults, **overrides}))``."""

    def factory(**overrides: Any) -> nn.Module:
        return model_cls(config_cls(**{**defaults, **overrides}))

    factory.__name__ = name
    register_preset(name)(factory)


__all__ = ["MODEL_CLASSES", "PRESETS", "model_class", "register_config_preset",
           "register_model", "register_preset"]
