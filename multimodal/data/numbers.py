"""Number words to digits: ``"three hundred and twelve" -> "312"``, for 0..999,999.

A generated translation task for encoder-decoder models. British usage: ``and`` after
``hundred`` when tens/units follow, and between ``thousand`` and a remainder below 100
(``"one thousand and five"``); hyphens in 21..99 (``"forty-two"``).

Sources are word-level (the 33 number words, ``and`` and ``-``), targets character-level
(the ten digits), both with the package's special ids (``[PAD]`` = 0, ``[BOS]`` = 5,
``[EOS]`` = 6). Held-out numbers (val and test) are chosen first, from a seeded random
subset of 0..999,999, and never occur in the training set.

With ``numbers_per_source=K > 1`` every example is a list of 1..K numbers (the count
uniform), words joined by ``,`` and digits joined by ``,`` (``"twelve , five" -> "12,5"``):
sources up to ``K`` times longer, for measuring how a model copes with input length (the
bottleneck of an RNN encoder-decoder without attention). The lists of the val and test
splits are drawn from the held-out numbers only, those of the training split from the
training numbers only.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset

from multimodal.data.splits import SplitDataModule
from multimodal.tokenizers.text import PAD_ID, SPECIAL_TOKENS, CharTokenizer, WordTokenizer

ONES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
        "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
        "eighteen", "nineteen")
TENS = ("_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty",
        "ninety")
MAX_NUMBER = 999_999
SEPARATOR = ","

__all__ = ["NumberWordsDataModule", "number_to_words", "numbers_to_digits", "numbers_to_words",
           "source_tokenizer", "target_tokenizer", "words_to_number"]


def _below_100(n: int) -> str:
    if n < 20:
        return ONES[n]
    tens, units = divmod(n, 10)
    return TENS[tens] + (f"-{ONES[units]}" if units else "")


def _below_1000(n: int) -> str:
    hundreds, rest = divmod(n, 100)
    if not hundreds:
        return _below_100(rest)
    head = f"{ONES[hundreds]} hundred"
    return f"{head} and {_below_100(rest)}" if rest else head


def number_to_words(n: int) -> str:
    """English words of ``0 <= n <= 999999`` (British ``and``, hyphenated 21..99)."""
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_NUMBER:
        raise ValueError(f"n must be an integer in [0, {MAX_NUMBER}], got {n!r}")
    thousands, rest = divmod(n, 1000)
    if not thousands:
        return _below_1000(rest)
    head = f"{_below_1000(thousands)} thousand"
    if not rest:
        return head
    return f"{head} and {_below_100(rest)}" if rest < 100 else f"{head} {_below_1000(rest)}"


def words_to_number(text: str) -> int:
    """Inverse of :func:`number_to_words` (a plain parser: sums groups, multiplies by
    ``hundred`` / ``thousand``); raises ValueError on an unknown word."""
    value = {w: i for i, w in enumerate(ONES)} | {w: 10 * i for i, w in enumerate(TENS) if i > 1}
    total, group = 0, 0
    for word in text.replace("-", " ").split():
        if word == "and":
            continue
        if word == "hundred":
            group *= 100
        elif word == "thousand":
            total, group = (total + group) * 1000, 0
        elif word in value:
            group += value[word]
        else:
            raise ValueError(f"unknown number word {word!r} in {text!r}")
    return total + group


def numbers_to_words(numbers: Sequence[int]) -> str:
    """Words of a list of numbers, joined by ``" , "`` (one number: its words)."""
    if not numbers:
        raise ValueError("numbers is empty: give at least one number")
    return f" {SEPARATOR} ".join(number_to_words(n) for n in numbers)


def numbers_to_digits(numbers: Sequence[int]) -> str:
    """Digits of a list of numbers, joined by ``","``."""
    if not numbers:
        raise ValueError("numbers is empty: give at least one number")
    return SEPARATOR.join(str(n) for n in numbers)


def source_tokenizer(separator: bool = False) -> WordTokenizer:
    """Word-level tokenizer over the number words, ``and`` and ``-`` (and with
    ``separator`` the list separator ``,``, the last id, so the other ids do not move)."""
    words = [*ONES, *TENS[2:], "hundred", "thousand", "and", "-"]
    return WordTokenizer([*SPECIAL_TOKENS, *words, *([SEPARATOR] if separator else [])])


def target_tokenizer(separator: bool = False) -> CharTokenizer:
    """Character-level tokenizer over the ten digits (and with ``separator`` ``,``, the
    last id)."""
    return CharTokenizer([*SPECIAL_TOKENS, *"0123456789", *([SEPARATOR] if separator else [])])


def sample_number(rng: random.Random) -> int:
    """A number whose digit count is uniform in 1..6, then uniform among those numbers."""
    digits = rng.randint(1, 6)
    low = 0 if digits == 1 else 10 ** (digits - 1)
    return rng.randrange(low, 10**digits)


class NumberPairs(Dataset):
    """``(source ids, target ids)`` of a list of numbers: words -> ``[BOS] digits [EOS]``;
    an item that is a tuple of numbers becomes their joined words and digits
    (:func:`numbers_to_words`, :func:`numbers_to_digits`)."""

    def __init__(self, numbers: Sequence[int | tuple[int, ...]]) -> None:
        src, tgt = source_tokenizer(separator=True), target_tokenizer(separator=True)
        self.numbers = list(numbers)
        items = [n if isinstance(n, tuple) else (n,) for n in self.numbers]
        self.sources = src.encode_many([numbers_to_words(n) for n in items])
        self.targets = tgt.encode_many([numbers_to_digits(n) for n in items], add_bos=True,
                                       add_eos=True)

    def __len__(self) -> int:
        return len(self.numbers)

    def __getitem__(self, i: int) -> tuple[list[int], list[int]]:
        return self.sources[i], self.targets[i]


def collate_pairs(items: list[tuple[list[int], list[int]]]) -> dict[str, torch.Tensor]:
    """Right-pad into ``source_ids``, ``source_mask`` (1 = token), ``target_ids`` (``[PAD]``
    after ``[EOS]``)."""
    def pad(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.full((len(seqs), max(map(len, seqs))), PAD_ID, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, s in enumerate(seqs):
            ids[b, : len(s)] = torch.tensor(s)
            mask[b, : len(s)] = 1
        return ids, mask

    source_ids, source_mask = pad([s for s, _ in items])
    target_ids, _ = pad([t for _, t in items])
    return {"source_ids": source_ids, "source_mask": source_mask, "target_ids": target_ids}


class NumberWordsDataModule(SplitDataModule):
    """Train / val / test pairs of number words and digits.

    ``held_out`` numbers are drawn first (a seeded sample of 0..999,999 plus a share of
    0..9,999 so that short numbers are tested too) and split into val and test; the
    ``train_size`` distinct training numbers are drawn with :func:`sample_number` from
    the rest.

    ``numbers_per_source=K > 1``: each split holds as many lists of 1..K numbers (the count
    uniform, the numbers drawn with replacement from that split's numbers) as it has
    numbers; ``lists`` holds them, and the vocabularies gain the separator ``,``.
    """

    modality = "text-text"

    def __init__(self, train_size: int = 50_000, held_out: int = 10_000,
                 test_size: int = 2000, val_size: int = 500, batch_size: int = 64,
                 seed: int = 0, numbers_per_source: int = 1) -> None:
        super().__init__()
        if isinstance(numbers_per_source, bool) or not isinstance(numbers_per_source, int) \
                or numbers_per_source < 1:
            raise ValueError(f"numbers_per_source must be an integer >= 1, got "
                             f"{numbers_per_source!r}")
        if not 0 < val_size + test_size <= held_out:
            raise ValueError(f"need 0 < val_size + test_size <= held_out, got {val_size} + "
                             f"{test_size} and {held_out}")
        if not 0 < train_size <= 500_000:
            raise ValueError(f"train_size must be in (0, 500000], got {train_size}")
        self.train_size, self.held_out = train_size, held_out
        self.test_size, self.val_size = test_size, val_size
        self.batch_size, self.seed = batch_size, seed
        self.numbers_per_source = numbers_per_source
        lists = numbers_per_source > 1
        self.source_vocab_size = source_tokenizer(separator=lists).vocab_size
        self.target_vocab_size = target_tokenizer(separator=lists).vocab_size
        self.numbers: dict[str, list[int]] = {}
        self.lists: dict[str, list[tuple[int, ...]]] = {}

    @property
    def model_sizes(self) -> dict[str, int]:
        """The sizes a model of these data must have, by config field name (the
        ``multimodal`` CLI links them into the task's ``data_sizes``: a preset takes them)."""
        return {"source_vocab_size": self.source_vocab_size,
                "target_vocab_size": self.target_vocab_size}

    def setup(self, stage: str | None = None) -> None:
        if self.numbers:
            return
        rng = random.Random(self.seed)
        small = rng.sample(range(10_000), self.held_out // 20)
        held = list(dict.fromkeys(small + rng.sample(range(MAX_NUMBER + 1), self.held_out)))
        held = held[: self.held_out]
        rng.shuffle(held)
        held_set = set(held)
        train: set[int] = set()
        while len(train) < self.train_size:
            n = sample_number(rng)
            if n not in held_set:
                train.add(n)
        self.numbers = {"train": sorted(train), "val": held[: self.val_size],
                        "test": held[self.val_size: self.val_size + self.test_size]}
        if self.numbers_per_source > 1:
            lists_rng = random.Random(f"{self.seed}-lists")
            for split, pool in self.numbers.items():
                self.lists[split] = [
                    tuple(lists_rng.choices(pool, k=lists_rng.randint(1, self.numbers_per_source)))
                    for _ in pool]

    def split_dataset(self, split: str) -> NumberPairs:
        self.setup()
        return NumberPairs(self.lists[split] if self.lists else self.numbers[split])

    def collate_fn(self) -> Callable[..., dict[str, Any]]:
        return collate_pairs
