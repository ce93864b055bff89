"""bf16 autocast (what ``precision: bf16-mixed`` runs: bf16 matmuls, fp32 weights) stays
close to fp32 on every model family: the forward output and the weight gradients of one
small model per family, under ``torch.autocast("cpu", dtype=torch.bfloat16)``, against the
same model in fp32. bf16 keeps 8 significant bits (unit roundoff u = 2**-8 ~ 3.9e-3); a few
layers of rounded matmuls give a relative error of a few u (measured 1.1-2.0 u on these
models, outputs and gradients alike), so the stated tolerance is

    ||y_bf16 - y_fp32|| / ||y_fp32|| <= 0.02   (outputs, ~5 u)
    ||g_bf16 - g_fp32|| / ||g_fp32|| <= 0.03   (all weight gradients as one vector, ~8 u)

and the error must be nonzero (autocast really ran in bf16). bf16 autocast runs on any x86
CPU (emulated without avx512_bf16 / AMX): slow, but these models are tiny."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch import nn

import multimodal as mm

OUT_TOL = 0.02
GRAD_TOL = 0.03
FAMILIES = ["ViT", "TextDecoder", "TextEncoder", "Seq2Seq", "Captioner", "AudioClassifier",
            "ImageGPT", "CLIP"]


def _small(config: Any) -> Any:
    """``config`` with a 2-layer, 64-wide backbone in every part and small images."""
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name == "backbone":
            changes["backbone"] = dataclasses.replace(value, depth=2, dim=64, heads=2,
                                                      mlp_dim=128)
        elif dataclasses.is_dataclass(value):
            changes[f.name] = _small(value)
    if hasattr(config, "grid_size"):  # a ViT: 32 px images, 8 px patches (16 tokens)
        changes.update(image_size=32, patch_size=8)
    if hasattr(config, "num_pixels"):  # ImageGPT: 8 x 8 pixels
        changes["image_size"] = 8
    if "memory_dim" in {f.name for f in dataclasses.fields(config)} \
            and config.memory_dim is not None:
        changes["memory_dim"] = 64
    if "embed_dim" in {f.name for f in dataclasses.fields(config)}:
        changes["embed_dim"] = 64
    return dataclasses.replace(config, **changes)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _run(model: nn.Module, inputs: tuple[torch.Tensor, ...], weights: torch.Tensor | None,
         bf16: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Output (fp32 copy), the loss ``sum(output * weights)`` and all weight gradients."""
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = model(*inputs)
    out = out.float()
    if weights is None:
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out * weights).sum().backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return out.detach(), weights, grads


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_autocast_forward_backward_close_to_fp32(family: str) -> None:
    torch.manual_seed(0)
    cls = getattr(mm, family)
    model = cls(_small(cls.config_class())).train()
    for m in model.modules():  # dropout off: the two runs must see the same network
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    inputs = model.example_inputs(4)
    out32, weights, grads32 = _run(model, inputs, None, bf16=False)
    out16, _, grads16 = _run(model, inputs, weights, bf16=True)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # fp32 weights stay
    out_err, grad_err = _relative(out16, out32), _relative(grads16, grads32)
    assert 0 < out_err <= OUT_TOL, f"{family}: output relative error {out_err:.4f}"
    assert 0 < grad_err <= GRAD_TOL, f"{family}: gradient relative error {grad_err:.4f}"
