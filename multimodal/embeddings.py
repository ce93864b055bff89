"""Word-embedding queries on a trained model's token embedding table.

Cosine similarity ``cos(u, v) = u . v / (|u| |v|)``. ``nearest_neighbours`` ranks every
ordinary token (special tokens and ``##`` word-piece continuations left out) by cosine
similarity to a word's embedding; ``analogy(a, b, c)`` ("a is to b as c is to ?") ranks
them by cosine similarity to ``e(b) - e(a) + e(c)``, leaving out the three query words.

Word vectors in the word2vec formats (the reference C tool's, which gensim's
``KeyedVectors.load_word2vec_format`` reads): :func:`save_word2vec_format` /
:func:`load_word2vec_format`, text (``"V D"`` then ``word x_1 ... x_D`` a line) or binary
(the same header, then ``word`` + space + D little-endian float32 + newline per word).
A :class:`WordVectors` is both the matrix and the vocabulary, so
``nearest_neighbours(wv, wv, "king")`` and ``analogy(wv, wv, "man", "king", "woman")`` work
on it; :func:`init_embedding` copies the vectors of the words a model's tokenizer has into
the model's token embedding table.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["WordVectors", "analogy", "embedding_matrix", "init_embedding",
           "load_word2vec_format", "nearest_neighbours", "save_word2vec_format"]


@dataclass
class WordVectors:
    """Words and their (V, D) vectors, as a word2vec file holds them; a tokenizer for
    :func:`nearest_neighbours` / :func:`analogy` (``token_to_id`` / ``id_to_token``)."""

    words: list[str]
    vectors: Tensor

    def __post_init__(self) -> None:
        if self.vectors.dim() != 2 or self.vectors.shape[0] != len(self.words):
            raise ValueError(f"{len(self.words)} words need ({len(self.words)}, D) vectors, "
                             f"got {tuple(self.vectors.shape)}")
        self._index = {w: i for i, w in enumerate(self.words)}
        if len(self._index) != len(self.words):
            raise ValueError("the word list has duplicates")

    def token_to_id(self, word: str) -> int | None:
        return self._index.get(word)

    def id_to_token(self, i: int) -> str:
        return self.words[i]

    def __len__(self) -> int:
        return len(self.words)

    def __getitem__(self, word: str) -> Tensor:
        i = self._index.get(word)
        if i is None:
            raise KeyError(f"{word!r} is not in the vocabulary")
        return self.vectors[i]


def save_word2vec_format(path: str | Path, words: Sequence[str], vectors: Tensor,
                         binary: bool = False) -> Path:
    """Write ``words`` and their ``vectors`` (V, D) in the word2vec text or binary format.
    Text values are written with 9 significant digits, which read back to the same
    float32; a word may not contain whitespace."""
    vectors = vectors.detach().to("cpu", torch.float32).contiguous()
    if vectors.dim() != 2 or vectors.shape[0] != len(words):
        raise ValueError(f"{len(words)} words need ({len(words)}, D) vectors, got "
                         f"{tuple(vectors.shape)}")
    bad = next((w for w in words if not w or any(ch.isspace() for ch in w)), None)
    if bad is not None:
        raise ValueError(f"a word2vec word cannot be empty or hold whitespace: {bad!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = vectors.numpy().astype("<f4")
    with open(path, "wb") as f:
        f.write(f"{len(words)} {vectors.shape[1]}\n".encode())
        for word, row in zip(words, rows, strict=True):
            if binary:
                f.write(word.encode("utf-8") + b" " + row.tobytes() + b"\n")
            else:
                f.write((word + " " + " ".join(f"{x:.9g}" for x in row.tolist()) + "\n")
                        .encode("utf-8"))
    return path


def load_word2vec_format(path: str | Path, binary: bool | None = None) -> WordVectors:
    """Read a word2vec text or binary file (``binary=None``: binary when the name ends in
    ``.bin``). A malformed file is a ValueError naming it and the entry."""
    import numpy as np

    path = Path(path)
    if binary is None:
        binary = path.suffix == ".bin"
    with open(path, "rb") as f:
        header = f.readline().split()
        try:
            count, dim = int(header[0]), int(header[1])
        except (IndexError, ValueError):
            raise ValueError(f"{path}: the first line is not 'VOCAB_SIZE DIM'") from None
        words: list[str] = []
        out = np.empty((count, dim), dtype=np.float32)
        for i in range(count):
            if binary:
                raw = bytearray()
                while (ch := f.read(1)) != b" ":
                    if not ch:
                        raise ValueError(f"{path}: ends inside entry {i + 1} of {count}")
                    if ch != b"\n":
                        raw += ch
                data = f.read(4 * dim)
                if len(data) != 4 * dim:
                    raise ValueError(f"{path}: ends inside entry {i + 1} of {count}")
                words.append(raw.decode("utf-8"))
                out[i] = np.frombuffer(data, dtype="<f4")
            else:
                parts = f.readline().decode("utf-8").rstrip("\n").split(" ")
                if len(parts) != dim + 1:
                    raise ValueError(f"{path}: entry {i + 1} has {len(parts) - 1} values, "
                                     f"not {dim}")
                words.append(parts[0])
                out[i] = np.asarray(parts[1:], dtype=np.float32)
    return WordVectors(words, torch.from_numpy(out))


def init_embedding(model: nn.Module | Tensor, tokenizer: Any,
                   vectors: WordVectors | str | Path) -> int:
    """Copy the vector of every word of ``vectors`` (a :class:`WordVectors` or a word2vec
    file) that is a token of ``tokenizer`` into the model's token embedding (its
    ``tok_embed``, or the tensor); other rows are left as they are. Returns how many rows
    were set. The dimensions must agree."""
    if not isinstance(vectors, WordVectors):
        vectors = load_word2vec_format(vectors)
    if isinstance(model, Tensor):
        weight = model
    else:
        embed = getattr(model, "tok_embed", None)
        if not isinstance(embed, nn.Embedding):
            raise ValueError(f"{type(model).__name__} has no token embedding (tok_embed)")
        weight = embed.weight
    if weight.shape[1] != vectors.vectors.shape[1]:
        raise ValueError(f"the word vectors have {vectors.vectors.shape[1]} dimensions, the "
                         f"model's embedding {weight.shape[1]}: give vectors of that size")
    rows, src = [], []
    for word, i in vectors._index.items():
        token_id = tokenizer.token_to_id(word)
        if token_id is not None and 0 <= int(token_id) < weight.shape[0]:
            rows.append(int(token_id))
            src.append(i)
    if rows:
        with torch.no_grad():
            weight[torch.tensor(rows)] = vectors.vectors[torch.tensor(src)].to(weight)
    return len(rows)


def embedding_matrix(model: nn.Module | Tensor | WordVectors) -> Tensor:
    """The (V, D) token embedding of ``model`` (its ``tok_embed`` Embedding), a
    :class:`WordVectors`' vectors, or the tensor itself."""
    if isinstance(model, WordVectors):
        weight = model.vectors
    elif isinstance(model, Tensor):
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
        if not hasattr(tokenizer, "tokenize"):
            raise ValueError(f"{word!r} is not in the vocabulary")
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


def nearest_neighbours(model: nn.Module | Tensor | WordVectors, tokenizer: Any, word: str,
                       k: int = 10) -> list[tuple[str, float]]:
    """The ``k`` tokens most cosine-similar to ``word`` (itself excluded), as
    ``(token, similarity)`` pairs, most similar first."""
    weight = embedding_matrix(model)
    i = _token_id(tokenizer, word)
    return _rank(weight, tokenizer, weight[i], [i], k)


def analogy(model: nn.Module | Tensor | WordVectors, tokenizer: Any, a: str, b: str, c: str,
            k: int = 5) -> list[tuple[str, float]]:
    """"``a`` is to ``b`` as ``c`` is to ?": the ``k`` tokens nearest (cosine) to
    ``e(b) - e(a) + e(c)``, the three query words excluded."""
    weight = embedding_matrix(model)
    ia, ib, ic = (_token_id(tokenizer, w) for w in (a, b, c))
    return _rank(weight, tokenizer, weight[ib] - weight[ia] + weight[ic], [ia, ib, ic], k)

