"""Training Word2Vec (:mod:`multimodal.models.word2vec`) on
:class:`~multimodal.data.word2vec.Batches`: plain SGD with the fused update
(:meth:`~multimodal.models.word2vec.Word2Vec.sgd_step`) and the learning rate decaying
linearly from ``lr`` to ``min_lr`` over the whole run,

    lr(p) = lr - (lr - min_lr) p,     p = fraction of the run's epochs done,

as the reference code does. :func:`train_word2vec` is the loop without Lightning (the
benchmark and the notebook use it); :class:`Word2VecTask` is the same step for
``multimodal fit --config configs/word2vec.yaml``, which writes the vectors in the word2vec
formats next to the run (``vectors.txt``, ``vectors.bin``) when training ends.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar, Literal

import lightning as L
import torch
from torch import Tensor

from multimodal.models.word2vec import Word2Vec, Word2VecConfig

__all__ = ["Word2VecTask", "linear_lr", "train_word2vec"]


def linear_lr(lr: float, min_lr: float, progress: float) -> float:
    """``lr - (lr - min_lr) * progress``, progress clamped to [0, 1]."""
    p = min(max(progress, 0.0), 1.0)
    return lr - (lr - min_lr) * p


def train_word2vec(model: Word2Vec, batches: Any, epochs: int = 5, lr: float = 0.025,
                   min_lr: float = 1e-4, seed: int = 0) -> dict[str, float]:
    """Train ``model`` in place for ``epochs`` passes; returns ``{"words", "seconds",
    "words_per_s", "loss"}`` (words = corpus words before sub-sampling, times epochs, as the
    reference code counts them; loss = mean per example of the last epoch)."""
    if batches.mode != model.config.mode:
        raise ValueError(f"the batches are {batches.mode} examples but the model is "
                         f"{model.config.mode}")
    gen = torch.Generator().manual_seed(seed)
    model.reset_parameters(gen)
    start = time.perf_counter()
    loss_sum, examples = 0.0, 0
    for epoch in range(epochs):
        inputs, predict, mask = batches.examples(gen)
        n = predict.numel()
        loss_sum, examples = 0.0, 0
        for s in range(0, n, batches.batch_size):
            sl = slice(s, s + batches.batch_size)
            p = predict[sl]
            neg = batches.noise(p.numel(), gen)
            targets = torch.cat([p[:, None], neg], 1)
            valid = torch.ones_like(targets, dtype=torch.bool)
            valid[:, 1:] = neg != p[:, None]
            step_lr = linear_lr(lr, min_lr, (epoch + s / max(n, 1)) / epochs)
            loss = model.sgd_step(inputs[sl], targets, step_lr,
                                  mask=None if mask is None else mask[sl], valid=valid)
            loss_sum += float(loss)
            examples += p.numel()
    seconds = time.perf_counter() - start
    words = batches.words * epochs
    return {"words": words, "seconds": seconds, "words_per_s": words / max(seconds, 1e-9),
            "loss": loss_sum / max(examples, 1)}


class Word2VecTask(L.LightningModule):
    """Word2Vec under Lightning: manual optimisation, one fused SGD step per batch of
    :class:`~multimodal.data.word2vec.Word2VecDataModule`, learning rate
    :func:`linear_lr` from ``alpha`` to ``min_alpha`` (gensim's names) over
    ``trainer.max_epochs``. ``vocab_size`` comes from the data
    (``data_sizes``); ``mode`` must match the data module's. Logs ``train/loss`` (mean per
    example) and ``train/lr``. At the end of fit the vectors go to
    ``<default_root_dir>/vectors.txt`` and ``vectors.bin``
    (:func:`multimodal.embeddings.save_word2vec_format`). ``compile`` is every task's
    switch; here only ``False``."""

    accepts: ClassVar[tuple[type, ...]] = (Word2Vec,)
    """The model it trains (built here from ``vocab_size`` / ``dim`` / ``mode``: no preset
    or pretrained folder)."""

    def __init__(self, mode: Literal["cbow", "skipgram"] = "cbow", dim: int = 100,
                 alpha: float = 0.025, min_alpha: float = 1e-4,
                 context_grad: Literal["full", "mean"] = "full",
                 vocab_size: int | None = None,
                 data_sizes: dict[str, int] | None = None, compile: bool = False) -> None:
        super().__init__()
        if compile:
            raise ValueError("Word2VecTask has no forward to compile: its step is the fused "
                             "index_add_ update (compile: false)")
        self.save_hyperparameters()
        size = (data_sizes or {}).get("vocab_size", vocab_size)
        if size is None:
            raise ValueError("Word2VecTask needs vocab_size (from the data module's "
                             "model_sizes, or given)")
        self.model = Word2Vec(Word2VecConfig(vocab_size=int(size), dim=dim, mode=mode,
                                             context_grad=context_grad))
        self.alpha, self.min_alpha = alpha, min_alpha
        self.automatic_optimization = False
        self.words: list[str] | None = None

    def setup(self, stage: str) -> None:
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        batches = getattr(dm, "batches", None)
        if batches is not None and batches.mode != self.model.config.mode:
            raise ValueError(f"the data module makes {batches.mode} examples but the task's "
                             f"mode is {self.model.config.mode}: set both to the same")
        vocab = getattr(dm, "vocab", None)
        if vocab is not None:
            if len(vocab) != self.model.config.vocab_size:
                raise ValueError(f"the data's vocabulary has {len(vocab)} words, the model "
                                 f"{self.model.config.vocab_size}")
            self.words = list(vocab.words)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.words = checkpoint.get("word2vec_words", self.words)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.words is not None:
            checkpoint["word2vec_words"] = self.words

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """A plain SGD that never sees a gradient: the update is the model's fused step;
        stepping it counts the step (``global_step``), which checkpoints and ``max_steps``
        go by."""
        return torch.optim.SGD(self.parameters(), lr=0.0)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        epochs = max(int(self.trainer.max_epochs or 1), 1)
        progress = (self.current_epoch + float(batch["epoch_fraction"])) / epochs
        lr = linear_lr(self.alpha, self.min_alpha, progress)
        loss = self.model.sgd_step(batch["inputs"], batch["targets"], lr,
                                   mask=batch.get("mask"), valid=batch["valid"])
        self.optimizers().step()  # no gradients: only counts the step
        n = batch["targets"].shape[0]
        self.log("train/loss", loss / n, prog_bar=True, batch_size=n)
        self.log("train/lr", lr, batch_size=n)
        return loss / n

    def on_train_end(self) -> None:
        if self.words is None or not self.trainer.is_global_zero:
            return
        from multimodal.embeddings import save_word2vec_format

        root = Path(self.trainer.default_root_dir)
        for name, binary in (("vectors.txt", False), ("vectors.bin", True)):
            save_word2vec_format(root / name, self.words, self.model.vectors, binary=binary)
