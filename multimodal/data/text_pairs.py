"""Sequence to sequence on your own text pairs: :class:`TextPairsDataModule`.

``train`` is a ``source<TAB>target`` ``.tsv`` (header optional), a ``.csv`` with ``source``
and ``target`` columns, or a ``.jsonl`` with those fields
(:mod:`multimodal.data.text_labelled`); ``val`` / ``test`` the same, else held out of
``train`` (seeded). ``shards``: LitData shards written by ``multimodal-prepare text-pairs``.

Batches are ``{"source_ids", "source_mask", "target_ids"}``, what
:class:`~multimodal.tasks.seq2seq.Seq2SeqTask` trains on: a source is its ids (with a
Hugging Face tokenizer, what its post-processor adds, e.g. ``[CLS] .. [SEP]``), a target
``bos ids eos``; both right padded with their tokenizer's pad id. The module exposes the
target's ``bos_token_id`` / ``eos_token_id`` / ``pad_token_id`` (the package's ``[BOS]`` /
``[EOS]`` / ``[PAD]``, or a Hugging Face tokenizer's own: BERT ``[CLS]`` / ``[SEP]`` /
``[PAD]``), which the task decodes with, and ``source_vocab_size`` / ``target_vocab_size``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from multimodal.data.shards import (
    ShardLoaderMixin,
    read_shard_meta,
    shard_splits,
)
from multimodal.data.splits import SplitDataModule, held_out, held_out_sizes
from multimodal.data.text_labelled import TextPairs, read_text_pairs
from multimodal.data.text_tokenizer import (
    AnyTextTokenizer,
    SpecialIds,
    TrainedTokenizerState,
    encode_for_encoder,
    encode_plain,
    given_tokenizer,
    same_on_every_rank,
    shard_tokenizer,
    special_ids,
    tokenizer_from_text,
)
from multimodal.tokenizers.hf_json import HFTokenizer
from multimodal.tokenizers.io import tokenizer_file
from multimodal.tokenizers.text import WordPieceTokenizer

__all__ = ["PairCollate", "PairDataset", "PairShardDecoder", "PairShardEncoder",
           "TextPairsDataModule"]

log = logging.getLogger(__name__)

SHARD_KIND = "text-pairs"


class PairDataset(Dataset):
    """Pre-encoded ``(source ids, target ids)`` pairs."""

    def __init__(self, sources: list[list[int]], targets: list[list[int]]) -> None:
        if len(sources) != len(targets):
            raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
        self.sources, self.targets = sources, targets

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, i: int) -> tuple[list[int], list[int]]:
        return self.sources[i], self.targets[i]


class PairCollate:
    """Right-pad ``(source, target)`` pairs into ``source_ids``, ``source_mask`` (1 = token)
    and ``target_ids``, each side with its own pad id."""

    def __init__(self, source_pad: int, target_pad: int) -> None:
        self.source_pad, self.target_pad = source_pad, target_pad

    @staticmethod
    def _pad(seqs: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.full((len(seqs), max(map(len, seqs))), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, s in enumerate(seqs):
            ids[b, : len(s)] = torch.tensor(s, dtype=torch.long)
            mask[b, : len(s)] = 1
        return ids, mask

    def __call__(self, items: list[tuple[list[int], list[int]]]) -> dict[str, torch.Tensor]:
        source_ids, source_mask = self._pad([s for s, _ in items], self.source_pad)
        target_ids, _ = self._pad([t for _, t in items], self.target_pad)
        return {"source_ids": source_ids, "source_mask": source_mask, "target_ids": target_ids}


class PairShardEncoder:
    """``multimodal-prepare text-pairs``: item ``i`` is pair ``i``'s ids (int32)."""

    def __init__(self, data: PairDataset) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __call__(self, i: int) -> dict[str, Any]:
        source, target = self.data[i]
        return {"source": np.asarray(source, dtype=np.int32),
                "target": np.asarray(target, dtype=np.int32)}


class PairShardDecoder:
    """``StreamingDataset`` transform: a shard item -> ``(source ids, target ids)``."""

    def __call__(self, item: dict[str, Any]) -> tuple[list[int], list[int]]:
        return [int(i) for i in item["source"]], [int(i) for i in item["target"]]


class TextPairsDataModule(TrainedTokenizerState, ShardLoaderMixin, SplitDataModule):
    """Your own ``(source, target)`` text pairs (or LitData shards of them).

    Args:
        train: a ``.tsv`` (``source<TAB>target``; a first line naming ``source`` and
            ``target`` is a header), ``.csv`` (header with ``source`` and ``target``) or
            ``.jsonl`` (``source`` and ``target`` fields) file.
        val, test: the same kinds; default: held out of ``train`` by ``val_size`` /
            ``test_size`` (a fraction below 1 or a count; seeded; test first).
        val_fraction, test_fraction: the old names of ``val_size`` / ``test_size``
            (deprecated; still read).
        shards: written by ``multimodal-prepare text-pairs``; ``train`` / ``val`` / ``test``
            are then unused.
        tokenizer: a ``tokenizer.json`` (Hugging Face, or one of the package's own) or a
            folder holding one, for both sides; ``source_tokenizer`` / ``target_tokenizer``
            set one side. A side without one gets a WordPiece of ``vocab_size`` trained on
            the training pairs: one for both sides when ``shared_vocabulary`` (so the model
            may share embeddings), else one per side.
        max_source_len, max_target_len: ids per side at most, special tokens included; a
            longer text is cut (counted and logged).
        source_key, target_key: the column / field names.
    """

    modality = "text-text"

    def __init__(
        self,
        train: str | None = None,
        val: str | None = None,
        test: str | None = None,
        shards: str | None = None,
        tokenizer: str | None = None,
        source_tokenizer: str | None = None,
        target_tokenizer: str | None = None,
        vocab_size: int = 8000,
        shared_vocabulary: bool = True,
        lowercase: bool = False,
        max_source_len: int = 64,
        max_target_len: int = 64,
        source_key: str = "source",
        target_key: str = "target",
        batch_size: int = 32,
        val_size: int | float = 0.1,
        test_size: int | float = 0.1,
        seed: int = 0,
        num_workers: int = 0,
        val_fraction: int | float | None = None,
        test_fraction: int | float | None = None,
    ) -> None:
        super().__init__()
        val_size, test_size = held_out_sizes(val_size, test_size, val_fraction, test_fraction)
        self.save_hyperparameters()  # `multimodal test --ckpt_path` rebuilds the module
        if shards is not None and (train is not None or val is not None or test is not None):
            raise ValueError("give train / val / test (your pairs) or shards, not both")
        if shards is None and train is None:
            raise ValueError("give train (a source<TAB>target .tsv, or a .csv / .jsonl with "
                             "source and target) or shards")
        if max_source_len < 1 or max_target_len < 3:
            raise ValueError(f"need max_source_len >= 1 and max_target_len >= 3 (bos, a token, "
                             f"eos), got {max_source_len} and {max_target_len}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.files = {"train": train, "val": val, "test": test}
        self.shards = shards
        self.tokenizer_specs = {"source": source_tokenizer or tokenizer,
                                "target": target_tokenizer or tokenizer}
        for spec in self.tokenizer_specs.values():
            if spec is not None and shards is None:
                tokenizer_file(spec)  # a missing tokenizer fails here
        self.vocab_size_target, self.shared_vocabulary = vocab_size, shared_vocabulary
        self.lowercase = lowercase
        self.max_source_len, self.max_target_len = max_source_len, max_target_len
        self.source_key, self.target_key = source_key, target_key
        self.batch_size, self.num_workers, self.seed = batch_size, num_workers, seed
        self.record_sizes(val_size, test_size)
        self._meta: dict[str, Any] | None = None
        if shards is not None:
            self._meta = read_shard_meta(shards, SHARD_KIND)
            for side in ("source", "target"):
                have, want = self._meta[f"max_{side}_len"], getattr(self, f"max_{side}_len")
                if have > want:
                    raise ValueError(f"{shards} holds {side}s of up to {have} ids: set "
                                     f"max_{side}_len: {have}")
        self._tokenizers: dict[str, AnyTextTokenizer] = {}
        self._specials: dict[str, SpecialIds] = {}
        self.splits: dict[str, TextPairs] = {}
        self.datasets: dict[str, Dataset] = {}
        self.truncated: dict[str, int] = {}

    # --- splits --------------------------------------------------------------------------------
    def read_splits(self) -> dict[str, TextPairs]:
        """Train / val / test pairs: given files, else held out of ``train`` (seeded)."""
        if self.splits:
            return self.splits
        full = read_text_pairs(self.files["train"], self.source_key, self.target_key)  # type: ignore[arg-type]
        given = {k: read_text_pairs(v, self.source_key, self.target_key)
                 for k in ("val", "test") if (v := self.files[k]) is not None}
        idx = held_out(len(full), self.seed, self.val_size, self.test_size,
                       "test" in given, "val" in given)
        held = {k: full.subset(v.tolist()) for k, v in idx.items() if v is not None}
        self.splits = {"train": held["train"], "val": given.get("val", held.get("val")),
                       "test": given.get("test", held.get("test"))}  # type: ignore[dict-item]
        return self.splits

    # --- tokenizers ----------------------------------------------------------------------------
    def _load_tokenizers(self) -> None:
        if self._tokenizers:
            return
        if self._meta is not None:
            for side in ("source", "target"):
                self._tokenizers[side], self._specials[side] = shard_tokenizer(
                    self.shards, self._meta, side)  # type: ignore[arg-type]
            return
        trained: dict[str, AnyTextTokenizer] = {}
        for side in ("source", "target"):
            spec = self.tokenizer_specs[side]
            if spec is not None:
                self._tokenizers[side], self._specials[side] = given_tokenizer(spec)
                continue
            train = self.read_splits()["train"]
            key = "shared" if self.shared_vocabulary else side
            if key not in trained:
                texts = {"source": train.sources, "target": train.targets,
                         "shared": train.sources + train.targets}[key]
                trained[key] = WordPieceTokenizer.train(
                    texts, vocab_size=self.vocab_size_target, lowercase=self.lowercase)
            self._tokenizers[side] = trained[key]
            self._specials[side] = special_ids(trained[key])
        target = self._specials["target"]
        if target.bos is None or target.eos is None:
            raise ValueError(f"the target tokenizer {self.tokenizer_specs['target']} has no "
                             f"start or end token (bos {target.bos}, eos {target.eos}): a "
                             f"decoder target needs both")

    @property
    def source_tokenizer(self) -> AnyTextTokenizer:
        self._load_tokenizers()
        return self._tokenizers["source"]

    @property
    def target_tokenizer(self) -> AnyTextTokenizer:
        self._load_tokenizers()
        return self._tokenizers["target"]

    def specials(self, side: str) -> SpecialIds:
        """Special ids of the ``"source"`` or ``"target"`` tokenizer."""
        self._load_tokenizers()
        return self._specials[side]

    @property
    def source_vocab_size(self) -> int:
        return int(self.source_tokenizer.vocab_size)

    @property
    def target_vocab_size(self) -> int:
        return int(self.target_tokenizer.vocab_size)

    @property
    def model_sizes(self) -> dict[str, int]:
        """The sizes a model of these data must have, by config field name (the
        ``multimodal`` CLI links them into the task's ``data_sizes``: a preset takes them):
        the lengths, and the vocabularies: a given tokenizer's (or the shards') size, else
        the ``vocab_size`` the WordPiece is trained to (without training it here)."""
        sizes = {"max_source_len": self.max_source_len, "max_target_len": self.max_target_len}
        for side in ("source", "target"):
            own = self.tokenizer_specs[side] is not None or self._meta is not None
            sizes[f"{side}_vocab_size"] = int(getattr(self, f"{side}_vocab_size")) if own \
                else int(self.vocab_size_target)
        return sizes

    @property
    def bos_token_id(self) -> int:
        return int(self.specials("target").bos)  # type: ignore[arg-type]

    @property
    def eos_token_id(self) -> int:
        return int(self.specials("target").eos)  # type: ignore[arg-type]

    @property
    def pad_token_id(self) -> int:
        return self.specials("target").pad

    # --- encoding ------------------------------------------------------------------------------
    def encode_sources(self, texts: list[str]) -> list[list[int]]:
        """Source ids, at most ``max_source_len`` each."""
        tok = self.source_tokenizer
        if isinstance(tok, HFTokenizer):
            return encode_for_encoder(tok, texts, self.max_source_len)
        return tok.encode_many(texts, max_length=self.max_source_len, truncation=True)

    def encode_targets(self, texts: list[str]) -> list[list[int]]:
        """``[bos] ids [eos]``, the ids cut to fit ``max_target_len``."""
        bos, eos = self.bos_token_id, self.eos_token_id
        room = self.max_target_len - 2
        return [[bos, *ids[:room], eos] for ids in encode_plain(self.target_tokenizer, texts)]

    def decode_targets(self, ids: torch.Tensor | list[list[int]]) -> list[str]:
        """Texts of target ids (``bos`` / ``eos`` / padding dropped)."""
        rows = ids.tolist() if isinstance(ids, torch.Tensor) else ids
        skip = {self.bos_token_id, self.eos_token_id, self.pad_token_id}
        out = []
        for row in rows:
            row = row[1:] if row and row[0] == self.bos_token_id else row
            row = row[: row.index(self.eos_token_id)] if self.eos_token_id in row else row
            out.append(self.target_tokenizer.decode([i for i in row if i not in skip]))
        return out

    def encoded_splits(self) -> dict[str, PairDataset]:
        """``split -> PairDataset`` of your pairs (what the shards hold)."""
        out = {}
        for split, pairs in self.read_splits().items():
            if not len(pairs):
                out[split] = PairDataset([], [])
                continue
            sources = self.encode_sources(pairs.sources)
            targets = self.encode_targets(pairs.targets)
            plain_source = encode_plain(self.source_tokenizer, pairs.sources)
            plain_target = encode_plain(self.target_tokenizer, pairs.targets)
            spec = self.specials("source")  # the special tokens a source gets
            extra = len(spec.start) + len(spec.end) if isinstance(
                self.source_tokenizer, HFTokenizer) else 0
            cut = sum(len(p) + extra > self.max_source_len for p in plain_source) + sum(
                len(p) + 2 > self.max_target_len for p in plain_target)
            if cut:
                self.truncated[split] = cut
                log.warning("%s split: %d source / target text(s) cut to max_source_len=%d / "
                            "max_target_len=%d ids", split, cut, self.max_source_len,
                            self.max_target_len)
            out[split] = PairDataset(sources, targets)
        return out

    # --- datasets ------------------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        self._load_tokenizers()
        if self._meta is not None:
            self.datasets = shard_splits(self.shards, self._meta["sizes"],  # type: ignore[arg-type]
                                         PairShardDecoder(), self.seed)
            return
        for side in self._trained_sides():  # trained here: every rank must use rank 0's
            tok = self._tokenizers[side]
            agreed = same_on_every_rank(self, tok)
            if agreed is not tok:
                for other in ("source", "target"):  # a shared vocabulary stays shared
                    if self._tokenizers[other] is tok:
                        self._tokenizers[other] = agreed
                        self._specials[other] = special_ids(agreed)
        self.datasets = dict(self.encoded_splits())
        if len(self.datasets["train"]) == 0:  # type: ignore[arg-type]
            raise ValueError(f"{self.files['train']}: no training pair left after holding "
                             f"out val / test")

    def collate_fn(self) -> Callable[[list[Any]], dict[str, torch.Tensor]]:
        return PairCollate(self.specials("source").pad, self.pad_token_id)

    # --- checkpoints keep trained tokenizers ----------------------------------------------------
    def _trained_sides(self) -> list[str]:
        if self._meta is not None:
            return []
        return [side for side in ("source", "target") if self.tokenizer_specs[side] is None]

    def _trained_keys(self) -> list[str]:
        return [f"{side}_tokenizer" for side in self._trained_sides()]

    def _trained_tokenizers(self) -> dict[str, AnyTextTokenizer]:
        if not self._tokenizers:
            return {}
        return {f"{side}_tokenizer": self._tokenizers[side] for side in self._trained_sides()}

    def _restore_tokenizers(self, texts: dict[str, str]) -> None:
        self._load_tokenizers()  # the sides given as files
        restored = {k.removesuffix("_tokenizer"): text for k, text in texts.items()}
        shared = restored.get("source") == restored.get("target")
        for side, text in restored.items():
            tok = self._tokenizers["source"] if shared and side == "target" \
                else tokenizer_from_text(text)
            self._tokenizers[side] = tok
            self._specials[side] = special_ids(tok)
