"""Every model config carries one nested ``backbone: TransformerConfig``.

:func:`model_config` turns a class into a dataclass with a field ``backbone`` (the
model's default backbone) and accepts every :class:`~multimodal.nn.block.TransformerConfig`
field as a keyword too: ``ViTConfig(dim=192, depth=12, heads=3)`` folds ``dim``, ``depth``,
``heads`` into ``backbone`` (a keyword wins over the same setting in a ``backbone``
argument), and ``config.dim`` reads (and writes) ``config.backbone.dim``. So the flat
keywords of the public API, YAML files written for them and ``config.json`` files / Lightning
checkpoints saved before the backbone was nested all still work, while the fields live in
one place: a new backbone switch is a field of ``TransformerConfig`` and reaches every
model without touching its config.

Saved configs are nested (``{"backbone": {...}, ...}``); the flat keywords are init-only
(``dataclasses.InitVar``), so they are never written.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from dataclasses import InitVar, dataclass, field
from typing import Any, Optional, TypeVar

from multimodal.nn.block import TransformerConfig

__all__ = ["BACKBONE_FIELDS", "model_config"]

BACKBONE_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TransformerConfig))
# each flat keyword has its TransformerConfig type, or None for "not given" (CLI type checks)
_FLAT_TYPES = {name: InitVar[Optional[hint]]  # noqa: UP045  (a runtime type object)
               for name, hint in typing.get_type_hints(TransformerConfig).items()}

T = TypeVar("T", bound=type)


def _backbone_property(name: str) -> property:
    def get(self: Any) -> Any:
        return getattr(self.backbone, name)

    def set_(self: Any, value: Any) -> None:
        setattr(self.backbone, name, value)

    return property(get, set_, doc=f"``backbone.{name}``")


def model_config(*, fixed: dict[str, Any] | None = None,
                 **defaults: Any) -> Callable[[T], T]:
    """Class decorator (instead of ``@dataclass``) for a model config.

    ``defaults``: the model's default backbone, ``TransformerConfig(**defaults)``.
    ``fixed``: backbone settings the model's architecture requires (a decoder is
    ``causal``); they are applied after everything else.
    The class's own ``__post_init__(self)`` (validation) runs after the backbone is built.
    """
    bad = set(defaults) - set(BACKBONE_FIELDS) | set(fixed or {}) - set(BACKBONE_FIELDS)
    if bad:
        raise TypeError(f"not TransformerConfig fields: {sorted(bad)}")
    fixed = dict(fixed or {})

    def wrap(cls: T) -> T:
        own = inspect.get_annotations(cls)
        clash = set(own) & set(BACKBONE_FIELDS)
        if clash:
            raise TypeError(f"{cls.__name__} declares backbone fields {sorted(clash)}: they "
                            "belong to TransformerConfig")
        validate = cls.__dict__.get("__post_init__")
        annotations = dict(own)
        annotations["backbone"] = TransformerConfig
        cls.backbone = field(default_factory=lambda: TransformerConfig(**defaults))
        for name in BACKBONE_FIELDS:
            annotations[name] = _FLAT_TYPES[name]
            setattr(cls, name, None)
        cls.__annotations__ = annotations

        def __post_init__(self: Any, *flat: Any) -> None:
            backbone = self.backbone
            if isinstance(backbone, dict):
                backbone = TransformerConfig(**backbone)
            if not isinstance(backbone, TransformerConfig):
                raise TypeError(f"{cls.__name__}.backbone must be a TransformerConfig, "
                                f"got {type(backbone).__name__}")
            given = {n: v for n, v in zip(BACKBONE_FIELDS, flat, strict=True) if v is not None}
            # a copy always, so two configs never share (and mutate) one backbone
            self.backbone = dataclasses.replace(backbone, **{**given, **fixed})
            if validate is not None:
                validate(self)

        cls.__post_init__ = __post_init__
        cls = dataclass(cls)
        for name in BACKBONE_FIELDS:  # the init-only keywords read back from the backbone
            setattr(cls, name, _backbone_property(name))
        return cls

    return wrap

