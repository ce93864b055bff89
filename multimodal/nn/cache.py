"""Key/value cache for incremental decoding: prefill once, then one token per step.

Self-attention keys/values go into buffers allocated once at ``max_len`` (no
re-allocation or concatenation per step); cross-attention keys/values are computed
from the encoder memory on the first step and reused after that.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor


class LayerCache:
    """Cached keys/values of one Block, (B, H, T, d) each.

    ``rowwise`` (False by default): several new causal queries attend one at a time, each
    with the same call a one-token step makes (no mask, its own key prefix), so every row
    of a multi-token pass is bitwise what token-by-token decoding gives wherever the rest
    of the model is row-independent (the packed int4 / int8 kernels are): speculative
    decoding's verify pass, whose tokens must be greedy's.
    """

    rowwise = False

    def __init__(self, max_len: int) -> None:
        self.max_len = max_len
        self.length = 0
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.cross_kv: tuple[Tensor, Tensor] | None = None

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store ``n`` new keys/values (B, H, n, d); return all cached so far."""
        n = k.shape[-2]
        if self.length + n > self.max_len:
            raise ValueError(
                f"KV cache overflow: {self.length} cached + {n} new tokens > max_len {self.max_len}"
            )
        if self.k is None or self.v is None:
            b, h, _, d = k.shape
            self.k = k.new_empty(b, h, self.max_len, d)
            self.v = v.new_empty(b, h, self.max_len, d)
        end = self.length + n
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def append_one(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`append` for one token (B, H, 1, d) once the buffers exist (a decoding
        step): the same writes without the shape bookkeeping."""
        t = self.length
        if self.k is None or self.v is None or t >= self.max_len:
            return self.append(k, v)
        self.k[:, :, t : t + 1] = k
        self.v[:, :, t : t + 1] = v
        self.length = t = t + 1
        return self.k[:, :, :t], self.v[:, :, :t]

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search: follow each surviving beam's parent)."""
        if self.k is not None and self.v is not None:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)
        if self.cross_kv is not None:
            k, v = self.cross_kv
            self.cross_kv = (k.index_select(0, index), v.index_select(0, index))


class KVCache:
    """One :class:`LayerCache` per Block of a :class:`~multimodal.nn.block.Transformer`.

    >>> cache = model.transformer.make_cache(max_len=1024)
    >>> logits = model(prompt, cache=cache)       # prefill
    >>> logits = model(next_token, cache=cache)   # one step
    """

    def __init__(self, num_layers: int, max_len: int) -> None:
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        self.max_len = max_len
        self.layers = [LayerCache(max_len) for _ in range(num_layers)]
        # the decoder's one-token step plans (multimodal.nn.block.Transformer._step_plans)
        self.step_owner: object | None = None
        self.step_plans: list[Any] | None = None

    @property
    def length(self) -> int:
        """Number of tokens already cached (the position of the next token)."""
        return self.layers[0].length if self.layers else 0

    def __getitem__(self, i: int) -> LayerCache:
        return self.layers[i]

    def __len__(self) -> int:
        return len(self.layers)

    def reorder(self, index: Tensor) -> None:
        for layer in self.layers:
            layer.reorder(index)

    def set_rowwise(self, rowwise: bool) -> None:
        """Set :attr:`LayerCache.rowwise` on every layer."""
        for layer in self.layers:
            layer.rowwise = rowwise

    def crop(self, length: int) -> None:
        """Forget every cached token after the first ``length`` (speculative decoding:
        the keys / values of rejected draft tokens). The buffers keep their size; the next
        append overwrites the forgotten positions."""
        if not 0 <= length <= self.length:
            raise ValueError(f"crop length must be in [0, {self.length}], got {length}")
        for layer in self.layers:
            layer.length = length


class StaticLayerCache(LayerCache):
    """A :class:`LayerCache` whose buffers are zero-filled once and never replaced: the
    one-token step writes its key / value at a position given as a tensor and attends over
    the whole buffer under a mask, so every step has the same shapes (what a compiled or
    CUDA-graph step needs). Zeros, not ``empty``: a masked key still multiplies its value
    by a zero weight, and ``0 * NaN`` from uninitialised memory would be NaN."""

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        n = k.shape[-2]
        if self.length + n > self.max_len:
            raise ValueError(f"static KV cache overflow: {self.length} cached + {n} new "
                             f"tokens > its {self.max_len} positions")
        if self.k is None or self.v is None:
            b, h, _, d = k.shape
            self.k = k.new_zeros(b, h, self.max_len, d)
            self.v = v.new_zeros(b, h, self.max_len, d)
        return super().append(k, v)

    keep_storage = False  # True: reorder in place (a CUDA graph holds the addresses)

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index``: new buffers (one gather), or with ``keep_storage``
        gathered and copied back in place (the buffers keep their addresses)."""
        if not self.keep_storage:
            super().reorder(index)
            return
        if self.k is not None and self.v is not None:
            self.k.copy_(self.k.index_select(0, index))
            self.v.copy_(self.v.index_select(0, index))
        if self.cross_kv is not None:
            for t in self.cross_kv:
                t.copy_(t.index_select(0, index))


class StaticKVCache(KVCache):
    """A :class:`KVCache` of :class:`StaticLayerCache` plus what a fixed-shape one-token
    step reads besides the keys and values:

    - ``valid`` (B, max_len) bool: True at every cached real token (left padding stays
      False), the attention mask of a step over the whole buffer;
    - ``position`` (1,) long: the index the next token is written at, updated in place.

    ``prefix`` (default): a step attends over the cached prefix only, ``valid[:, :t + 1]``
    (one compiled graph with that length symbolic; no masked slot is read, and without
    left padding no mask at all); ``prefix=False``: over all ``max_len`` slots under the
    mask, every shape fixed (what CUDA graphs need).

    The prompt is prefilled by the ordinary forward (variable length, once); then
    :meth:`multimodal.nn.block.Transformer.forward` sends each one-token call to
    :func:`multimodal.nn.step.static_step`, compiled or not (``step_fn``).
    """

    def __init__(self, num_layers: int, max_len: int, prefix: bool = True) -> None:
        super().__init__(num_layers, max_len)
        self.layers = [StaticLayerCache(max_len) for _ in range(num_layers)]
        for layer in self.layers:
            layer.keep_storage = not prefix
        self.prefix = prefix
        self.padded = False  # some cached token is padding: steps need the mask
        self.valid: Tensor | None = None
        self.position: Tensor | None = None
        # the step function (multimodal.generation sets a compiled one); None: eager
        self.step_fn: Any = None

    def mark(self, start: int, n: int, batch: int, device: Any,
             padding: Tensor | None = None) -> None:
        """Record ``n`` new tokens at ``start``: valid unless ``padding`` (B, start + n)
        says otherwise. Allocates ``valid`` / ``position`` on first use."""
        import torch  # local: this module stays import-light

        if self.valid is None or self.position is None:
            self.valid = torch.zeros(batch, self.max_len, dtype=torch.bool, device=device)
            self.position = torch.zeros(1, dtype=torch.long, device=device)
        if padding is None:
            self.valid[:, start : start + n] = True
        else:
            self.valid[:, start : start + n] = ~padding[:, start : start + n]
            if not self.padded:  # (a host sync, until the first padding is seen)
                self.padded = bool(padding[:, start : start + n].any())

    def advance(self) -> None:
        """After a one-token step: every layer holds one more token."""
        for layer in self.layers:
            layer.length += 1

    def crop(self, length: int) -> None:
        super().crop(length)
        if self.valid is not None:
            self.valid[:, length:] = False

    def reorder(self, index: Tensor) -> None:
        super().reorder(index)
        if self.valid is not None:
            if self.prefix:
                self.valid = self.valid.index_select(0, index)
            else:
                self.valid.copy_(self.valid.index_select(0, index))
