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
from multimodal.nn.layers import MLP


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


def mean_pool(features: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """The mean of the real tokens: ``sum_n m_n x_n / sum_n m_n`` over ``features`` (B, N, D)
    with ``attention_mask`` (B, N) 1 at real tokens, 0 at padding (all real when None).

    The one masked mean of the package (the pooling of sentence-transformers models such as
    all-MiniLM-L6-v2, of mean-pooled audio encoders and of CLIP's ``text_pool="mean"``).
    A row without a real token has no mean: a ValueError naming the rows, never zeros.
    """
    if features.dim() != 3:
        raise ValueError(f"features must be (batch, tokens, dim), got {tuple(features.shape)}")
    if attention_mask is None:
        return features.mean(dim=1)
    if attention_mask.shape != features.shape[:2]:
        raise ValueError(f"attention_mask must be {tuple(features.shape[:2])}, "
                         f"got {tuple(attention_mask.shape)}")
    m = attention_mask.to(features.dtype)[..., None]
    count = m.sum(dim=1)
    empty = (count[:, 0] == 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"row(s) {empty} have no real token (an all-zero attention_mask "
                         "row): their mean is undefined")
    return (features * m).sum(dim=1) / count


def last_token(features: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """``features[b, last real token of b]`` ``(B, dim)`` for right or left padding
    (``attention_mask`` 1 at tokens); the last position when there is no mask."""
    if attention_mask is None:
        return features[:, -1]
    positions = torch.arange(features.shape[1], device=features.device)
    last = (attention_mask.bool() * positions).argmax(dim=1)
    return features[torch.arange(features.shape[0], device=features.device), last]


TOKEN_POOLING = ("cls", "mean", "max", "mean_sqrt_len", "lasttoken")


def pool_tokens(features: Tensor, attention_mask: Tensor | None, mode: str) -> Tensor:
    """One vector per row of ``features`` (B, N, D) by ``mode`` (the pooling modes of
    sentence-transformers): ``"cls"`` the first token; ``"mean"`` :func:`mean_pool`;
    ``"max"`` the element-wise max over real tokens; ``"mean_sqrt_len"``
    ``sum_n m_n x_n / sqrt(sum_n m_n)``; ``"lasttoken"`` the last real token (right or
    left padding). ``attention_mask`` (B, N): 1 = real token; None: every token is real."""
    if mode not in TOKEN_POOLING:
        raise ValueError(f"unknown pooling {mode!r}; known: {', '.join(TOKEN_POOLING)}")
    if mode == "cls":
        return features[:, 0]
    if mode == "mean":
        return mean_pool(features, attention_mask)
    mask = torch.ones(features.shape[:2], dtype=torch.bool, device=features.device) \
        if attention_mask is None else attention_mask.bool()
    if not bool(mask.any(dim=1).all()):
        raise ValueError("a row has no real token (an all-zero attention_mask row)")
    if mode == "max":
        return features.masked_fill(~mask[..., None], float("-inf")).amax(dim=1)
    if mode == "mean_sqrt_len":
        m = mask.to(features.dtype)[..., None]
        return (features * m).sum(dim=1) / m.sum(dim=1).sqrt()
    return last_token(features, mask)


__all__ = ["TOKEN_POOLING", "AttentionPool", "last_token", "mean_pool", "pool_tokens"]
