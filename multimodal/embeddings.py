"""Word-embedding queries on a trained model's token embedding table.

Cosine similarity ``cos(u, v) = u . v / (|u| |v|)``. ``nearest_neighbours`` ranks every
ordinary token (special tokens and ``##`` word-piece continuations left out) by cosine
similarity to a word's embedding; ``analogy(a, b, c)`` ("a is to b as c is to ?") ranks
them by cosine similarity to ``e(b) - e(a) + e(c)``, leaving out the three query words.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["analogy", "embedding_matrix", "nearest_neighbours"]


def embedding_matrix(model: nn.Module | Tensor) -> Tensor:
    """The (V, D) token embedding of ``model`` (its ``tok_embed`` Embedding), or the
    tensor itself."""
    if isinstance(model, Tensor):
        weight = model
    else:
        embed = getattr(model, "tok_embed", None)
        if not isinstance(embed, nn.Embedding):
            raise ValueError(f"{type(model).__name__} has no token embedding (tok_embed); pass "
                             "a TextDecoder, a TextEncoder or a (vocab, dim) tensor")
        weight = embed.weight
    if weight.dim() != 2:
        raise ValueError(f"an embedding matrix is (vocab, dim), got {tuple(weight.shape)}")
    return weight.detach().float()


def _token_id(tokenizer: Any, word: str) -> int:
    token_id = tokenizer.token_to_id(word)
    if token_id is None:
        raise ValueError(f"{word!r} is not a single token of the vocabulary (it would be split "
                         f"into {tokenizer.tokenize(word)})")
    return int(token_id)


def _rank(weight: Tensor, tokenizer: Any, query: Tensor, exclude: Iterable[int],
          k: int) -> list[tuple[str, float]]:
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    sims = F.cosine_similarity(weight, query[None], dim=-1)
    skip = set(exclude) | set(getattr(tokenizer, "special_token_ids", []))
    candidates = [i for i in range(weight.shape[0]) if i not in skip
                  and not tokenizer.id_to_token(i).startswith("##")]
    if not candidates:
        return []
    cand = torch.tensor(candidates)
    top = sims[cand].topk(min(k, len(candidates)))
    return [(tokenizer.id_to_token(int(cand[i])), float(s))
            for s, i in zip(top.values, top.indices, strict=True)]


def nearest_neighbours(model: nn.Module | Tensor, tokenizer: Any, word: str,
                       k: int = 10) -> list[tuple[str, float]]:
    """The ``k`` tokens most cosine-similar to ``word`` (itself excluded), as
    ``(token, similarity)`` pairs, most similar first."""
    weight = embedding_matrix(model)
    i = _token_id(tokenizer, word)
    return _rank(weight, tokenizer, weight[i], [i], k)


def analogy(model: nn.Module | Tensor, tokenizer: Any, a: str, b: str, c: str,
            k: int = 5) -> list[tuple[str, float]]:
    """"``a`` is to ``b`` as ``c`` is to ?": the ``k`` tokens nearest (cosine) to
    ``e(b) - e(a) + e(c)``, the three query words excluded."""
    weight = embedding_matrix(model)
    ia, ib, ic = (_token_id(tokenizer, w) for w in (a, b, c))
    return _rank(weight, tokenizer, weight[ib] - weight[ia] + weight[ic], [ia, ib, ic], k)

