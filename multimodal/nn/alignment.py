"""Alignment scores of a recurrent decoder over encoder states (Bahdanau, Luong).

With decoder state ``s`` (the query, size ``query_dim``) and encoder states ``h_1..h_S``
(size ``key_dim``), a score ``e_i = score(s, h_i)`` per source position, padded positions
set to ``-inf``, and ``a = softmax(e)``; the context is ``c = sum_i a_i h_i``.

- additive (Bahdanau et al. 2014): ``score(s, h) = vᵀ tanh(W s + U h)``
- multiplicative (Luong et al. 2015, "general"): ``score(s, h) = sᵀ W h``

Each module splits its score into ``keys(h)`` (the part that depends on the encoder only:
``U h`` or ``W h``, computed once per source) and ``scores(s, keys)``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class AdditiveScore(nn.Module):
    """``score(s, h) = vᵀ tanh(W s + U h)`` with ``W: query_dim -> attention_dim``,
    ``U: key_dim -> attention_dim``, ``v: attention_dim`` (no biases, as in the formula)."""

    def __init__(self, query_dim: int, key_dim: int, attention_dim: int) -> None:
        super().__init__()
        self.W = nn.Linear(query_dim, attention_dim, bias=False)
        self.U = nn.Linear(key_dim, attention_dim, bias=False)
        self.v = nn.Linear(attention_dim, 1, bias=False)

    def keys(self, memory: Tensor) -> Tensor:
        """(B, S, key_dim) -> ``U h`` (B, S, attention_dim)."""
        return self.U(memory)

    def scores(self, query: Tensor, keys: Tensor) -> Tensor:
        """(B, T, query_dim), (B, S, attention_dim) -> (B, T, S)."""
        summed = self.W(query)[:, :, None, :] + keys[:, None, :, :]
        return self.v(torch.tanh(summed)).squeeze(-1)


class MultiplicativeScore(nn.Module):
    """``score(s, h) = sᵀ W h`` with ``W: key_dim -> query_dim`` (no bias)."""

    def __init__(self, query_dim: int, key_dim: int) -> None:
        super().__init__()
        self.W = nn.Linear(key_dim, query_dim, bias=False)

    def keys(self, memory: Tensor) -> Tensor:
        """(B, S, key_dim) -> ``W h`` (B, S, query_dim)."""
        return self.W(memory)

    def scores(self, query: Tensor, keys: Tensor) -> Tensor:
        """(B, T, query_dim), (B, S, query_dim) -> (B, T, S)."""
        return query @ keys.transpose(1, 2)


def attend(scores: Tensor, memory: Tensor, padding_mask: Tensor | None = None
           ) -> tuple[Tensor, Tensor]:
    """Softmax over source positions and the weighted sum of ``memory``.

    ``scores`` (B, T, S), ``memory`` (B, S, D), ``padding_mask`` (B, S) True at padding.
    Returns the context (B, T, D) and the weights (B, T, S), exactly 0 at padding.
    """
    if padding_mask is not None:
        scores = scores.masked_fill(padding_mask[:, None, :], float("-inf"))
    weights = scores.float().softmax(dim=-1).to(memory.dtype)
    return weights @ memory, weights
