"""Named presets and model classes, in one place.

``create_model("vit_tiny_patch16_224", num_classes=10)`` builds a preset with overrides;
``MODEL_CLASSES`` maps the ``model_type`` written by ``save_pretrained`` back to a class.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

PRESETS: dict[str, Callable[..., nn.Module]] = {}
MODEL_CLASSES: dict[str, type[nn.Module]] = {}


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


def register_model(cls: type[nn.Module]) -> type[nn.Module]:
    """Class decorator: make ``cls`` loadable by :func:`multimodal.from_pretrained`."""
    MODEL_CLASSES[cls.__name__] = cls
    return cls


def _import_models() -> None:
    import multimodal.models  # noqa: F401  (registers every preset and class)


def list_presets() -> list[str]:
    _import_models()
    return sorted(PRESETS)


def create_model(name: str, **overrides: Any) -> nn.Module:
    """Build the preset ``name``; keyword arguments override its config fields."""
    _import_models()
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; available: {', '.join(sorted(PRESETS))}")
    return PRESETS[name](**overrides)
