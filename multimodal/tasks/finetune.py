"""Fine-tuning regimes as config keys: full, linear probe, LoRA, frozen first blocks,
layer-wise learning-rate decay and a separate head learning rate.

Every task takes ``finetune: {...}`` (a :class:`FinetuneConfig`); the default is full
fine-tuning with one learning rate, as before.

Layer-wise decay (BEiT, Bao et al. 2022; timm's ``param_groups_layer_decay``): with ``L``
blocks in a tower, the embeddings (patch / token / position embeddings, class and register
tokens) get layer id 0, block ``i`` id ``i + 1``, the blocks' final norm id ``L`` (with the
last block, as timm groups it), everything else (the head) id ``L + 1``, and a parameter of
layer id ``l`` learns at

    lr_l = lr * layer_decay ** (L + 1 - l)

so the head learns at ``lr`` and the embeddings at ``lr * layer_decay ** (L + 1)``.
``head_lr`` (when set) replaces the head's rate. Models with two towers (CLIP, encoder-
decoders) count the blocks of each tower separately.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from torch import nn

from multimodal.nn.lora import apply_lora, lora_layers, merge_lora

__all__ = ["FinetuneConfig", "apply_regime", "choose_regime", "is_head", "layer_ids",
           "merged_model"]

REGIMES = ("full", "linear_probe", "lora", "contrastive", "auto")
MANY_LABELS_REGIMES = ("full", "lora")
FEW_LABELS_REGIMES = ("contrastive", "linear_probe")
_BLOCK = re.compile(r"^(.*?)(?:transformer\.)?blocks\.(\d+)\.")


@dataclass
class FinetuneConfig:
    """How a pretrained model is adapted (module docstring).

    ``regime``: ``full`` (every weight trains), ``linear_probe`` (only the head trains: the
    backbone is frozen and kept in eval mode), ``lora`` (low-rank adapters of rank
    ``lora_rank`` and scale ``lora_alpha / lora_rank`` on the Linears named by
    ``lora_targets``, plus the head; merged into plain weights by ``save_pretrained``).
    In a classification task ``linear_probe`` is *solved*, not trained: the frozen
    features are computed once and a multinomial logistic regression is fitted to its
    optimum (:mod:`multimodal.tasks.probe`; ``probe_cs``: the grid of inverse L2 strengths
    ``C``, chosen by ``probe_folds``-fold cross-validation; ``probe_class_weight``:
    ``balanced`` or ``none``). ``contrastive`` (classification tasks; SetFit, Tunstall et
    al. 2022): the body is fine-tuned on pairs of examples with a cosine-similarity loss,
    the head is the solved probe on the tuned features
    (:class:`~multimodal.tasks.classification.ClassificationTask`).
    ``auto`` (classification tasks; elsewhere it is ``full``): the regime follows the number
    of labelled training examples, chosen when ``fit`` starts and logged
    (:func:`choose_regime`): at most ``few_labels`` per class on average -> ``contrastive``
    (the few-label recipe; ``few_labels_regime: linear_probe`` for the solved probe alone),
    more -> ``many_labels_regime`` (``full`` or ``lora``, with ``layer_decay`` / ``head_lr`` /
    the LoRA keys as given).
    ``contrastive_epochs``: with ``contrastive`` (chosen or given), tune for this many epochs
    whatever the trainer's step budget (``trainer.min_steps`` / ``max_epochs``), validate
    once, at the end, and drop early stopping (a fixed length chooses nothing from
    validation); None keeps the trainer's budget. SetFit takes ``2.5 N`` optimiser steps on
    ``N`` examples (``2 R N`` pairs, ``R = 20``, 16 a step); in-batch tuning takes
    ``epochs * N / B``, so a fixed number of epochs is SetFit's budget at any data size:
    ``B = 16`` and 20 epochs (``configs/finetune_text.yaml``) is half its steps, each with
    120 pairs instead of 16. Measured at 8 labelled texts a class (BENCHMARKS.md, "Learning
    curves on real weights"), with no validation hold-out: level with SetFit on two real
    tasks, in about a minute. A solved ``linear_probe`` takes one epoch (one pass of
    features), also whatever the budget.
    ``freeze_blocks``: with ``full``, the embeddings and the first k blocks stay frozen.
    ``layer_decay``: layer-wise learning-rate decay factor in (0, 1]; ``head_lr``: the
    head's learning rate (default: the ``optimizer`` block's ``lr``).
    """

    regime: Literal["full", "linear_probe", "lora", "contrastive", "auto"] = "full"
    freeze_blocks: int = 0
    layer_decay: float | None = None
    head_lr: float | None = None
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_targets: list[str] = field(default_factory=lambda: ["qkv", "proj"])
    lora_dropout: float = 0.0
    probe_cs: list[float] | None = None
    probe_folds: int = 5
    probe_class_weight: Literal["balanced", "none"] = "balanced"
    few_labels: int = 64
    many_labels_regime: Literal["full", "lora"] = "full"
    few_labels_regime: Literal["contrastive", "linear_probe"] = "contrastive"
    contrastive_epochs: int | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.regime not in REGIMES:
            problems.append(f"regime must be one of {REGIMES}, got {self.regime!r}")
        if self.freeze_blocks < 0:
            problems.append(f"freeze_blocks must be >= 0, got {self.freeze_blocks}")
        if self.freeze_blocks and self.regime != "full":
            problems.append(f"freeze_blocks goes with regime 'full' (the {self.regime} "
                            "regime already freezes the backbone)")
        if self.layer_decay is not None and not 0 < self.layer_decay <= 1:
            problems.append(f"layer_decay must be in (0, 1], got {self.layer_decay}")
        if self.head_lr is not None and not self.head_lr > 0:
            problems.append(f"head_lr must be > 0, got {self.head_lr}")
        if self.lora_rank < 1:
            problems.append(f"lora_rank must be >= 1, got {self.lora_rank}")
        if self.probe_cs is not None and (not self.probe_cs
                                          or not all(c > 0 for c in self.probe_cs)):
            problems.append(f"probe_cs must be a non-empty list of C > 0, got {self.probe_cs}")
        if self.probe_folds < 2:
            problems.append(f"probe_folds must be >= 2, got {self.probe_folds}")
        if self.probe_class_weight not in ("balanced", "none"):
            problems.append(f"probe_class_weight must be 'balanced' or 'none', got "
                            f"{self.probe_class_weight!r}")
        if self.few_labels < 0:
            problems.append(f"few_labels must be >= 0, got {self.few_labels}")
        if self.many_labels_regime not in MANY_LABELS_REGIMES:
            problems.append(f"many_labels_regime must be one of {MANY_LABELS_REGIMES}, got "
                            f"{self.many_labels_regime!r}")
        if self.few_labels_regime not in FEW_LABELS_REGIMES:
            problems.append(f"few_labels_regime must be one of {FEW_LABELS_REGIMES}, got "
                            f"{self.few_labels_regime!r}")
        if self.contrastive_epochs is not None and self.contrastive_epochs < 1:
            problems.append(f"contrastive_epochs must be >= 1 or null, got "
                            f"{self.contrastive_epochs}")
        if problems:
            raise ValueError("finetune: " + "; ".join(problems))

    @classmethod
    def of(cls, value: FinetuneConfig | dict[str, Any] | None) -> FinetuneConfig:
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = sorted(set(value) - set(cls.__dataclass_fields__))
            if unknown:
                raise ValueError(f"finetune: unknown key(s) {unknown}; keys: "
                                 f"{sorted(cls.__dataclass_fields__)}")
            return cls(**value)
        raise ValueError(f"finetune must be a mapping of FinetuneConfig keys, got {value!r}")


def is_head(name: str, heads: tuple[str, ...]) -> bool:
    """Whether parameter ``name`` belongs to one of the top-level modules ``heads``."""
    return name.split(".", 1)[0] in heads


def _is_embedding(name: str) -> bool:
    parts = name.split(".")
    return any("embed" in p or p.endswith("_token") or p in ("pos_table", "norm_pre")
               for p in parts[:-1] or parts)


def _towers(model: nn.Module) -> dict[str, int]:
    """prefix -> number of blocks, for every ``blocks.<i>`` stack in ``model``."""
    depth: dict[str, int] = {}
    for name, _ in model.named_parameters():
        m = _BLOCK.match(name)
        if m:
            depth[m.group(1)] = max(depth.get(m.group(1), 0), int(m.group(2)) + 1)
    return depth


def layer_ids(model: nn.Module, heads: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """name -> ``(layer id, L)`` of every parameter (module docstring): 0 for embeddings,
    ``i + 1`` for block ``i``, ``L`` for the final norm, ``L + 1`` for the rest; ``L`` is the
    depth of its tower."""
    towers = _towers(model)
    out = {}
    for name, _ in model.named_parameters():
        m = _BLOCK.match(name)
        if m:
            out[name] = (int(m.group(2)) + 1, towers[m.group(1)])
            continue
        prefixes = [p for p in towers if name.startswith(p)]
        depth = towers[max(prefixes, key=len)] if prefixes else max(towers.values(), default=0)
        emb = _is_embedding(name) and not is_head(name, heads)
        last = name[len(max(prefixes, key=len)) if prefixes else 0:].startswith(
            "transformer.norm.")  # the blocks' final norm goes with the last block (timm)
        out[name] = (0 if emb else depth if last else depth + 1, depth)
    return out


def choose_regime(config: FinetuneConfig, examples: int | None, classes: int,
                  solvable: bool = True) -> tuple[FinetuneConfig, str]:
    """The regime ``auto`` stands for, from the labelled training set's size, and why.

    Few labels (``examples / classes <= few_labels``): ``few_labels_regime``, by default
    ``contrastive`` (SetFit's recipe: pairs of examples tune the body, then the solved
    probe; BENCHMARKS.md "Learning curves on real weights": the shipped text default is
    level with SetFit at 8 labelled texts a class on two real tasks), or the solved
    ``linear_probe`` alone. More: ``many_labels_regime``.
    A model whose head cannot be solved (not one ``nn.Linear`` with a bias) takes
    ``many_labels_regime`` whatever the count, as does data whose size is unknown
    (``examples`` None: a loader without a length). A config that is not ``auto`` is
    returned as it is, with an empty reason."""
    if config.regime != "auto":
        return config, ""
    if examples is None:
        regime = config.many_labels_regime
        return (replace(config, regime=regime),
                f"finetune: regime auto -> {regime} (the training data has no length to count)")
    per_class = examples / max(classes, 1)
    few = per_class <= config.few_labels
    regime = config.few_labels_regime if few and solvable else config.many_labels_regime
    why = (f"{examples} labelled training examples, {per_class:.1f} a class "
           f"{'<=' if few else '>'} few_labels {config.few_labels}")
    if few and not solvable:
        why += (f"; the model's head cannot be solved ({config.few_labels_regime} needs one "
                "linear head)")
    return replace(config, regime=regime), f"finetune: regime auto -> {regime} ({why})"


def apply_regime(model: nn.Module, config: FinetuneConfig, heads: tuple[str, ...]) -> None:
    """Freeze / wrap ``model`` in place for ``config``'s regime (module docstring)."""
    head = [n for n, _ in model.named_modules() if n and n.split(".")[0] in heads and
            "." not in n]
    head_params = [n for n, _ in model.named_parameters() if is_head(n, heads)]
    if config.regime == "linear_probe":
        if not head_params:
            raise ValueError(f"finetune: linear_probe trains the head, and "
                             f"{type(model).__name__} has none (no {', '.join(heads)})")
        for name, p in model.named_parameters():
            p.requires_grad_(is_head(name, heads))
    elif config.regime == "contrastive":  # the body trains; the head is solved
        if not head_params:
            raise ValueError(f"finetune: contrastive fits a head, and "
                             f"{type(model).__name__} has none (no {', '.join(heads)})")
        for name, p in model.named_parameters():
            p.requires_grad_(not is_head(name, heads))
    elif config.regime == "lora":
        apply_lora(model, config.lora_rank, config.lora_alpha, tuple(config.lora_targets),
                   dropout=config.lora_dropout, trainable=tuple(head))
    elif config.freeze_blocks:
        ids = layer_ids(model, heads)
        depth = max((d for _, d in ids.values()), default=0)
        if config.freeze_blocks > depth:
            raise ValueError(f"finetune: freeze_blocks={config.freeze_blocks} but "
                             f"{type(model).__name__} has {depth} blocks")
        for name, p in model.named_parameters():
            if ids[name][0] <= config.freeze_blocks:  # embeddings (0) and blocks 1..k
                p.requires_grad_(False)


def merged_model(model: nn.Module) -> nn.Module:
    """``model`` with its LoRA adapters folded in (a copy), or ``model`` itself."""
    return merge_lora(model) if lora_layers(model) else model


def lora_settings(model: nn.Module) -> dict[str, Any] | None:
    return getattr(model, "_lora_settings", None)
