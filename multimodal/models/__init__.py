"""Models on the shared backbone. Importing this package registers every model class and
preset (each model module registers itself when imported), so presets are built by name
here: :func:`create_model`, :func:`list_presets` (``mm.create_model``, ``mm.list_presets``).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from multimodal.models import (  # noqa: F401  (registers)
    audio,
    captioner,
    clip,
    codec_lm,
    image_gpt,
    rnn,
    seq2seq,
    whisper,
)
from multimodal.models.text import TextDecoder, TextDecoderConfig, TextEncoder, TextEncoderConfig
from multimodal.models.vit import ViT, ViTConfig
from multimodal.registry import PRESETS


def list_presets() -> list[str]:
    """Names accepted by :func:`create_model`."""
    return sorted(PRESETS)


def create_model(name: str, **overrides: Any) -> nn.Module:
    """Build the preset ``name``; keyword arguments override its config fields."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; available: {', '.join(sorted(PRESETS))}")
    return PRESETS[name](**overrides)


__all__ = ["TextDecoder", "TextDecoderConfig", "TextEncoder", "TextEncoderConfig", "ViT",
           "ViTConfig", "create_model", "list_presets"]
