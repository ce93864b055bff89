"""Audio clips held whole on the accelerator: the batched twins of the per-clip steps of
:class:`~multimodal.data.readers.audio.AudioFileDataset` and
:class:`~multimodal.data.audio_datasets.AudioBatchCollate`, for
:class:`~multimodal.data.device_batches.DeviceBatches`.

A split is held as ``waves`` (N, W) float32 (16 kHz mono, zero padded at the end),
``lengths`` (N,) and ``labels`` (N,) int64. Training holds the whole clips; a clip longer
than ``n`` samples is cropped per batch at a random start, :class:`BatchAudioCrop`:
``start ~ U{0, ..., L - n}`` for a clip of ``L > n`` samples (the per-clip
``torch.randint(L - n + 1)``), drawn for the whole epoch at once from the epoch's generator
as ``r mod (L - n + 1)`` with ``r ~ U{0, ..., 2^62 - 1}`` (a bias below ``2^-40`` for any
clip shorter than a day), then one gather: ``out[b, t] = waves[b, start_b + t]``. Shorter
clips keep their length. Evaluation splits are centre-cropped once when decoded.

The batch: ``{"waveform": (B, W'), "lengths", "label"}`` or, with a tokenizer, its log-mel
``{"features": (B, F, n_mels), "lengths": frames, "label"}`` computed on the device
(:func:`batch_features`). ``W'`` is the split's width, at most ``n``, not the longest clip
of the batch (the DataLoader's padding): a static shape and no host sync per batch; the
samples past each clip's length are zeros and its valid frames the same.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from multimodal.tokenizers.audio import AudioFrameTokenizer

__all__ = ["AudioBatchAssembler", "BatchAudioCrop", "batch_features", "pad_clips"]

_DRAW_HIGH = 2**62


def pad_clips(clips: list[Tensor], width: int | None = None) -> tuple[Tensor, Tensor]:
    """1-D clips -> ``(waves (N, width), lengths (N,))``, zero padded at the end
    (``width``: the longest clip by default)."""
    lengths = torch.tensor([c.shape[0] for c in clips], dtype=torch.int64)
    width = int(lengths.max()) if width is None and clips else (width or 0)
    waves = torch.zeros(len(clips), width)
    for i, clip in enumerate(clips):
        waves[i, : clip.shape[0]] = clip
    return waves, lengths


class BatchAudioCrop:
    """The random crop of training clips to ``samples`` (see the module doc); the arrays it
    applies to are ``[waves, lengths, ...]``, returned as ``[cropped, min(lengths, n),
    ...]``."""

    random = True

    def __init__(self, samples: int) -> None:
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        self.samples = samples

    def to(self, device: torch.device | str) -> BatchAudioCrop:
        return self

    def draw(self, n: int, generator: torch.Generator) -> tuple[Tensor, None]:
        """One ``r ~ U{0..2^62 - 1}`` per item (int64; the start is ``r mod (L - n + 1)``)."""
        return torch.randint(0, _DRAW_HIGH, (n,), generator=generator), None

    def starts(self, lengths: Tensor, draws: Tensor) -> Tensor:
        """``start = r mod (L - n + 1)`` (0 for clips not longer than ``n``)."""
        room = (lengths - self.samples).clamp(min=0) + 1
        return torch.remainder(draws, room)

    def apply(self, arrays: list[Tensor], draws: Tensor | None,
              unused: Tensor | None = None) -> list[Tensor]:
        waves, lengths = arrays[0], arrays[1]
        n = self.samples
        if waves.shape[1] <= n or draws is None:  # no clip of the split is longer
            return arrays
        index = self.starts(lengths, draws)[:, None] + torch.arange(n, device=waves.device)
        return [waves.gather(1, index), lengths.clamp(max=n), *arrays[2:]]


def batch_features(tokenizer: AudioFrameTokenizer, waves: Tensor, lengths: Tensor
                   ) -> tuple[Tensor, Tensor]:
    """What ``tokenizer(waves, 16000, lengths)`` returns for a padded 16 kHz batch, without
    its host-side checks (the clips were checked when decoded: finite, at least one window)
    and so without a host sync: ``(features (B, F, n_mels), frame lengths (B,))``, frames
    past a clip's end set to 0. Another front end than log-mel, or another rate, goes
    through the tokenizer itself."""
    c = tokenizer.config
    if c.frontend != "logmel" or c.sample_rate != 16000:
        return tokenizer(waves, 16000, lengths)
    feats = tokenizer.log_mel(waves)
    if c.max_frames is not None:
        feats = feats[:, : c.max_frames]
    frames = tokenizer.frame_lengths(lengths)
    feats = (feats - tokenizer.mean) / tokenizer.std
    valid = torch.arange(feats.shape[1], device=feats.device) < frames[:, None]
    return feats * valid.unsqueeze(-1), frames


class AudioBatchAssembler:
    """``assemble`` of a held audio split: the batch dict of the DataLoader path
    (:class:`~multimodal.data.audio_datasets.AudioBatchCollate`) from ``[waves, lengths,
    labels]``. ``tokenizer``: a function giving the data module's current tokenizer (it
    may be replaced, e.g. by a checkpoint's), copied once to the batch's device; None:
    waveform batches."""

    def __init__(self, tokenizer: Callable[[], AudioFrameTokenizer] | None) -> None:
        self.tokenizer = tokenizer
        self._held: tuple[AudioFrameTokenizer, str, AudioFrameTokenizer] | None = None

    def _on(self, device: torch.device) -> AudioFrameTokenizer:
        source = self.tokenizer()  # type: ignore[misc]
        held = self._held
        if held is None or held[0] is not source or held[1] != str(device):
            held = self._held = (source, str(device), copy.deepcopy(source).to(device))
        return held[2]

    def __call__(self, arrays: list[Tensor], host: Any = None) -> dict[str, Any]:
        waves, lengths, labels = arrays
        if self.tokenizer is None:
            return {"waveform": waves, "lengths": lengths, "label": labels}
        with torch.no_grad():
            features, frames = batch_features(self._on(waves.device), waves, lengths)
        return {"features": features, "lengths": frames, "label": labels}
