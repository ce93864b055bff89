"""Word2Vec's data: words of the offline corpora, a counted vocabulary, and each epoch's
batches of (input, word to predict, noise words), drawn as the reference C code does.

Per epoch, over the corpus as one array of word ids (sentences kept apart):

1. sub-sampling of frequent words: a word of count ``f`` among ``T`` kept with probability
   ``min(1, (sqrt(f / (s T)) + 1) (s T) / f)`` (``s`` = ``sample``, the C code's formula),
   the discarded words removed before the windows are drawn;
2. a dynamic window: each centre word's half-width drawn uniformly from ``1..window`` (near
   words are in more windows than far ones), never crossing a sentence boundary;
3. CBOW: one example per centre word (its context words, a mask); skip-gram: one example
   per (centre, context) pair; the examples shuffled;
4. ``negatives`` noise words per example from the unigram distribution to the power 0.75
   (``P(w) ~ f(w)^0.75``); a noise word equal to the word to predict is masked out.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset

from multimodal.data.contract import follow_settings
from multimodal.data.documents import split_sentences
from multimodal.data.sources.shakespeare import DEFAULT_ROOT

__all__ = ["Batches", "Vocabulary", "Word2VecDataModule", "corpus_sentences", "encode",
           "keep_probabilities", "noise_cumulative", "tokenize"]

_WORD_RE = re.compile(r"[a-z]+(?:'[a-z]+)?")


def tokenize(text: str) -> list[str]:
    """Lower-cased words: runs of letters, one inner apostrophe kept (``o'er``, ``'tis`` ->
    ``tis``); digits and punctuation dropped."""
    return _WORD_RE.findall(text.lower())


def corpus_sentences(sources: Sequence[str] = ("bible", "fortunes", "shakespeare"),
                     max_words: int | None = None, root: str | Path = DEFAULT_ROOT,
                     ) -> list[list[str]]:
    """The named corpora (:func:`multimodal.data.sources.corpora.load_corpus`) as tokenised
    sentences (:func:`~multimodal.data.documents.split_sentences`, :func:`tokenize`),
    source by source in reading order; ``max_words`` keeps the first sentences of *each*
    source up to that many words."""
    from multimodal.data.sources.corpora import load_corpus

    out: list[list[str]] = []
    for source in sources:
        words = 0
        for doc in load_corpus([source], root=root):
            for sentence in split_sentences(doc.text):
                toks = tokenize(sentence)
                if not toks:
                    continue
                if max_words is not None and words >= max_words:
                    break
                out.append(toks)
                words += len(toks)
            if max_words is not None and words >= max_words:
                break
    return out


@dataclass
class Vocabulary:
    """Words by decreasing count (ties: first seen first) and their counts."""

    words: list[str]
    counts: list[int]

    @classmethod
    def build(cls, sentences: Iterable[Sequence[str]], min_count: int = 5,
              max_size: int | None = None) -> Vocabulary:
        """Words seen at least ``min_count`` times (the ``max_size`` most frequent)."""
        counter: Counter[str] = Counter()
        for s in sentences:
            counter.update(s)
        kept = [(w, c) for w, c in counter.most_common(max_size) if c >= min_count]
        if not kept:
            raise ValueError(f"no word occurs {min_count} times or more (min_count); the "
                             f"corpus has {sum(counter.values())} words")
        return cls([w for w, _ in kept], [c for _, c in kept])

    def __len__(self) -> int:
        return len(self.words)

    def index(self) -> dict[str, int]:
        return {w: i for i, w in enumerate(self.words)}


def encode(sentences: Iterable[Sequence[str]], vocab: Vocabulary) -> tuple[Tensor, Tensor]:
    """All in-vocabulary words as one id array (N,) and each word's sentence number (N,);
    out-of-vocabulary words are dropped, as the reference code does."""
    index = vocab.index()
    ids: list[int] = []
    sent: list[int] = []
    for i, s in enumerate(sentences):
        row = [index[w] for w in s if w in index]
        ids.extend(row)
        sent.extend([i] * len(row))
    return torch.tensor(ids, dtype=torch.long), torch.tensor(sent, dtype=torch.long)


def keep_probabilities(counts: Sequence[int], sample: float) -> Tensor:
    """Probability of keeping each word in sub-sampling (module docstring, step 1);
    ``sample <= 0`` keeps every word."""
    c = torch.tensor(counts, dtype=torch.float64)
    if sample <= 0:
        return torch.ones_like(c)
    threshold = sample * c.sum()
    return ((c / threshold).sqrt() + 1.0).mul(threshold / c).clamp(max=1.0)


def noise_cumulative(counts: Sequence[int], power: float = 0.75) -> Tensor:
    """Cumulative noise distribution ``f^power / sum f^power`` (float64), for
    ``searchsorted``."""
    p = torch.tensor(counts, dtype=torch.float64).pow(power)
    return (p / p.sum()).cumsum(0)


class Batches:
    """Each epoch's examples of one corpus (module docstring). ``epoch(generator)`` yields
    ``(inputs, targets, mask, valid)``: ``inputs`` (B,) centre words (skip-gram) or (B, 2W)
    context words with ``mask`` (CBOW; ``mask`` None for skip-gram), ``targets`` (B, 1+K)
    the word to predict then the noise words, ``valid`` (B, 1+K) false for a noise word
    equal to the word to predict."""

    def __init__(self, ids: Tensor, sentence: Tensor, counts: Sequence[int],
                 mode: Literal["cbow", "skipgram"] = "cbow", window: int = 5,
                 negatives: int = 5, sample: float = 1e-3, batch_size: int = 1024) -> None:
        if mode not in ("cbow", "skipgram"):
            raise ValueError(f"mode must be 'cbow' or 'skipgram', got {mode!r}")
        if window < 1 or negatives < 1 or batch_size < 1:
            raise ValueError(f"window, negatives and batch_size must be >= 1, got {window}, "
                             f"{negatives}, {batch_size}")
        self.ids, self.sentence = ids, sentence
        self.mode, self.window, self.negatives = mode, window, negatives
        self.batch_size = batch_size
        self.keep = keep_probabilities(counts, sample).float()
        self.cum = noise_cumulative(counts)

    @property
    def words(self) -> int:
        """Words of the corpus (in-vocabulary, before sub-sampling): one epoch's worth."""
        return int(self.ids.numel())

    def examples(self, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor,
                                                                          Tensor | None]:
        """One epoch's shuffled examples ``(inputs, predict, mask)`` (steps 1-3)."""
        keep = torch.rand(self.ids.numel(), generator=generator) < self.keep[self.ids]
        ids, sent = self.ids[keep], self.sentence[keep]
        n, w = ids.numel(), self.window
        half = w - torch.randint(0, w, (n,), generator=generator)      # 1..window
        pos = torch.arange(n)
        offsets = [d for d in range(-w, w + 1) if d != 0]
        ctx = torch.full((n, len(offsets)), -1, dtype=torch.long)
        for j, d in enumerate(offsets):
            p = pos + d
            pc = p.clamp(0, max(n - 1, 0))
            ok = (p >= 0) & (p < n) & (half >= abs(d)) & (sent[pc] == sent)
            ctx[:, j] = torch.where(ok, ids[pc], -1)
        mask = ctx >= 0
        if self.mode == "cbow":
            rows = mask.any(1)
            inputs, predict, mask_out = ctx[rows], ids[rows], mask[rows]
            order = torch.randperm(inputs.shape[0], generator=generator)
            return inputs[order], predict[order], mask_out[order]
        r, c = mask.nonzero(as_tuple=True)
        centre, context = ids[r], ctx[r, c]
        order = torch.randperm(centre.numel(), generator=generator)
        return centre[order], context[order], None

    def noise(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """``(n, negatives)`` noise words, ``P(w) ~ f(w)^0.75``."""
        u = torch.rand(n, self.negatives, generator=generator, dtype=torch.float64)
        return torch.searchsorted(self.cum, u * self.cum[-1]).clamp(max=self.cum.numel() - 1)

    def epoch(self, generator: torch.Generator | None = None,
              ) -> Iterator[tuple[Tensor, Tensor, Tensor | None, Tensor]]:
        inputs, predict, mask = self.examples(generator)
        for start in range(0, predict.numel(), self.batch_size):
            sl = slice(start, start + self.batch_size)
            p = predict[sl]
            neg = self.noise(p.numel(), generator)
            targets = torch.cat([p[:, None], neg], 1)
            valid = torch.ones_like(targets, dtype=torch.bool)
            valid[:, 1:] = neg != p[:, None]
            yield inputs[sl], targets, None if mask is None else mask[sl], valid

    def num_batches(self, examples: int) -> int:
        return math.ceil(examples / self.batch_size)


class _EpochStream(IterableDataset):
    """Each pass draws a new epoch with the seed ``seed + pass``; batches are dicts with
    ``epoch_fraction`` (how far into the epoch the batch ends) for the learning rate."""

    def __init__(self, batches: Batches, seed: int) -> None:
        self.batches, self.seed, self.passes = batches, seed, 0

    def __iter__(self) -> Iterator[dict[str, Tensor]]:
        gen = torch.Generator().manual_seed(self.seed + self.passes)
        self.passes += 1
        items = list(self.batches.epoch(gen))
        for i, (inputs, targets, mask, valid) in enumerate(items):
            batch = {"inputs": inputs, "targets": targets, "valid": valid,
                     "epoch_fraction": torch.tensor((i + 1) / len(items))}
            if mask is not None:
                batch["mask"] = mask
            yield batch


class Word2VecDataModule(L.LightningDataModule):
    """The offline corpora (``bash data/get_text.sh``) as Word2Vec batches
    (:class:`Batches`). The vocabulary (``min_count``) is built when the module is made, so
    that its size reaches the task (``model_sizes``) and the word list the saved vectors.
    No validation split: Word2Vec is judged by analogies (``benchmarks/word2vec.py``), so
    this is no :class:`~multimodal.data.splits.SplitDataModule`; it declares the rest of the
    data contract (modality, ``model_sizes``, ``follow``)."""

    modality: ClassVar[str] = "text"

    def __init__(self, sources: Sequence[str] = ("bible", "fortunes", "shakespeare"),
                 mode: Literal["cbow", "skipgram"] = "cbow", min_count: int = 5,
                 window: int = 5, negatives: int = 5, sample: float = 1e-3,
                 batch_size: int = 1024, max_words: int | None = None, seed: int = 0,
                 root: str = str(DEFAULT_ROOT),
                 sentences: list[list[str]] | None = None) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["sentences"])
        self.sentences = sentences if sentences is not None else \
            corpus_sentences(sources, max_words=max_words, root=root)
        self.vocab = Vocabulary.build(self.sentences, min_count=min_count)
        ids, sent = encode(self.sentences, self.vocab)
        self.batches = Batches(ids, sent, self.vocab.counts, mode=mode, window=window,
                               negatives=negatives, sample=sample, batch_size=batch_size)
        self.seed = seed

    @property
    def model_sizes(self) -> dict[str, int]:
        return {"vocab_size": len(self.vocab)}

    @classmethod
    def follow(cls, settings: Mapping[str, Any], given: Mapping[str, Any],
               source: str = "the pretrained model") -> tuple[dict[str, Any], list[str]]:
        """The arguments ``given`` with ``settings`` filled in (the data contract's rule,
        :func:`~multimodal.data.contract.follow_settings`)."""
        return follow_settings(cls, settings, given, source)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_EpochStream(self.batches, self.seed), batch_size=None)
