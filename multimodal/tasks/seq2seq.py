"""Sequence-to-sequence training for :class:`~multimodal.models.seq2seq.Seq2Seq` (the
transformer) and :class:`~multimodal.models.rnn.RNNSeq2Seq` (the recurrent baselines).

Teacher forcing: with a target ``[BOS] y_1 .. y_T [EOS] [PAD]..``, the decoder reads
``target[:, :-1]`` and is trained to predict ``target[:, 1:]``; ``[PAD]`` targets are
ignored. ``L = -1/|T| sum_t log p(y_t | y_<t, source)``.

Exact match (val / test): the share of sources whose greedily decoded target equals the
reference exactly (every token up to and including ``[EOS]``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from multimodal.models.rnn import RNNSeq2Seq
from multimodal.models.seq2seq import Seq2Seq
from multimodal.tasks.base import ModelTask
from multimodal.tasks.optim import OptimizerConfig
from multimodal.tokenizers.text import BOS_ID, EOS_ID, PAD_ID

__all__ = ["Seq2SeqTask", "exact_match"]

IGNORE_INDEX = -100


def _until_eos(ids: list[int], eos: int) -> list[int]:
    return ids[: ids.index(eos) + 1] if eos in ids else ids


def exact_match(generated: Tensor, reference: Tensor, eos_token_id: int = EOS_ID) -> Tensor:
    """Per row, 1.0 when ``generated`` and ``reference`` agree up to (and including) their
    first EOS, else 0.0. Both (B, *) id tensors that start with the same ``[BOS]``."""
    if generated.shape[0] != reference.shape[0]:
        raise ValueError(f"batch sizes differ: {generated.shape[0]} vs {reference.shape[0]}")
    hits = [_until_eos(g, eos_token_id) == _until_eos(r, eos_token_id)
            for g, r in zip(generated.tolist(), reference.tolist(), strict=True)]
    return torch.tensor(hits, dtype=torch.float)


class Seq2SeqTask(ModelTask):
    """Train a :class:`Seq2Seq` or :class:`RNNSeq2Seq` on batches ``{"source_ids",
    "source_mask", "target_ids"}`` (e.g. :class:`~multimodal.data.numbers.NumberWordsDataModule`)
    with AdamW, warm-up + cosine and label smoothing; logs ``val/loss``,
    ``val/exact_match`` (greedy decoding), and the same for test."""

    accepts = (Seq2Seq, RNNSeq2Seq)
    optimizer_defaults = OptimizerConfig(lr=1e-3, weight_decay=0.01,
                                         warmup_fraction=0.05, min_lr_ratio=0.01)

    default_monitor = ("val/exact_match", "max")  # the CLI's default ModelCheckpoint ranks by it

    def __init__(
        self,
        model: Seq2Seq | RNNSeq2Seq | None = None,
        label_smoothing: float = 0.0,
        num_beams: int = 1,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        self.save_hyperparameters(ignore=["model"])

    # the target's special ids: the package's, or the data module's (a Hugging Face
    # tokenizer's own, e.g. BERT [CLS] / [SEP] / [PAD]; TextPairsDataModule)
    bos_token_id: int = BOS_ID
    eos_token_id: int = EOS_ID
    pad_token_id: int = PAD_ID

    def setup(self, stage: str) -> None:
        dm = self.datamodule
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(dm, name, None)
            if value is not None:
                setattr(self, name, int(value))
        cfg = self.model.config
        for side in ("source", "target"):
            n = getattr(dm, f"{side}_vocab_size", None)
            have = getattr(cfg, f"{side}_vocab_size")
            if n is not None and n > have:
                raise ValueError(f"the data's {side} vocabulary has {n} tokens but the model's "
                                 f"{side}_vocab_size is {have}")

    def loss(self, batch: dict[str, Tensor]) -> Tensor:
        target = batch["target_ids"]
        logits = self.model(batch["source_ids"], target[:, :-1], batch.get("source_mask"))
        labels = target[:, 1:].masked_fill(target[:, 1:] == self.pad_token_id, IGNORE_INDEX)
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(),
                               ignore_index=IGNORE_INDEX,
                               label_smoothing=self.hparams.label_smoothing)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = self.loss(batch)
        self.log_train("train/loss", loss, prog_bar=True)
        return loss

    def _eval(self, batch: dict[str, Tensor], split: str) -> None:
        target = batch["target_ids"]
        self.log_mean(f"{split}/loss", self.loss(batch), target.shape[0], prog_bar=True)
        out = self.model.generate(batch["source_ids"], batch.get("source_mask"),
                                  max_new_tokens=min(target.shape[1] + 1,
                                                     self.model.config.max_target_len - 1),
                                  num_beams=self.hparams.num_beams,
                                  bos_token_id=self.bos_token_id,
                                  eos_token_id=self.eos_token_id,
                                  pad_token_id=self.pad_token_id)
        em = exact_match(out, target, self.eos_token_id).mean()
        self.log_mean(f"{split}/exact_match", em, target.shape[0], prog_bar=True)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval(batch, "val")

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval(batch, "test")

