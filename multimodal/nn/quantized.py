"""Weight-only quantised Linear layers for CPU decoding: the weights stay packed (int8 or
int4) and are multiplied by PyTorch's own packed kernels; activations stay floating point.

At batch 1 a decoder is bound by the bytes of weights it reads per token, so storing
them in 8 or 4 bits is what makes decoding faster (fp32: 4 bytes a weight; int8: 1;
int4: 0.5, plus the scales).

Formats (``W`` is a Linear's ``(out, in)`` weight):

- ``int8``: one scale per output channel (row), symmetric:
  ``W[n, k] = s[n] q[n, k]`` with ``q`` in ``[-128, 127]``, ``s[n] = max_k |W[n, k]| / 127``.
  Kernel: ``torch.ops.aten._weight_int8pack_mm(x, q, s)`` = ``x (s q)^T``.
- ``int4``: groups of ``group_size`` consecutive inputs per row (32 by default, as
  GGUF's blocks), asymmetric: ``W[n, k] = (q[n, k] - 8) s[n, g] + z[n, g]`` with
  ``q`` in ``[0, 15]`` and ``g = k // group_size`` (the meaning of ``qScaleAndZeros`` in
  ``torch.ops.aten._weight_int4pack_mm_for_cpu``, checked against the float product in
  tests/nn/test_quantized.py). Quantising a float group of minimum ``lo`` and maximum
  ``hi``: ``s = (hi - lo) / 15``, ``z = lo + 8 s``, ``q = round((W - lo) / s)``. The
  values are packed by ``torch.ops.aten._convert_weight_to_int4pack_for_cpu`` (two a
  byte, in the kernel's own tiled layout), which needs ``out % 16 == 0`` and
  ``in % group_size == 0``: a Linear of another shape gets int8 instead.

Why these kernels, with **bf16 activations** (measured, benchmarks/decode_roofline.py
``--kernels``, on the 2-core AVX-512 Xeon at SmolLM2-135M's shapes, batch 1): the packed
kernels are fast only for bf16 inputs (their fp32-input path measured 5-30x slower than
a plain fp32 ``F.linear``), so the input is cast to bf16, the kernel accumulates in fp32
and returns bf16, and the result is cast back to the input's dtype (the residual stream
stays fp32). The scales are kept in bf16 for the same reason. torchao's weight-only
configs call the same two aten kernels on a CPU (int4) or dequantise in eager (int8), so
they would add a dependency and no speed.

:func:`quantize_` swaps a model's ``nn.Linear`` layers for :class:`QuantizedLinear` in
place; :func:`quantized_copy` gives (and caches) a quantised view of a model whose
tensors it shares, which is how ``generate(..., quantize=...)`` decodes.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Iterable
from typing import Literal

import torch
from torch import Tensor, nn

__all__ = ["MODES", "QuantizedEmbedding", "QuantizedLinear", "quantize_", "quantize_int4",
           "quantize_int8", "quantized_copy"]

Mode = Literal["int8", "int4"]
#: the weight-only modes
MODES = ("int8", "int4")
#: dtype the packed kernels compute in (their fast path; see the module docstring)
COMPUTE_DTYPE = torch.bfloat16
#: inputs per int4 group (GGUF's block size; the kernel takes 32, 64, 128)
DEFAULT_GROUP_SIZE = 32
_INT4_GROUPS = (32, 64, 128, 256)


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"quantize must be one of {MODES} (or None), got {mode!r}")


# ======================================================================================
# quantisers (float weight -> integer values and scales)
# ======================================================================================


def quantize_int8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """``(q int8 (out, in), s (out,) bf16)`` with ``weight ~= s[:, None] q``; the scale
    is rounded to bf16 before ``q`` is computed, so ``s q`` is what the kernel uses."""
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1) / 127).clamp_min(1e-12).to(COMPUTE_DTYPE)
    q = torch.round(w / scale.float()[:, None]).clamp_(-128, 127).to(torch.int8)
    return q, scale


def quantize_int4(weight: Tensor, group_size: int = DEFAULT_GROUP_SIZE
                  ) -> tuple[Tensor, Tensor, Tensor]:
    """``(q (out, in) int32 in [0, 15], s (out, in / g), z (out, in / g))`` (bf16 scales
    and zeros) with ``weight ~= (q - 8) s + z`` group by group (asymmetric min / max: see
    the module docstring); ``s`` and ``z`` are rounded to bf16 first, so the values are
    chosen for the dequantisation the kernel actually computes."""
    out_f, in_f = weight.shape
    if in_f % group_size:
        raise ValueError(f"int4 groups of {group_size} do not divide in_features={in_f}")
    w = weight.detach().float().reshape(out_f, in_f // group_size, group_size)
    lo, hi = w.amin(dim=-1), w.amax(dim=-1)
    scale = ((hi - lo) / 15).clamp_min(1e-8).to(COMPUTE_DTYPE)
    zero = (lo + 8 * scale.float()).to(COMPUTE_DTYPE)
    s, z = scale.float()[..., None], zero.float()[..., None]
    q = torch.round((w - z) / s + 8).clamp_(0, 15).to(torch.int32)
    return q.reshape(out_f, in_f), scale, zero


def int4_fits(out_features: int, in_features: int, group_size: int) -> bool:
    """Whether the int4 CPU kernel takes a Linear of this shape."""
    return out_features % 16 == 0 and in_features % group_size == 0


# ======================================================================================
# the layers
# ======================================================================================


class QuantizedLinear(nn.Module):
    """``y = x W^T + b`` with ``W`` held packed (see the module docstring for the two
    formats); inputs of any float dtype and any leading shape ``(..., in)``. CPU only (the
    packed layouts are the CPU kernels'). Build with :meth:`from_linear`,
    :meth:`from_int8` or :meth:`from_int4`; :meth:`dequantize` gives ``W`` back in fp32."""

    def __init__(self, in_features: int, out_features: int, mode: Mode,
                 qweight: Tensor, scales: Tensor, bias: Tensor | None = None,
                 group_size: int | None = None) -> None:
        super().__init__()
        check_mode(mode)
        self.in_features, self.out_features, self.mode = in_features, out_features, mode
        self.group_size = group_size
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales)  # int8: (out,); int4: (in / g, out, 2)
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(),
                                                            requires_grad=False)
        #: recompute the largest outputs in fp32 (an LM head: see :meth:`_refine_top`)
        self.refine_top = False

    # --- constructors ------------------------------------------------------------------

    @classmethod
    def from_int8(cls, q: Tensor, scale: Tensor, bias: Tensor | None = None
                  ) -> QuantizedLinear:
        """From int8 values ``q`` (out, in) and per-row scales ``scale`` (out,):
        ``W = scale[:, None] q``."""
        if q.dtype != torch.int8 or q.dim() != 2 or scale.shape != (q.shape[0],):
            raise ValueError(f"int8 weights are q int8 (out, in) and scale (out,), got "
                             f"{q.dtype} {tuple(q.shape)} and {tuple(scale.shape)}")
        return cls(q.shape[1], q.shape[0], "int8", q.contiguous(),
                   scale.to(COMPUTE_DTYPE).contiguous(), bias)

    @classmethod
    def from_int4(cls, q: Tensor, scale: Tensor, zero: Tensor, bias: Tensor | None = None
                  ) -> QuantizedLinear:
        """From values ``q`` (out, in) in ``[0, 15]`` and per-group ``scale``, ``zero``
        (out, in / g): ``W[n, k] = (q[n, k] - 8) scale[n, k // g] + zero[n, k // g]``."""
        out_f, in_f = q.shape
        groups = scale.shape[-1] if scale.dim() == 2 else 0
        if scale.shape != zero.shape or scale.shape[:1] != (out_f,) or groups == 0 \
                or in_f % groups:
            raise ValueError(f"int4 scales / zeros must be (out, in / group) for q "
                             f"{tuple(q.shape)}, got {tuple(scale.shape)} / {tuple(zero.shape)}")
        group_size = in_f // groups
        if group_size not in _INT4_GROUPS or not int4_fits(out_f, in_f, group_size):
            raise ValueError(f"the int4 CPU kernel needs out_features % 16 == 0 and groups of "
                             f"{_INT4_GROUPS}: got ({out_f}, {in_f}) in groups of {group_size}")
        if q.numel() and (int(q.min()) < 0 or int(q.max()) > 15):
            raise ValueError("int4 values must lie in [0, 15]")
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            q.to(torch.int32).contiguous(), 1)
        scales_and_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1) \
            .to(COMPUTE_DTYPE).contiguous()  # (in / g, out, 2), the kernel's layout
        return cls(in_f, out_f, "int4", packed, scales_and_zeros, bias, group_size)

    @classmethod
    def from_linear(cls, linear: nn.Linear, mode: Mode,
                    group_size: int = DEFAULT_GROUP_SIZE) -> QuantizedLinear:
        """``linear`` quantised (int4 falls back to int8 for a shape the kernel refuses:
        ``out % 16 != 0`` or ``in % group_size != 0``)."""
        check_mode(mode)
        w = linear.weight
        if w.device.type != "cpu":
            raise ValueError(f"weight-only quantisation packs for the CPU kernels; the "
                             f"Linear is on {w.device}: move the model to the CPU first")
        if mode == "int4" and group_size not in _INT4_GROUPS:
            raise ValueError(f"group_size must be one of {_INT4_GROUPS}, got {group_size}")
        if mode == "int4" and int4_fits(*w.shape, group_size):
            return cls.from_int4(*quantize_int4(w, group_size), bias=linear.bias)
        return cls.from_int8(*quantize_int8(w), bias=linear.bias)

    # --- use ---------------------------------------------------------------------------

    def forward(self, x: Tensor) -> Tensor:
        if x.device.type != "cpu":
            raise ValueError(f"QuantizedLinear runs on the CPU (packed CPU layout); the "
                             f"input is on {x.device}")
        shape = x.shape
        if shape[-1] != self.in_features:
            raise ValueError(f"expected inputs (..., {self.in_features}), got {tuple(shape)}")
        x2 = x.reshape(-1, self.in_features).to(COMPUTE_DTYPE).contiguous()
        if self.mode == "int8":
            y = torch.ops.aten._weight_int8pack_mm(x2, self.qweight, self.scales)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.qweight, self.group_size,
                                                           self.scales)
        y = y.to(x.dtype if x.is_floating_point() else torch.float32)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        if self.refine_top and self.mode == "int8" and y.dtype == torch.float32:
            y = self._refine_top(x.reshape(-1, self.in_features).float(), y)
        return y.reshape(*shape[:-1], self.out_features)

    def _refine_top(self, x: Tensor, y: Tensor, max_candidates: int = 64) -> Tensor:
        """The outputs within ``2^-6 |max|`` of each row's largest, recomputed in fp32 from
        the int8 rows (``x . (s q_n)``). The kernel returns bf16 (8 significant bits): at a
        logit of 25 its spacing is 0.125, coarser than the margin between the two best
        tokens of a real prompt (0.08 on SmolLM2's chat prompt, where rounding swapped
        them). The tolerance covers the input's and the output's bf16 roundings (2^-8
        each, relative) with a factor 2 to spare; greedy and beam choices among the
        candidates are then those of the int8 weights in fp32."""
        top = y.max(dim=-1, keepdim=True).values
        near = y >= top - top.abs() * 2.0**-6
        if int(near.sum()) > max_candidates * y.shape[0]:  # flat logits: keep the k best
            kth = y.topk(max_candidates, dim=-1).values[:, -1:]
            near = y >= kth
        rows, cols = near.nonzero(as_tuple=True)
        exact = (x[rows] * self.qweight[cols].float()).sum(-1) * self.scales[cols].float()
        if self.bias is not None:
            exact = exact + self.bias[cols]
        y = y.clone()
        y[rows, cols] = exact
        return y

    @torch.no_grad()
    def dequantize(self) -> Tensor:
        """``W`` (out, in) in fp32, exactly as the kernel sees it (fp32 arithmetic on the
        stored values; for int4 the kernel itself applied to the identity)."""
        if self.mode == "int8":
            return self.qweight.float() * self.scales.float()[:, None]
        eye = torch.eye(self.in_features, dtype=torch.float32)
        wt = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.qweight, self.group_size,
                                                        self.scales.float())
        return wt.t().contiguous()

    @property
    def weight_bytes(self) -> int:
        """Bytes read per product: packed values + scales (+ bias)."""
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.scales)) + (
            0 if self.bias is None else self.bias.numel() * 4)

    def extra_repr(self) -> str:
        group = f", group_size={self.group_size}" if self.mode == "int4" else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"mode={self.mode}{group}, bias={self.bias is not None}")


class QuantizedEmbedding(nn.Module):
    """An ``nn.Embedding`` whose table is int8 with one scale per row
    (``E[v] = s[v] q[v]``): a lookup dequantises only the rows asked for. Built from a
    float table (:meth:`from_weight`) or sharing the buffers of an int8
    :class:`QuantizedLinear` (a tied LM head: :meth:`tied_to`), so one int8 matrix
    serves as both, as the float one did."""

    def __init__(self, qweight: Tensor, scales: Tensor) -> None:
        super().__init__()
        if qweight.dtype != torch.int8 or scales.shape != qweight.shape[:1]:
            raise ValueError("QuantizedEmbedding holds int8 rows (V, D) and scales (V,)")
        self.num_embeddings, self.embedding_dim = qweight.shape
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales)

    @classmethod
    def from_weight(cls, weight: Tensor) -> QuantizedEmbedding:
        return cls(*quantize_int8(weight))

    @classmethod
    def tied_to(cls, head: QuantizedLinear) -> QuantizedEmbedding:
        if head.mode != "int8":
            raise ValueError("only an int8 head's rows can be looked up directly")
        return cls(head.qweight, head.scales)

    def forward(self, ids: Tensor) -> Tensor:
        rows = self.qweight[ids]  # IndexError for an id outside the table, as nn.Embedding
        return rows.float() * self.scales[ids].float()[..., None]

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, int8"


# ======================================================================================
# whole models
# ======================================================================================


def quantize_(model: nn.Module, mode: Mode, group_size: int = DEFAULT_GROUP_SIZE, *,
              skip: Iterable[str] = ()) -> nn.Module:
    """Replace, in place, every plain ``nn.Linear`` of ``model`` (not those whose
    qualified name is in ``skip``) by a :class:`QuantizedLinear` of ``mode``; returns
    ``model`` in eval mode. An ``lm_head`` that ends up int8 recomputes its top logits in
    fp32 (``refine_top``). A Linear whose weight is shared with another module (a tied
    LM head) is quantised as a copy: the other module keeps the float tensor. Layers
    already quantised are left alone. Errors: an unknown mode, a model off the CPU, no
    Linear to quantise."""
    check_mode(mode)
    skip = set(skip)
    targets = [(name, m) for name, m in model.named_modules()
               if type(m) is nn.Linear and name not in skip]
    if not targets:
        if any(isinstance(m, QuantizedLinear) for m in model.modules()):
            return model.eval()
        raise ValueError(f"quantize={mode!r}: {type(model).__name__} has no nn.Linear layer "
                         "to quantise")
    for name, linear in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        layer = QuantizedLinear.from_linear(linear, mode, group_size)
        layer.refine_top = attr == "lm_head"  # exact top logits (QuantizedLinear._refine_top)
        setattr(parent, attr, layer)
    return model.eval()


# generate(..., quantize=) decodes with a quantised view of the model, made once and kept
# while the model's Linear weights are unchanged (same storage, same version counter)
_COPIES: weakref.WeakKeyDictionary[nn.Module, dict[str, tuple[tuple, nn.Module]]] = \
    weakref.WeakKeyDictionary()


def _fingerprint(model: nn.Module) -> tuple:
    return tuple((t.data_ptr(), t._version, tuple(t.shape))
                 for m in model.modules() if type(m) is nn.Linear
                 for t in (m.weight, m.bias) if t is not None)


def quantized_copy(model: nn.Module, mode: Mode, group_size: int = DEFAULT_GROUP_SIZE
                   ) -> nn.Module:
    """A copy of ``model`` whose plain Linears are :class:`QuantizedLinear` (``mode``) and
    whose other tensors (norms, embeddings, buffers) are ``model``'s own, not copies. Kept
    for ``model`` and handed out again while its Linear weights are unchanged (an
    in-place update or new weights make a fresh one). ``model`` itself is untouched."""
    check_mode(mode)
    key = f"{mode}/{group_size}"
    fingerprint = _fingerprint(model)
    cached = _COPIES.get(model, {}).get(key)
    if cached is not None and cached[0] == fingerprint:
        return cached[1]
    shared = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    twin = copy.deepcopy(model, memo=dict(shared))
    quantize_(twin, mode, group_size)
    _COPIES.setdefault(model, {})[key] = (fingerprint, twin)
    return twin
