"""Pick the training / inference precision that fits the CPU and the model.

bf16 autocast (``"bf16-mixed"``: bf16 matmuls, fp32 weights and optimizer state) pays on a
CPU only where the hardware computes in bf16 natively (``avx512_bf16`` or AMX); elsewhere it
is emulated and slower than fp32. Even with native bf16 it pays only for models large enough
that the GEMMs dominate the casts: the team measured, on a 2-core x86-64 CPU with
``avx512_bf16`` (no AMX), ViT-Tiny/16 at 224 px (width 192, 197 tokens) training 1.55x
faster under bf16 autocast, but the Fashion-MNIST ViT (width 128, 16 tokens) slower
(58 s vs 42 s per epoch). :func:`choose_precision` therefore picks bf16 only when the CPU
has native bf16 AND the model reaches both :data:`BF16_MIN_DIM` and
:data:`BF16_MIN_TOKENS`; ``benchmarks/precision_speed.py`` re-measures the crossover.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
"""/proc/cpuinfo flags of CPUs that compute bf16 dot products natively."""
BF16_MIN_DIM = 192
"""Smallest model width that gets bf16 autocast under ``precision: auto`` (measured: 192)."""
BF16_MIN_TOKENS = 64
"""Smallest sequence length that gets bf16 autocast under ``precision: auto`` (measured
faster at 197 tokens, slower at 16)."""
AUTO = "auto"
"""``precision: auto`` (or leaving ``trainer.precision`` unset): :func:`auto_precision`."""


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU feature flags of the first processor in ``cpuinfo`` (empty if unreadable)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def native_bf16(flags: Iterable[str] | None = None, capability: str | None = None) -> bool:
    """Whether the CPU computes bf16 natively: an ``avx512_bf16`` or ``amx_bf16`` flag, or
    (where the flags cannot be read) a ``torch.backends.cpu.get_cpu_capability()`` that
    names AMX. ``flags`` / ``capability`` default to this machine's."""
    flags = cpu_flags() if flags is None else frozenset(flags)
    if flags:
        return bool(flags & BF16_FLAGS)
    if capability is None:
        capability = torch.backends.cpu.get_cpu_capability()
    return "AMX" in capability.upper()


def choose_precision(dim: int, tokens: int, *, bf16: bool | None = None) -> tuple[str, str]:
    """Lightning precision for a CPU run of a model of width ``dim`` over ``tokens`` tokens
    and the reason, e.g. ``("32-true", "no native bf16 on this CPU")``. ``bf16``: whether
    the CPU has native bf16 (default: :func:`native_bf16`)."""
    if bf16 is None:
        bf16 = native_bf16()
    if not bf16:
        return "32-true", "no native bf16 on this CPU (avx512_bf16 / amx_bf16)"
    if dim < BF16_MIN_DIM or tokens < BF16_MIN_TOKENS:
        return "32-true", (f"native bf16, but the model (width {dim}, {tokens} tokens) is "
                           f"below the bf16 threshold (width >= {BF16_MIN_DIM} and tokens >= "
                           f"{BF16_MIN_TOKENS})")
    return "bf16-mixed", f"native bf16 and a model of width {dim} over {tokens} tokens"


def _node_tokens(node: Any) -> int | None:
    """Tokens one sample puts through the transformer of one model config (duck-typed on
    the config's fields, so that this module never imports the models)."""
    if hasattr(node, "grid_size"):  # ViT: patches (+ class token)
        gh, gw = node.grid_size
        return gh * gw + int(bool(getattr(node, "class_token", False)))
    if hasattr(node, "num_pixels"):  # ImageGPT: one token per pixel
        return int(node.num_pixels)
    if hasattr(node, "n_mels"):  # AudioClassifier: frames of a clip (1 s if unbounded)
        frames = node.max_frames or node.pos_frames
        if node.mode == "patches":
            per_axis = [max(0, (n - node.patch_size) // node.patch_stride + 1)
                        for n in (node.n_mels, frames)]
            return per_axis[0] * per_axis[1]
        return frames // node.stack_frames
    max_len = getattr(node, "max_len", None)  # text
    return int(max_len) if isinstance(max_len, int) else None


def model_shape(config: Any) -> tuple[int, int]:
    """``(width, tokens)`` of the heaviest transformer in a model config: every nested
    config with a ``backbone`` (a ViT, a text tower, both towers of CLIP / an
    encoder-decoder) is one transformer of ``backbone.dim`` over its tokens per sample
    (ViT: patches + class token; ImageGPT: pixels; text: ``max_len``; audio: frames or
    patches of ``max_frames``, else of ``pos_frames``); the one with the largest
    ``width x tokens`` is returned. Raises ``ValueError`` for a config without one."""
    found: list[tuple[int, int]] = []

    def walk(node: Any) -> None:
        if not dataclasses.is_dataclass(node) or isinstance(node, type):
            return
        backbone = getattr(node, "backbone", None)
        tokens = _node_tokens(node)
        if backbone is not None and tokens is not None:
            found.append((int(backbone.dim), tokens))
        for f in dataclasses.fields(node):
            if f.name != "backbone":
                walk(getattr(node, f.name))

    walk(config)
    if not found:
        raise ValueError(f"{type(config).__name__} has no transformer backbone whose width "
                         "and sequence length precision='auto' could read; set "
                         "trainer.precision explicitly (32-true or bf16-mixed)")
    return max(found, key=lambda shape: shape[0] * shape[1])


def auto_precision(config: Any, accelerator: str = "auto", *, bf16: bool | None = None,
                   cuda: bool | None = None, cuda_bf16: bool | None = None
                   ) -> tuple[str, str]:
    """Lightning precision for a run of a model with ``config`` on ``accelerator``
    ("cpu", "gpu" / "cuda", or "auto": the GPU when CUDA is available), and the reason.

    * GPU: ``bf16-mixed`` where the GPU supports bf16 (``torch.cuda.is_bf16_supported``),
      else ``32-true``;
    * CPU: :func:`choose_precision` on :func:`model_shape` (bf16 only with native bf16 and
      a model above the measured size threshold); a config without a readable shape
      (the RNN baselines) gets ``32-true``.

    ``bf16`` / ``cuda`` / ``cuda_bf16``: this machine's CPU bf16, CUDA availability and GPU
    bf16 support, detected when None (tests pass them)."""
    accelerator = str(accelerator).lower()
    if accelerator not in ("cpu", "gpu", "cuda", "auto"):
        return "32-true", f"accelerator {accelerator!r}: no automatic rule, fp32"
    if accelerator == "auto":
        if cuda is None:
            cuda = torch.cuda.is_available()
        accelerator = "gpu" if cuda else "cpu"
    if accelerator in ("gpu", "cuda"):
        if cuda_bf16 is None:
            cuda_bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        if cuda_bf16:
            return "bf16-mixed", "GPU with bf16 support"
        return "32-true", "GPU without bf16 support"
    try:
        dim, tokens = model_shape(config)
    except ValueError:
        return "32-true", (f"CPU, and {type(config).__name__} has no transformer shape for "
                           "the bf16 rule")
    precision, reason = choose_precision(dim, tokens, bf16=bf16)
    return precision, f"CPU: {reason}"
