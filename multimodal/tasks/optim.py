"""Optimiser and learning-rate schedule shared by every task."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR


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

    def build(self, module: nn.Module, total_steps: int) -> dict[str, Any]:
        """Lightning's ``configure_optimizers`` answer for ``module`` trained for
        ``total_steps`` steps (the schedule steps every batch)."""
        opt = adamw(module, self.lr, self.weight_decay, tuple(self.betas))
        sched = warmup_cosine(opt, int(self.warmup_fraction * total_steps), total_steps,
                              self.min_lr_ratio)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def adamw(module: nn.Module, lr: float, weight_decay: float = 0.05,
          betas: tuple[float, float] = (0.9, 0.999)) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on biases, norms, embeddings of
    positions or class tokens: every parameter with fewer than 2 dims or named *_token /
    pos_embed). Fused kernels on CUDA."""
    decay, no_decay = [], []
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        skip = p.dim() < 2 or name.endswith("_token") or "pos_embed" in name
        (no_decay if skip else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    fused = all(p.is_cuda for p in decay + no_decay) and bool(decay + no_decay)
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
