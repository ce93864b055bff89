"""The small layers of the backbone's blocks: activations by name, the plain and the gated
MLP, RMSNorm, LayerScale and stochastic depth (DropPath). :mod:`multimodal.nn.block` stacks
them into Blocks; :mod:`multimodal.nn.step` runs them one token at a time."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor, nn

__all__ = ["ACTIVATIONS", "MLP", "ActLayer", "DropPath", "GatedMLP", "LayerScale", "NormLayer",
           "QuickGELU", "RMSNorm"]

NormLayer = Callable[[int], nn.Module]
ActLayer = Callable[[], nn.Module]


class QuickGELU(nn.Module):
    """``x * sigmoid(1.702 x)``: the GELU approximation OpenAI's CLIP was trained with."""

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.sigmoid(1.702 * x)


ACTIVATIONS: dict[str, ActLayer] = {
    "gelu": nn.GELU,
    "gelu_tanh": partial(nn.GELU, approximate="tanh"),
    "relu": nn.ReLU,
    "silu": nn.SiLU,
    "quick_gelu": QuickGELU,
}


class MLP(nn.Module):
    """Position-wise feed-forward ``fc2(act(fc1(x)))``, applied to each token alone."""

    def __init__(
        self, dim: int, hidden_dim: int, act_layer: ActLayer = nn.GELU, dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim, bias=bias)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_dim, dim, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class GatedMLP(nn.Module):
    """Gated feed-forward (Shazeer, 2020): ``fc2(act(gate(x)) * up(x))``.

    With ``act_layer=nn.SiLU`` this is SwiGLU (Llama, Mistral), with GELU GeGLU (Gemma,
    T5 v1.1).
    """

    def __init__(
        self, dim: int, hidden_dim: int, act_layer: ActLayer = nn.SiLU, dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, hidden_dim, bias=bias)
        self.up = nn.Linear(dim, hidden_dim, bias=bias)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_dim, dim, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.gate(x)) * self.up(x))))


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dim (Zhang & Sennrich, 2019).

    Computed in float32 and cast back, as Llama does.
    """

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


class LayerScale(nn.Module):
    """``x * gamma``: a learned per-channel scale of a residual branch (CaiT, DINOv2)."""

    def __init__(self, dim: int, init: float = 1e-5) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(init)))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


class DropPath(nn.Module):
    """Stochastic depth: drop a whole residual branch per sample with probability ``p``."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(1.0 - self.p)
        return x * keep / (1.0 - self.p)
