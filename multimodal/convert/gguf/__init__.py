"""A GGUF file (llama.cpp's one-file format: metadata, tokenizer and quantised weights)
-> our :class:`~multimodal.TextDecoder` and an :class:`~multimodal.HFTokenizer`.

Read with the ``gguf`` package (llama.cpp's own Python reader). Only the Llama family
(``general.architecture == "llama"``: Llama, SmolLM, TinyLlama, ...) is converted; its
tensors are renamed to transformers' ``LlamaForCausalLM`` names and handed to the same
converter as a transformers model or a Hugging Face folder (:mod:`.hf_text`), so there is
one Llama mapping in the package.

What llama.cpp changed on the way in, and is undone here:

- **quantisation.** Each weight row is stored in blocks of 32 values. ``Q8_0``: an fp16
  scale ``d`` and 32 int8 ``q``, ``x = d q``. ``Q4_0``: ``d`` and 32 4-bit ``q``,
  ``x = d (q - 8)``. ``Q4_1``: ``d``, an fp16 minimum ``m`` and 32 4-bit ``q``,
  ``x = d q + m``. ``Q5_0`` / ``Q5_1``: the same with a fifth bit stored apart. The "K"
  types (``Q2_K`` ... ``Q6_K``, as in ``Q4_K_M`` files) use super-blocks of 256 values
  with 4- to 8-bit sub-block scales. ``F16``, ``BF16``, ``F32`` are plain. Dequantised
  with ``gguf.quants.dequantize`` to float32; any other type is refused by name (see
  :data:`SUPPORTED_TYPES`).
- **shapes.** GGUF lists dimensions fastest first (``[in, out]``); numpy's order
  (``(out, in)``, ``nn.Linear``'s) is the reverse.
- **the Q/K row permutation.** llama.cpp rotates adjacent pairs ``(x_{2i}, x_{2i+1})``
  (GPT-J style) where transformers' Llama rotates the halves ``(x_i, x_{i+d/2})``, so its
  converter reorders the rows of ``W_q`` and ``W_k`` within each head: GGUF row ``2i`` is
  HF row ``i``, GGUF row ``2i+1`` is HF row ``i + d/2``. :func:`unpermute_qk` puts them
  back (per KV head for ``W_k``).

**Kept packed** (``quantize="int8" | "int4"``, :func:`from_gguf` / :func:`load_gguf`):
the blocks are read from the file one tensor at a time (not through the memory map, so
the file's pages do not stay in the process) and repacked for
:class:`~multimodal.nn.quantized.QuantizedLinear` without a float32 copy of the model:
``Q4_0`` / ``Q4_1`` -> int4 exactly (groups of 32: ``Q4_0`` is scale ``d``, zero 0;
``Q4_1`` is scale ``d``, zero ``m + 8 d``, since the kernel computes ``(q - 8) s + z``;
``d`` and the zero rounded to bf16), ``Q8_0`` -> int8 with one scale per row
(requantised: ``q' = round(d_b q / s)``, ``s = max |x| / 127``: at most half a step of
``s`` off), other types (``Q5_*``, the K-quants) dequantised a few rows at a time and
requantised to int8 (no packed kernel for them), ``F16`` / ``BF16`` / ``F32`` weights
quantised to ``quantize``'s format. So ``quantize`` chooses the format of float weights
only; blocks keep their own precision. The token embedding tied to the head is looked up
from the head's int8 rows (:class:`~multimodal.nn.quantized.QuantizedEmbedding`). See
:func:`pack_gguf_tensor`.

The tokenizer is rebuilt from ``tokenizer.ggml.*`` (tokens, merges, token types, the
pre-tokenizer name) as a ``tokenizers`` byte-level BPE (``tokenizer.ggml.model ==
"gpt2"``), and the chat template from ``tokenizer.chat_template``: see
:func:`gguf_tokenizer`.
"""

from __future__ import annotations

import os
from pathlib import Path

from multimodal.convert.gguf.packed import Packed, pack_gguf_tensor, packed_model
from multimodal.convert.gguf.reader import open_gguf, open_header, read_gguf_metadata
from multimodal.convert.gguf.tensors import (
    ARCHITECTURES,
    SUPPORTED_TYPES,
    float_model,
    unpermute_qk,
)
from multimodal.convert.gguf.tokenizer import gguf_tokenizer, read_tokenizer
from multimodal.models.text import TextDecoder
from multimodal.tokenizers.hf_json import HFTokenizer

__all__ = ["ARCHITECTURES", "SUPPORTED_TYPES", "Packed", "from_gguf", "gguf_tokenizer",
           "load_gguf", "pack_gguf_tensor", "read_gguf_metadata", "unpermute_qk"]


def from_gguf(path: str | os.PathLike, quantize: str | None = None) -> TextDecoder:
    """A Llama-family GGUF file -> :class:`~multimodal.TextDecoder`: float32 weights, or
    with ``quantize="int8" | "int4"`` its Linears kept packed (see the module docstring)."""
    path = Path(path)
    if quantize is not None:
        return packed_model(open_header(path), path, quantize)
    return float_model(open_gguf(path), path)


def load_gguf(path: str | os.PathLike, tokenizer: bool = True,
              quantize: str | None = None) -> tuple[TextDecoder, HFTokenizer | None]:
    """``(model, tokenizer)`` of a GGUF file read once; the tokenizer is ``None`` when the
    file holds none or ``tokenizer=False`` (then its metadata is not read, so a file whose
    tokenizer is not rebuilt still gives its model). ``quantize="int8" | "int4"``: the
    Linears kept packed (see the module docstring)."""
    path = Path(path)
    if quantize is None:
        reader = open_gguf(path)
        model = float_model(reader, path)
    else:
        reader = open_header(path)
        model = packed_model(reader, path, quantize)
    has_tokenizer = tokenizer and "tokenizer.ggml.model" in reader.fields
    return model, read_tokenizer(reader, path) if has_tokenizer else None
