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
What a run of the ``multimodal`` command uses is decided from these by
:func:`multimodal.cli.precision.auto_precision`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
"""/proc/cpuinfo flags of CPUs that compute bf16 dot products natively."""
BF16_MIN_DIM = 192
"""Smallest model width that gets bf16 autocast under ``precision: auto`` (measured: 192)."""
BF16_MIN_TOKENS = 64
"""Smallest sequence length that gets bf16 autocast under ``precision: auto`` (measured
faster at 197 tokens, slower at 16)."""


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
