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
import re
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from multimodal.convert.common import (
    HF_CONVERTERS,
    HFConfig,
    build,
    dry_run,
    meta_parameters,
    traced,
)
from multimodal.files import GGUF_MAGIC
from multimodal.models.text import TextDecoder
from multimodal.nn.quantized import (
    QuantizedEmbedding,
    QuantizedLinear,
    check_mode,
    quantize_int4,
    quantize_int8,
)
from multimodal.progress import progress
from multimodal.tokenizers.hf_json import HFTokenizer
from multimodal.tokenizers.io import byte_alphabet

__all__ = ["ARCHITECTURES", "SUPPORTED_TYPES", "Packed", "from_gguf", "gguf_tokenizer",
           "load_gguf", "pack_gguf_tensor", "read_gguf_metadata", "unpermute_qk"]

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


# ======================================================================================
# the file
# ======================================================================================


def _gguf_extent(path: Path) -> int:
    """The byte count the header says the file has (its tensor data included), read by
    :class:`_HeaderReader`; raises ``EOFError`` where the header itself ends early. Used
    only to explain why ``gguf.GGUFReader`` could not read a file."""
    reader = _HeaderReader(path, check_size=False)
    return max((t.data_offset + t.n_bytes for t in reader.tensors), default=0)


def _open(path: str | os.PathLike) -> Any:
    """A ``gguf.GGUFReader`` of ``path`` (memory-mapped), with errors that name the file
    and the problem: absent, not GGUF, truncated (bytes expected vs present), corrupt."""
    try:
        import gguf
    except ImportError as err:
        raise ImportError("reading a GGUF file needs the gguf package "
                          "(pip install gguf)") from err
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a folder, not a GGUF file")
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} does not exist")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ValueError(f"{path} is not a GGUF file: it starts with {magic!r}, not {GGUF_MAGIC!r}")
    try:
        return gguf.GGUFReader(path)
    except Exception as err:  # the reader's own errors are numpy reshape / index errors
        size = path.stat().st_size
        try:
            expected = _gguf_extent(path)
        except EOFError as why:
            raise ValueError(f"{path} is truncated: {why}; the file has {size} bytes") from None
        except Exception:
            expected = None
        if expected is not None and expected > size:
            raise ValueError(f"{path} is truncated: its header describes {expected} bytes of "
                             f"header and tensor data, the file has {size}") from None
        raise ValueError(f"{path} is not a readable GGUF file "
                         f"({type(err).__name__}: {err})") from None


class _LightField:
    """A metadata value as :class:`_HeaderReader` holds it (``contents()`` as gguf's)."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.data = value if isinstance(value, list) else [value]

    def contents(self) -> Any:
        return self.value


class _LightTensor:
    """A tensor's header entry; ``data`` read from the file on demand, in the shapes
    ``gguf.GGUFReader`` gives (float types: numpy dims; others: uint8 rows of bytes)."""

    def __init__(self, path: Path, name: str, kind: int, dims: list[int], offset: int) -> None:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        self.path, self.name = path, name
        self.tensor_type = GGMLQuantizationType(kind)
        self.shape = np.array(dims, dtype=np.uint64)
        self.n_elements = int(np.prod(dims))
        block, size = GGML_QUANT_SIZES[self.tensor_type]
        self.n_bytes = self.n_elements * size // block
        self.data_offset = offset

    @property
    def data(self) -> np.ndarray:
        dims = tuple(int(d) for d in reversed(self.shape.tolist()))
        if self.tensor_type.name in ("F32", "F16"):
            dtype = np.float32 if self.tensor_type.name == "F32" else np.float16
            return np.fromfile(self.path, dtype=dtype, count=self.n_elements,
                               offset=self.data_offset).reshape(dims)
        raw = np.fromfile(self.path, dtype=np.uint8, count=self.n_bytes, offset=self.data_offset)
        return raw.reshape(*dims[:-1], -1)


# GGUF metadata value types -> struct formats (8: string, 9: array)
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                 10: "<Q", 11: "<q", 12: "<d"}


class _HeaderReader:
    """The header of a GGUF file as plain Python values (``fields`` / ``tensors`` as
    ``gguf.GGUFReader`` names them), read in one pass without a memory map. gguf's reader
    keeps a numpy view per array element (~145 MB for SmolLM2's 49k-token vocabulary, more
    than the 94 MB file): the packed path reads the header with this instead, so loading
    stays within 1.5x the file size (tests/convert/test_gguf_quant.py checks both readers
    agree). ``check_size``: tensor data past the end of the file is an ``EOFError``.
    """

    def __init__(self, path: Path, check_size: bool = True) -> None:
        import io

        with path.open("rb") as raw:
            f = io.BufferedReader(raw, buffer_size=1 << 20)

            def take(fmt: str) -> Any:
                size = struct.calcsize(fmt)
                chunk = f.read(size)
                if len(chunk) != size:
                    raise EOFError("the header ends early")
                return struct.unpack(fmt, chunk)[0]

            def string() -> str:
                n = take("<Q")
                chunk = f.read(n)
                if len(chunk) != n:
                    raise EOFError("the header ends early")
                return chunk.decode("utf-8")

            def value(kind: int) -> Any:
                if kind == 8:
                    return string()
                if kind == 9:
                    inner, count = take("<I"), take("<Q")
                    if inner in _GGUF_SCALARS:
                        fmt = _GGUF_SCALARS[inner]
                        size = struct.calcsize(fmt)
                        chunk = f.read(size * count)
                        if len(chunk) != size * count:
                            raise EOFError("the header ends early")
                        return list(struct.unpack(f"<{count}{fmt[1]}", chunk))
                    return [value(inner) for _ in range(count)]
                return take(_GGUF_SCALARS[kind])

            if f.read(4) != GGUF_MAGIC:
                raise ValueError("not a GGUF file")
            take("<I")
            n_tensors, n_kv = take("<Q"), take("<Q")
            self.fields: dict[str, _LightField] = {}
            for _ in range(n_kv):
                key = string()
                self.fields[key] = _LightField(value(take("<I")))
            infos = []
            for _ in range(n_tensors):
                name = string()
                dims = [take("<Q") for _ in range(take("<I"))]
                infos.append((name, dims, take("<I"), take("<Q")))
            alignment = int(self.fields.get("general.alignment", _LightField(32)).value)
            start = -(-f.tell() // alignment) * alignment
        self.tensors = [_LightTensor(path, name, kind, dims, start + offset)
                        for name, dims, kind, offset in infos]
        size = path.stat().st_size
        if check_size and any(t.data_offset + t.n_bytes > size for t in self.tensors):
            raise EOFError("tensor data past the end of the file")


def _open_header(path: str | os.PathLike) -> Any:
    """:class:`_HeaderReader` of ``path``; any problem is reported by :func:`_open`'s
    checks (the same one-line errors as the float path)."""
    path = Path(path)
    try:
        return _HeaderReader(path)
    except Exception:
        return _open(path)


def _field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def read_gguf_metadata(path: str | os.PathLike, arrays: bool = False) -> dict[str, Any]:
    """The key/value metadata of a GGUF file as Python values (arrays such as
    ``tokenizer.ggml.tokens`` shortened to their length unless ``arrays=True``)."""
    reader = _open(path)
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        if not arrays and len(field.data) > 1:
            out[key] = f"<array of {len(field.data)}>"
        else:
            out[key] = field.contents()
    return out


# ======================================================================================
# tensors
# ======================================================================================


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


def _dequantise(tensor: Any, path: Path) -> Tensor:
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


def _hf_config(reader: Any, path: Path) -> dict[str, Any]:
    """transformers ``LlamaConfig`` fields from ``llama.*`` metadata."""
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not supported; supported: "
                         f"{', '.join(ARCHITECTURES)}")

    def need(key: str) -> Any:
        value = _field(reader, f"{arch}.{key}")
        if value is None:
            raise ValueError(f"{path}: metadata {arch}.{key} is missing")
        return value

    heads = int(need("attention.head_count"))
    dim = int(need("embedding_length"))
    head_dim = dim // heads
    kv_heads = _field(reader, f"{arch}.attention.head_count_kv", heads)
    if isinstance(kv_heads, list):
        raise ValueError(f"{path}: a KV head count per layer ({arch}.attention.head_count_kv "
                         "is an array) is not supported")
    for key in ("rope.dimension_count", "attention.key_length", "attention.value_length"):
        value = _field(reader, f"{arch}.{key}")
        if value is not None and int(value) != head_dim:
            raise ValueError(f"{path}: {arch}.{key} = {value} differs from the head size "
                             f"{head_dim} (embedding_length / head_count); partial rotary or "
                             "odd head sizes are not supported")
    scaling = _field(reader, f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ValueError(f"{path}: rope scaling {scaling!r} ({arch}.rope.scaling.type) is not "
                         "supported (only the default rope)")
    names = {t.name for t in reader.tensors}
    vocab = _field(reader, f"{arch}.vocab_size")
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
        "max_position_embeddings": int(_field(reader, f"{arch}.context_length", 2048)),
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
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


def _hf_name(name: str, path: Path) -> str:
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
        name = _hf_name(tensor.name, path)
        value = _dequantise(tensor, path)
        if ".q_proj." in name:
            value = unpermute_qk(value, heads)
        elif ".k_proj." in name:
            value = unpermute_qk(value, kv_heads)
        state[name] = value
    if config["tie_word_embeddings"] and "model.embed_tokens.weight" in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return state


class _Snapshot:
    """What a converter reads from a model: ``config`` and ``state_dict()``; subclassed
    under the architecture's name, which the converters dispatch on."""

    def __init__(self, config: HFConfig, state: dict[str, Tensor]) -> None:
        self.config, self._state = config, state

    def state_dict(self) -> dict[str, Tensor]:
        return self._state


def _model(reader: Any, path: Path) -> TextDecoder:
    config = _hf_config(reader, path)
    state = _hf_state(reader, config, path)
    snapshot = type("LlamaForCausalLM", (_Snapshot,), {})(
        HFConfig(config, Path(f"{path} (metadata)")), state)
    try:
        with meta_parameters():  # the dequantised tensors become the parameters
            return HF_CONVERTERS["LlamaForCausalLM"](snapshot)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def from_gguf(path: str | os.PathLike, quantize: str | None = None) -> TextDecoder:
    """A Llama-family GGUF file -> :class:`~multimodal.TextDecoder`: float32 weights, or
    with ``quantize="int8" | "int4"`` its Linears kept packed (see the module docstring)."""
    path = Path(path)
    if quantize is not None:
        return _packed_model(_open_header(path), path, quantize)
    return _model(_open(path), path)


# ======================================================================================
# kept packed: GGUF blocks -> QuantizedLinear without a float32 model
# ======================================================================================

_INT4_KINDS = ("Q4_0", "Q4_1")
_ROW_CHUNK = 512  # rows dequantised at a time where a float detour is unavoidable


class Packed(NamedTuple):
    """One GGUF matrix (out, in) ready for a packed kernel: ``kind == "int4"``: ``q``
    uint8 values in [0, 15] (out, in), ``scale`` / ``zero`` float32 (out, in / 32),
    ``W = (q - 8) scale + zero`` per group of 32; ``kind == "int8"``: ``q`` int8
    (out, in) and ``scale`` (out,) (``zero`` None), ``W = scale q``."""

    kind: str
    q: Tensor
    scale: Tensor
    zero: Tensor | None

    def rows(self, index: Tensor | slice) -> Packed:
        return Packed(self.kind, self.q[index], self.scale[index],
                      None if self.zero is None else self.zero[index])

    def dequantize(self) -> Tensor:
        if self.kind == "int8":
            return self.q.float() * self.scale[:, None]
        groups = torch.arange(self.q.shape[1]) // (self.q.shape[1] // self.scale.shape[1])
        return (self.q.float() - 8) * self.scale[:, groups] + self.zero[:, groups]


def _read_blocks(tensor: Any, path: Path, start: int = 0, stop: int | None = None
                 ) -> np.ndarray:
    """Rows ``start:stop`` of the tensor's raw bytes (rows, bytes a row), read from the
    file (a private copy: no memory map, so the file's pages do not count to the
    process)."""
    rows = int(np.prod(tensor.shape[1:])) if len(tensor.shape) > 1 else 1
    stop = rows if stop is None else stop
    row_bytes = int(tensor.n_bytes) // rows
    with path.open("rb") as f:
        f.seek(int(tensor.data_offset) + start * row_bytes)
        raw = np.frombuffer(f.read((stop - start) * row_bytes), dtype=np.uint8)
    return raw.reshape(stop - start, row_bytes)


def _q4(raw: np.ndarray, with_min: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Q4_0 / Q4_1 blocks (rows, blocks * (18 | 20) bytes) -> (q, d, m): per block an fp16
    scale ``d`` (and minimum ``m``), then 16 bytes holding values 0-15 in their low
    nibbles and 16-31 in their high ones."""
    rows = raw.shape[0]
    size = 20 if with_min else 18
    blocks = raw.reshape(rows, -1, size)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32) if with_min \
        else None
    qs = blocks[..., size - 16:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(rows, -1)
    return (torch.from_numpy(np.ascontiguousarray(q)), torch.from_numpy(d),
            None if m is None else torch.from_numpy(m))


def _q8_0(raw: np.ndarray) -> tuple[Tensor, Tensor]:
    """Q8_0 blocks (rows, blocks * 34 bytes) -> (q int8 (rows, in), d (rows, in / 32))."""
    blocks = raw.reshape(raw.shape[0], -1, 34)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    q = blocks[..., 2:].copy().view(np.int8).reshape(raw.shape[0], -1)
    return torch.from_numpy(q), torch.from_numpy(d)


def _requantize_int8(rows: int, dequantize: Any) -> Packed:
    """int8 with one scale per row from ``dequantize(start, stop) -> float32 rows``,
    a chunk of rows at a time (no float32 copy of the whole matrix)."""
    q = torch.empty(0, dtype=torch.int8)
    scales = torch.empty(rows)
    for start in range(0, rows, _ROW_CHUNK):
        stop = min(start + _ROW_CHUNK, rows)
        chunk, s = quantize_int8(dequantize(start, stop))
        if start == 0:
            q = torch.empty(rows, chunk.shape[1], dtype=torch.int8)
        q[start:stop] = chunk
        scales[start:stop] = s.float()
    return Packed("int8", q, scales, None)


def pack_gguf_tensor(tensor: Any, path: Path, mode: str = "int8") -> Packed | Tensor:
    """One GGUF tensor for a packed kernel (:class:`Packed`), or a float32 tensor (a
    1-D tensor: norms, biases). Q4_0 / Q4_1: int4 exactly; Q8_0: int8 per row; other
    quantised types: dequantised a chunk of rows at a time, int8 per row; float matrices:
    ``mode`` (``"int8"`` or ``"int4"``, groups of 32; int8 where 32 does not divide the
    width)."""
    from gguf import quants

    kind = tensor.tensor_type.name
    if kind not in SUPPORTED_TYPES:
        raise ValueError(f"{path}: tensor {tensor.name!r} is stored as {kind}, which this "
                         f"reader does not read; supported: {', '.join(SUPPORTED_TYPES)}")
    shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
    if len(shape) == 1:
        return _dequantise(tensor, path)
    if kind in _INT4_KINDS:
        q, d, m = _q4(_read_blocks(tensor, path), kind == "Q4_1")
        zero = torch.zeros_like(d) if m is None else m + 8 * d
        return Packed("int4", q.reshape(shape), d, zero)
    if kind == "Q8_0":
        groups = torch.arange(shape[1]) // 32

        def q8_rows(a: int, b: int) -> Tensor:
            q8, d = _q8_0(_read_blocks(tensor, path, a, b))
            return q8.float() * d[:, groups]

        return _requantize_int8(shape[0], q8_rows)
    if kind in ("F32", "F16", "BF16"):
        w = _dequantise(tensor, path)
        if mode == "int4" and shape[1] % 32 == 0:
            return Packed("int4", *quantize_int4(w, 32))
        q, scale = quantize_int8(w)
        return Packed("int8", q, scale.float(), None)
    return _requantize_int8(shape[0], lambda a, b: torch.from_numpy(np.asarray(
        quants.dequantize(_read_blocks(tensor, path, a, b), tensor.tensor_type),
        dtype=np.float32)).reshape(b - a, -1))


def _to_int8(packed: Packed) -> Packed:
    """int4 blocks requantised to int8 with one scale per row (a chunk of rows at a time)."""
    return _requantize_int8(packed.q.shape[0],
                            lambda a, b: packed.rows(slice(a, b)).dequantize())


def _fuse(parts: list[Packed]) -> Packed:
    """Row blocks (q, k, v) of one fused Linear: concatenated when all are int4 (values
    and scales stack by rows), else int8 per row (each row keeps its own scale)."""
    if len(parts) == 1:
        return parts[0]
    if all(p.kind == "int4" for p in parts):
        return Packed("int4", torch.cat([p.q for p in parts]),
                      torch.cat([p.scale for p in parts]), torch.cat([p.zero for p in parts]))
    as_int8 = [p if p.kind == "int8" else _to_int8(p) for p in parts]
    return Packed("int8", torch.cat([p.q for p in as_int8]),
                  torch.cat([p.scale.float() for p in as_int8]), None)


def _linear(packed: Packed, bias: Tensor | None) -> QuantizedLinear:
    if packed.kind == "int4":
        from multimodal.nn.quantized import int4_fits

        if int4_fits(*packed.q.shape, 32):
            return QuantizedLinear.from_int4(packed.q, packed.scale, packed.zero, bias)
        packed = _to_int8(packed)
    return QuantizedLinear.from_int8(packed.q, packed.scale, bias)


def _embedding(packed: Packed) -> QuantizedEmbedding:
    """An int8 table with one scale per row (int4 blocks requantised a chunk of rows at a
    time: a lookup reads rows, which the int4 kernel's tiled layout does not give)."""
    if packed.kind == "int4":
        packed = _to_int8(packed)
    return QuantizedEmbedding(packed.q, packed.scale.to(torch.bfloat16))


def _our_config(reader: Any, path: Path, hf: dict[str, Any]) -> Any:
    """Our TextDecoderConfig, from the one Llama converter run on the file's shapes
    (a dry run: nothing read, nothing allocated)."""
    state = {}
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))
        state[_hf_name(t.name, path)] = traced(str(path), t.name, torch.float32, shape)
    if hf["tie_word_embeddings"]:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    snapshot = type("LlamaForCausalLM", (_Snapshot,), {})(
        HFConfig(hf, Path(f"{path} (metadata)")), state)
    try:
        with dry_run(Path(f"{path} (metadata)"), hf):
            return HF_CONVERTERS["LlamaForCausalLM"](snapshot).config
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def _trim_heap() -> None:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim``; nothing
    elsewhere). Packing allocates and frees a few MB per tensor between the packed
    tensors it keeps; glibc keeps those holes, which measured ~2.5x the model's size in
    resident memory after loading SmolLM2 (103 MiB after trimming)."""
    global _MALLOC_TRIM
    if _MALLOC_TRIM is None:
        try:
            import ctypes

            _MALLOC_TRIM = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _MALLOC_TRIM = False
    if _MALLOC_TRIM:
        _MALLOC_TRIM(0)


_MALLOC_TRIM: Any = None


def _set(model: nn.Module, name: str, value: nn.Module | Tensor) -> None:
    owner, _, attr = name.rpartition(".")
    parent = model.get_submodule(owner) if owner else model
    if isinstance(value, Tensor):
        value = nn.Parameter(value, requires_grad=False)
    setattr(parent, attr, value)


def _packed_model(reader: Any, path: Path, mode: str) -> TextDecoder:
    """The model with its Linears built straight from the file's blocks (GGUF names ->
    ours: Llama's layout, q / k / v rows fused into ``attn.qkv``)."""
    check_mode(mode)
    hf = _hf_config(reader, path)
    config = _our_config(reader, path, hf)
    with meta_parameters():
        model = build(TextDecoder, config)
    heads, kv_heads = hf["num_attention_heads"], hf["num_key_value_heads"]
    tensors = {t.name: t for t in reader.tensors}

    def packed(name: str) -> Packed | Tensor:
        value = pack_gguf_tensor(tensors[name], path, mode)
        part = name.split(".")[-2] if name.count(".") >= 2 else ""
        if part in ("attn_q", "attn_k"):
            n = heads if part == "attn_q" else kv_heads
            if isinstance(value, Packed):
                value = Packed(value.kind, unpermute_qk(value.q, n), unpermute_qk(value.scale, n),
                               None if value.zero is None else unpermute_qk(value.zero, n))
            else:
                value = unpermute_qk(value, n)
        return value

    def bias(names: list[str]) -> Tensor | None:
        if not all(n in tensors for n in names):
            return None
        return torch.cat([packed(n) for n in names])  # type: ignore[misc]

    for i in progress(range(config.depth), desc=f"packing {path.name}", unit="block"):
        blk, ours = f"blk.{i}", f"transformer.blocks.{i}"
        _set(model, f"{ours}.norm1.weight", packed(f"{blk}.attn_norm.weight"))
        _set(model, f"{ours}.norm2.weight", packed(f"{blk}.ffn_norm.weight"))
        qkv = [f"{blk}.attn_{p}" for p in "qkv"]
        _set(model, f"{ours}.attn.qkv", _linear(_fuse([packed(f"{n}.weight") for n in qkv]),
                                                bias([f"{n}.bias" for n in qkv])))
        for theirs, our in (("attn_output", "attn.proj"), ("ffn_gate", "mlp.gate"),
                            ("ffn_up", "mlp.up"), ("ffn_down", "mlp.fc2")):
            _set(model, f"{ours}.{our}", _linear(packed(f"{blk}.{theirs}.weight"),
                                                 bias([f"{blk}.{theirs}.bias"])))
        _trim_heap()
    _set(model, "transformer.norm.weight", packed("output_norm.weight"))
    embed = packed("token_embd.weight")
    if hf["tie_word_embeddings"]:
        head = _linear(embed, None)
        head.refine_top = True  # exact top logits in fp32 (QuantizedLinear._refine_top)
        _set(model, "lm_head", head)
        _set(model, "tok_embed", QuantizedEmbedding.tied_to(head) if head.mode == "int8"
             else _embedding(embed))
    else:
        head = _linear(packed("output.weight"), None)
        head.refine_top = True
        _set(model, "lm_head", head)
        _set(model, "tok_embed", _embedding(embed))
    _trim_heap()
    still = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if still:
        raise ValueError(f"{path}: no GGUF tensor for our " + ", ".join(still[:5]))
    return model.eval()


# ======================================================================================
# the tokenizer
# ======================================================================================

# tokenizer.ggml.pre -> how text is split before the byte-level BPE, as llama.cpp does
# (llama-vocab.cpp); None: GPT-2's split
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_PRE_TOKENIZERS = {"default": None, "gpt2": None, "gpt-2": None,
                   "smollm": "digits", "starcoder": "digits", "refact": "digits",
                   "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT,
                   "llama-bpe": _LLAMA3_SPLIT}
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types


def _pre_tokenizer(pre: str | None, add_prefix_space: bool, path: Path) -> Any:
    from tokenizers import Regex, pre_tokenizers

    if pre is not None and pre not in _PRE_TOKENIZERS:
        raise ValueError(f"{path}: tokenizer.ggml.pre = {pre!r} is not supported; supported: "
                         f"{sorted(_PRE_TOKENIZERS)}")
    split = _PRE_TOKENIZERS.get(pre or "default")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space,
                                          use_regex=split is None or split == "digits")
    if split is None:
        return byte_level
    if split == "digits":  # every digit its own piece, then GPT-2's split
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        byte_level])
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                    byte_level])


def _tokenizer(reader: Any, path: Path) -> HFTokenizer:
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    kind = _field(reader, "tokenizer.ggml.model")
    if kind is None:
        raise ValueError(f"{path} holds no tokenizer (no tokenizer.ggml.model)")
    if kind != "gpt2":
        raise ValueError(f"{path}: tokenizer.ggml.model = {kind!r} is not supported; only "
                         "byte-level BPE ('gpt2', e.g. SmolLM2, Llama 3) is rebuilt. Pass a "
                         "tokenizer yourself (load_encoder(path, tokenizer=...))")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    merges = _field(reader, "tokenizer.ggml.merges")
    if not tokens or merges is None:
        raise ValueError(f"{path}: a byte-level BPE tokenizer needs tokenizer.ggml.tokens "
                         "and tokenizer.ggml.merges")
    types = _field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise ValueError(f"{path}: tokenizer.ggml.token_type has {len(types)} entries, "
                         f"tokenizer.ggml.tokens {len(tokens)}")
    alphabet = set(byte_alphabet().values())
    vocab = {token: i for i, token in enumerate(tokens)}
    pairs = []
    for i, merge in enumerate(merges):
        left, sep, right = merge.partition(" ")
        if not sep:
            raise ValueError(f"{path}: tokenizer.ggml.merges[{i}] = {merge!r} is not 'a b'")
        pairs.append((left, right))
    backend = Tokenizer(models.BPE(vocab, pairs, fuse_unk=False))
    backend.pre_tokenizer = _pre_tokenizer(_field(reader, "tokenizer.ggml.pre"),
                                           bool(_field(reader, "tokenizer.ggml.add_space_prefix",
                                                       False)), path)
    backend.decoder = decoders.ByteLevel()
    # control tokens (<|im_start|>, ...) stay whole and are skipped on decoding; user-defined
    # ones stay whole too; a control token outside the byte alphabet would be a mislabel
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t, k in zip(tokens, types, strict=True)
                                if k == _CONTROL and set(t) <= alphabet])
    backend.add_tokens([AddedToken(t, special=False, normalized=False)
                        for t, k in zip(tokens, types, strict=True) if k == _USER_DEFINED])

    def special(key: str) -> str | None:
        i = _field(reader, f"tokenizer.ggml.{key}_token_id")
        if i is None:
            return None
        if not 0 <= int(i) < len(tokens):
            raise ValueError(f"{path}: tokenizer.ggml.{key}_token_id = {i} is outside the "
                             f"vocabulary of {len(tokens)}")
        return tokens[int(i)]

    bos, eos = special("bos"), special("eos")
    add_bos = bool(_field(reader, "tokenizer.ggml.add_bos_token", False)) and bos is not None
    add_eos = bool(_field(reader, "tokenizer.ggml.add_eos_token", False)) and eos is not None
    if add_bos or add_eos:
        single = [*([bos] if add_bos else []), "$A", *([eos] if add_eos else [])]
        backend.post_processor = processors.TemplateProcessing(
            single=" ".join(single),
            special_tokens=[(t, vocab[t]) for t in {bos if add_bos else None,
                                                    eos if add_eos else None} - {None}])
    pad = special("padding")
    return HFTokenizer(backend, pad_id=vocab[pad] if pad is not None else 0,
                       chat_template=_field(reader, "tokenizer.chat_template"),
                       bos_token=bos, eos_token=eos)


def gguf_tokenizer(path: str | os.PathLike) -> HFTokenizer:
    """The tokenizer described by a GGUF file's metadata, with its chat template.

    Byte-level BPE (``tokenizer.ggml.model == "gpt2"``): the vocabulary and merges as
    stored, split before BPE as llama.cpp does for ``tokenizer.ggml.pre`` (``"smollm"``:
    each digit alone, then GPT-2's split; ``"llama-bpe"``: Llama 3's split; default:
    GPT-2's), tokens typed *control* as special tokens (kept whole, dropped by
    ``decode``), *user-defined* ones kept whole, BOS / EOS added when
    ``tokenizer.ggml.add_bos_token`` / ``add_eos_token`` say so, padding with
    ``tokenizer.ggml.padding_token_id``. SentencePiece vocabularies (``"llama"``) are
    refused by name."""
    path = Path(path)
    return _tokenizer(_open(path), path)


def load_gguf(path: str | os.PathLike, tokenizer: bool = True,
              quantize: str | None = None) -> tuple[TextDecoder, HFTokenizer | None]:
    """``(model, tokenizer)`` of a GGUF file read once; the tokenizer is ``None`` when the
    file holds none or ``tokenizer=False`` (then its metadata is not read, so a file whose
    tokenizer is not rebuilt still gives its model). ``quantize="int8" | "int4"``: the
    Linears kept packed (see the module docstring)."""
    path = Path(path)
    if quantize is None:
        reader = _open(path)
        model = _model(reader, path)
    else:
        reader = _open_header(path)
        model = _packed_model(reader, path, quantize)
    has_tokenizer = tokenizer and "tokenizer.ggml.model" in reader.fields
    return model, _tokenizer(reader, path) if has_tokenizer else None
