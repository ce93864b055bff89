"""Models on the shared backbone. Importing this package registers every model class and
preset (each model module registers itself when imported)."""

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

__all__ = ["TextDecoder", "TextDecoderConfig", "TextEncoder", "TextEncoderConfig", "ViT",
           "ViTConfig"]
