"""What every task shares: it wraps one of our models and makes its checkpoints
self-describing."""

from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, ClassVar

import lightning as L
import torch
from torch import Tensor, nn
from torchmetrics.aggregation import MeanMetric

from multimodal.convert.hf_preprocess import data_image_preprocessor
from multimodal.tasks.finetune import FinetuneConfig, apply_regime, lora_settings, merged_model
from multimodal.tasks.optim import (
    OPTIMIZER_KEYS,
    OptimizerConfig,
    clip_gradients,
    flat_keywords_error,
    fold_stored_optimizer,
)
from multimodal.tasks.pretrained import HEAD_MODULES, PretrainedSource, task_model

CHECKPOINT_KEY = "multimodal_model"

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune",
                 "max-autotune-no-cudagraphs")
"""The ``torch.compile`` modes a task's ``compile`` may name (``true``: the default)."""

_STORED = ContextVar("multimodal_stored_hparams", default=False)


@contextmanager
def stored_hyperparameters() -> Iterator[None]:
    """Tasks built inside read hyper-parameters a checkpoint stored: the flat optimiser
    keys of checkpoints written before the ``optimizer`` block map into it silently
    (:meth:`ModelTask._stored_keywords`); anywhere else they are an error."""
    token = _STORED.set(True)
    try:
        yield
    finally:
        _STORED.reset(token)


def loader_examples(make_loader: Any) -> int | None:
    """How many examples the loader that ``make_loader()`` (a data module's
    ``val_dataloader`` / ``test_dataloader``) reads: its dataset's length, or None when that
    is unknown (an unsized, streamed dataset, or a loader that cannot be made yet: the
    trainer's own loop then says why, as it would have)."""
    try:
        return len(make_loader().dataset)
    except Exception:
        return None


class ModelTask(L.LightningModule):
    """A LightningModule around ``self.model`` (one of multimodal's models).

    The keywords every task shares are this class's, once: where the model comes from
    (``model``, ``pretrained``, ``preset`` with ``overrides`` and ``data_sizes``),
    ``compile``, ``optimizer`` and ``finetune``. A task declares only its own keywords and
    passes the rest on, ``super().__init__(model, **kwargs)``; jsonargparse follows that
    call, so LightningCLI offers each task its own and the shared keywords (``fit
    --model.help``, ``--print_config``, a config's keys) as before. A task that adjusts
    how its model is built overrides :meth:`build_model`.

    Checkpoints carry ``checkpoint["multimodal_model"] = {"model_type", "model_config"}``
    (plain types, so ``torch.load(weights_only=True)`` reads them and
    :func:`multimodal.from_pretrained` rebuilds the model without the task). They are
    kept out of ``hyper_parameters``, which LightningCLI feeds back to ``__init__`` when a
    run is resumed or tested from a checkpoint.

    ``compile=True`` compiles the model's forward in place (``nn.Module.compile``): the
    task calls ``self.model`` as before and the parameter names, hence checkpoints, are
    those of the eager model, so a run saved compiled resumes or tests uncompiled and back.
    Only the model's ``__call__`` is compiled; its own ``generate`` loops stay eager.
    ``compile`` may also name a ``torch.compile`` mode (:data:`COMPILE_MODES`):
    ``"reduce-overhead"`` replays the compiled forward and backward as CUDA graphs (one
    launch instead of one per kernel: the host overhead of a small model's step; a CPU run
    compiles without graphs), ``"max-autotune"`` also searches kernel configurations.
    A batch of another shape (an epoch's last, smaller batch) compiles once more.

    ``optimizer`` (:class:`~multimodal.tasks.optim.OptimizerConfig` or some of its keys as
    a dict, the others from the task's :attr:`optimizer_defaults`): AdamW's ``lr``,
    ``weight_decay``, ``betas`` and the schedule's ``warmup_fraction``, ``min_lr_ratio``.
    The flat keywords of earlier releases (``lr=`` ...) are a TypeError naming the block's
    spelling; hyper-parameters of checkpoints written before the block map into it
    silently (:meth:`load_from_checkpoint`, :func:`multimodal.tasks.stored_task`, the
    CLI's ``--ckpt_path``).

    ``finetune`` (:class:`~multimodal.tasks.finetune.FinetuneConfig` or its keys as a dict)
    picks the fine-tuning regime: full (default), linear probe, LoRA, frozen first blocks,
    layer-wise learning-rate decay, a head learning rate. Tasks take ``pretrained: PATH``
    (:mod:`multimodal.tasks.pretrained`) to start from a folder or checkpoint, or
    ``preset: NAME`` with ``overrides`` for a new model (:mod:`multimodal.tasks.presets`),
    whose sizes the data fixes (``image_size``, ``vocab_size`` ...) come in ``data_sizes``:
    the ``multimodal`` CLI links it from the data module's ``model_sizes``.
    """

    accepts: ClassVar[tuple[type, ...]] = (nn.Module,)
    """The model classes the task trains: a given model, a preset's or the part of a
    pretrained folder it takes must be one of them."""
    model_sources: ClassVar[tuple[str, ...]] = ("model", "preset", "pretrained")
    """Where the task's model may come from (:meth:`model_from`)."""
    head_modules: tuple[str, ...] = HEAD_MODULES
    solves_head: bool = False
    """True where the task fits its head in closed form (``linear_probe`` solved, and the
    ``contrastive`` regime): :class:`~multimodal.tasks.classification.ClassificationTask`."""
    preset_defaults: ClassVar[dict[str, Any]] = {}
    """Config fields the task sets in a ``preset``'s config unless ``overrides`` does
    (where the config has them): a classifier's ``mlm_head: false``."""
    default_monitor: tuple[str, str] = ("val/loss", "min")
    """(metric, "min" | "max") the CLI's default ``ModelCheckpoint`` keeps the best of."""
    optimizer_defaults: ClassVar[OptimizerConfig] = OptimizerConfig()
    """The task's own optimiser settings: the keys an ``optimizer`` block leaves out."""

    def __init__(self, model: nn.Module | None = None, *, pretrained: str | None = None,
                 preset: str | None = None, overrides: dict[str, Any] | None = None,
                 data_sizes: dict[str, int] | None = None, compile: bool | str = False,
                 optimizer: dict[str, Any] | OptimizerConfig | None = None,
                 finetune: FinetuneConfig | None = None, **removed: Any) -> None:
        super().__init__()
        self._left_out = set(removed)  # not saved again (save_hyperparameters)
        if removed:
            optimizer = self._stored_keywords(removed, optimizer)
        self._shared_hparams = {"compile": compile, "pretrained": pretrained, "preset": preset,
                                "overrides": overrides, "optimizer": optimizer,
                                "finetune": finetune, "data_sizes": data_sizes}
        if "pretrained" not in self.model_sources:  # a task that takes none has no such key
            del self._shared_hparams["pretrained"]
        self.optimizer_config: OptimizerConfig = OptimizerConfig.of(optimizer,
                                                                    self.optimizer_defaults)
        """The task's optimiser settings (:class:`~multimodal.tasks.optim.OptimizerConfig`):
        the ``optimizer`` block over :attr:`optimizer_defaults`."""
        self.finetune = FinetuneConfig.of(finetune)
        if self.finetune.regime == "contrastive" and not self.solves_head:
            raise ValueError(f"finetune: regime 'contrastive' fits a classifier's head; "
                             f"{type(self).__name__} has none to fit (use full, lora or "
                             "linear_probe)")
        model, source = self.build_model(model, pretrained=pretrained, preset=preset,
                                         overrides=overrides, data_sizes=data_sizes)
        config = getattr(model, "config", None)
        if config is None or not dataclasses.is_dataclass(config):
            raise ValueError("model must be one of multimodal's models (with a dataclass "
                             f".config), got {type(model).__name__}")
        self.pretrained_source: PretrainedSource | None = source
        """What came with ``pretrained`` (tokenizer, class names, preprocessing ...), read
        once (:class:`~multimodal.tasks.pretrained.PretrainedSource`); None without it."""
        apply_regime(model, self.finetune, self.head_modules)
        if compile is True or compile == "true":
            model.compile()
        elif compile not in (False, None, "false"):
            if compile not in COMPILE_MODES:
                raise ValueError(f"compile must be true, false or a torch.compile mode "
                                 f"{list(COMPILE_MODES)}, got {compile!r}")
            model.compile(mode=str(compile))
        self.model = model

    def _stored_keywords(self, removed: dict[str, Any],
                         optimizer: dict[str, Any] | OptimizerConfig | None
                         ) -> dict[str, Any] | OptimizerConfig | None:
        """The ``optimizer`` block for keywords no task takes any more. Inside
        :func:`stored_hyperparameters` (hyper-parameters a checkpoint stored): the flat
        optimiser keys (``lr`` ...) of checkpoints written before the block move into it,
        the block's keys winning (:func:`~multimodal.tasks.optim.fold_stored_optimizer`),
        and any other key is left out, as Lightning leaves out what a signature lacks.
        Anywhere else a flat key is a TypeError naming the block's spelling, and any other
        unknown keyword is Python's TypeError."""
        task = type(self).__name__
        flat = {k: v for k, v in removed.items() if k in OPTIMIZER_KEYS}
        if _STORED.get():
            return fold_stored_optimizer({**flat, "optimizer": optimizer}).get("optimizer",
                                                                              optimizer)
        unknown = sorted(k for k in removed if k not in OPTIMIZER_KEYS)
        if unknown:
            raise TypeError(f"{task}.__init__() got an unexpected keyword argument "
                            f"{unknown[0]!r}")
        raise flat_keywords_error(task, flat)

    def build_model(self, model: nn.Module | None, *, pretrained: str | None,
                    preset: str | None, overrides: dict[str, Any] | None,
                    data_sizes: dict[str, Any] | None) -> tuple[nn.Module, PretrainedSource | None]:
        """The model the task trains, from exactly one of the sources :meth:`__init__` was
        given, and what came with ``pretrained`` (:meth:`model_from`). A task that adjusts a
        source (a masked-LM task's ``mlm_head``, a classifier's class count) overrides this;
        it runs inside ``ModelTask.__init__``, before the regime and ``compile``."""
        return self.model_from(model, pretrained=pretrained, preset=preset,
                               overrides=overrides, data_sizes=data_sizes)

    @classmethod
    def model_from(cls, model: nn.Module | None = None, *, pretrained: str | None = None,
                   preset: str | None = None, overrides: dict[str, Any] | None = None,
                   data_sizes: dict[str, Any] | None = None, modality: str | None = None
                   ) -> tuple[nn.Module, PretrainedSource | None]:
        """The model the task trains and, with ``pretrained``, what came with it: exactly one
        of ``model``, ``preset`` (with ``overrides`` and the data's ``data_sizes``) or
        ``pretrained`` (with ``overrides``), of the task's :attr:`accepts`
        (:func:`~multimodal.tasks.pretrained.task_model`); a source the task does not take
        (:attr:`model_sources`) is an error naming those it takes."""
        given = {"preset": preset, "pretrained": pretrained}
        refused = [k for k, v in given.items() if v is not None and k not in cls.model_sources]
        if refused:
            raise ValueError(f"{cls.__name__} takes no {refused[0]}: its model comes from "
                             f"{' or '.join(cls.model_sources)}")
        return task_model(model, pretrained, overrides, task=cls.__name__, accept=cls.accepts,
                          modality=modality, preset=preset, data_sizes=data_sizes,
                          preset_defaults=cls.preset_defaults)

    def train(self, mode: bool = True) -> ModelTask:
        """A linear probe keeps the frozen backbone in eval mode (no dropout / drop path)."""
        super().train(mode)
        if mode and self.finetune.regime == "linear_probe":
            for name, module in self.model.named_children():
                if name not in self.head_modules:
                    module.eval()
        return self

    def save_pretrained(self, path: str | Path) -> Path:
        """The trained model as by ``save_pretrained``, LoRA adapters merged in; with an
        image data module attached, also its preprocessing (``preprocessor_config.json``:
        image size and normalisation, read back by ``pretrained:`` and ``load_encoder``)."""
        folder = merged_model(self.model).save_pretrained(path)
        if getattr(self.model, "modality", None) in ("image", "image+text") \
                and self.datamodule is not None:
            preprocessor = data_image_preprocessor(self.datamodule)
            if preprocessor is not None:
                preprocessor.save(folder)
        return folder

    @property
    def datamodule(self) -> Any:
        """The trainer's data module, or None (no trainer attached, or no data module)."""
        return getattr(self.trainer, "datamodule", None) if self._trainer is not None else None

    @classmethod
    def load_from_checkpoint(cls, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """Lightning's ``load_from_checkpoint``, the stored hyper-parameters mapped once
        onto today's arguments (flat optimiser keys into the ``optimizer`` block, silently:
        :func:`stored_hyperparameters`)."""
        with stored_hyperparameters():
            return super().load_from_checkpoint(*args, **kwargs)

    def save_hyperparameters(self, *args: Any, ignore: Any = None, frame: Any = None,
                             logger: bool = True) -> None:
        """Lightning's ``save_hyperparameters`` (of the caller's ``__init__`` arguments, the
        shared ones :meth:`__init__` took included, with their defaults, those of a stored
        checkpoint that no task takes any more left out), then the optimiser as one block:
        ``hparams["optimizer"]`` holds every key of :attr:`optimizer_config` (what the task
        trains with, its defaults included)."""
        if frame is None:
            frame = inspect.currentframe().f_back  # the __init__ whose arguments are kept
        super().save_hyperparameters(*args, ignore=ignore, frame=frame, logger=logger)
        ignored = {ignore} if isinstance(ignore, str) else set(ignore or ())
        for key, value in getattr(self, "_shared_hparams", {}).items():
            if key not in ignored:
                self._hparams.setdefault(key, value)
        for key in getattr(self, "_left_out", ()):  # stored keys no task takes any more
            self._hparams.pop(key, None)
        block = dataclasses.asdict(self.optimizer_config)
        block["betas"] = list(block["betas"])  # plain types, as a YAML writes them
        self._hparams["optimizer"] = block
        self._hparams_initial = copy.deepcopy(self._hparams)

    def log_mean(self, name: str, value: Tensor | float, batch_size: int, **kwargs: Any) -> None:
        """Log ``name`` as the mean of ``value`` over every example of the epoch, on every
        process: ``sum(value_b * batch_size_b) / sum(batch_size_b)`` over the batches ``b``
        of all ranks (a ``MeanMetric`` whose sums are added across ranks).

        For evaluation scores: with one ``EvalShardSampler`` share per rank each example
        counts once. (``self.log(..., sync_dist=True)`` averages the per-rank example counts
        in an integer tensor, which truncates them when the split does not divide by the
        number of processes.) ``kwargs`` go to ``self.log`` (``prog_bar``, ...).
        """
        means = self.__dict__.setdefault("_logged_means", {})  # not a submodule: no state
        value = torch.as_tensor(value, dtype=torch.float32, device=self.device).detach()
        metric = means.get(name)
        if metric is None:
            metric = means[name] = MeanMetric().to(value.device)
        metric.update(value, batch_size)
        self.log(name, metric, batch_size=batch_size, metric_attribute=f"_logged_means.{name}",
                 **kwargs)

    def log_train(self, name: str, value: Tensor, **kwargs: Any) -> None:
        """Log a training metric without touching the host on most steps.

        ``value`` (detached, fp32) is added to a running sum on its own device; ``self.log``
        is called, with the mean of the values since its previous call, only on the steps
        whose metrics are read: those Lightning writes to the loggers (every
        ``trainer.log_every_n_steps``, and when the run stops), those a drawn progress bar
        refreshes on (every ``refresh_rate`` values), and the last batch of an epoch (the
        epoch line). ``self.log`` every step cost ~1 ms of host time a step on a 2-core
        CPU (its result collection moved to the device, the batch size extracted) and,
        with a bar, a host sync; the value a logger records at step ``k`` is now the
        mean over the steps since the previous record instead of step ``k``'s alone.
        ``kwargs`` go to ``self.log`` (``prog_bar``, ``batch_size`` ...)."""
        sums = self.__dict__.setdefault("_train_sums", {})  # not module state
        value = value.detach().float()
        held = sums.get(name)
        if held is None:
            held = sums[name] = [value, 1]
        else:
            held[0] = held[0] + value
            held[1] += 1
        if self._train_log_due(held[1]):
            total, count = held
            del sums[name]
            self.log(name, total / count, **kwargs)

    def _train_log_due(self, count: int) -> bool:
        trainer = self._trainer
        if trainer is None:
            return True
        try:
            if trainer._logger_connector.should_update_logs or trainer.is_last_batch:
                return True
        except AttributeError:  # another Lightning: every step, as self.log does
            return True
        bar = trainer.progress_bar_callback
        if bar is not None and getattr(bar, "is_enabled", False):
            return count % max(int(getattr(bar, "refresh_rate", 1) or 1), 1) == 0
        return False

    def model_description(self) -> dict[str, Any]:
        about = {"model_type": type(self.model).__name__,
                 "model_config": dataclasses.asdict(self.model.config)}
        lora = lora_settings(self.model)
        if lora:  # the state dict holds adapters: load_checkpoint wraps, loads, merges
            about["lora"] = dict(lora)
        return about

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[CHECKPOINT_KEY] = self.model_description()
        hp = checkpoint.get("hyper_parameters")
        if isinstance(hp, dict):  # plain types only: read_checkpoint loads weights_only
            for key in ("finetune", "optimizer"):
                if dataclasses.is_dataclass(hp.get(key)):
                    hp[key] = dataclasses.asdict(hp[key])

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Checkpoints of ClassificationTask before 2026-11 also held every weight a second
        # time under "_forward." (the model registered twice); the "model." copy is enough.
        state = checkpoint.get("state_dict")
        if state is not None:
            for key in [k for k in state if k.startswith("_forward.")]:
                del state[key]

    def configure_optimizers(self) -> dict[str, Any]:
        """AdamW (weight decay on matrices only) with linear warm-up over
        ``warmup_fraction`` of the steps, then cosine decay to ``min_lr_ratio`` x ``lr``
        (:attr:`optimizer_config`); with ``finetune.layer_decay`` / ``head_lr`` one parameter
        group per rate (:func:`~multimodal.tasks.optim.adamw`)."""
        total, ft = int(self.trainer.estimated_stepping_batches), self.finetune
        return self.optimizer_config.build(self.model, total, layer_decay=ft.layer_decay,
                                           head_lr=ft.head_lr, heads=self.head_modules,
                                           fused=self.fused_optimizer())

    def fused_optimizer(self) -> bool | None:
        """The AdamW implementation the run gets: False (for-each) where the trainer clips
        gradients under a gradient scaler (``16-mixed``): a fused step unscales inside its
        kernel, after the clipping, which would then see scaled gradients. None otherwise:
        :func:`~multimodal.tasks.optim.use_fused` (fused on CUDA, or as
        ``MULTIMODAL_FUSED_ADAMW`` says)."""
        trainer = self._trainer
        if trainer is not None and trainer.gradient_clip_val \
                and getattr(trainer.precision_plugin, "scaler", None) is not None:
            return False
        return None

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer,
                                    gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        """Lightning's clipping, for every optimiser the tasks build:

        * a fused optimiser (``_step_supports_amp_scaling``) without a gradient scaler (fp32,
          bf16 autocast: the gradients are not scaled): clipped here
          (:func:`~multimodal.tasks.optim.clip_gradients`), where Lightning's mixed-precision
          plugin refuses to ("does not allow for gradient clipping because it performs
          unscaling of gradients internally");
        * FSDP with clipping by norm: the root FSDP module's ``clip_grad_norm_`` (the norm
          over every rank's shard; Lightning's FSDP plugin refuses ``norm``);
        * otherwise Lightning's own (which unscales first under ``16-mixed``)."""
        value = float(gradient_clip_val or 0.0)
        if value <= 0:
            return
        algorithm = str(getattr(gradient_clip_algorithm, "value", gradient_clip_algorithm)
                        or "norm")
        trainer = self.trainer
        root = getattr(trainer.strategy, "model", None)
        if algorithm == "norm" and "FSDP" in type(trainer.strategy).__name__ \
                and callable(getattr(root, "clip_grad_norm_", None)):
            root.clip_grad_norm_(value)
            return
        if getattr(optimizer, "_step_supports_amp_scaling", False) \
                and getattr(trainer.precision_plugin, "scaler", None) is None:
            clip_gradients(optimizer, value, algorithm)
            return
        super().configure_gradient_clipping(optimizer, gradient_clip_val,
                                            gradient_clip_algorithm)
