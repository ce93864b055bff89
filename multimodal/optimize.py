"""Faster encoder inference on a CPU: a compiled forward, a measured precision, and int8
dynamic quantisation of the Linear layers.

Functions on a model, each returning the model to use:

- :func:`compile_encoder`: the methods an encoder is called through (``forward``,
  ``forward_features``, CLIP's ``encode_image`` / ``encode_text``) replaced on the instance
  by their ``torch.compile`` (inductor) versions; outputs equal to eager up to fp32
  rounding. :func:`uncompile_encoder` undoes it.
- :func:`with_precision`: the same methods under CPU bf16 autocast (``"bf16"``) or as they
  are (``"fp32"``); :func:`choose_inference_precision` times both on an example batch and
  keeps bf16 only where the CPU computes it natively (:func:`multimodal.precision.
  native_bf16`) AND it measured faster, the rule training precision follows.
- :func:`quantize_int8`: a copy whose ``nn.Linear`` layers are dynamically quantised
  (int8 weights, activations quantised per call; CPU only; ``quantize="dynamic-int8"``),
  and :func:`output_cosine`, the cosine similarity of its outputs to fp32, which must
  reach :data:`INT8_MIN_COSINE` for int8 to be offered as a default anywhere.
- ``quantize="int8" | "int4"``: weight-only (:mod:`multimodal.nn.quantized`, the same
  packed layers as ``generate(..., quantize=...)``; activations stay floating point): a
  copy sharing the model's other tensors.
- :func:`optimize_encoder`: the three in order (quantise, precision, compile).
"""

from __future__ import annotations

import copy
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from multimodal.precision import native_bf16

ENCODER_METHODS = ("forward", "forward_features", "encode_image", "encode_text")
"""The methods an encoder is called through (hub.Encoder calls ``forward_features``, or
``encode_image`` / ``encode_text`` for an image-text model)."""
QUANTIZE_MODES = ("int8", "int4", "dynamic-int8")
"""Weight-only int8 / int4 (:mod:`multimodal.nn.quantized`), or torch.ao's dynamic int8."""
PRECISIONS = ("fp32", "bf16")
INT8_MIN_COSINE = 0.999
"""Smallest output cosine similarity to fp32 at which int8 may be a default."""

_ORIGINAL = "_optimize_original_methods"


def _methods(model: nn.Module, methods: Sequence[str] | None) -> list[str]:
    names = [m for m in (methods or ENCODER_METHODS) if callable(getattr(model, m, None))]
    unknown = [m for m in (methods or ()) if not callable(getattr(model, m, None))]
    if unknown:
        raise ValueError(f"{type(model).__name__} has no method {unknown[0]!r} to optimise "
                         f"(it has: {[m for m in ENCODER_METHODS if hasattr(model, m)]})")
    return names


def _replace(model: nn.Module, name: str, fn: Callable[..., Any]) -> None:
    """Shadow ``model.name`` by ``fn`` on the instance, remembering the class's method."""
    originals = model.__dict__.setdefault(_ORIGINAL, {})
    originals.setdefault(name, getattr(model, name))
    model.__dict__[name] = fn


def uncompile_encoder(model: nn.Module) -> nn.Module:
    """Undo :func:`compile_encoder` / :func:`with_precision`: the class's methods again."""
    for name in model.__dict__.pop(_ORIGINAL, {}):
        model.__dict__.pop(name, None)
    return model


def compile_encoder(model: nn.Module, methods: Sequence[str] | None = None, *,
                    dynamic: bool | None = None, mode: str | None = None) -> nn.Module:
    """Compile ``model``'s encoder methods (default :data:`ENCODER_METHODS` that exist) with
    ``torch.compile`` in place; returns ``model`` in eval mode. Each new input shape
    compiles once (``dynamic=None``: from the second shape on, one graph with symbolic
    sizes); the first call of a shape is slow, later calls replay. Raises ``RuntimeError``
    where torch.compile cannot run here (no dynamo, no C++ compiler for a CPU model)."""
    from multimodal.generation import compile_unavailable

    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    reason = compile_unavailable(device)
    if reason is not None:
        raise RuntimeError(f"compile_encoder: {reason}")
    model.eval()
    for name in _methods(model, methods):
        current = getattr(model, name)
        _replace(model, name, torch.compile(current, dynamic=dynamic, mode=mode))
    return model


def with_precision(model: nn.Module, precision: str,
                   methods: Sequence[str] | None = None) -> nn.Module:
    """Run ``model``'s encoder methods in ``precision``: ``"fp32"`` (unchanged) or
    ``"bf16"`` (CPU / CUDA autocast to bfloat16: matmuls in bf16, weights kept fp32,
    outputs returned as fp32). In place; returns ``model``."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "fp32":
        return model
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    for name in _methods(model, methods):
        inner = getattr(model, name)

        def bf16(*args: Any, _inner: Callable[..., Any] = inner, **kwargs: Any) -> Any:
            with torch.autocast(device.type, dtype=torch.bfloat16):
                out = _inner(*args, **kwargs)
            return out.float() if isinstance(out, Tensor) and out.is_floating_point() else out

        _replace(model, name, bf16)
    return model


def time_call(fn: Callable[[], Any], repeats: int = 5, warmup: int = 1) -> float:
    """Median seconds of ``fn()`` after ``warmup`` calls, under inference mode."""
    with torch.inference_mode():
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def choose_inference_precision(model: nn.Module, example: Any, *,
                               method: str = "forward_features", repeats: int = 3,
                               bf16: bool | None = None,
                               margin: float = 0.05) -> tuple[str, dict[str, float]]:
    """``("fp32" | "bf16", {"fp32": s, "bf16": s})``: the precision that ran ``model.method
    (example)`` faster (interleaved medians of ``repeats``), bf16 only where the CPU has
    native bf16 (``bf16``, default detected) and it is faster by more than ``margin``.
    Without native bf16 nothing is timed (emulated bf16 measured 4-10x slower)."""
    if bf16 is None:
        bf16 = native_bf16()
    fn = getattr(model, method)
    args = example if isinstance(example, tuple) else (example,)
    if not bf16:
        return "fp32", {}
    times: dict[str, list[float]] = {"fp32": [], "bf16": []}
    with torch.inference_mode():
        for i in range(repeats + 1):
            for name in times:
                ctx = torch.autocast("cpu", dtype=torch.bfloat16) if name == "bf16" \
                    else nullcontext()
                start = time.perf_counter()
                with ctx:
                    fn(*args)
                if i:  # the first round warms up
                    times[name].append(time.perf_counter() - start)
    med = {name: statistics.median(t) for name, t in times.items()}
    best = "bf16" if med["bf16"] < (1 - margin) * med["fp32"] else "fp32"
    return best, med


def _check_quantizable(model: nn.Module, mode: str) -> None:
    if mode not in QUANTIZE_MODES and mode != "int8":
        raise ValueError(f"quantize must be one of {QUANTIZE_MODES} (or None), got {mode!r}")
    engines = torch.backends.quantized.supported_engines
    if not any(e in engines for e in ("x86", "fbgemm", "qnnpack", "onednn")):
        raise RuntimeError(f"quantize='int8': this torch build has no quantised CPU engine "
                           f"(supported_engines={engines})")
    devices = {p.device.type for p in model.parameters()}
    if devices - {"cpu"}:
        raise ValueError(f"quantize='int8' is dynamic quantisation for CPU inference; the "
                         f"model is on {sorted(devices)}: move it to the CPU first")
    if any(p.dtype != torch.float32 for p in model.parameters()):
        raise ValueError("quantize='int8' starts from fp32 weights; the model holds "
                         f"{sorted({str(p.dtype) for p in model.parameters()})}")
    linears = 0
    for name, module in model.named_modules():
        if type(module) is nn.Linear:
            linears += 1
        elif isinstance(module, nn.Linear) or (
                type(module).__name__.endswith("Linear") and hasattr(module, "base")):
            raise ValueError(f"quantize='int8' supports plain nn.Linear layers only; "
                             f"{name or 'the model'} is a {type(module).__name__} (merge "
                             "LoRA adapters first: multimodal.nn.lora.merge_lora)")
    if linears == 0:
        raise ValueError(f"quantize='int8': {type(model).__name__} has no nn.Linear layer "
                         "to quantise")


def quantize_int8(model: nn.Module) -> nn.Module:
    """A copy of ``model`` (eval mode) whose ``nn.Linear`` layers hold int8 weights
    (one scale per output channel) and quantise their input per call (one scale per
    tensor): ``y = s_x s_w (q_x q_w^T) + b``
    with ``q = round(x / s) + z`` (``torch.ao`` dynamic quantisation). CPU only; other
    layers (norms, attention, convolutions) stay fp32. The original is untouched.
    Measured on the real all-MiniLM-L6-v2: output cosine to fp32 0.94 (per-tensor weight
    scales: 0.89, transformers' own model the same): BERT's outlier activation channels
    defeat one activation scale per tensor, so int8 is no default for real text encoders.
    Clear errors for a non-CPU or non-fp32 model, LoRA-wrapped Linears, no Linear at all,
    or a torch without a quantised engine."""
    _check_quantizable(model, "int8")
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    quantized = copy.deepcopy(model).eval()
    uncompile_encoder(quantized)
    with warnings.catch_warnings():  # torch.ao's notice that the API moves to torchao
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        return quantize_dynamic(quantized, {nn.Linear: per_channel_dynamic_qconfig},
                                dtype=torch.qint8, inplace=True)


def output_cosine(reference: Callable[..., Tensor], candidate: Callable[..., Tensor],
                  *inputs: Any) -> float:
    """The smallest cosine similarity, over the batch, between the flattened outputs of
    ``reference(*inputs)`` and ``candidate(*inputs)`` (one number per input row)."""
    with torch.inference_mode():
        a, b = reference(*inputs).float(), candidate(*inputs).float()
    if a.shape != b.shape:
        raise ValueError(f"outputs differ in shape: {tuple(a.shape)} vs {tuple(b.shape)}")
    return float(F.cosine_similarity(a.flatten(1), b.flatten(1), dim=1).min())


def optimize_encoder(model: nn.Module, *, compile: bool = False, precision: str = "fp32",
                     quantize: str | None = None, example: Any = None,
                     methods: Sequence[str] | None = None) -> nn.Module:
    """``model`` made faster for inference: ``quantize`` (``"int8"`` / ``"int4"``:
    weight-only packed Linears, :func:`multimodal.nn.quantized.quantized_copy`;
    ``"dynamic-int8"``: :func:`quantize_int8`; a copy either way), then ``precision``
    (``"fp32"``, ``"bf16"``, or ``"auto"``: timed on ``example`` by
    :func:`choose_inference_precision`, fp32 without an example), then ``compile``
    (:func:`compile_encoder`). Quantised models combine with fp32 only (their kernels
    choose their own arithmetic)."""
    if quantize is not None:
        if quantize not in QUANTIZE_MODES:
            raise ValueError(f"quantize must be one of {QUANTIZE_MODES} (or None), "
                             f"got {quantize!r}")
        if precision == "bf16":
            raise ValueError(f"quantize={quantize!r} runs its own kernels: combine it with "
                             "precision='fp32' (or 'auto'), not 'bf16'")
        if quantize == "dynamic-int8":
            model = quantize_int8(model)
        else:
            from multimodal.nn.quantized import quantized_copy

            model = uncompile_encoder(quantized_copy(model, quantize))
        precision = "fp32"
    if precision == "auto":
        precision = "fp32" if example is None else choose_inference_precision(
            model, example, method=(methods or ["forward_features"])[0])[0]
    model = with_precision(model.eval(), precision, methods)
    if compile:
        model = compile_encoder(model, methods)
    return model
