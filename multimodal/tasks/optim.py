"""Optimiser and learning-rate schedule shared by every task."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim.lr_scheduler import LambdaLR

from multimodal.tasks.finetune import is_head, layer_ids


@dataclass(frozen=True)
class OptimizerConfig:
    """The optimiser every task uses: :func:`adamw` with :func:`warmup_cosine`.

    Tasks take these as keywords (``lr``, ``weight_decay``, ``betas`` where a task has
    it, ``warmup_fraction``, ``min_lr_ratio``) with their own defaults, so a YAML sets
    ``model.init_args.lr`` as before; ``ModelTask.optimizer_config`` gathers them here.
    """

    lr: float = 1e-3
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_fraction: float = 0.05
    min_lr_ratio: float = 0.01

    def __post_init__(self) -> None:
        problems = []
        if not self.lr > 0:
            problems.append(f"lr must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            problems.append(f"weight_decay must be >= 0, got {self.weight_decay}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            problems.append(f"betas must be two numbers in [0, 1), got {self.betas}")
        if not 0 <= self.warmup_fraction < 1:
            problems.append(f"warmup_fraction must be in [0, 1), got {self.warmup_fraction}")
        if not 0 <= self.min_lr_ratio <= 1:
            problems.append(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if problems:
            raise ValueError("; ".join(problems))

    def build(self, module: nn.Module, total_steps: int, *, layer_decay: float | None = None,
              head_lr: float | None = None, heads: tuple[str, ...] = ()) -> dict[str, Any]:
        """Lightning's ``configure_optimizers`` answer for ``module`` trained for
        ``total_steps`` steps (the schedule steps every batch); ``layer_decay`` / ``head_lr``
        / ``heads`` as in :func:`adamw`."""
        opt = adamw(module, self.lr, self.weight_decay, tuple(self.betas),
                    layer_decay=layer_decay, head_lr=head_lr, heads=heads)
        sched = warmup_cosine(opt, int(self.warmup_fraction * total_steps), total_steps,
                              self.min_lr_ratio)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def no_weight_decay(name: str, param: Tensor) -> bool:
    """True for the parameters AdamW does not decay: biases, norms and every other
    parameter with fewer than 2 dims, class / register tokens (``*_token``) and position
    embeddings (``pos_embed``)."""
    return param.dim() < 2 or name.endswith("_token") or "pos_embed" in name


def param_groups(model: nn.Module, lr: float, weight_decay: float, *,
                 layer_decay: float | None = None, head_lr: float | None = None,
                 heads: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """AdamW parameter groups of ``model``'s trainable parameters, by (learning rate,
    decay or not): weight decay on the parameters :func:`no_weight_decay` does not name.

    Without ``layer_decay`` / ``head_lr`` two groups, ``all/decay`` then ``all/no_decay``,
    at ``lr``. With them, one pair per rate (named ``layer<id>`` or ``head``, then
    ``/decay`` or ``/no_decay``): a parameter of the top-level modules ``heads`` learns at
    ``head_lr`` when set; with ``layer_decay`` one of layer id ``l`` of a tower of ``L``
    blocks (:func:`~multimodal.tasks.finetune.layer_ids`) at
    ``lr * layer_decay ** (L + 1 - l)``."""
    plain = layer_decay is None and head_lr is None
    ids = layer_ids(model, heads) if layer_decay is not None else {}
    groups: dict[str, dict[str, Any]] = {} if not plain else {
        key: {"params": [], "lr": lr, "name": key, "weight_decay": decay}
        for key, decay in (("all/decay", weight_decay), ("all/no_decay", 0.0))}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        skip = no_weight_decay(name, p)
        if head_lr is not None and is_head(name, heads):
            key, rate = "head", head_lr
        elif layer_decay is not None:
            layer, depth = ids[name]
            key, rate = f"layer{layer}", lr * layer_decay ** (depth + 1 - layer)
        else:
            key, rate = "all", lr
        key += "/no_decay" if skip else "/decay"
        group = groups.setdefault(key, {"params": [], "lr": rate, "name": key,
                                        "weight_decay": 0.0 if skip else weight_decay})
        group["params"].append(p)
    return list(groups.values())


def adamw(model: nn.Module, lr: float, weight_decay: float = 0.05,
          betas: tuple[float, float] = (0.9, 0.999), *, layer_decay: float | None = None,
          head_lr: float | None = None, heads: tuple[str, ...] = ()) -> torch.optim.AdamW:
    """The one AdamW of every task: the groups of :func:`param_groups` (weight decay on
    matrices only; layer-wise decay and a head rate as options). Fused kernels on CUDA.
    A model without a trainable parameter is a ValueError."""
    groups = param_groups(model, lr, weight_decay, layer_decay=layer_decay,
                          head_lr=head_lr, heads=heads)
    params = [p for g in groups for p in g["params"]]
    if not params:
        raise ValueError(f"{type(model).__name__}: no parameter is trainable")
    fused = all(p.is_cuda for p in params)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused or None)


def warmup_cosine(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int,
                  min_lr_ratio: float = 0.0) -> LambdaLR:
    """Linear warm-up from 0 to the base rate over ``warmup_steps``, then cosine decay to
    ``min_lr_ratio`` x base at ``total_steps``:
    ``lr(t) = base * (r + (1 - r) * (1 + cos(pi * (t - w) / (T - w))) / 2)``."""
    total_steps = max(total_steps, 1)
    warmup_steps = min(max(warmup_steps, 0), total_steps - 1) if total_steps > 1 else 0

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min((step - warmup_steps) / max(total_steps - warmup_steps, 1), 1.0)
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return LambdaLR(optimizer, factor)
