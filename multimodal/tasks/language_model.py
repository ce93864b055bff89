"""Next-token language modelling for a :class:`~multimodal.models.text.TextDecoder`.

Loss: the mean next-token negative log-likelihood over the predicted positions,
``L = -1/T sum_t log p(y_t | x_<=t)`` (targets equal to ``ignore_index`` are skipped).
Perplexity is ``exp`` of the mean NLL over *all* held-out tokens of the epoch
(``exp(sum NLL / number of tokens)``, not the mean of per-batch perplexities).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torchmetrics import Metric

from multimodal.models.text import TextDecoder
from multimodal.tasks.base import ModelTask
from multimodal.tasks.optim import OptimizerConfig

__all__ = ["LanguageModelTask", "TokenNLL", "next_token_nll"]

IGNORE_INDEX = -100


def next_token_nll(logits: Tensor, targets: Tensor,
                   ignore_index: int = IGNORE_INDEX) -> tuple[Tensor, Tensor]:
    """Summed NLL ``-sum_t log softmax(logits_t)[y_t]`` and the number of counted tokens.

    ``logits`` (B, N, V), ``targets`` (B, N) with ``ignore_index`` at skipped positions.
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits (B, N, V) and targets (B, N) disagree: "
                         f"{tuple(logits.shape)} vs {tuple(targets.shape)}")
    total = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(),
                            ignore_index=ignore_index, reduction="sum")
    return total, (targets != ignore_index).sum()


class TokenNLL(Metric):
    """Summed NLL and token count over every batch (and, under DDP, every process: both
    states are summed across processes before :meth:`compute`);
    ``compute() = mean NLL = sum / count``, ``perplexity = exp(sum / count)``."""

    full_state_update = False
    higher_is_better = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("total", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, nll_sum: Tensor, count: Tensor) -> None:
        self.total += torch.as_tensor(nll_sum, dtype=torch.float64, device=self.total.device)
        self.count += torch.as_tensor(count, dtype=torch.long, device=self.count.device)

    def compute(self) -> Tensor:
        return self.total / self.count.clamp(min=1)

    @property
    def mean(self) -> float:
        """Mean NLL per token (nats), over every process."""
        return float(self.compute())

    @property
    def perplexity(self) -> float:
        return math.exp(self.mean)


class LanguageModelTask(ModelTask):
    """Train a :class:`TextDecoder` on batches ``{"input_ids": (B, N), "targets": (B, N)}``
    (``targets[:, t]`` is the token after ``input_ids[:, t]``; an optional
    ``attention_mask`` is passed to the model) with AdamW and warm-up + cosine decay.

    Logs ``train/loss``, ``val/loss`` (mean NLL per token, nats) and ``val/ppl``
    ``= exp(val/loss)``; likewise ``test/loss`` and ``test/ppl``.

    ``word_vectors: PATH`` (a word2vec text or ``.bin`` file, e.g. the ``vectors.txt`` of
    ``configs/word2vec.yaml``, of the model's ``dim``): when a fit starts (not when it
    resumes from a checkpoint), the token embedding rows of the words the tokenizer has as
    whole tokens are set to those vectors (:func:`multimodal.embeddings.init_embedding`).
    """

    accepts = (TextDecoder,)
    optimizer_defaults = OptimizerConfig(lr=1e-3, weight_decay=0.1,
                                         betas=(0.9, 0.95), warmup_fraction=0.05, min_lr_ratio=0.1)

    def __init__(
        self,
        model: TextDecoder | None = None,
        word_vectors: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        model = self.model
        if model.config.cross_attention:
            raise ValueError("LanguageModelTask trains a decoder-only model; this TextDecoder "
                             "has cross_attention=True (use Seq2SeqTask)")
        self.save_hyperparameters(ignore=["model"])
        self.word_vectors = word_vectors
        self.val_nll = TokenNLL()
        self.test_nll = TokenNLL()

    def setup(self, stage: str) -> None:
        dm = self.datamodule
        vocab = getattr(dm, "vocab_size", None) if dm is not None else None
        if vocab is not None and vocab > self.model.config.vocab_size:
            raise ValueError(f"the tokenizer has {vocab} tokens but the model's vocab_size is "
                             f"{self.model.config.vocab_size}: set model vocab_size >= {vocab}")
        block = getattr(dm, "block_size", None) if dm is not None else None
        if block is not None and block > self.model.config.max_len:
            raise ValueError(f"data block_size {block} exceeds the model's max_len "
                             f"{self.model.config.max_len}")

    def on_fit_start(self) -> None:
        if self.word_vectors is None or self.trainer.ckpt_path is not None:
            return
        from multimodal.embeddings import init_embedding

        tokenizer = getattr(self.datamodule, "tokenizer", None)
        if tokenizer is None:
            raise ValueError("word_vectors needs the data module's tokenizer (a text data "
                             "module) to match words to token ids")
        n = init_embedding(self.model, tokenizer, self.word_vectors)
        rank_zero_info(f"word_vectors: {n} token embeddings set from {self.word_vectors}")

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        return self.model(input_ids, attention_mask=attention_mask)

    def _nll_sum(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        if not isinstance(batch, dict) or "input_ids" not in batch or "targets" not in batch:
            raise ValueError("a language-model batch is a dict with 'input_ids' and 'targets'")
        logits = self(batch["input_ids"], batch.get("attention_mask"))
        return next_token_nll(logits, batch["targets"])

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        total, count = self._nll_sum(batch)
        loss = total / count.clamp(min=1)
        self.log_train("train/loss", loss, prog_bar=True)
        return loss

    def _metric(self, split: str) -> TokenNLL:
        return self.val_nll if split == "val" else self.test_nll

    def _eval_step(self, batch: dict[str, Tensor], split: str) -> None:
        total, count = self._nll_sum(batch)
        self._metric(split).update(total, count)

    def _eval_end(self, split: str) -> None:
        """Log the NLL and perplexity of every held-out token of every process (the metric
        sums its states across processes in ``compute``, so every rank logs the global
        value)."""
        acc = self._metric(split)
        if acc.update_count:
            mean = acc.compute()
            self.log(f"{split}/loss", mean.float(), prog_bar=True)
            self.log(f"{split}/ppl", mean.exp().float(), prog_bar=True)
        acc.reset()

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def on_validation_epoch_end(self) -> None:
        self._eval_end("val")

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def on_test_epoch_end(self) -> None:
        self._eval_end("test")

    @torch.no_grad()
    def evaluate(self, loader: Any) -> TokenNLL:
        """Mean NLL / perplexity of the model over every batch of ``loader``."""
        acc = TokenNLL().to(self.device)
        was_training = self.model.training
        self.model.eval()
        for batch in loader:
            batch = {k: v.to(self.device) for k, v in batch.items()}
            acc.update(*self._nll_sum(batch))
        self.model.train(was_training)
        return acc
