"""What every task shares: it wraps one of our models and makes its checkpoints
self-describing."""

from __future__ import annotations

import dataclasses
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torchmetrics.aggregation import MeanMetric

from multimodal.tasks.optim import OptimizerConfig

CHECKPOINT_KEY = "multimodal_model"


class ModelTask(L.LightningModule):
    """A LightningModule around ``self.model`` (one of multimodal's models).

    Checkpoints carry ``checkpoint["multimodal_model"] = {"model_type", "model_config"}``
    (plain types, so ``torch.load(weights_only=True)`` reads them and
    :func:`multimodal.hub.load_checkpoint` rebuilds the model without the task). They are
    kept out of ``hyper_parameters``, which LightningCLI feeds back to ``__init__`` when a
    run is resumed or tested from a checkpoint.

    ``compile=True`` compiles the model's forward in place (``nn.Module.compile``): the
    task calls ``self.model`` as before and the parameter names, hence checkpoints, are
    those of the eager model, so a run saved compiled resumes or tests uncompiled and back.
    Only the model's ``__call__`` is compiled; its own ``generate`` loops stay eager.
    """

    def __init__(self, model: nn.Module, compile: bool = False) -> None:
        super().__init__()
        config = getattr(model, "config", None)
        if config is None or not dataclasses.is_dataclass(config):
            raise ValueError("model must be one of multimodal's models (with a dataclass "
                             f".config), got {type(model).__name__}")
        if compile:
            model.compile()
        self.model = model

    @property
    def datamodule(self) -> Any:
        """The trainer's data module, or None (no trainer attached, or no data module)."""
        return getattr(self.trainer, "datamodule", None) if self._trainer is not None else None

    @property
    def optimizer_config(self) -> OptimizerConfig:
        """The task's optimiser settings, from its hyper-parameters (``lr``,
        ``weight_decay``, ``warmup_fraction``, ``min_lr_ratio`` and optional ``betas``: the
        keywords every task takes, each with its own defaults)."""
        hp = self.hparams
        return OptimizerConfig(lr=hp.lr, weight_decay=hp.weight_decay,
                               betas=tuple(hp.get("betas", (0.9, 0.999))),
                               warmup_fraction=hp.warmup_fraction, min_lr_ratio=hp.min_lr_ratio)

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

    def model_description(self) -> dict[str, Any]:
        return {"model_type": type(self.model).__name__,
                "model_config": dataclasses.asdict(self.model.config)}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[CHECKPOINT_KEY] = self.model_description()

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
        (:attr:`optimizer_config`)."""
        return self.optimizer_config.build(self.model, int(self.trainer.estimated_stepping_batches))
