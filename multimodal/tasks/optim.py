"""Optimiser and learning-rate schedule shared by every task."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim.lr_scheduler import LambdaLR

from multimodal.tasks.finetune import is_head, layer_ids


@dataclass(frozen=True)
class OptimizerConfig:
    """The optimiser every task uses: :func:`adamw` with :func:`warmup_cosine`.

    Tasks take it as one ``optimizer`` block (a config writes
    ``model.init_args.optimizer: {lr: 0.0005, weight_decay: 0.01}``); the keys it leaves
    out keep the task's own defaults (``ModelTask.optimizer_defaults``, :meth:`of`). The
    flat keywords of earlier releases (``lr=``, ``weight_decay=``, ``betas=``,
    ``warmup_fraction=``, ``min_lr_ratio=``) are gone: given to a task, one error names the
    block's spelling (:func:`flat_keywords_error`); checkpoints that stored them load as
    before (:func:`fold_stored_optimizer`).
    """

    lr: float = 1e-3
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_fraction: float = 0.05
    min_lr_ratio: float = 0.01

    def __post_init__(self) -> None:
        problems = []
        for key in ("lr", "weight_decay", "warmup_fraction", "min_lr_ratio"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"optimizer: {key} must be a number, got {value!r}")
        betas = self.betas
        if isinstance(betas, (str, bytes)) or not isinstance(betas, (tuple, list)) or \
                not all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in betas):
            raise ValueError(f"optimizer: betas must be two numbers in [0, 1), got {betas!r}")
        object.__setattr__(self, "betas", tuple(float(b) for b in betas))  # YAML: a list
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
            raise ValueError("optimizer: " + "; ".join(problems))

    @classmethod
    def of(cls, value: OptimizerConfig | Mapping[str, Any] | None,
           defaults: OptimizerConfig | None = None) -> OptimizerConfig:
        """The block a task was given: ``None`` -> ``defaults`` (the task's own); a mapping
        of some of the keys -> ``defaults`` with those keys replaced; an
        :class:`OptimizerConfig` -> itself, whole. An unknown key is a ValueError naming
        the keys."""
        base = cls() if defaults is None else defaults
        if value is None:
            return base
        if isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - set(OPTIMIZER_KEYS))
            if unknown:
                raise ValueError(f"optimizer: unknown key(s) {unknown}; keys: "
                                 f"{list(OPTIMIZER_KEYS)}")
            return dataclasses.replace(base, **value)
        raise ValueError(f"optimizer must be a mapping of OptimizerConfig keys "
                         f"{list(OPTIMIZER_KEYS)}, got {value!r}")

    def build(self, module: nn.Module, total_steps: int, *, layer_decay: float | None = None,
              head_lr: float | None = None, heads: tuple[str, ...] = (),
              fused: bool | None = None) -> dict[str, Any]:
        """Lightning's ``configure_optimizers`` answer for ``module`` trained for
        ``total_steps`` steps (the schedule steps every batch); ``layer_decay`` / ``head_lr``
        / ``heads`` / ``fused`` as in :func:`adamw`."""
        opt = adamw(module, self.lr, self.weight_decay, tuple(self.betas),
                    layer_decay=layer_decay, head_lr=head_lr, heads=heads, fused=fused)
        sched = warmup_cosine(opt, int(self.warmup_fraction * total_steps), total_steps,
                              self.min_lr_ratio)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


OPTIMIZER_KEYS = ("lr", "weight_decay", "betas", "warmup_fraction", "min_lr_ratio")
"""The block's keys; also the flat task keywords of earlier releases (removed)."""


def flat_keywords_error(task: str, flat: Mapping[str, Any]) -> TypeError:
    """The one-line error for the flat optimiser keywords of earlier releases (``lr=`` ...)
    given to ``task``: they are gone; it names the block's spelling, in Python and on the
    command line."""
    keys = [k for k in OPTIMIZER_KEYS if k in flat]
    new = ", ".join(f"{k!r}: {list(flat[k]) if isinstance(flat[k], tuple) else flat[k]!r}"
                    for k in keys)
    verb = "was" if len(keys) == 1 else "were"
    return TypeError(f"{task}: {', '.join(f'{k}=' for k in keys)} {verb} removed (one "
                     f"optimizer block): write optimizer={{{new}}} "
                     f"({', '.join('--model.init_args.optimizer.' + k for k in keys)})")


def fold_stored_optimizer(hparams: Mapping[str, Any]) -> dict[str, Any]:
    """Hyper-parameters a checkpoint stored, with the flat optimiser keys of checkpoints
    written before the ``optimizer`` block (``lr``, ``weight_decay``, ...) moved into
    ``optimizer`` (whose own keys win); unchanged otherwise. Mapped once where a
    checkpoint's task is rebuilt, so that it trains as before and warns of nothing."""
    flat = {k: hparams[k] for k in OPTIMIZER_KEYS if hparams.get(k) is not None}
    out = {k: v for k, v in hparams.items() if k not in OPTIMIZER_KEYS}
    if not flat:
        return out
    block = hparams.get("optimizer")
    if isinstance(block, OptimizerConfig):
        block = dataclasses.asdict(block)
    out["optimizer"] = {**flat, **(block or {})}
    return out


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


FUSED_ENV = "MULTIMODAL_FUSED_ADAMW"
"""Environment variable that picks the AdamW implementation: ``1`` the fused kernel, ``0``
torch's default (for-each on CUDA, a per-tensor loop on CPU: the behaviour before issue
50), ``auto`` or unset: fused wherever every parameter is a floating tensor on a device
with fused kernels (CUDA and CPU among them)."""


def _fused_devices() -> tuple[str, ...]:
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        return tuple(_get_fused_kernels_supported_devices())
    except ImportError:  # an older torch: the devices it had fused AdamW for
        return ("cuda", "cpu")


def use_fused(params: list[Tensor], fused: bool | None = None) -> bool:
    """Whether :func:`adamw` builds the fused AdamW for ``params``: ``fused`` when given,
    else :data:`FUSED_ENV` when set to ``1`` / ``0``, else True where every parameter is a
    floating tensor on one device type that has fused kernels (CUDA, CPU, ...).

    The fused kernel does the whole update of every tensor in one call: on a 2-core CPU it
    steps the main job's ViT (565 K parameters in 65 tensors) in 2.8 ms against 11.9 ms
    for the per-tensor loop and 9.5 ms for for-each (benchmarks/host_overhead.py's
    numbers in BENCHMARKS.md), with the same update to float rounding. A value of the
    variable other than 1, 0, true, false, auto is a ValueError."""
    if fused is not None:
        return bool(fused)
    env = os.environ.get(FUSED_ENV, "auto").strip().lower()
    if env in ("1", "true", "yes", "on"):
        return True
    if env in ("0", "false", "no", "off"):
        return False
    if env not in ("", "auto"):
        raise ValueError(f"{FUSED_ENV} must be 1, 0 or auto, got {env!r}")
    kinds = {p.device.type for p in params}
    return len(kinds) == 1 and kinds <= set(_fused_devices()) and \
        all(p.is_floating_point() for p in params)


def adamw(model: nn.Module, lr: float, weight_decay: float = 0.05,
          betas: tuple[float, float] = (0.9, 0.999), *, layer_decay: float | None = None,
          head_lr: float | None = None, heads: tuple[str, ...] = (),
          fused: bool | None = None) -> torch.optim.AdamW:
    """The one AdamW of every task: the groups of :func:`param_groups` (weight decay on
    matrices only; layer-wise decay and a head rate as options). Fused kernels on CUDA and
    CPU (``fused``: force it on or off; None: :func:`use_fused`). A fused AdamW unscales
    gradients inside its step, so Lightning refuses to clip for it under mixed precision:
    :meth:`multimodal.tasks.base.ModelTask.configure_gradient_clipping` clips instead.
    A model without a trainable parameter is a ValueError."""
    groups = param_groups(model, lr, weight_decay, layer_decay=layer_decay,
                          head_lr=head_lr, heads=heads)
    params = [p for g in groups for p in g["params"]]
    if not params:
        raise ValueError(f"{type(model).__name__}: no parameter is trainable")
    return torch.optim.AdamW(groups, lr=lr, betas=betas,
                             fused=True if use_fused(params, fused) else None)


def clip_gradients(optimizer: torch.optim.Optimizer, value: float,
                   algorithm: str = "norm") -> None:
    """Clip the gradients of ``optimizer``'s parameters in place: ``"norm"`` scales them
    all by ``min(1, value / ||g||_2)`` (``||g||_2`` over every gradient together),
    ``"value"`` clamps each entry to ``[-value, value]``. For unscaled gradients (fp32,
    bf16 autocast): the clipping Lightning does for an optimiser it does not refuse."""
    params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    if not params or value <= 0:
        return
    algorithm = str(getattr(algorithm, "value", algorithm or "norm"))
    if algorithm == "value":
        torch.nn.utils.clip_grad_value_(params, value)
    elif algorithm == "norm":
        torch.nn.utils.clip_grad_norm_(params, value)
    else:
        raise ValueError(f"gradient_clip_algorithm must be 'norm' or 'value', got {algorithm!r}")


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
