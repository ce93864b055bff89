"""Import models from torchvision, timm, transformers and open_clip: the one place that
knows foreign weight layouts.

>>> vit = from_torchvision(torchvision.models.vit_b_16(weights=None))
>>> vit = from_timm(timm.create_model("vit_tiny_patch16_224"), img_size=384)
>>> gpt = from_hf(transformers.GPT2LMHeadModel(config))
>>> llama = from_hf("path/to/hf_folder")   # config.json + safetensors, no transformers
>>> smol = from_hf("SmolLM2-135M-Instruct.Q4_1.gguf")   # a GGUF file (gguf package)
>>> clip = from_open_clip(open_clip.create_model("ViT-B-32", pretrained=None))

Every converter reads the source's hyper-parameters, builds the matching model of this
package, renames (and where needed fuses or transposes) the weights and loads them with
:func:`multimodal.weights.load_state_dict_checked`. The result gives the source's outputs
(to float rounding). A foreign key that is needed but absent, or present but never used
(a feature we do not implement, e.g. attention pooling), is an error that lists the keys.

Layout notes:

- fused attention: our ``qkv`` Linear maps D -> 3D with rows ``[W_q; W_k; W_v]``, each
  split into heads by contiguous blocks of ``d = D / H`` rows. This is the layout of
  ``nn.MultiheadAttention.in_proj_weight`` (torchvision) and timm's ``qkv``; separate
  ``query/key/value`` Linears (transformers ViT, BERT) are concatenated in that order.
- GPT-2 stores ``Conv1D`` weights as (in, out): they are transposed to ``nn.Linear``'s
  (out, in). ``gelu_new`` is the tanh approximation of GELU.
- transformers ``ViTModel`` ends in a pooler (``tanh(W h_cls + b)``), which our ViT has
  not: the converted ViT has no head (``num_classes=0``); ``forward_features`` equals
  ``last_hidden_state`` and ``forward`` returns the normalised class token
  ``last_hidden_state[:, 0]``. The pooler weights are dropped.

Layout of this package: ``common`` (state-dict reading, the registry of transformers
architectures), one module per source family (``torchvision_vit``, ``timm_vit``,
``hf_vision``, ``hf_text``, ``hf_clip``, ``hf_siglip``, ``hf_captioner``, ``openclip``,
...) each registering what it converts, and
``hf_folder`` for folders read without transformers. A new converter is a new module
imported below.
"""

from __future__ import annotations

import os
from typing import Any

from torch import nn

from multimodal.convert import (  # noqa: F401  (each module registers its converters)
    hf_audio,
    hf_captioner,
    hf_clip,
    hf_siglip,
    hf_text,
    hf_vision,
)
from multimodal.convert.common import HF_CONVERTERS, SUPPORTED
from multimodal.convert.hf_audio import whisper_from_hf
from multimodal.convert.hf_folder import from_hf_folder, read_hf_weights
from multimodal.convert.openclip import from_open_clip
from multimodal.convert.timm_vit import from_timm
from multimodal.convert.torchvision_vit import from_torchvision
from multimodal.installed import resolve_weights

SUPPORTED["open_clip"] = ("CLIP, CustomTextCLIP with open_clip's own VisionTransformer and "
                         "TextTransformer (from_open_clip)")
SUPPORTED["gguf"] = ("a llama.cpp GGUF file of the Llama family (F32 / F16 / BF16 / Q4_0 / "
                     "Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q2_K-Q6_K tensors; from_gguf, or "
                     "from_hf(path))")
SUPPORTED["transformers"] = (", ".join(sorted(HF_CONVERTERS)) + "; or a Hugging Face layout "
                             "folder of one of them (from_hf_folder)")


def from_hf(model: nn.Module | str | os.PathLike) -> nn.Module:
    """A transformers model, a folder in the Hugging Face layout (see
    :func:`from_hf_folder`; transformers need not be installed), or a GGUF file (see
    :func:`from_gguf`) -> our model.

    ``ViTModel`` / ``ViTForImageClassification`` -> :class:`~multimodal.ViT`,
    ``GPT2Model`` / ``GPT2LMHeadModel`` -> :class:`~multimodal.TextDecoder`,
    ``BertModel`` / ``BertForMaskedLM`` / ``BertForSequenceClassification`` ->
    :class:`~multimodal.TextEncoder`, ``CLIPModel`` -> :class:`~multimodal.CLIP`; see
    :data:`SUPPORTED` for the rest. A CTranslate2 Whisper directory (``model.bin``,
    faster-whisper's layout) and a transformers ``WhisperForConditionalGeneration`` (model
    or folder) -> :class:`~multimodal.Whisper` (encoder and decoder; its encoder is
    ``.encoder``); a bare ``WhisperModel`` -> its encoder.
    """
    if isinstance(model, (str, os.PathLike)):
        return from_hf_folder(resolve_weights(model))  # or an installed model's name
    name = type(model).__name__
    if name not in HF_CONVERTERS or not hasattr(model, "config"):
        raise ValueError(f"from_hf supports {SUPPORTED['transformers']}; got {name}")
    return HF_CONVERTERS[name](model)


# The CTranslate2 and GGUF readers are imported when one of their names is first used (a
# BERT fine-tune never reads such a file, so it does not import them).
_LAZY = {"from_ctranslate2": "multimodal.convert.ctranslate2",
         "from_gguf": "multimodal.convert.gguf", "gguf_tokenizer": "multimodal.convert.gguf",
         "load_gguf": "multimodal.convert.gguf"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def convert(model: nn.Module, **kwargs: Any) -> nn.Module:
    """Dispatch on the source library: torchvision, timm, transformers or open_clip."""
    module = type(model).__module__
    if module.startswith("torchvision."):
        return from_torchvision(model, **kwargs)
    if module.startswith("timm."):
        return from_timm(model, **kwargs)
    if module.startswith("transformers."):
        return from_hf(model, **kwargs)
    if module.startswith("open_clip."):
        return from_open_clip(model, **kwargs)
    raise ValueError(f"cannot convert a {module}.{type(model).__name__}; supported: "
                     + "; ".join(f"{lib}: {what}" for lib, what in SUPPORTED.items()))


__all__ = ["SUPPORTED", "convert", "from_ctranslate2", "from_gguf", "from_hf", "from_hf_folder",
           "from_open_clip", "from_timm", "from_torchvision", "gguf_tokenizer", "load_gguf",
           "read_hf_weights", "whisper_from_hf"]
