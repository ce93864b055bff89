"""Attention, from the parameter-free formula to multi-head self- and cross-attention.

Shapes: B batch, N query tokens, M key tokens, H heads, D model width, d = D / H.

The fast path is ``torch.nn.functional.scaled_dot_product_attention`` (flash and
memory-efficient kernels on GPU). When the attention weights themselves are wanted,
the explicit path ``softmax(Q K^T / sqrt(d)) V`` runs instead; both take the same
masks and give the same result.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from multimodal.nn.position import apply_rotary

if TYPE_CHECKING:
    from multimodal.nn.cache import LayerCache

NormLayer = Callable[[int], nn.Module]


def simple_self_attention(x: Tensor) -> tuple[Tensor, Tensor]:
    """Parameter-free self-attention ``Y = Softmax(X X^T) X`` (reference notes, section 2.1).

    ``a_nm = exp(x_n . x_m) / sum_k exp(x_n . x_k)``: every row of the weight matrix is
    non-negative and sums to one. Returns ``(Y, A)`` for ``x`` of shape (..., N, D).
    """
    weights = torch.softmax(x @ x.transpose(-2, -1), dim=-1)
    return weights @ x, weights


def causal_mask(num_queries: int, num_keys: int, device: torch.device | None = None) -> Tensor:
    """Boolean (N, M) mask, True where query n may attend key m.

    Queries are the *last* N positions of the M keys (bottom-right alignment), so the
    same mask serves a full forward (N == M) and incremental decoding with a cache
    (N new tokens after M - N cached ones): query n sees keys m <= n + (M - N).
    """
    offset = num_keys - num_queries
    q = torch.arange(num_queries, device=device)[:, None]
    k = torch.arange(num_keys, device=device)[None, :]
    return k <= q + offset


def build_attention_mask(
    batch: int,
    num_queries: int,
    num_keys: int,
    *,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    attn_mask: Tensor | None = None,
    device: torch.device | None = None,
) -> Tensor | None:
    """Combine causal, key-padding and custom masks into one boolean "may attend" mask.

    ``key_padding_mask``: (B, M) bool, True where the key is padding (ignored), as in
    ``torch.nn.MultiheadAttention``. ``attn_mask``: (N, M) or (B, N, M) bool, True where
    attention is *allowed* (as in SDPA). Returns None when nothing is masked, else a
    mask broadcastable to (B, 1, N, M).
    """
    mask: Tensor | None = None
    if causal and not (num_queries == 1 and attn_mask is None):
        mask = causal_mask(num_queries, num_keys, device)[None, None]
    if attn_mask is not None:
        if (
            attn_mask.dim() not in (2, 3)
            or attn_mask.shape[-2:] != (num_queries, num_keys)
            or (attn_mask.dim() == 3 and attn_mask.shape[0] not in (1, batch))
            or attn_mask.dtype != torch.bool
        ):
            raise ValueError(
                f"attn_mask must be a bool tensor (True = may attend) of shape (queries, keys)"
                f" = ({num_queries}, {num_keys}) or ({batch}, {num_queries}, {num_keys}), "
                f"got {attn_mask.dtype} {tuple(attn_mask.shape)}"
            )
        extra = attn_mask[None, None] if attn_mask.dim() == 2 else attn_mask[:, None]
        mask = extra if mask is None else mask & extra
    if key_padding_mask is not None:
        keep = ~key_padding_mask[:, None, None, :]
        mask = keep if mask is None else mask & keep
    return mask


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    causal: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """``Softmax(Q K^T / sqrt(d_k)) V`` over (B, H, N, d) queries and (B, H, M, d) keys.

    ``mask`` is boolean, True where attention is allowed, broadcastable to (B, H, N, M).
    ``causal=True`` lets query n see keys m <= n + (M - N) (bottom-right aligned, see
    :func:`causal_mask`), combined with ``mask`` when one is given; with no mask and
    N == M the kernel's own causal path runs.
    A query row whose keys are all masked attends to nothing: its output (and its
    weights) are zero, never NaN.

    With ``need_weights`` the explicit formula runs and the (B, H, N, M) weights are
    returned; otherwise SDPA runs and the weights are None.
    """
    if mask is not None and mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor (True = may attend), got {mask.dtype}")
    num_queries, num_keys = q.shape[-2], k.shape[-2]
    if causal and (mask is not None or num_queries != num_keys):
        # The kernel's is_causal is top-left aligned and ignores attn_mask: build it here.
        cm = causal_mask(num_queries, num_keys, q.device)
        mask = cm if mask is None else mask & cm
        causal = False
    empty_rows = None
    if mask is not None:
        has_key = mask.any(dim=-1, keepdim=True)
        if not bool(has_key.all()):
            # Let empty rows attend everywhere (finite softmax), then zero them out.
            empty_rows = ~has_key
            mask = mask | empty_rows
    if need_weights:
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        if causal:
            mask = causal_mask(num_queries, num_keys, q.device)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        if empty_rows is not None:
            weights = weights.masked_fill(empty_rows, 0.0)
        dropped = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
        out = dropped @ v
    else:
        weights = None
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal
        )
    if empty_rows is not None:
        out = out.masked_fill(empty_rows, 0.0)
    return out, weights


class Attention(nn.Module):
    """Multi-head attention ``Concat[H_1..H_H] W_o`` with ``H_h = Attn(X W_q^h, M W_k^h, M W_v^h)``.

    Self-attention (``memory`` is None) projects queries, keys and values with one fused
    ``qkv`` Linear (rows: queries, then keys, then values; D -> 3D, the layout torchvision,
    timm and GPT-2 use). Cross-attention (``cross=True``) takes queries from ``x`` and
    keys/values from ``memory`` of width ``memory_dim``, with separate ``q`` and fused ``kv``
    projections.

    Switches of the modern encoders and decoders:

    - ``kv_heads`` < ``heads``: grouped-query attention (multi-query when 1). Only
      ``kv_heads`` key/value heads are projected (and cached); query head ``h`` reads
      key/value head ``h // (heads / kv_heads)``. With one query a head (a decoding step)
      the ``heads / kv_heads`` queries of a group are attended as one head's queries
      (``(B, H, 1, d) -> (B, kv_heads, group, d)``), so the cached keys and values are read
      once instead of repeated ``group`` times; longer inputs repeat them.
    - ``qk_norm_layer``: ``q_h <- norm(q_h)``, ``k_h <- norm(k_h)`` over each head's ``d``
      channels (one norm of width ``d`` shared by the heads), before the rotation.
    - ``rope`` (a forward argument): rotary position angles from
      :func:`multimodal.nn.position.rotary_angles`; queries and the new keys are rotated
      (:func:`~multimodal.nn.position.apply_rotary`) before they enter the cache, so cached
      keys keep their own positions.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        *,
        qkv_bias: bool = True,
        proj_bias: bool = True,
        attn_dropout: float = 0.0,
        proj_dropout: float = 0.0,
        cross: bool = False,
        memory_dim: int | None = None,
        kv_heads: int | None = None,
        qk_norm_layer: NormLayer | None = None,
    ) -> None:
        super().__init__()
        if dim % heads != 0:
            raise ValueError(f"dim ({dim}) must be divisible by heads ({heads})")
        kv_heads = heads if kv_heads is None else kv_heads
        if kv_heads < 1 or heads % kv_heads != 0:
            raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
        self.dim, self.heads, self.head_dim = dim, heads, dim // heads
        self.kv_heads = kv_heads
        kv_dim = kv_heads * self.head_dim
        self.cross = cross
        self.attn_dropout = attn_dropout
        if cross:
            self.memory_dim = memory_dim or dim
            self.q = nn.Linear(dim, dim, bias=qkv_bias)
            self.kv = nn.Linear(self.memory_dim, 2 * kv_dim, bias=qkv_bias)
        else:
            self.memory_dim = dim
            self.qkv = nn.Linear(dim, dim + 2 * kv_dim, bias=qkv_bias)
        if qk_norm_layer is not None:
            self.q_norm = qk_norm_layer(self.head_dim)
            self.k_norm = qk_norm_layer(self.head_dim)
        else:
            self.q_norm = self.k_norm = None
        self.proj = nn.Linear(dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_dropout)

    def _split_heads(self, t: Tensor, heads: int | None = None) -> Tensor:
        # (B, N, heads * d) -> (B, heads, N, d)
        b, n, _ = t.shape
        return t.view(b, n, heads or self.heads, self.head_dim).transpose(1, 2)

    def _norm_k(self, k: Tensor) -> Tensor:
        return self.k_norm(k) if self.k_norm is not None else k

    def project_memory(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values (B, kv_heads, M, d) of a cross-attention memory; cacheable."""
        if memory.dim() != 3 or memory.shape[-1] != self.memory_dim:
            raise ValueError(
                f"memory must be (batch, tokens, {self.memory_dim}), got {tuple(memory.shape)}"
            )
        k, v = self.kv(memory).chunk(2, dim=-1)
        return self._norm_k(self._split_heads(k, self.kv_heads)), \
            self._split_heads(v, self.kv_heads)

    def _one_query(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """One query a head (B, heads, 1, d) over every key (B, kv_heads, M, d), no mask:
        the attention of a one-token step in :meth:`forward` (grouped heads folded the
        same way), called per row by a ``rowwise`` cache."""
        b, group = q.shape[0], self.heads // self.kv_heads
        if group > 1:
            q = q.reshape(b, self.kv_heads, group, self.head_dim)
        out = scaled_dot_product_attention(q, k, v)[0]
        return out.reshape(b, self.heads, 1, self.head_dim)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        causal: bool = False,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        cache: LayerCache | None = None,
        need_weights: bool = False,
        rope: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``x`` (B, N, D) to itself, or to ``memory`` (B, M, D_m) if cross.

        ``cache``: a per-layer :class:`~multimodal.nn.cache.LayerCache`. Self-attention
        appends the new keys/values and attends over everything cached; cross-attention
        projects the memory once and reuses it on later steps (``memory`` may then be None).
        ``key_padding_mask`` (B, M) is True at padded keys (for self-attention with a
        cache, M counts the cached tokens too). ``rope``: rotary angles (B or 1, 1, N, S,
        d / 2S) for the N new tokens (self-attention only).
        """
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"expected x of shape (batch, tokens, {self.dim}), "
                             f"got {tuple(x.shape)}")
        b, n, _ = x.shape
        if self.cross:
            q = self._split_heads(self.q(x))
            if self.q_norm is not None:
                q = self.q_norm(q)
            if cache is not None and cache.cross_kv is not None:
                k, v = cache.cross_kv
            else:
                if memory is None:
                    raise ValueError("cross-attention needs a memory (encoder output)")
                k, v = self.project_memory(memory)
                if cache is not None:
                    cache.cross_kv = (k, v)
            causal = False
        else:
            if memory is not None:
                raise ValueError("memory was given to a self-attention layer (cross=False)")
            kv_dim = self.kv_heads * self.head_dim
            q, k, v = self.qkv(x).split([self.dim, kv_dim, kv_dim], dim=-1)
            q, k = self._split_heads(q), self._split_heads(k, self.kv_heads)
            v = self._split_heads(v, self.kv_heads)
            if self.q_norm is not None:
                q = self.q_norm(q)
            k = self._norm_k(k)
            if rope is not None:
                q, k = apply_rotary(q, rope), apply_rotary(k, rope)
            if cache is not None:
                k, v = cache.append(k, v)
        if n > 1 and cache is not None and cache.rowwise and causal and not need_weights \
                and not self.training and key_padding_mask is None and attn_mask is None:
            # each new query exactly as a one-token step computes it (speculative verify)
            past = k.shape[-2] - n
            out = torch.cat([self._one_query(q[:, :, i : i + 1], k[:, :, : past + i + 1],
                                             v[:, :, : past + i + 1]) for i in range(n)],
                            dim=2)
            return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, n, self.dim))), None
        group = self.heads // self.kv_heads
        folded = group > 1 and n == 1  # one query a head: fold each group into "queries"
        if folded:  # (B, H, 1, d) -> (B, kv_heads, group, d): head h = kv * group + g
            q = q.reshape(b, self.kv_heads, group, self.head_dim)
        elif group > 1:
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        m = k.shape[-2]
        if key_padding_mask is not None and (
            key_padding_mask.shape != (b, m) or key_padding_mask.dtype != torch.bool
        ):
            raise ValueError(
                f"key_padding_mask must be a bool tensor (True = padding) of shape "
                f"(batch, keys) = ({b}, {m}), "
                f"got {key_padding_mask.dtype} {tuple(key_padding_mask.shape)}"
            )
        mask = build_attention_mask(b, n, m, key_padding_mask=key_padding_mask,
                                    attn_mask=attn_mask, device=x.device)
        out, weights = scaled_dot_product_attention(
            q, k, v, mask,
            dropout_p=self.attn_dropout if self.training else 0.0,
            need_weights=need_weights,
            causal=causal and n > 1,  # one new query after the cache sees every key
        )
        if folded:  # back to one query per head
            out = out.reshape(b, self.heads, 1, self.head_dim)
            if weights is not None:
                weights = weights.reshape(b, self.heads, 1, m)
        out = out.transpose(1, 2).reshape(b, n, self.dim)
        return self.proj_drop(self.proj(out)), weights
