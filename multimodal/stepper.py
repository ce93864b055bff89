"""A decoder fed one step at a time: what the decoding loops of :mod:`multimodal.generation`
and :mod:`multimodal.speculative` both stand on.

A *decoder* (:class:`Decoder`) is any module with
``model(input_ids, attention_mask=..., cache=..., **model_kwargs) -> logits (B, N, V)``,
``model.make_cache(max_len)`` and ``model.max_len``. :class:`Stepper` holds one decoder, its
cache (made by the caller: a growing KV cache, a static one, a recurrent state, or none) and
the model keyword arguments, and returns the logits that a step reads: the last position's,
or the last few positions' for a speculative verify pass.

This module sits below both loops so that neither imports the other's internals
(``generation`` imports ``speculative`` to dispatch to it; ``speculative`` imports only this).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from torch import Tensor

from multimodal.nn.cache import KVCache

__all__ = ["Cache", "Decoder", "LogitsProcessor", "Stepper"]


class Cache(Protocol):
    """What the loop needs of a decoder's cache (a KV cache, a recurrent state)."""

    def reorder(self, index: Tensor) -> None: ...


class Decoder(Protocol):
    max_len: int

    def __call__(self, input_ids: Tensor, attention_mask: Tensor | None = ...,
                 **kwargs: Any) -> Tensor: ...

    def make_cache(self, max_len: int | None = None) -> KVCache | Cache: ...


#: a model's rules on the next token: ``(ids so far (B, N), scores (B, V)) -> scores``
LogitsProcessor = Callable[[Tensor, Tensor], Tensor]


class Stepper:
    """Feeds ``model`` one step at a time on ``cache`` (None: every step runs the whole
    sequence again), passing ``model_kwargs`` to every call."""

    def __init__(self, model: Decoder, cache: KVCache | Cache | None,
                 model_kwargs: dict[str, Any]) -> None:
        self.model = model
        self.cache = cache
        self.kwargs = model_kwargs
        # looked up on the class: a wrapper (torch.compile's) keeps its own forward
        self.head_on_last = bool(getattr(type(model), "logits_per_position", False))

    def __call__(self, new_ids: Tensor, all_ids: Tensor, mask: Tensor | None) -> Tensor:
        """Logits (B, V) for the token after ``all_ids`` (``new_ids`` are its not yet
        cached tail)."""
        if self.cache is None:
            return self._last_logits(all_ids, mask, self.kwargs)
        return self._last_logits(new_ids, mask, {**self.kwargs, "cache": self.cache})

    def _last_logits(self, ids: Tensor, mask: Tensor | None, kwargs: dict[str, Any]) -> Tensor:
        """The last position's logits (B, V). Several positions (the prompt's prefill, an
        uncached step) through a decoder whose head works row by row
        (``logits_per_position``): its features, then the head on the last row only, so
        the (N, dim) x (dim, V) vocabulary projection of the rows nobody reads is skipped."""
        if self.head_on_last and ids.shape[1] > 1:
            features = self.model.forward_features(ids, attention_mask=mask, **kwargs)
            return self.model.forward_head(features[:, -1:])[:, -1]
        return self.model(ids, attention_mask=mask, **kwargs)[:, -1]

    def last_rows(self, ids: Tensor, mask: Tensor | None, rows: int) -> Tensor:
        """Logits (B, rows, V) of the last ``rows`` positions of ``ids`` (its not yet
        cached tail; a cache is required): a speculative verify step. One row of one
        token takes the same one-token path as :meth:`__call__`."""
        kwargs = {**self.kwargs, "cache": self.cache}
        if self.head_on_last and ids.shape[1] > 1:
            features = self.model.forward_features(ids, attention_mask=mask, **kwargs)
            return self.model.forward_head(features[:, -rows:])
        return self.model(ids, attention_mask=mask, **kwargs)[:, -rows:]

    def reorder(self, index: Tensor) -> None:
        """Keep the rows ``index`` (beam search): of the cache and of every batch-first
        tensor in the model keyword arguments."""
        if self.cache is not None:
            self.cache.reorder(index)
        for key, value in self.kwargs.items():
            if isinstance(value, Tensor) and value.dim() > 0:
                self.kwargs[key] = value.index_select(0, index)
