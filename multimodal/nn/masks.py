"""Sparse attention patterns as boolean "may attend" masks (True = allowed).

Every mask is (N, M) for N queries and M keys, bottom-right aligned like
:func:`multimodal.nn.attention.causal_mask`: the queries are the *last* N of the M
positions, so query ``i`` sits at absolute position ``p = i + (M - N)``. The same mask
therefore serves a full forward (N == M) and incremental decoding with a KV cache
(N new tokens after M - N cached ones).

With ``d = p - j`` the signed distance from query position ``p`` back to key ``j``:

- sliding window (local attention), causal: ``0 <= d < window`` (the last ``window``
  keys up to and including the query); non-causal: ``|d| <= window // 2``.
- strided (Child et al., 2019, "Generating long sequences with sparse transformers"),
  causal: ``d >= 0 and (d < stride or d % stride == 0)``: the previous ``stride``
  positions plus every ``stride``-th one before them; non-causal: the same on ``|d|``.

Attention cost stays O(N M) with a dense mask; the mask fixes *which* keys count,
which is what the receptive-field and cache-consistency tests check.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

AttentionPattern = Literal["full", "sliding", "strided"]
PATTERNS: tuple[str, ...] = ("full", "sliding", "strided")


def _check(num_queries: int, num_keys: int, size: int, name: str) -> None:
    if num_queries < 0 or num_keys < 0:
        raise ValueError(f"num_queries and num_keys must be >= 0, got {num_queries}, {num_keys}")
    if num_queries > num_keys:
        raise ValueError(
            f"bottom-right aligned masks need num_queries <= num_keys (queries are the last "
            f"positions of the keys), got {num_queries} queries and {num_keys} keys"
        )
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"{name} must be a positive int, got {size!r}")


def _distance(num_queries: int, num_keys: int, device: torch.device | None) -> Tensor:
    """(N, M) signed distance ``d = p - j`` from query position p back to key j."""
    offset = num_keys - num_queries
    p = torch.arange(num_queries, device=device)[:, None] + offset
    j = torch.arange(num_keys, device=device)[None, :]
    return p - j


def sliding_window_mask(
    num_queries: int, num_keys: int, window: int, causal: bool = True,
    device: torch.device | None = None,
) -> Tensor:
    """Local attention: causal ``0 <= p - j < window``; non-causal ``|p - j| <= window // 2``.

    Returns a bool (num_queries, num_keys) mask, True where query may attend key.
    """
    _check(num_queries, num_keys, window, "window")
    d = _distance(num_queries, num_keys, device)
    if causal:
        return (d >= 0) & (d < window)
    return d.abs() <= window // 2


def strided_mask(
    num_queries: int, num_keys: int, stride: int, causal: bool = True,
    device: torch.device | None = None,
) -> Tensor:
    """Strided sparse attention (Child et al., 2019): key j is visible to query position p
    iff ``(p - j) < stride or (p - j) % stride == 0`` with ``p - j >= 0`` (causal), or the
    same on ``|p - j|`` (non-causal). Returns a bool (num_queries, num_keys) mask.
    """
    _check(num_queries, num_keys, stride, "stride")
    d = _distance(num_queries, num_keys, device)
    if not causal:
        d = d.abs()
    return (d >= 0) & ((d < stride) | (d % stride == 0))


def pattern_mask(
    pattern: str, num_queries: int, num_keys: int, window: int, causal: bool,
    device: torch.device | None = None,
) -> Tensor | None:
    """The mask of a named pattern (``"full"`` gives None: nothing masked).

    ``window`` is the sliding window's width or the strided pattern's stride.
    """
    if pattern == "full":
        return None
    if pattern == "sliding":
        return sliding_window_mask(num_queries, num_keys, window, causal, device)
    if pattern == "strided":
        return strided_mask(num_queries, num_keys, window, causal, device)
    raise ValueError(f"attention_pattern must be one of {PATTERNS}, got {pattern!r}")
