"""Text as documents: the unit never split across train / val / test, and what is made of
documents for training: seeded splits by document, next-token blocks, sentence passages."""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from multimodal.data.splits import check_sizes, group_count
from multimodal.tokenizers.text import EOS_ID

__all__ = ["Document", "balanced_passages", "make_passages", "pack_blocks", "split_documents",
           "split_sentences"]

_SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+|(?<=[.!?][\"')\]])\s+")


@dataclass(frozen=True)
class Document:
    """One unit of text that is never split across train/val/test."""

    text: str
    source: str
    title: str



def split_documents(
    documents: Sequence[Document],
    val_size: float = 0.05,
    test_size: float = 0.05,
    seed: int = 0,
    max_documents: int | None = None,
) -> tuple[list[Document], list[Document], list[Document]]:
    """Seeded split into (train, val, test) by whole document, stratified by source.

    Within each source the documents are shuffled with ``random.Random(seed)``; the first
    ``max(1, round(n * test_size))`` go to test (a fraction; a whole count ``k >= 1``: ``k``
    per source), the next ones to val (likewise), the rest to train. ``max_documents`` caps
    the number of documents kept *per source*.
    """
    check_sizes(val_size, test_size)
    if max_documents is not None and max_documents < 1:
        raise ValueError(f"max_documents must be >= 1 or None, got {max_documents}")
    rng = random.Random(seed)
    by_source: dict[str, list[Document]] = {}
    for doc in documents:
        by_source.setdefault(doc.source, []).append(doc)
    train: list[Document] = []
    val: list[Document] = []
    test: list[Document] = []
    for source in sorted(by_source):
        docs = list(by_source[source])
        rng.shuffle(docs)
        if max_documents is not None:
            docs = docs[:max_documents]
        n = len(docs)
        n_test = group_count(test_size, n, "test_size")
        n_val = group_count(val_size, n, "val_size")
        if n - n_test - n_val < 1:
            raise ValueError(
                f"source {source!r} has {n} documents: too few for a train split after "
                f"{n_val} val and {n_test} test documents"
            )
        test += docs[:n_test]
        val += docs[n_test: n_test + n_val]
        train += docs[n_test + n_val:]
    return train, val, test


def pack_blocks(token_streams: Iterable[Sequence[int]], block_size: int,
                separator: int | None = EOS_ID) -> torch.Tensor:
    """Concatenate token lists (each followed by ``separator``) and cut into blocks.

    Returns a LongTensor (num_blocks, block_size + 1) of consecutive, non-overlapping
    slices of the stream; the tail shorter than ``block_size + 1`` is dropped. A block ``b``
    gives input ``b[:-1]`` and next-token target ``b[1:]``.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    stream: list[int] = []
    for ids in token_streams:
        stream.extend(ids)
        if separator is not None:
            stream.append(separator)
    n_blocks = len(stream) // (block_size + 1)
    data = torch.tensor(stream[: n_blocks * (block_size + 1)], dtype=torch.long)
    return data.view(n_blocks, block_size + 1)


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text``: split after ``.``, ``!`` or ``?`` followed by space.

    Whitespace (line breaks included) is collapsed to single spaces.
    """
    text = " ".join(text.split())
    return [s for s in _SENTENCE_END_RE.split(text) if s.strip()]


def make_passages(document: Document, rng: random.Random, min_sentences: int = 1,
                  max_sentences: int = 4, max_chars: int = 400) -> list[str]:
    """Cut a document into consecutive passages of ``min..max_sentences`` sentences each.

    The number of sentences of each passage is drawn uniformly; a passage stops early when
    it would exceed ``max_chars`` (a single long sentence is cut at ``max_chars``).
    """
    if not 1 <= min_sentences <= max_sentences:
        raise ValueError(f"need 1 <= min_sentences <= max_sentences, got "
                         f"{min_sentences}, {max_sentences}")
    sentences = split_sentences(document.text)
    passages, i = [], 0
    while i < len(sentences):
        k = rng.randint(min_sentences, max_sentences)
        parts = [sentences[i]]
        i += 1
        while len(parts) < k and i < len(sentences) and \
                len(" ".join(parts)) + 1 + len(sentences[i]) <= max_chars:
            parts.append(sentences[i])
            i += 1
        passages.append(" ".join(parts)[:max_chars])
    return passages


def balanced_passages(documents: Sequence[Document], sources: Sequence[str], seed: int,
                      min_sentences: int = 1, max_sentences: int = 4, max_chars: int = 400,
                      max_per_source: int | None = None) -> list[tuple[str, int]]:
    """(passage, label) pairs with the same number of passages for every source.

    Label = index of the document's source in ``sources``. Each source is subsampled
    (seeded) to the size of the smallest one (and to ``max_per_source``).
    """
    rng = random.Random(seed)
    per_source: dict[str, list[str]] = {s: [] for s in sources}
    for doc in documents:
        if doc.source not in per_source:
            raise ValueError(f"document source {doc.source!r} not in sources {tuple(sources)}")
        per_source[doc.source].extend(
            make_passages(doc, rng, min_sentences, max_sentences, max_chars))
    empty = [s for s, p in per_source.items() if not p]
    if empty:
        raise ValueError(f"no passages for sources {empty} in this split")
    n = min(len(p) for p in per_source.values())
    if max_per_source is not None:
        n = min(n, max_per_source)
    pairs = []
    for label, source in enumerate(sources):
        pairs.extend((text, label) for text in rng.sample(per_source[source], n))
    rng.shuffle(pairs)
    return pairs
