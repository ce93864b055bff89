"""Supervised classification of images (ViT) or audio clips: one LightningModule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

from multimodal.plots import plot_confusion_matrix
from multimodal.tasks.base import ModelTask


class ClassificationTask(ModelTask):
    """Train ``model`` (any of our classifiers: ``model(inputs) -> (B, classes)`` logits)
    with cross-entropy (optional label smoothing), AdamW and warm-up + cosine.

    Batches are ``(inputs, labels)`` or a dict with a ``"label"`` entry whose other entries
    are passed to the model as keyword arguments. Logs loss, top-1 and (with >= 5
    classes) top-5 accuracy; at the end of ``test`` writes ``confusion_matrix.png`` to the
    run's log folder. ``predict`` prints ``file<TAB>class<TAB>probability`` per input; its
    batches are ``(inputs, filenames)`` or a dict with a ``"filename"`` list. A model with a
    ``setup_from_data(datamodule)`` method is handed the data module in ``setup`` (the audio
    classifier shares its feature normalisation with it).
    """

    def __init__(
        self,
        model: nn.Module,
        lr: float = 1e-3,
        weight_decay: float = 0.05,
        warmup_fraction: float = 0.05,
        min_lr_ratio: float = 0.01,
        label_smoothing: float = 0.0,
        compile: bool = False,
    ) -> None:
        super().__init__(model, compile=compile)
        self.save_hyperparameters(ignore=["model"])
        self.num_classes = int(model.config.num_classes)
        if self.num_classes < 2:
            raise ValueError(f"a classifier needs num_classes >= 2, got {self.num_classes}")
        self.class_names: list[str] = [str(i) for i in range(self.num_classes)]
        metrics = {"acc": MulticlassAccuracy(self.num_classes, top_k=1)}
        if self.num_classes >= 5:
            metrics["top5"] = MulticlassAccuracy(self.num_classes, top_k=5)
        self.val_metrics = nn.ModuleDict({k: m.clone() for k, m in metrics.items()})
        self.test_metrics = nn.ModuleDict({k: m.clone() for k, m in metrics.items()})
        self.confusion = MulticlassConfusionMatrix(self.num_classes)

    # -- data plumbing ---------------------------------------------------------------
    def setup(self, stage: str) -> None:
        dm = self.datamodule
        if dm is None:
            return
        n = getattr(dm, "num_classes", None)
        if n is not None and n != self.num_classes:
            raise ValueError(f"the data has {n} classes but the model's head has "
                             f"{self.num_classes}: set model num_classes to {n}")
        names = getattr(dm, "class_names", None)
        if names:
            self.class_names = list(names)
        hook = getattr(self.model, "setup_from_data", None)  # e.g. audio: share feature stats
        if callable(hook):
            hook(dm)

    def forward(self, inputs: Any) -> Tensor:
        return self.model(**inputs) if isinstance(inputs, dict) else self.model(inputs)

    @staticmethod
    def split_batch(batch: Any) -> tuple[Any, Tensor | None]:
        if isinstance(batch, dict):
            inputs = {k: v for k, v in batch.items() if k != "label"}
            return inputs, batch.get("label")
        return batch[0], batch[1]

    # -- steps -------------------------------------------------------------------------
    def _loss(self, batch: Any) -> tuple[Tensor, Tensor, Tensor]:
        inputs, labels = self.split_batch(batch)
        logits = self(inputs)
        loss = F.cross_entropy(logits.float(), labels,
                               label_smoothing=self.hparams.label_smoothing)
        return loss, logits, labels

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss, _, _ = self._loss(batch)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def _eval_step(self, batch: Any, metrics: nn.ModuleDict, prefix: str) -> None:
        loss, logits, labels = self._loss(batch)
        self.log_mean(f"{prefix}/loss", loss, labels.shape[0], prog_bar=True)
        for name, metric in metrics.items():
            metric.update(logits, labels)
            self.log(f"{prefix}/{name}", metric, prog_bar=name == "acc")
        if prefix == "test":
            self.confusion.update(logits, labels)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._eval_step(batch, self.val_metrics, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._eval_step(batch, self.test_metrics, "test")

    def on_test_epoch_end(self) -> None:
        matrix = self.confusion.compute().cpu()
        self.confusion.reset()
        folder = self.trainer.log_dir or self.trainer.default_root_dir
        if self.trainer.is_global_zero and folder:
            path = Path(folder) / "confusion_matrix.png"
            plot_confusion_matrix(matrix, self.class_names, path)
            print(f"confusion matrix: {path}")

    def predict_step(self, batch: Any, batch_idx: int) -> list[tuple[str, str, float]]:
        if isinstance(batch, dict):  # {"filename": [...], **model inputs}
            names = batch["filename"]
            inputs = {k: v for k, v in batch.items() if k not in ("filename", "label")}
        else:
            inputs, names = batch
        probs = self(inputs).float().softmax(dim=-1)
        conf, idx = probs.max(dim=-1)
        rows = [(str(n), self.class_names[i], float(c))
                for n, i, c in zip(names, idx.tolist(), conf.tolist(), strict=True)]
        for row in rows:
            print(f"{row[0]}\t{row[1]}\t{row[2]:.3f}")
        return rows

    # -- checkpoints keep what predict needs -------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["class_names"] = list(self.class_names)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self.class_names = list(checkpoint.get("class_names", self.class_names))
