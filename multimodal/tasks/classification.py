"""Supervised classification of images (ViT) or audio clips: one LightningModule."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

from multimodal.models.audio import AudioClassifier
from multimodal.models.text import TextEncoder
from multimodal.models.vit import ViT
from multimodal.plots.figures import plot_confusion_matrix
from multimodal.tasks.base import ModelTask
from multimodal.tasks.finetune import FinetuneConfig
from multimodal.tasks.pretrained import task_model

CLASSIFIERS = (ViT, AudioClassifier, TextEncoder)
HEAD_SEED = 0  # every rank draws the same new head


def data_modality(datamodule: Any) -> str | None:
    """What a data module yields (``image`` / ``audio`` / ``text``): its ``modality``
    attribute, else guessed from its module (``multimodal.data.vision`` ...); None when
    unknown."""
    given = getattr(datamodule, "modality", None)
    if isinstance(given, str):
        return given
    module = type(datamodule).__module__
    for key, kind in (("vision", "image"), ("images", "image"), ("audio", "audio"),
                      ("text", "text")):
        if module.startswith(f"multimodal.data.{key}"):
            return kind
    return None


def _default_num_classes(model: nn.Module) -> int | None:
    field = getattr(type(model.config), "__dataclass_fields__", {}).get("num_classes")
    return None if field is None or field.default is dataclasses.MISSING else field.default


class ClassificationTask(ModelTask):
    """Train ``model`` (any of our classifiers: ``model(inputs) -> (B, classes)`` logits)
    with cross-entropy (optional label smoothing), AdamW and warm-up + cosine.

    Batches are ``(inputs, labels)`` or a dict with a ``"label"`` entry whose other entries
    are passed to the model as keyword arguments. Logs loss, top-1 accuracy twice:
    ``acc_macro`` (the mean over classes of each class's recall, ``1/C sum_c correct_c / n_c``;
    what the best checkpoint is ranked by) and ``acc_micro`` (the fraction of examples right,
    ``sum_c correct_c / N``), ``acc`` (the name before both: ``acc_macro``, kept so that old
    configs and scripts read the same number) and, with >= 5 classes, ``top5`` (macro); at
    the end of ``test`` writes ``confusion_matrix.png`` to the run's log folder.
    ``predict`` prints ``file<TAB>class<TAB>probability`` per input; its batches are
    ``(inputs, filenames)`` or a dict with a ``"filename"`` list. A model with a
    ``setup_from_data(datamodule)`` method is handed the data module in ``setup`` (the audio
    classifier shares its feature normalisation with it).
    """

    default_monitor = ("val/acc_macro", "max")  # the CLI's default ModelCheckpoint ranks by it

    def __init__(
        self,
        model: nn.Module | None = None,
        lr: float = 1e-3,
        weight_decay: float = 0.05,
        warmup_fraction: float = 0.05,
        min_lr_ratio: float = 0.01,
        label_smoothing: float = 0.0,
        compile: bool = False,
        pretrained: str | None = None,
        overrides: dict[str, Any] | None = None,
        num_classes: int | None = None,
        class_names: list[str] | None = None,
        modality: Literal["image", "audio", "text"] | None = None,
        finetune: FinetuneConfig | None = None,
        preset: str | None = None,
        data_sizes: dict[str, int] | None = None,
    ) -> None:
        data_n = len(class_names) if class_names else None
        if num_classes is not None and data_n is not None and num_classes != data_n:
            raise ValueError(f"num_classes={num_classes} but the data has {data_n} classes "
                             f"({', '.join(class_names[:5])}{' ...' if data_n > 5 else ''}): "
                             f"drop num_classes to take the data's count")
        want = num_classes if num_classes is not None else data_n
        overrides = dict(overrides or {})
        if pretrained is not None and want is not None:
            overrides.setdefault("num_classes", want)  # a new head in the one log line
        model, source = task_model(model, pretrained, overrides or None,
                                   task=type(self).__name__, accept=CLASSIFIERS,
                                   modality=modality, preset=preset,
                                   data_sizes=data_sizes)
        # the model's own count is the user's choice when set away from its default
        # (a preset's count is its default: only overrides' num_classes is the user's)
        model_explicit = source is None and (
            "num_classes" in overrides if preset is not None
            else model.config.num_classes != _default_num_classes(model))
        explicit = num_classes is not None or model_explicit
        if want is not None and want != model.config.num_classes:
            if model_explicit:
                raise ValueError(f"the data has {want} classes but the model's head has "
                                 f"{model.config.num_classes}: set model num_classes to "
                                 f"{want} (or leave it out to take the data's)")
            self._new_head(model, want)
        super().__init__(model, compile=compile, finetune=finetune)
        self._explicit = explicit
        self._pretrained = source is not None  # its preprocessing is the model's own
        self.save_hyperparameters(ignore=["model", "class_names"])
        self.num_classes = int(model.config.num_classes)
        self.class_names: list[str] = [str(i) for i in range(self.num_classes)]
        if class_names and len(class_names) == self.num_classes:
            self.class_names = list(map(str, class_names))
        elif source is not None and source.class_names and \
                len(source.class_names) == self.num_classes:
            self.class_names = list(source.class_names)
        self._build_metrics()
        example = model.example_inputs(1) if hasattr(model, "example_inputs") else ()
        if len(example) == 1:  # the model summary counts FLOPs on it
            self.example_input_array = example[0]

    @staticmethod
    def _new_head(model: nn.Module, n: int) -> None:
        old = model.config.num_classes
        model.reset_classifier(n, generator=torch.Generator().manual_seed(HEAD_SEED))
        rank_zero_info(f"classifier: new head of {n} classes for {type(model).__name__} "
                       f"(was {old})")

    def _build_metrics(self) -> None:
        """Accuracy (top-1, top-5 with >= 5 classes) and the confusion matrix for
        ``num_classes`` (none yet while the count is unknown: it comes from the data)."""
        n = self.num_classes
        if n == 1 or n < 0:
            raise ValueError(f"a classifier needs num_classes >= 2, got {n}")
        metrics = {"acc_macro": MulticlassAccuracy(max(n, 2), top_k=1, average="macro"),
                   "acc_micro": MulticlassAccuracy(max(n, 2), top_k=1, average="micro")}
        if n >= 5:
            metrics["top5"] = MulticlassAccuracy(n, top_k=5)
        self.val_metrics = nn.ModuleDict({k: m.clone() for k, m in metrics.items()})
        self.test_metrics = nn.ModuleDict({k: m.clone() for k, m in metrics.items()})
        self.confusion = MulticlassConfusionMatrix(max(n, 2))

    # -- data plumbing ---------------------------------------------------------------
    def setup(self, stage: str) -> None:
        dm = self.datamodule
        if dm is None:
            if self.num_classes < 2:
                raise ValueError("the model has no classifier head and there is no data "
                                 "module to take the class count from: set num_classes")
            return
        kind, ours = data_modality(dm), getattr(self.model, "modality", None)
        if kind is not None and ours is not None and kind != ours:
            raise ValueError(f"the model reads {ours} ({type(self.model).__name__}) but the "
                             f"data module {type(dm).__name__} gives {kind}")
        if isinstance(self.model, TextEncoder):  # the data's tokens must fit the model
            vocab, length = getattr(dm, "vocab_size", None), getattr(dm, "max_length", None)
            cfg = self.model.config
            if isinstance(vocab, int) and vocab > cfg.vocab_size:
                raise ValueError(f"the data's tokenizer has {vocab} tokens but the model's "
                                 f"embedding has {cfg.vocab_size} rows (vocab_size): use the "
                                 "model's own tokenizer (data tokenizer: the model folder)")
            if isinstance(length, int) and length > cfg.max_len:
                raise ValueError(f"data max_length {length} exceeds the model's max_len "
                                 f"{cfg.max_len}")
        rate, wants = getattr(dm, "sample_rate", None), getattr(self.model.config,
                                                               "sample_rate", None)
        if getattr(dm, "features", True) is False and isinstance(rate, int) \
                and isinstance(wants, int) and rate != wants:
            raise ValueError(f"the data's waveforms are at {rate} Hz but the model's front end "
                             f"expects {wants} Hz (its sample_rate)")
        n = getattr(dm, "num_classes", None)
        if n is not None and n != self.num_classes:
            if self._explicit or self._trainer_has_state():
                raise ValueError(f"the data has {n} classes but the model's head has "
                                 f"{self.num_classes}: set model num_classes to {n}")
            self._new_head(self.model, int(n))
            self.num_classes = int(n)
            self.class_names = [str(i) for i in range(n)]
            self._build_metrics()
        if self.num_classes < 2:
            raise ValueError("the model has no classifier head and the data module gives "
                             "no num_classes: set num_classes")
        names = getattr(dm, "class_names", None)
        if names:
            self.class_names = list(names)
        hook = getattr(self.model, "setup_from_data", None)  # e.g. audio: share feature stats
        if callable(hook) and not self._pretrained:
            hook(dm)

    def _trainer_has_state(self) -> bool:
        """A run resumed / tested from a checkpoint keeps the checkpoint's head."""
        trainer = self._trainer
        return bool(trainer is not None and getattr(trainer, "ckpt_path", None))

    def forward(self, inputs: Any) -> Tensor:
        if isinstance(self.model, TextEncoder):  # hidden states -> [CLS] head
            if not isinstance(inputs, dict):
                inputs = {"input_ids": inputs}
            hidden = self.model(inputs["input_ids"], attention_mask=inputs.get("attention_mask"))
            return self.model.classify(hidden)
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
            self.log(f"{prefix}/{name}", metric, prog_bar=name == "acc_macro")
            if name == "acc_macro":  # the old name, the same number
                self.log(f"{prefix}/acc", metric)
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
        names = checkpoint.get("class_names")
        if names:
            self.class_names = list(names)
