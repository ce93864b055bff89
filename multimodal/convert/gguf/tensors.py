"""GGUF tensors -> transformers' Llama names and float32 values (dequantised, the Q/K row
order undone), converted through the one Llama mapping (:mod:`multimodal.convert.hf_text`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from multimodal.convert.common import (
    HF_CONVERTERS,
    HFConfig,
    meta_parameters,
)
from multimodal.convert.gguf.reader import field
from multimodal.models.text import TextDecoder
from multimodal.progress import progress

#: ``general.architecture`` values converted (all through transformers' Llama names)
ARCHITECTURES = ("llama",)
#: tensor types dequantised (``gguf.GGMLQuantizationType`` names)
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                   "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")

# GGUF tensor name (after ``blk.N.``) -> transformers LlamaForCausalLM name (after
# ``model.layers.N.``)
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
              "output": "lm_head"}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")


def unpermute_qk(weight: Tensor, heads: int) -> Tensor:
    """llama.cpp's Q/K row order -> transformers' (see the module docstring).

    For each of ``heads`` heads of ``d`` rows, GGUF row ``2i`` becomes row ``i`` and
    row ``2i + 1`` row ``i + d/2``; works on a weight ``(heads d, in)`` or a bias
    ``(heads d,)``."""
    rows = weight.shape[0]
    if rows % (2 * heads):
        raise ValueError(f"cannot un-permute {rows} rows into {heads} heads of an even size")
    return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]) \
        .transpose(1, 2).reshape(weight.shape)


def dequantise(tensor: Any, path: Path) -> Tensor:
    from gguf import quants

    kind = tensor.tensor_type.name
    if kind not in SUPPORTED_TYPES:
        raise ValueError(f"{path}: tensor {tensor.name!r} is stored as {kind}, which this "
                         f"reader does not dequantise; supported: {', '.join(SUPPORTED_TYPES)}")
    shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
    values = quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
    values = np.asarray(values, dtype=np.float32).reshape(shape)
    if not (values.flags.writeable and values.flags.c_contiguous):  # F32: a view of the map
        values = values.copy()
    return torch.from_numpy(values)


def hf_config(reader: Any, path: Path) -> dict[str, Any]:
    """transformers ``LlamaConfig`` fields from ``llama.*`` metadata."""
    arch = field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not supported; supported: "
                         f"{', '.join(ARCHITECTURES)}")

    def need(key: str) -> Any:
        value = field(reader, f"{arch}.{key}")
        if value is None:
            raise ValueError(f"{path}: metadata {arch}.{key} is missing")
        return value

    heads = int(need("attention.head_count"))
    dim = int(need("embedding_length"))
    head_dim = dim // heads
    kv_heads = field(reader, f"{arch}.attention.head_count_kv", heads)
    if isinstance(kv_heads, list):
        raise ValueError(f"{path}: a KV head count per layer ({arch}.attention.head_count_kv "
                         "is an array) is not supported")
    for key in ("rope.dimension_count", "attention.key_length", "attention.value_length"):
        value = field(reader, f"{arch}.{key}")
        if value is not None and int(value) != head_dim:
            raise ValueError(f"{path}: {arch}.{key} = {value} differs from the head size "
                             f"{head_dim} (embedding_length / head_count); partial rotary or "
                             "odd head sizes are not supported")
    scaling = field(reader, f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ValueError(f"{path}: rope scaling {scaling!r} ({arch}.rope.scaling.type) is not "
                         "supported (only the default rope)")
    names = {t.name for t in reader.tensors}
    vocab = field(reader, f"{arch}.vocab_size")
    if vocab is None:
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        embed = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
        vocab = len(tokens.data) if tokens is not None else (
            int(embed.shape[1]) if embed is not None else None)
    if vocab is None:
        raise ValueError(f"{path}: cannot tell the vocabulary size (no {arch}.vocab_size, "
                         "tokenizer.ggml.tokens or token_embd.weight)")
    _check_against_tensors(reader, path, arch, int(need("block_count")), dim, int(vocab))
    return {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "vocab_size": int(vocab), "hidden_size": dim,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads, "num_key_value_heads": int(kv_heads),
        "max_position_embeddings": int(field(reader, f"{arch}.context_length", 2048)),
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(field(reader, f"{arch}.rope.freq_base", 10000.0)),
        "hidden_act": "silu", "attention_bias": "blk.0.attn_q.bias" in names,
        "mlp_bias": "blk.0.ffn_up.bias" in names,
        "tie_word_embeddings": "output.weight" not in names,
    }


def _check_against_tensors(reader: Any, path: Path, arch: str, depth: int, dim: int,
                           vocab: int) -> None:
    """The metadata's depth, width and vocabulary agree with the tensors actually in the
    file, before any model is built (a corrupt or hostile header cannot make us build a
    million layers or mis-size everything)."""
    layers = {int(m.group(1)) for t in reader.tensors if (m := _BLOCK_RE.match(t.name))}
    if layers != set(range(depth)):
        raise ValueError(f"{path}: {arch}.block_count = {depth}, but the file holds tensors "
                         f"of {len(layers)} blocks (blk.{min(layers, default='-')} .. "
                         f"blk.{max(layers, default='-')})")
    embed = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embed is None:
        raise ValueError(f"{path}: no token_embd.weight tensor")
    shape = tuple(int(n) for n in reversed(embed.shape.tolist()))
    if shape != (vocab, dim):
        raise ValueError(f"{path}: token_embd.weight is {shape} (vocabulary, width), the "
                         f"metadata says ({vocab}, {dim}) ({arch}.vocab_size / "
                         f"{arch}.embedding_length)")


def hf_name(name: str, path: Path) -> str:
    top, _, kind = name.rpartition(".")
    if top in _TOP_NAMES and kind in ("weight", "bias"):
        return f"{_TOP_NAMES[top]}.{kind}"
    match = _BLOCK_RE.match(name)
    if match and match.group(2) in _BLOCK_NAMES:
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{_BLOCK_NAMES[part]}.{kind}"
    raise ValueError(f"{path}: tensor {name!r} has no Llama counterpart (a feature this "
                     "package does not implement, e.g. rope_freqs of Llama 3.1 rope scaling)")


def _hf_state(reader: Any, config: Mapping[str, Any], path: Path) -> dict[str, Tensor]:
    """Every tensor dequantised, renamed to transformers' Llama names, Q/K un-permuted."""
    state: dict[str, Tensor] = {}
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    for tensor in progress(reader.tensors, desc=f"dequantising {path.name}", unit="tensor"):
        name = hf_name(tensor.name, path)
        value = dequantise(tensor, path)
        if ".q_proj." in name:
            value = unpermute_qk(value, heads)
        elif ".k_proj." in name:
            value = unpermute_qk(value, kv_heads)
        state[name] = value
    if config["tie_word_embeddings"] and "model.embed_tokens.weight" in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return state


class Snapshot:
    """What a converter reads from a model: ``config`` and ``state_dict()``; subclassed
    under the architecture's name, which the converters dispatch on."""

    def __init__(self, config: HFConfig, state: dict[str, Tensor]) -> None:
        self.config, self._state = config, state

    def state_dict(self) -> dict[str, Tensor]:
        return self._state


def float_model(reader: Any, path: Path) -> TextDecoder:
    config = hf_config(reader, path)
    state = _hf_state(reader, config, path)
    snapshot = type("LlamaForCausalLM", (Snapshot,), {})(
        HFConfig(config, Path(f"{path} (metadata)")), state)
    try:
        with meta_parameters():  # the dequantised tensors become the parameters
            return HF_CONVERTERS["LlamaForCausalLM"](snapshot)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
