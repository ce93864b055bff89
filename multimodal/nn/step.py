"""The decoding step of one new token per row, written out without module calls.

Two forms, both equal to the Blocks' own forward on a cache (tests/nn/test_cache.py):

- :func:`block_step` runs a plain pre-norm block on a growing :class:`~multimodal.nn.cache.
  KVCache` from a :class:`StepPlan` (:func:`plan_block`): the block's tensors and functions
  taken once per cache, so a step reads no module attributes;
- :func:`static_step` runs the whole stack on a fixed-size :class:`~multimodal.nn.cache.
  StaticKVCache`, every shape fixed (what ``torch.compile`` and CUDA graphs need);
  :mod:`multimodal.generation` compiles it.

:class:`~multimodal.nn.block.Transformer` picks one of them for a one-token call; the Blocks
themselves stay the one definition of the layer.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from multimodal.nn.attention import Attention
from multimodal.nn.cache import LayerCache
from multimodal.nn.layers import MLP, GatedMLP
from multimodal.nn.position import apply_rotary

if TYPE_CHECKING:
    from multimodal.nn.block import Block, Transformer

__all__ = ["StepPlan", "block_step", "plan_block", "static_step"]


class StepPlan(NamedTuple):
    """One pre-norm block's tensors and functions for :func:`block_step`."""

    norm1: Callable[[Tensor], Tensor]
    qkv_weight: Tensor  # (out, in): the Linear's own weight
    qkv_bias: Tensor | None  # (out, 1): a view of the Linear's bias as a column
    proj_weight: Tensor
    proj_bias: Tensor | None
    norm2: Callable[[Tensor], Tensor]
    fc1_weight: Tensor
    fc1_bias: Tensor | None
    act: Callable[[Tensor], Tensor]
    fc2_weight: Tensor
    fc2_bias: Tensor | None
    heads: int
    head_dim: int


def plan_block(block: Block) -> StepPlan:
    """What :func:`block_step` needs of a block that :meth:`~multimodal.nn.block.Block.can_step`:
    the Linear weights as they are, (out, in) (no copy: the parameters themselves), the
    biases as (out, 1) columns, the norm parameters, the norm / activation as plain functions.
    Taken once per decoding cache, so a step reads no module attributes (at batch 4 on a CPU,
    ``nn.Module.__getattr__`` for ~30 attributes per block cost ~8 % of the step)."""
    attn, mlp = block.attn, block.mlp
    return StepPlan(_plain(block.norm1), *_column_affine(attn.qkv), *_column_affine(attn.proj),
                    _plain(block.norm2), *_column_affine(mlp.fc1), _plain(mlp.act),
                    *_column_affine(mlp.fc2), attn.heads, attn.head_dim)


def block_step(x: Tensor, p: StepPlan, cache: LayerCache) -> Tensor:
    """One new token per row through a plain pre-norm block, ``x`` (B, dim) -> (B, dim):
    ``z = x + W_o Attn(q, K, V)`` with ``(q, k, v) = W_qkv LN_1(x)`` (k, v appended to the
    cache, K, V all cached keys and values), then ``z + W_2 act(W_1 LN_2(z))``. For a block
    that :meth:`~Block.can_step`, in eval mode, with ``p = block.step_plan()``: equal to
    ``block(x[:, None], cache=cache)[0][:, 0]`` up to fp32 rounding (the GEMMs run as
    ``W x^T``, see :func:`_affine`; tests/nn/test_cache.py), without the module calls,
    identity dropouts, per-layer argument handling and (B, 1, ...) reshapes that cost more
    than the arithmetic at batch 4 on a CPU. One query after the cache sees every cached
    key: no mask. Heads are views of the fused projection: for one token
    (B, 3 * heads * d) is (B, 3, heads, 1, d) once contiguous."""
    b = x.shape[0]
    qkv = _affine(p.norm1(x), p.qkv_weight, p.qkv_bias).contiguous()
    q, k, v = qkv.view(b, 3, p.heads, 1, p.head_dim).unbind(1)
    k, v = cache.append_one(k, v)
    out = F.scaled_dot_product_attention(q, k, v).view(b, x.shape[1])
    x = x + _affine(out, p.proj_weight, p.proj_bias)
    h = p.act(_affine(p.norm2(x), p.fc1_weight, p.fc1_bias))
    return x + _affine(h, p.fc2_weight, p.fc2_bias)


def _affine(x: Tensor, weight: Tensor, bias_column: Tensor | None) -> Tensor:
    """``F.linear(x, weight, bias)`` for a few rows ``x`` (B, in), computed as
    ``(W x^T + b) ^T``: (out, in) @ (in, B), returned as a (B, out) view of the (out, B)
    result. At B = 4 the GEMM streams the weight; measured on the 2-core AVX2 CPU, torch
    runs this orientation 1.7x faster than ``x @ W^T`` on one thread and 2.7x on two (the
    (B, in) @ (in, out) form does not use the second core at all)."""
    xt = x.t()
    y = torch.mm(weight, xt) if bias_column is None else torch.addmm(bias_column, weight, xt)
    return y.t()


def _column_affine(linear: nn.Linear) -> tuple[Tensor, Tensor | None]:
    """A Linear's weight (out, in) and its bias as an (out, 1) column, views of the
    parameters (no copy), for :func:`_affine`."""
    bias = linear.bias
    return linear.weight.detach(), None if bias is None else bias.detach()[:, None]


def _plain(module: nn.Module) -> Callable[[Tensor], Tensor]:
    """``module`` as a function: LayerNorm and GELU become their functional form bound to
    the module's parameters and settings (no module call); anything else stays the module."""
    if type(module) is nn.LayerNorm:
        return partial(F.layer_norm, normalized_shape=module.normalized_shape,
                       weight=module.weight, bias=module.bias, eps=module.eps)
    if type(module) is nn.GELU:
        return partial(F.gelu, approximate=module.approximate)
    return module


def static_step(
    transformer: Transformer, x: Tensor, keys: tuple[Tensor, ...], values: tuple[Tensor, ...],
    cross: tuple[tuple[Tensor, Tensor] | None, ...], position: Tensor, valid: Tensor,
    rope: Tensor | None, memory_padding_mask: Tensor | None, masked: bool = True,
) -> Tensor:
    """One new token per row through ``transformer`` (eval mode) on a
    :class:`~multimodal.nn.cache.StaticKVCache`: ``x`` (B, 1, dim) -> (B, 1, dim) after the
    final norm, every shape fixed by the cache (what ``torch.compile`` / CUDA graphs need).

    Per layer the new key and value are written at ``position`` (a (1,) tensor) of the
    preallocated (B, H, max_len, d) buffers, and the query attends over the first
    ``n = valid.shape[1]`` slots (all of them, or the cached prefix) under the mask
    ``valid`` (B, n) (True at real tokens, the new one's slot included; the caller sets
    it): ``softmax(q K^T / sqrt(d) + log valid) V``. A masked
    slot gets weight exactly 0, so this equals attention over the cached real tokens up to
    the order of fp32 sums. ``masked=False`` (every one of the n slots is a real token):
    no mask. Cross-attention reads the keys / values projected at prefill. Only the
    blocks' own modules run (any norm, MLP, GQA, q/k norm, rope, LayerScale); plain
    Linears multiply as ``W x^T`` (:func:`_linear`).
    """
    n = valid.shape[1]
    mask = valid[:, None, None, :] if masked else None
    memory_mask = None if memory_padding_mask is None \
        else ~memory_padding_mask[:, None, None, :]
    for block, k_buf, v_buf, kv in zip(transformer.blocks, keys, values, cross, strict=True):
        def self_attn(h: Tensor, block: Block = block, k_buf: Tensor = k_buf,
                      v_buf: Tensor = v_buf) -> Tensor:
            return _static_self_attention(block.attn, h, k_buf, v_buf, position, mask, rope,
                                          n)

        def cross_attn(h: Tensor, block: Block = block, kv: Any = kv) -> Tensor:
            return _static_cross_attention(block.cross_attn, h, kv, memory_mask)

        if block.norm_first:
            x = x + block.ls1(self_attn(block.norm1(x)))
            if block.cross_attn is not None:
                x = x + block.ls_cross(cross_attn(block.norm_cross(x)))
            x = x + block.ls2(_static_mlp(block.mlp, block.norm2(x)))
        else:
            x = block.norm1(x + block.ls1(self_attn(x)))
            if block.cross_attn is not None:
                x = block.norm_cross(x + block.ls_cross(cross_attn(x)))
            x = block.norm2(x + block.ls2(_static_mlp(block.mlp, x)))
    return transformer.norm(x)


def _linear(module: nn.Module, x: Tensor) -> Tensor:
    """``module(x)`` for one token per row, (B, 1, in) -> (B, 1, out); a plain Linear
    multiplies as ``W x^T`` (:func:`_affine`: the orientation torch runs fastest at a few
    rows on a CPU), anything else (LoRA, quantised) is called as it is."""
    if type(module) is not nn.Linear:
        return module(x)
    b = x.shape[0]
    bias = module.bias
    y = _affine(x.reshape(b, x.shape[-1]), module.weight,
                None if bias is None else bias[:, None])
    return y.reshape(b, 1, y.shape[-1])


def _static_mlp(mlp: nn.Module, x: Tensor) -> Tensor:
    """The MLP of one token per row with :func:`_linear` (dropout is identity in eval)."""
    if type(mlp) is MLP:
        return _linear(mlp.fc2, mlp.act(_linear(mlp.fc1, x)))
    if type(mlp) is GatedMLP:
        return _linear(mlp.fc2, mlp.act(_linear(mlp.gate, x)) * _linear(mlp.up, x))
    return mlp(x)


def _attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """SDPA with a bool "may attend" mask. On a CPU the flash kernel is called by name: it
    is what eager SDPA runs there, while under ``torch.compile`` SDPA is decomposed into
    a generated matmul-softmax-matmul loop that measured slower over long caches. The
    kernel reads each head's channels as contiguous (``_linear``'s output is not)."""
    if q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    if mask is not None:
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(
            ~mask, float("-inf"))
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, attn_mask=mask)[0]


def _repeat_kv(attn: Attention, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    if attn.kv_heads == attn.heads:
        return k, v
    group = attn.heads // attn.kv_heads
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)


def _static_self_attention(attn: Attention, x: Tensor, k_buf: Tensor, v_buf: Tensor,
                           position: Tensor, mask: Tensor | None, rope: Tensor | None,
                           n: int) -> Tensor:
    """:class:`Attention`'s cached self-attention for one token, on fixed-size buffers."""
    b = x.shape[0]
    kv_dim = attn.kv_heads * attn.head_dim
    q, k, v = _linear(attn.qkv, x).split([attn.dim, kv_dim, kv_dim], dim=-1)
    q, k = attn._split_heads(q), attn._split_heads(k, attn.kv_heads)
    v = attn._split_heads(v, attn.kv_heads)
    if attn.q_norm is not None:
        q = attn.q_norm(q)
    k = attn._norm_k(k)
    if rope is not None:
        q, k = apply_rotary(q, rope), apply_rotary(k, rope)
    k_buf.index_copy_(2, position, k)
    v_buf.index_copy_(2, position, v)
    keys, vals = _repeat_kv(attn, k_buf[:, :, :n], v_buf[:, :, :n])
    out = _attend(q, keys, vals, mask)
    return _linear(attn.proj, out.transpose(1, 2).reshape(b, 1, attn.dim))


def _static_cross_attention(attn: Attention, x: Tensor, kv: tuple[Tensor, Tensor],
                            memory_mask: Tensor | None) -> Tensor:
    """:class:`Attention`'s cross-attention for one token, keys / values from prefill."""
    b = x.shape[0]
    q = attn._split_heads(_linear(attn.q, x))
    if attn.q_norm is not None:
        q = attn.q_norm(q)
    k, v = _repeat_kv(attn, *kv)
    out = _attend(q, k, v, memory_mask)
    return _linear(attn.proj, out.transpose(1, 2).reshape(b, 1, attn.dim))
