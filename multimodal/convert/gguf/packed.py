"""GGUF blocks kept packed: ``Q4_*`` / ``Q8_0`` / float weights repacked for
:class:`~multimodal.nn.quantized.QuantizedLinear` one tensor at a time, without a float32
copy of the model (the package docstring says how each type maps)."""

from __future__ import annotations

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
from multimodal.convert.gguf.tensors import (
    SUPPORTED_TYPES,
    Snapshot,
    dequantise,
    hf_config,
    hf_name,
    unpermute_qk,
)
from multimodal.models.text import TextDecoder
from multimodal.nn.quantized import (
    QuantizedEmbedding,
    QuantizedLinear,
    check_mode,
    quantize_int4,
    quantize_int8,
)
from multimodal.progress import progress

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
        return dequantise(tensor, path)
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
        w = dequantise(tensor, path)
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
        state[hf_name(t.name, path)] = traced(str(path), t.name, torch.float32, shape)
    if hf["tie_word_embeddings"]:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    snapshot = type("LlamaForCausalLM", (Snapshot,), {})(
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


def packed_model(reader: Any, path: Path, mode: str) -> TextDecoder:
    """The model with its Linears built straight from the file's blocks (GGUF names ->
    ours: Llama's layout, q / k / v rows fused into ``attn.qkv``)."""
    check_mode(mode)
    hf = hf_config(reader, path)
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
