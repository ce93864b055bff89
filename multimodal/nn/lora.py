"""Low-rank adaptation (LoRA, Hu et al., 2021) of the Linear layers of any model.

A wrapped Linear computes ``y = W x + b + (alpha / r) B A x`` with ``A`` (r, in) and
``B`` (out, r). ``B`` starts at zero, so a freshly wrapped model gives exactly the
outputs it gave before; training updates only ``A`` and ``B`` (r (in + out) numbers
instead of in * out). ``merge_lora`` folds the update into a plain Linear,
``W' = W + (alpha / r) B A``, so the fine-tuned model costs nothing extra at inference.

>>> apply_lora(vit, rank=8, alpha=16, targets=("qkv", "proj"), trainable=("head",))
>>> ...train...
>>> save_lora(vit, "adapters.safetensors")      # only the adapters (and trainable extras)
>>> plain = merge_lora(vit)
"""

from __future__ import annotations

import copy
import fnmatch
import json
import math
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor, nn

from multimodal.weights import load_safetensors, save_safetensors


class LoRALinear(nn.Module):
    """``base(x) + (alpha / rank) * B(A(dropout(x)))`` around a frozen ``nn.Linear``.

    Works unchanged on a fused ``qkv`` projection: the low-rank update spans all three
    output blocks (as in the original paper's fused-projection variant).
    """

    def __init__(self, base: nn.Linear, rank: int = 8, alpha: float = 16.0,
                 dropout: float = 0.0) -> None:
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise ValueError(f"LoRALinear wraps an nn.Linear, got {type(base).__name__}")
        if rank < 1:
            raise ValueError(f"rank must be >= 1, got {rank}")
        self.base = base
        self.rank = rank
        self.alpha = float(alpha)
        self.scaling = self.alpha / rank
        factory = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, **factory))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, **factory))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # as nn.Linear's weight
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def delta_weight(self) -> Tensor:
        """The update ``(alpha / r) B A`` (out, in)."""
        return (self.lora_B @ self.lora_A) * self.scaling

    def forward(self, x: Tensor) -> Tensor:
        update = self.dropout(x) @ self.lora_A.t() @ self.lora_B.t()
        return self.base(x) + update * self.scaling

    def merged(self) -> nn.Linear:
        """A plain Linear with ``W + (alpha / r) B A`` and the same bias."""
        base = self.base
        out = nn.Linear(base.in_features, base.out_features, bias=base.bias is not None,
                        device=base.weight.device, dtype=base.weight.dtype)
        with torch.no_grad():
            out.weight.copy_(base.weight + self.delta_weight().to(base.weight.dtype))
            if base.bias is not None:
                out.bias.copy_(base.bias)
        return out

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha}"


def _matches(name: str, patterns: Sequence[str]) -> bool:
    """``name`` (a dotted module path) matches a pattern equal to its last component
    (``"qkv"``), a dotted suffix (``"attn.proj"``) or a glob (``"transformer.blocks.1*"``)."""
    return any(
        name == p or name.endswith("." + p) or fnmatch.fnmatchcase(name, p) for p in patterns
    )


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}


def apply_lora(
    model: nn.Module,
    rank: int = 8,
    alpha: float = 16.0,
    targets: Sequence[str] = ("qkv", "proj"),
    *,
    dropout: float = 0.0,
    trainable: Sequence[str] = (),
) -> nn.Module:
    """Wrap every ``nn.Linear`` whose name matches ``targets`` in a :class:`LoRALinear`
    (in place) and freeze every other parameter, except those of the modules named in
    ``trainable`` (e.g. ``("head",)`` to train a new classifier too). Returns ``model``.

    ``targets`` entries match the last name component (``"qkv"``, ``"fc1"``), a dotted
    suffix (``"attn.proj"``) or a glob over the full name. Only Linears are wrapped, so
    ``"proj"`` leaves the patch-embedding convolution ``patch_embed.proj`` alone.
    """
    if rank < 1:
        raise ValueError(f"rank must be >= 1, got {rank}")
    if isinstance(targets, str):
        targets = (targets,)
    if lora_layers(model):
        raise ValueError("this model already has LoRA layers; merge_lora it first")
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    chosen = [n for n in linears if _matches(n, targets)]
    if not chosen:
        shown = sorted({n.rsplit(".", 1)[-1] for n in linears})
        raise ValueError(f"no nn.Linear matches targets {tuple(targets)}; "
                         f"Linear names in this model: {shown}")
    extra = [n for n, _ in model.named_modules() if n and _matches(n, trainable)]
    missing = [t for t in trainable if not any(_matches(n, (t,)) for n in extra)]
    if missing:
        raise ValueError(f"trainable={tuple(trainable)}: no module named {missing} in "
                         f"{type(model).__name__}")
    for p in model.parameters():
        p.requires_grad_(False)
    for name in chosen:
        _set_module(model, name, LoRALinear(model.get_submodule(name), rank, alpha, dropout))
    for name in extra:
        for p in model.get_submodule(name).parameters():
            p.requires_grad_(True)
    for layer in lora_layers(model).values():
        layer.base.requires_grad_(False)
        layer.lora_A.requires_grad_(True)
        layer.lora_B.requires_grad_(True)
    model._lora_settings = {"rank": rank, "alpha": float(alpha), "targets": list(targets),
                            "trainable": list(trainable), "dropout": dropout}
    return model


def merge_lora(model: nn.Module, inplace: bool = False) -> nn.Module:
    """A plain model: every :class:`LoRALinear` replaced by an ``nn.Linear`` holding
    ``W + (alpha / r) B A``. Every parameter is trainable again. Works on a copy unless
    ``inplace``."""
    layers = lora_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no LoRA layers (call apply_lora first)")
    if not inplace:
        model = copy.deepcopy(model)
        layers = lora_layers(model)
    for name, layer in layers.items():
        _set_module(model, name, layer.merged())
    for p in model.parameters():
        p.requires_grad_(True)
    if hasattr(model, "_lora_settings"):
        del model._lora_settings
    return model


def lora_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The trainable parameters only: every LoRA factor plus the ``trainable`` extras
    (everything with ``requires_grad`` after :func:`apply_lora`)."""
    if not lora_layers(model):
        raise ValueError(f"{type(model).__name__} has no LoRA layers (call apply_lora first)")
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def save_lora(model: nn.Module, path: str | Path) -> Path:
    """Write :func:`lora_state_dict` to a safetensors file, with the LoRA settings as
    metadata so that :func:`load_lora` can wrap a fresh model the same way."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    settings = getattr(model, "_lora_settings", None)
    metadata = {"lora": json.dumps(settings)} if settings else None
    save_safetensors({k: v.contiguous() for k, v in lora_state_dict(model).items()}, path,
                     metadata=metadata)
    return path


def load_lora(model: nn.Module, path: str | Path) -> nn.Module:
    """Load adapters written by :func:`save_lora` into ``model`` (in place).

    A model without LoRA layers is first wrapped with the settings stored in the file.
    Missing, unexpected or mis-shaped adapter tensors are listed in a ValueError.
    """
    state = load_safetensors(path)  # refuses anything that is not safetensors
    if not lora_layers(model):
        with safe_open(str(path), framework="pt") as f:
            meta = (f.metadata() or {}).get("lora")
        if meta is None:
            raise ValueError(f"{path} stores no LoRA settings and the model has no LoRA "
                             "layers: call apply_lora(model, ...) with the training settings "
                             "first")
        settings = json.loads(meta)
        apply_lora(model, settings["rank"], settings["alpha"], tuple(settings["targets"]),
                   dropout=settings.get("dropout", 0.0),
                   trainable=tuple(settings.get("trainable", ())))
    own = dict(model.named_parameters())
    expected = {n for n, p in own.items() if p.requires_grad}
    problems = []
    shapes = [f"{k}: expected {tuple(own[k].shape)}, got {tuple(v.shape)}"
              for k, v in state.items() if k in own and own[k].shape != v.shape]
    if shapes:
        problems.append("mis-shaped: " + "; ".join(shapes))
    if expected - set(state):
        problems.append("missing: " + ", ".join(sorted(expected - set(state))))
    if set(state) - expected:
        problems.append("unexpected: " + ", ".join(sorted(set(state) - expected)))
    if problems:
        raise ValueError(f"{path} does not fit the LoRA layers of {type(model).__name__}: "
                         + " | ".join(problems))
    with torch.no_grad():
        for k, v in state.items():
            own[k].copy_(v)
    return model


__all__ = ["LoRALinear", "apply_lora", "load_lora", "lora_layers", "lora_state_dict",
           "merge_lora", "save_lora"]
