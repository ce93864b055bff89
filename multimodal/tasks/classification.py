"""Supervised classification of images (ViT), audio clips (AudioClassifier) or texts
(TextEncoder): one LightningModule."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import EarlyStopping
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

from multimodal.models.audio import AudioClassifier
from multimodal.models.text import TextEncoder
from multimodal.models.vit import ViT
from multimodal.plots.figures import plot_confusion_matrix
from multimodal.tasks.agreement import agreed, check_data_fits
from multimodal.tasks.base import ModelTask, loader_examples
from multimodal.tasks.finetune import apply_regime, choose_regime
from multimodal.tasks.optim import OptimizerConfig
from multimodal.tasks.pairs import pair_loss
from multimodal.tasks.probe import ProbeFit, fit_probe

CLASSIFIERS = (ViT, AudioClassifier, TextEncoder)
HEAD_SEED = 0  # every rank draws the same new head


def _drop_early_stopping(trainer: Any) -> list[EarlyStopping]:
    """Remove the trainer's ``EarlyStopping`` callbacks; the ones removed."""
    stops = [c for c in trainer.callbacks if isinstance(c, EarlyStopping)]
    trainer.callbacks = [c for c in trainer.callbacks if c not in stops]
    return stops


def _default_num_classes(model: nn.Module) -> int | None:
    field = getattr(type(model.config), "__dataclass_fields__", {}).get("num_classes")
    return None if field is None or field.default is dataclasses.MISSING else field.default


class ClassificationTask(ModelTask):
    """Train ``model`` (any of our classifiers: ``model(inputs) -> (B, classes)`` logits)
    with cross-entropy (optional label smoothing), AdamW and warm-up + cosine.

    A text classifier is this task over a :class:`TextEncoder`: batches
    ``{"input_ids", "attention_mask", "label"}``, logits ``head(pool(hidden states))`` (the
    model's ``pool``: ``[CLS]``, or the pooling of a sentence-transformers folder such as
    all-MiniLM-L6-v2's normalised mean; :mod:`multimodal.tasks.pretrained`); a text
    ``preset`` is built without its masked-LM head (``overrides: {mlm_head: true}`` keeps
    it).

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

    Two regimes fit the head instead of training it (``finetune.regime``):

    * ``linear_probe``: the solved probe. The one training epoch is the forward pass of
      the frozen backbone over the training data: each step caches the batch's
      :meth:`head_inputs` (no gradient, nothing else computed); at the epoch's last batch
      the multinomial logistic regression of :mod:`multimodal.tasks.probe` is solved on
      all of them (gathered across processes; L-BFGS to convergence, ``C`` by
      cross-validation, balanced class weights), written into the head, and the run stops
      (``trainer.should_stop``): validation, checkpoints, ``predict`` and ``embed`` then
      see an ordinary classifier. Why inside ``fit`` rather than a verb of its own: the
      pass needs exactly what ``fit`` already provides (the data module's loaders, the
      device, precision, the distributed sampler, the checkpoint callback), so the probe is
      one more config of the command users already run. Manual optimisation: Lightning is
      told of one optimiser step (a zero-gradient, zero-rate SGD step on the head, which
      leaves the solution as it is) so its checkpointing sees a finished step; hence no
      ``gradient_clip_val`` / ``accumulate_grad_batches`` with this regime.
    * ``contrastive`` (SetFit): each step's loss is :func:`~multimodal.tasks.pairs.
      pair_loss` of the batch's :meth:`head_inputs` (the body trains, the head is frozen);
      at the end of every epoch that validates or ends the run (and at ``max_steps``) the
      training set's features are recomputed in eval mode and the probe solved on them,
      before validation, so every validation score and the final checkpoint are those of
      the tuned body with its solved head.
    """

    accepts = CLASSIFIERS
    optimizer_defaults = OptimizerConfig(lr=1e-3, weight_decay=0.05,
                                         warmup_fraction=0.05, min_lr_ratio=0.01)

    default_monitor = ("val/acc_macro", "max")  # the CLI's default ModelCheckpoint ranks by it
    solves_head = True
    checks_data = True  # the data must fit its model: multimodal.tasks.agreement
    preset_defaults: ClassVar[dict[str, Any]] = {"mlm_head": False}  # text presets: no MLM head

    def __init__(
        self,
        model: nn.Module | None = None,
        label_smoothing: float = 0.0,
        num_classes: int | None = None,
        class_names: list[str] | None = None,
        modality: Literal["image", "audio", "text"] | None = None,
        **kwargs: Any,
    ) -> None:
        data_n = len(class_names) if class_names else None
        if num_classes is not None and data_n is not None and num_classes != data_n:
            raise ValueError(f"num_classes={num_classes} but the data has {data_n} classes "
                             f"({', '.join(class_names[:5])}{' ...' if data_n > 5 else ''}): "
                             f"drop num_classes to take the data's count")
        # what build_model (called by ModelTask.__init__) needs of this task's own arguments
        self._head_request = (num_classes if num_classes is not None else data_n,
                              num_classes is not None, modality)
        super().__init__(model, **kwargs)
        source = self.pretrained_source
        self._pretrained = source is not None  # its preprocessing is the model's own
        self.save_hyperparameters(ignore=["model", "class_names"])
        self.num_classes = int(self.model.config.num_classes)
        self.class_names: list[str] = [str(i) for i in range(self.num_classes)]
        if class_names and len(class_names) == self.num_classes:
            self.class_names = list(map(str, class_names))
        elif source is not None and source.class_names and \
                len(source.class_names) == self.num_classes:
            self.class_names = list(source.class_names)
        self._build_metrics()
        if self.finetune.regime == "linear_probe":
            self.automatic_optimization = False  # one pass, one solve (class docstring)
        self._probe_rows: list[tuple[Tensor, Tensor]] = []
        self.probe_fit: ProbeFit | None = None
        example = self.model.example_inputs(1) if hasattr(self.model, "example_inputs") else ()
        if len(example) == 1:  # the model summary counts FLOPs on it
            self.example_input_array = example[0]

    def build_model(self, model: nn.Module | None, *, pretrained: str | None,
                    preset: str | None, overrides: dict[str, Any] | None,
                    data_sizes: dict[str, Any] | None) -> tuple[nn.Module, Any]:
        """The classifier, its head of the wanted class count (``num_classes``, else the
        data's ``class_names``): a pretrained model is built with it, a preset's or a given
        model's default count is replaced by a new head; a count the user set on the model
        (away from its default, or in a preset's ``overrides``) that disagrees is an error."""
        want, explicit, modality = self._head_request
        overrides = dict(overrides or {})
        if pretrained is not None and want is not None:
            overrides.setdefault("num_classes", want)  # a new head in the one log line
        model, source = self.model_from(model, pretrained=pretrained, preset=preset,
                                        overrides=overrides or None, data_sizes=data_sizes,
                                        modality=modality)
        # the model's own count is the user's choice when set away from its default
        # (a preset's count is its default: only overrides' num_classes is the user's)
        model_explicit = source is None and (
            "num_classes" in overrides if preset is not None
            else model.config.num_classes != _default_num_classes(model))
        self._explicit = explicit or model_explicit
        if want is not None and want != model.config.num_classes:
            if model_explicit:
                raise ValueError(f"the data has {want} classes but the model's head has "
                                 f"{model.config.num_classes}: set model num_classes to "
                                 f"{want} (or leave it out to take the data's)")
            self._new_head(model, want)
        return model, source

    @staticmethod
    def _new_head(model: nn.Module, n: int) -> None:
        old = model.config.num_classes
        model.reset_classifier(n, generator=torch.Generator().manual_seed(HEAD_SEED))
        # a preset's or a model's default count is a placeholder, not weights being lost
        rank_zero_info(f"classifier: a head of {n} classes (the data's) for "
                       f"{type(model).__name__}, drawn new (the architecture's default: {old})")

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
        self._setup_data(stage)
        if self.finetune.regime == "auto" and stage == "fit":
            self._choose_regime()  # after the data gave the class count
        if stage == "fit":
            self._without_validation()
            self._regime_length()
            self._note_old_metric_names()

    def _note_old_metric_names(self) -> None:
        """``val/acc`` is logged beside ``val/acc_macro`` (the same number) until 0.2: a
        callback that ranks or stops by the old name gets a FutureWarning naming the new
        one (a CLI run shows it)."""
        trainer = self._trainer
        for callback in getattr(trainer, "callbacks", None) or []:
            monitor = getattr(callback, "monitor", None)
            if isinstance(monitor, str) and monitor.endswith("/acc"):
                warnings.warn(f"{type(callback).__name__}(monitor={monitor!r}): {monitor} is "
                              f"the old name of {monitor}_macro (the same number), logged "
                              f"until 0.2: monitor {monitor}_macro", FutureWarning,
                              stacklevel=2)

    def _without_validation(self) -> None:
        """A data module that holds no validation split (``min_held_out_per_class``: too few
        labelled examples to spare) leaves nothing to validate: validation is off
        (``limit_val_batches`` 0) and so is early stopping, with one line, and the run takes
        its whole length (checkpoints: the latest, ``last.ckpt``)."""
        trainer, dm = self._trainer, self.datamodule
        if trainer is None or dm is None or not callable(getattr(dm, "val_dataloader", None)):
            return
        if loader_examples(dm.val_dataloader) != 0:
            return
        stops = _drop_early_stopping(trainer)
        trainer.limit_val_batches = 0
        rank_zero_info("no validation split: validation" + (" and early stopping" * bool(stops))
                       + " off, the run takes its whole length")

    def _regime_length(self) -> None:
        """The solved regimes' own length, whatever the trainer's step budget (``min_steps``,
        ``max_epochs``): ``linear_probe`` reads the data once (one epoch); ``contrastive``
        tunes for ``finetune.contrastive_epochs`` epochs when that is set (see
        :class:`~multimodal.tasks.finetune.FinetuneConfig`), or fewer when a smaller
        ``--trainer.max_epochs`` was typed on the command line (the CLI sets the trainer's
        ``command_line_limits``): the user's limit wins. A fixed length decides nothing
        from validation, so the run validates once, at its end (``check_val_every_n_epoch``
        = its epochs), and the trainer's ``EarlyStopping`` callbacks are dropped: with few
        labels the held-out split is a handful of examples, and stopping on it picked an
        epoch by noise (BENCHMARKS.md, "Learning curves on real weights"). Runs in
        ``setup``, before the optimiser and its schedule are made, so a warm-up + cosine
        schedule spans the run."""
        trainer, ft = self._trainer, self.finetune
        if trainer is None or trainer.fast_dev_run:
            return
        if ft.regime == "linear_probe":
            epochs, why = 1, "the solved probe reads the training data once"
        elif ft.regime == "contrastive" and ft.contrastive_epochs:
            epochs, why = ft.contrastive_epochs, "finetune.contrastive_epochs"
        else:
            return
        typed = (getattr(trainer, "command_line_limits", None) or {}).get("max_epochs")
        if typed is not None and typed < epochs:  # the user's limit wins over the config's
            epochs, why = typed, f"--trainer.max_epochs {typed} on the command line, over {why}"
        loop = trainer.fit_loop
        if loop.max_epochs == epochs and not loop.epoch_loop.min_steps \
                and not any(isinstance(c, EarlyStopping) for c in trainer.callbacks) \
                and trainer.check_val_every_n_epoch in (None, epochs):
            return
        loop.max_epochs, loop.epoch_loop.min_steps = epochs, None
        # a fixed length chooses nothing from validation: it runs once, at the end, on the
        # tuned body with its solved head (no early stopping, no epoch picked from a
        # handful of held-out examples; the probe's cross-validation scores each solve)
        trainer.check_val_every_n_epoch = epochs
        stops = _drop_early_stopping(trainer)
        notes = ", ".join(n for n, say in (("validation at the end",
                                            trainer.limit_val_batches != 0),
                                           ("no early stopping", bool(stops))) if say)
        rank_zero_info(f"finetune: {ft.regime} runs {epochs} epoch{'s' * (epochs > 1)} "
                       f"({why}), not the trainer's step budget" + (f"; {notes}" * bool(notes)))

    def _setup_data(self, stage: str) -> None:
        dm = self.datamodule
        if dm is None:
            if self.num_classes < 2:
                raise ValueError("the model has no classifier head and there is no data "
                                 "module to take the class count from: set num_classes")
            return
        if not agreed(dm, self.pretrained_source):  # the CLI's agreement checked it
            check_data_fits(dm, self.model)  # the data-module contract: modality, sizes
        names = getattr(dm, "class_names", None)
        n = len(names) if names else None
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
        if names:
            self.class_names = list(names)
        hook = getattr(self.model, "setup_from_data", None)  # e.g. audio: share feature stats
        if callable(hook) and not self._pretrained:
            hook(dm)
        if self.finetune.regime in ("linear_probe", "contrastive"):
            self._check_solvable()

    def _choose_regime(self) -> None:
        """``finetune.regime: auto`` becomes a regime for this data (:func:`~multimodal.tasks.
        finetune.choose_regime`): the training set's size is the training loader's (the
        loader Lightning itself will iterate; a loader without a length keeps
        ``many_labels_regime``). The saved hyper-parameters keep ``auto``, so a resumed run
        chooses again, the same way, from the same data."""
        trainer = self.trainer
        trainer.fit_loop.setup_data()  # idempotent: the loader Lightning then reuses
        loader = trainer.train_dataloader
        try:
            examples = len(loader.dataset)  # type: ignore[union-attr, arg-type]
        except TypeError:
            examples = None
        self.finetune, why = choose_regime(self.finetune, examples, self.num_classes,
                                           solvable=self._solvable_head() is None)
        rank_zero_info(why)
        apply_regime(self.model, self.finetune, self.head_modules)

    def _solvable_head(self) -> str | None:
        """Why the head cannot be solved in closed form, or None when it can."""
        head = getattr(self.model, "head", None)
        if not isinstance(head, nn.Linear) or head.bias is None:
            return f"{type(head).__name__ if head is not None else 'no head'}"
        if getattr(self.model, "head_dist", None) is not None:
            return "a distillation head too"
        return None

    def _check_solvable(self) -> None:
        why = self._solvable_head()
        if why is not None:
            raise ValueError(f"finetune: {self.finetune.regime} solves one linear head with a "
                             f"bias; {type(self.model).__name__} has {why}")

    def _trainer_has_state(self) -> bool:
        """A run resumed / tested from a checkpoint keeps the checkpoint's head."""
        trainer = self._trainer
        return bool(trainer is not None and getattr(trainer, "ckpt_path", None))

    def forward(self, inputs: Any) -> Tensor:
        if isinstance(self.model, TextEncoder):  # hidden states -> pooled -> head
            if not isinstance(inputs, dict):
                inputs = {"input_ids": inputs}
            mask = inputs.get("attention_mask")
            return self.model.classify(self.model(inputs["input_ids"], attention_mask=mask),
                                       mask)
        return self.model(**inputs) if isinstance(inputs, dict) else self.model(inputs)

    def head_inputs(self, inputs: Any) -> Tensor:
        """The vector the classifier head reads, ``(B, D)``: the model's pooled embedding
        (a TextEncoder's ``pool``: [CLS] or its folder's pooling, normalised where the
        folder says; a ViT's class token or mean; an audio model's pooled tokens through
        its ``head_norm``), taken as the input of ``model.head`` during :meth:`forward`,
        so it is what the head sees for every model."""
        seen: list[Tensor] = []
        handle = self.model.head.register_forward_pre_hook(
            lambda _module, args: seen.append(args[0]))
        try:
            self(inputs)
        finally:
            handle.remove()
        if not seen:
            raise ValueError(f"{type(self.model).__name__}'s forward did not call its head")
        return seen[-1]

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

    def training_step(self, batch: Any, batch_idx: int) -> Tensor | None:
        if self.finetune.regime == "linear_probe":
            return self._probe_step(batch, batch_idx)
        if self.finetune.regime == "contrastive":
            inputs, labels = self.split_batch(batch)
            loss = pair_loss(self.head_inputs(inputs), labels)
            self.log_train("train/pair_loss", loss, prog_bar=True)
            return loss
        loss, _, _ = self._loss(batch)
        self.log_train("train/loss", loss, prog_bar=True)
        return loss

    # -- solved heads (class docstring) -----------------------------------------------
    def configure_optimizers(self) -> Any:
        if self.finetune.regime == "linear_probe":  # the solve writes the head
            return torch.optim.SGD(self.model.head.parameters(), lr=0.0)
        return super().configure_optimizers()

    def _epoch_ends(self, batch_idx: int) -> bool:
        trainer = self.trainer
        return bool(trainer.is_last_batch) or batch_idx + 1 >= trainer.num_training_batches

    def on_train_epoch_start(self) -> None:
        self._probe_rows = []

    def _probe_step(self, batch: Any, batch_idx: int) -> None:
        inputs, labels = self.split_batch(batch)
        with torch.no_grad():
            self._probe_rows.append((self.head_inputs(inputs).detach(), labels.detach()))
        if not self._epoch_ends(batch_idx):
            return None
        rows, self._probe_rows = self._probe_rows, []
        self._solve_head(rows)
        opt = self.optimizers()
        for p in self.model.head.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()  # counted by Lightning; a zero rate and gradient change nothing
        opt.zero_grad()
        self.trainer.should_stop = True
        return None

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.finetune.regime == "contrastive" and self._head_needed(batch_idx):
            self._solve_head(self._train_features())

    def _head_needed(self, batch_idx: int) -> bool:
        """Whether the contrastive body needs its solved head after this batch: at the end
        of an epoch that validates (``check_val_every_n_epoch``) or ends the run
        (``max_epochs`` / ``max_steps``), so that validation and the final checkpoint see
        the tuned body with its own probe."""
        trainer = self.trainer
        limit = trainer.max_steps
        if limit is not None and 0 < limit <= self.global_step:
            return True
        if not self._epoch_ends(batch_idx):
            return False
        epoch, every = self.current_epoch + 1, trainer.check_val_every_n_epoch
        last = trainer.max_epochs is not None and 0 < trainer.max_epochs <= epoch
        return last or every is None or epoch % every == 0

    def _train_features(self) -> list[tuple[Tensor, Tensor]]:
        """Every training batch's :meth:`head_inputs` and labels, in eval mode."""
        trainer, was = self.trainer, self.training
        rows = []
        self.eval()
        try:
            with torch.no_grad(), trainer.precision_plugin.forward_context():
                for batch in trainer.train_dataloader:
                    batch = trainer.strategy.batch_to_device(batch, self.device)
                    inputs, labels = self.split_batch(batch)
                    rows.append((self.head_inputs(inputs), labels))
        finally:
            self.train(was)
        return rows

    def _gather_rows(self, x: Tensor) -> Tensor:
        """``x`` of every process, concatenated (rows may differ in number)."""
        if self.trainer.world_size <= 1:
            return x
        counts = self.all_gather(torch.tensor([x.shape[0]], device=x.device)).flatten()
        counts = [int(c) for c in counts.tolist()]
        pad = x.new_zeros((max(counts) - x.shape[0], *x.shape[1:]))
        every = self.all_gather(torch.cat([x, pad]))
        return torch.cat([every[r, :c] for r, c in enumerate(counts)])

    def _solve_head(self, rows: list[tuple[Tensor, Tensor]]) -> None:
        """Fit the probe (:func:`multimodal.tasks.probe.fit_probe`) on ``rows`` of every
        process and write it into ``model.head``."""
        features = self._gather_rows(torch.cat([f for f, _ in rows]).float())
        labels = self._gather_rows(torch.cat([y for _, y in rows]).long())
        ft = self.finetune
        fit = fit_probe(features, labels, self.num_classes, ft.probe_cs, ft.probe_folds,
                        None if ft.probe_class_weight == "none" else "balanced")
        head = self.model.head
        with torch.no_grad():
            head.weight.copy_(fit.weight.to(head.weight))
            head.bias.copy_(fit.bias.to(head.bias))
        self.probe_fit = fit
        best = max(fit.cv_accuracy) if fit.cv_accuracy else float("nan")
        self.log("probe/C", fit.C)
        self.log("probe/cv_acc", best)
        rank_zero_info(f"probe: logistic regression on {features.shape[0]} x "
                       f"{features.shape[1]} features solved, C = {fit.C:.3g} "
                       f"(cross-validated accuracy {best:.3f}), {fit.iterations} L-BFGS "
                       "iterations")

    def _eval_step(self, batch: Any, metrics: nn.ModuleDict, prefix: str) -> None:
        loss, logits, labels = self._loss(batch)
        self.log_mean(f"{prefix}/loss", loss, labels.shape[0], prog_bar=True)
        for name, metric in metrics.items():
            metric.update(logits, labels)
            self.log(f"{prefix}/{name}", metric, prog_bar=name == "acc_macro")
            if name == "acc_macro":  # the old name, the same number (until 0.2)
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
        if self.probe_fit is not None:
            checkpoint["probe"] = {"C": self.probe_fit.C,
                                   "cv_accuracy": list(self.probe_fit.cv_accuracy)}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        names = checkpoint.get("class_names")
        if names:
            self.class_names = list(names)
