"""Text classification on your own labelled texts: :class:`TextClassificationDataModule`.

``train`` is a ``text,label`` ``.csv`` / ``.tsv`` / ``.jsonl`` file or a folder with one
subfolder of ``.txt`` files per class (:mod:`multimodal.data.text_labelled`); ``val`` /
``test`` are the same kinds, else held out of ``train`` (seeded). ``shards``: LitData shards
written by ``multimodal-prepare labelled-text``. Batches are ``{"input_ids",
"attention_mask", "label"}`` (right padded with the tokenizer's pad id), what
a :class:`~multimodal.tasks.classification.ClassificationTask` over a text encoder trains on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from multimodal.data.shards import (
    ShardLoaderMixin,
    read_shard_meta,
    shard_splits,
)
from multimodal.data.splits import (
    SplitDataModule,
    check_min_per_class,
    held_out,
    held_out_sizes,
)
from multimodal.data.text import PadCollate, PassageDataset
from multimodal.data.text_labelled import (
    LabelledTexts,
    encode_labels,
    read_labelled_texts,
    read_predict_texts,
    resolve_classes,
)
from multimodal.data.text_tokenizer import (
    AnyTextTokenizer,
    SpecialIds,
    TrainedTokenizerState,
    encode_for_encoder,
    given_tokenizer,
    same_on_every_rank,
    shard_tokenizer,
    special_ids,
    tokenizer_from_text,
)
from multimodal.data.workers import ignore_job_signals
from multimodal.tokenizers.io import tokenizer_file
from multimodal.tokenizers.text import WordPieceTokenizer

__all__ = [
    "LabelledShardDecoder",
    "LabelledShardEncoder",
    "NamedPadCollate",
    "TextClassificationDataModule",
]

log = logging.getLogger(__name__)

SHARD_KIND = "labelled-text"


class LabelledShardEncoder:
    """``multimodal-prepare labelled-text``: item ``i`` is text ``i``'s token ids (int32)
    and its class index."""

    def __init__(self, ids: list[list[int]], labels: list[int]) -> None:
        self.ids, self.labels = ids, labels

    def __len__(self) -> int:
        return len(self.ids)

    def __call__(self, i: int) -> dict[str, Any]:
        return {"ids": np.asarray(self.ids[i], dtype=np.int32), "label": int(self.labels[i])}


class LabelledShardDecoder:
    """``StreamingDataset`` transform: a shard item -> ``(ids, label)`` as
    :class:`~multimodal.data.text.PassageDataset` gives it."""

    def __call__(self, item: dict[str, Any]) -> tuple[list[int], int]:
        return [int(i) for i in item["ids"]], int(item["label"])


class NamedPadCollate(PadCollate):
    """Collate ``(ids, name)`` items into ``{input_ids, attention_mask, filename}``."""

    def __call__(self, items: list[tuple[list[int], Any]]) -> dict[str, Any]:
        batch = super().__call__([(ids, 0) for ids, _ in items])
        del batch["label"]
        batch["filename"] = [name for _, name in items]
        return batch


class TextClassificationDataModule(TrainedTokenizerState, ShardLoaderMixin, SplitDataModule):
    """Your own labelled texts (or LitData shards of them) for text classification.

    Args:
        train: a ``.csv`` / ``.tsv`` (header with ``text`` and ``label`` columns) or
            ``.jsonl`` (``text`` and ``label`` fields) file, or a folder
            ``train/<class>/<file>.txt``. Labels are names or integer class ids (see
            :mod:`multimodal.data.text_labelled`).
        val, test: the same kinds; default: held out of ``train`` by ``val_size`` /
            ``test_size`` (a fraction below 1 or a count; seeded; test first). A label
            of a given ``val`` / ``test`` file that no training text has is an error naming
            the file and line.
        val_fraction, test_fraction: the old names of ``val_size`` / ``test_size``
            (deprecated; still read).
        min_held_out_per_class: hold no validation (test) split out of ``train`` where a
            fractional ``val_size`` (``test_size``) gives fewer texts than this per
            class: they train (:func:`~multimodal.data.splits.held_out`); 0: always.
        shards: a folder or object-store URL written by ``multimodal-prepare labelled-text``
            (token ids, labels, the tokenizer); ``train`` / ``val`` / ``test`` are then unused.
        classes: the class names in index order (default: the sorted training labels; with
            integer labels ``"0", "1", ...``).
        tokenizer: a ``tokenizer.json`` (Hugging Face, or one of the package's own) or a
            folder holding one, used as it is; default: a WordPiece of ``vocab_size`` trained
            on the training texts. With a Hugging Face tokenizer, ``[CLS]`` / ``[SEP]`` /
            pad ids are the tokenizer's.
        max_length: ids per text at most, special tokens included (longer texts are cut).
        text_key, label_key: the column / field names.
        predict: texts for ``multimodal predict``
            (:func:`~multimodal.data.text_labelled.read_predict_texts`).

    ``num_classes`` and ``class_names`` are known right after construction (the training
    labels are read once, then kept).
    """

    modality = "text"

    def __init__(
        self,
        train: str | None = None,
        val: str | None = None,
        test: str | None = None,
        shards: str | None = None,
        classes: list[str] | None = None,
        tokenizer: str | None = None,
        vocab_size: int = 8000,
        lowercase: bool = True,
        max_length: int = 128,
        text_key: str = "text",
        label_key: str = "label",
        batch_size: int = 32,
        val_size: int | float = 0.1,
        test_size: int | float = 0.1,
        seed: int = 0,
        num_workers: int = 0,
        predict: str | None = None,
        val_fraction: int | float | None = None,
        test_fraction: int | float | None = None,
        min_held_out_per_class: int = 0,
    ) -> None:
        super().__init__()
        val_size, test_size = held_out_sizes(val_size, test_size, val_fraction, test_fraction)
        self.save_hyperparameters()  # `multimodal predict --ckpt_path` rebuilds the module
        self.min_held_out_per_class = check_min_per_class(min_held_out_per_class)
        if shards is not None and (train is not None or val is not None or test is not None):
            raise ValueError("give train / val / test (your texts) or shards, not both")
        if shards is None and train is None:
            raise ValueError("give train (a text,label .csv / .jsonl, or a folder of class "
                             "subfolders of .txt files) or shards")
        if max_length < 2:
            raise ValueError(f"max_length must be >= 2 (a special token + one token), got "
                             f"{max_length}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.files = {"train": train, "val": val, "test": test}
        self.shards, self.classes = shards, classes
        self.tokenizer_spec = tokenizer
        self.vocab_size_target, self.lowercase = vocab_size, lowercase
        self.max_length, self.text_key, self.label_key = max_length, text_key, label_key
        self.batch_size, self.num_workers, self.seed = batch_size, num_workers, seed
        self.record_sizes(val_size, test_size)
        self.predict = predict
        self._meta: dict[str, Any] | None = None
        if shards is not None:
            self._meta = read_shard_meta(shards, SHARD_KIND)
            if self._meta["max_length"] > max_length:
                raise ValueError(f"{shards} holds texts of up to {self._meta['max_length']} "
                                 f"ids: set max_length: {self._meta['max_length']}")
        elif tokenizer is not None:
            tokenizer_file(tokenizer)  # a missing tokenizer fails here, not after reading
        self._train_texts: LabelledTexts | None = None
        self._classes: tuple[list[str], bool] | None = None
        self._tokenizer: AnyTextTokenizer | None = None
        self._specials: SpecialIds | None = None
        self.splits: dict[str, LabelledTexts] = {}
        self.datasets: dict[str, Dataset] = {}

    # --- classes ---------------------------------------------------------------------------
    def _train(self) -> LabelledTexts:
        if self._train_texts is None:
            self._train_texts = read_labelled_texts(self.files["train"],  # type: ignore[arg-type]
                                                    self.text_key, self.label_key)
        return self._train_texts

    def _resolved(self) -> tuple[list[str], bool]:
        if self._classes is None:
            if self._meta is not None:
                names = self.classes or self._meta["classes"]
                self._classes = (list(names), bool(self._meta.get("integer_labels")))
            else:
                self._classes = resolve_classes(self._train(), self.classes)
        return self._classes

    @property
    def class_names(self) -> list[str]:
        """Class names in index order."""
        return list(self._resolved()[0])

    @property
    def num_classes(self) -> int:
        return len(self._resolved()[0])

    # --- splits ------------------------------------------------------------------------------
    def read_splits(self) -> dict[str, LabelledTexts]:
        """Train / val / test texts: given files, else held out of ``train`` (seeded)."""
        if self.splits:
            return self.splits
        full = self._train()
        given = {k: read_labelled_texts(v, self.text_key, self.label_key)
                 for k in ("val", "test") if (v := self.files[k]) is not None}
        idx = held_out(len(full), self.seed, self.val_size, self.test_size,
                       "test" in given, "val" in given, labels=full.labels,  # stratified
                       min_held_out_per_class=self.min_held_out_per_class)
        splits = {k: full.subset(v.tolist()) for k, v in idx.items() if v is not None}
        self.splits = {"train": splits["train"], "val": given.get("val", splits.get("val")),
                       "test": given.get("test", splits.get("test"))}  # type: ignore[dict-item]
        return self.splits

    def _labels(self) -> dict[str, list[int]]:
        names, integer = self._resolved()
        splits = self.read_splits()
        train = encode_labels(splits["train"], names, integer)
        seen = set(train)
        out = {"train": train}
        for split in ("val", "test"):
            data = splits[split]
            if self.files[split] is not None:  # the user's own file: unknown labels are errors
                out[split] = encode_labels(data, names, integer,
                                           None if self.classes else seen, split)
            else:
                out[split] = encode_labels(data, names, integer)
                unseen = sorted({names[i] for i in out[split]} - {names[i] for i in seen})
                if unseen:
                    log.warning("the held-out %s split has class(es) %s that no training "
                                "text has", split, unseen[:10])
        return out

    # --- tokenizer -----------------------------------------------------------------------------
    @property
    def tokenizer(self) -> AnyTextTokenizer:
        """The given ``tokenizer``, the shards' one, or a WordPiece trained on the training
        split."""
        if self._tokenizer is None:
            if self._meta is not None:
                self._tokenizer, self._specials = shard_tokenizer(
                    self.shards, self._meta)  # type: ignore[arg-type]
            elif self.tokenizer_spec is not None:
                self._tokenizer, self._specials = given_tokenizer(self.tokenizer_spec)
            else:
                texts = self.read_splits()["train"].texts
                self._tokenizer = WordPieceTokenizer.train(
                    texts, vocab_size=self.vocab_size_target, lowercase=self.lowercase)
                self._specials = special_ids(self._tokenizer)
        return self._tokenizer

    @property
    def specials(self) -> SpecialIds:
        """The tokenizer's special ids (pad, start / end of an encoder input ...)."""
        self.tokenizer  # noqa: B018  (loads the specials with it)
        return self._specials  # type: ignore[return-value]

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.vocab_size)

    @property
    def model_sizes(self) -> dict[str, int]:
        """The sizes a model of these data must have, by config field name (the
        ``multimodal`` CLI links them into the task's ``data_sizes``: a preset takes them):
        ``max_len`` (``max_length``) and ``vocab_size``: a given tokenizer's (or the
        shards') size, else the ``vocab_size`` the WordPiece is trained to (without
        training it here)."""
        own = self.tokenizer_spec is not None or self._meta is not None
        return {"vocab_size": int(self.vocab_size) if own else int(self.vocab_size_target),
                "max_len": int(self.max_length)}

    @property
    def pad_token_id(self) -> int:
        return self.specials.pad

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Encoder inputs of ``texts`` (at most ``max_length`` ids each)."""
        return encode_for_encoder(self.tokenizer, texts, self.max_length)

    # --- datasets ------------------------------------------------------------------------------
    def encoded_splits(self) -> dict[str, tuple[list[list[int]], list[int]]]:
        """``split -> (ids, labels)`` of your texts (what the shards hold)."""
        labels = self._labels()
        return {k: (self.encode(v.texts) if len(v) else [], labels[k])
                for k, v in self.read_splits().items()}

    def setup(self, stage: str | None = None) -> None:
        if self.datasets or stage == "predict":  # predict encodes only its own texts
            return
        if self._meta is not None:
            self.tokenizer  # noqa: B018
            self.datasets = shard_splits(self.shards, self._meta["sizes"],  # type: ignore[arg-type]
                                         LabelledShardDecoder(), self.seed)
            return
        if self.tokenizer_spec is None:  # trained here: every rank must use rank 0's
            self._tokenizer = same_on_every_rank(self, self.tokenizer)
            self._specials = special_ids(self._tokenizer)
        for split, (ids, labels) in self.encoded_splits().items():
            self.datasets[split] = PassageDataset(ids, labels)
        if len(self.datasets["train"]) == 0:  # type: ignore[arg-type]
            raise ValueError(f"{self.files['train']}: no training text left after holding "
                             f"out val / test")

    def collate_fn(self) -> Callable[[list[Any]], dict[str, torch.Tensor]]:
        return PadCollate(self.pad_token_id)

    # --- checkpoints keep a trained tokenizer (TrainedTokenizerState) ---------------------------
    def _trained_keys(self) -> list[str]:
        return ["tokenizer"] if self.tokenizer_spec is None and self._meta is None else []

    def _trained_tokenizers(self) -> dict[str, AnyTextTokenizer]:
        if self._tokenizer is None:
            return {}
        return {k: self._tokenizer for k in self._trained_keys()}

    def _restore_tokenizers(self, texts: dict[str, str]) -> None:
        self._tokenizer = tokenizer_from_text(texts["tokenizer"])
        self._specials = special_ids(self._tokenizer)

    def predict_dataloader(self) -> DataLoader:
        if self.predict is None:
            raise ValueError("set predict to the texts to classify (a .txt file with one text "
                             "a line, a .csv / .jsonl with a text column, or a folder of .txt)")
        texts, names = read_predict_texts(self.predict, self.text_key)
        data = PassageDataset(self.encode(texts), names)  # type: ignore[arg-type]
        return DataLoader(data, batch_size=self.batch_size, shuffle=False,
                          num_workers=self.num_workers,
                          collate_fn=NamedPadCollate(self.pad_token_id),
                          worker_init_fn=ignore_job_signals)
