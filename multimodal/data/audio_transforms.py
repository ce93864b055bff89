"""Per-clip audio transforms: mono 16 kHz resampling, centre crops, silence trimming.

Background-noise augmentation is :mod:`multimodal.data.noise`; log-mel features are the
tokenizer's job (:class:`~multimodal.tokenizers.audio.AudioFrameTokenizer`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from multimodal.deps import require
from multimodal.tokenizers.waveform import as_mono

__all__ = ["SAMPLE_RATE", "Augment", "Resampler", "augment_item", "centre_crop", "trim_silence"]

SAMPLE_RATE = 16000

# A waveform augmentation, e.g. multimodal.data.noise.NoiseMixer: (clip, generator) -> clip.
Augment = Callable[[Tensor, torch.Generator | None], Tensor]


def trim_silence(x: np.ndarray, sample_rate: int, threshold: float = 0.02,
                 margin_s: float = 0.03) -> np.ndarray:  # fmt: skip
    """Cut leading/trailing samples quieter than ``threshold * max|x|``, keeping
    ``margin_s`` seconds each side (espeak-ng appends ~0.45 s of silence)."""
    peak = float(np.abs(x).max()) if x.size else 0.0
    if peak == 0.0:
        return x
    loud = np.nonzero(np.abs(x) > threshold * peak)[0]
    margin = int(margin_s * sample_rate)
    return x[max(0, loud[0] - margin) : min(len(x), loud[-1] + 1 + margin)]


class Resampler:
    """Mono 16 kHz from any rate, with torchaudio's kernels cached per input rate."""

    def __init__(self, target: int = SAMPLE_RATE) -> None:
        self.target = target
        self._cache: dict[int, torch.nn.Module] = {}  # torchaudio's Resample per rate

    def __call__(self, waveform: Tensor, rate: int) -> Tensor:
        mono = as_mono(waveform)  # integer PCM rescaled as on every audio path
        if rate == self.target:
            return mono
        if rate not in self._cache:
            resample = require("torchaudio").transforms.Resample
            self._cache[rate] = resample(rate, self.target)
        return self._cache[rate](mono)


def centre_crop(x: Tensor, n: int) -> Tensor:
    """The middle ``n`` samples of ``x`` (all of it when not longer)."""
    if x.shape[0] <= n:
        return x
    start = (x.shape[0] - n) // 2
    return x[start : start + n]


def augment_item(x: Tensor, augment: Augment | None, seed: int | None, index: int) -> Tensor:
    """``augment(x)`` for item ``index`` of a dataset: with the global torch RNG when ``seed``
    is None (training: new noise every epoch), else with a generator seeded from
    ``(seed, index)`` (evaluation: item ``index`` always gets the same noise)."""
    if augment is None:
        return x
    gen = None if seed is None else torch.Generator().manual_seed(seed * 1_000_003 + index)
    return augment(x, gen)
