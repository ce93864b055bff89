"""``preset: NAME`` for a task: the named model (:func:`multimodal.models.create_model`) with the
config's ``overrides`` and the sizes its data module fixes.

The sizes come from the data module's ``model_sizes`` (``{"image_size": 32, "in_channels": 1}``,
``{"vocab_size": 2000, "max_len": 64}``, ...), which the CLI links into the task's
``data_sizes``: a size is written once, in the data section. Each size replaces every field of
that name in the preset's config, at any depth (a captioner's ``encoder.image_size``, a
CLIP's ``vision.image_size``, both halves' ``codebook_size`` of a codec language model); a
model without that field ignores it. An override that sets a field to another value than
the data's is an error naming both.

``overrides`` may reach into nested configs with a mapping:
``{"encoder": {"dim": 128}, "decoder": {"depth": 4}}`` changes those fields only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from multimodal.models import create_model


def with_fields(config: Any, fields: Mapping[str, Any], where: str = "") -> Any:
    """``config`` (a dataclass) with ``fields`` replaced; a mapping given for a field that
    holds a dataclass replaces fields inside it. An unknown field is a ValueError."""
    known = set(_field_names(config))
    changes = {}
    for name, value in fields.items():
        if name not in known:
            raise ValueError(f"{type(config).__name__} has no field '{where}{name}'; fields: "
                             f"{sorted(n for n in known if not n.startswith('_'))}")
        current = getattr(config, name)
        if dataclasses.is_dataclass(current) and isinstance(value, Mapping):
            value = with_fields(current, value, f"{where}{name}.")
        changes[name] = value
    return dataclasses.replace(config, **changes)


def _field_names(config: Any) -> list[str]:
    """The keywords ``dataclasses.replace`` takes: the fields and the init-only ones (a
    config's flat aliases, such as a sequence-to-sequence config's ``source_vocab_size``)."""
    fields = dataclasses.fields(config)
    init_only = [name for name, f in type(config).__dataclass_fields__.items()
                 if f._field_type is dataclasses._FIELD_INITVAR]  # type: ignore[attr-defined]
    return [f.name for f in fields if f.init] + init_only


def size_fields(config: Any, sizes: Mapping[str, Any]) -> dict[str, Any]:
    """The nested ``{field: value}`` that sets every field of ``config`` named like a key of
    ``sizes`` (None values skipped), at any depth."""
    out: dict[str, Any] = {}
    for name in _field_names(config):
        if name in sizes and sizes[name] is not None:
            out[name] = sizes[name]
            continue
        current = getattr(config, name, None)
        if dataclasses.is_dataclass(current):
            inner = size_fields(current, sizes)
            if inner:
                out[name] = inner
    return out


def _flat(fields: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in fields.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _template(preset: str) -> nn.Module:
    """The preset built without weights (meta tensors: no memory, no random numbers drawn),
    only to read its config and class; built normally if the model cannot be made on meta."""
    try:
        with torch.device("meta"):
            return create_model(preset)
    except Exception:
        return create_model(preset)


def preset_config(preset: str, overrides: Mapping[str, Any] | None = None,
                  data_sizes: Mapping[str, Any] | None = None,
                  defaults: Mapping[str, Any] | None = None) -> tuple[type, Any]:
    """``(model class, config)`` of ``preset`` with ``overrides`` and ``data_sizes`` applied
    (see the module doc). ``defaults``: top-level fields a task sets unless ``overrides``
    does (a classifier's ``mlm_head: false``), applied where the config has them."""
    template = _template(preset)
    known = set(_field_names(template.config))
    preset_defaults = {k: v for k, v in dict(defaults or {}).items() if k in known}
    config = with_fields(template.config, {**preset_defaults, **dict(overrides or {})})
    linked = size_fields(config, dict(data_sizes or {}))
    given = _flat(dict(overrides or {}))
    clashes = {k: (given[k], v) for k, v in _flat(linked).items() if k in given and given[k] != v}
    if clashes:
        detail = "; ".join(f"{k}: overrides {a!r}, data {b!r}" for k, (a, b) in clashes.items())
        raise ValueError(f"preset {preset!r}: the overrides disagree with the data ({detail}); "
                         "these sizes come from the data section: drop them from overrides")
    return type(template), with_fields(config, linked)


def preset_model(preset: str, overrides: Mapping[str, Any] | None = None,
                 data_sizes: Mapping[str, Any] | None = None,
                 defaults: Mapping[str, Any] | None = None) -> nn.Module:
    """The model of ``preset`` with ``overrides``, ``data_sizes`` and the task's
    ``defaults`` (:func:`preset_config`; fresh weights)."""
    model_cls, config = preset_config(preset, overrides, data_sizes, defaults)
    return model_cls(config)
