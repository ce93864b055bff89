"""Weight initialisation shared by every model built on the backbone."""

from __future__ import annotations

import math
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn


def off_meta() -> AbstractContextManager:
    """Around what a module computes from its config in ``__init__`` (position tables,
    filter banks, drop-path schedules): while the model is built under
    ``torch.device("meta")`` (a Hugging Face folder is converted without allocating
    parameters, :func:`multimodal.convert.common.build`), these are computed on the CPU and
    keep their values; otherwise nothing changes."""
    return torch.device("cpu") if torch.get_default_device().type == "meta" else nullcontext()


def init_weights(module: nn.Module, conv_fan_in: bool = False) -> None:
    """ViT / GPT-2 style: Linear weights ~ truncated N(0, 0.02^2) with zero bias,
    LayerNorm to the identity. With ``conv_fan_in`` Conv2d weights get
    truncated N(0, 1 / fan_in) and zero bias (otherwise PyTorch's default).
    Use as ``model.apply(init_weights)``."""
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
    elif conv_fan_in and isinstance(module, nn.Conv2d):
        fan_in = module.in_channels * math.prod(module.kernel_size)
        nn.init.trunc_normal_(module.weight, std=1 / math.sqrt(fan_in))
        if module.bias is not None:
            nn.init.zeros_(module.bias)
