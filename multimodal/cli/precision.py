"""The precision of a ``multimodal`` run: ``trainer.precision`` unset (or ``"auto"``) picks
it from the accelerator and the model's config.

On a GPU: bf16 autocast where the GPU supports bf16. On a CPU:
:func:`multimodal.precision.choose_precision` on the model's width and tokens per sample
(:func:`model_shape`), i.e. bf16 only with native bf16 and a model above the measured size
threshold (docs/precision.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from multimodal.precision import choose_precision

AUTO = "auto"
"""``precision: auto`` (or leaving ``trainer.precision`` unset): :func:`auto_precision`."""


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


TF32_ENV = "MULTIMODAL_TF32"
"""``0`` keeps fp32 matmuls in full fp32 on a GPU (``torch.set_float32_matmul_precision
("highest")``); ``1`` or unset lets them use TF32 tensor cores (``"high"``)."""


def matmul_precision(accelerator: str = "auto", *, cuda: bool | None = None,
                     env: str | None = None) -> tuple[str | None, str]:
    """``torch.set_float32_matmul_precision`` for a run on ``accelerator`` and the reason
    (one log line): ``"high"`` (TF32 tensor cores for fp32 matmuls, a 10-bit mantissa in
    the products, fp32 accumulation) on a CUDA GPU unless :data:`TF32_ENV` is ``0``
    (``"highest"``); None (leave torch's setting) on a CPU. ``cuda`` / ``env``: CUDA
    availability and the variable's value, read when None (tests pass them)."""
    accelerator = str(accelerator).lower()
    if cuda is None:
        cuda = torch.cuda.is_available()
    if accelerator not in ("gpu", "cuda", "auto") or not cuda:
        return None, "no CUDA GPU in use"
    if env is None:
        import os

        env = os.environ.get(TF32_ENV, "1")
    value = env.strip().lower()
    if value in ("0", "false", "no", "off"):
        return "highest", f"{TF32_ENV}={env}: fp32 matmuls in full fp32"
    if value not in ("1", "true", "yes", "on", ""):
        raise ValueError(f"{TF32_ENV} must be 1 or 0, got {env!r}")
    return "high", f"TF32 tensor cores for fp32 matmuls; {TF32_ENV}=0 turns them off"


def unused_gpu(accelerator: str, *, cuda: bool | None = None) -> str | None:
    """The line a run on the CPU logs when a CUDA GPU is there (None otherwise)."""
    if cuda is None:
        cuda = torch.cuda.is_available()
    if cuda and str(accelerator).lower() == "cpu":
        return ("GPU left unused: trainer.accelerator is cpu (--trainer.accelerator auto "
                "trains on the GPU)")
    return None
