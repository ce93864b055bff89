"""Attention pooling (MAP head, "multihead attention pooling" of SigLIP and timm).

A learned probe ``p`` (1, L, D) attends to the tokens ``X``; then a residual MLP:
``z = Attn(p W_q, X W_k, X W_v) W_o``, ``y = z + MLP(LN(z))``; the pooled feature is
``y[:, 0]`` (L = 1 probe by default).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from multimodal.nn.attention import Attention
from multimodal.nn.block import MLP


class AttentionPool(nn.Module):
    """(B, N, D) tokens -> (B, D) by a learned query's cross-attention and a residual MLP."""

    def __init__(
        self,
        dim: int,
        heads: int,
        mlp_dim: int | None = None,
        *,
        act_layer: Callable[[], nn.Module] = nn.GELU,
        norm_layer: Callable[[int], nn.Module] = nn.LayerNorm,
        qkv_bias: bool = True,
        probes: int = 1,
    ) -> None:
        super().__init__()
        self.probe = nn.Parameter(torch.randn(1, probes, dim) * dim ** -0.5)
        self.attn = Attention(dim, heads, qkv_bias=qkv_bias, cross=True)
        self.norm = norm_layer(dim)
        self.mlp = MLP(dim, mlp_dim or 4 * dim, act_layer)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None,
                need_weights: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Pool (B, N, D) -> (B, D); with ``need_weights`` also the (B, heads, L, N) map."""
        probe = self.probe.expand(x.shape[0], -1, -1)
        z, weights = self.attn(probe, x, key_padding_mask=key_padding_mask,
                               need_weights=need_weights)
        y = (z + self.mlp(self.norm(z)))[:, 0]
        return (y, weights) if need_weights else y
