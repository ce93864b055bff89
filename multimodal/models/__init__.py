"""Models on the shared backbone. Importing this package registers every preset."""

import importlib

from multimodal.models.text import TextDecoder, TextDecoderConfig, TextEncoder, TextEncoderConfig
from multimodal.models.vit import ViT, ViTConfig

# Modules written by later work register themselves when present.
for _name in ("image_gpt", "captioner", "audio", "seq2seq", "clip"):
    try:
        importlib.import_module(f"multimodal.models.{_name}")
    except ModuleNotFoundError as _err:
        if _err.name != f"multimodal.models.{_name}":
            raise

__all__ = ["TextDecoder", "TextDecoderConfig", "TextEncoder", "TextEncoderConfig", "ViT",
           "ViTConfig"]
