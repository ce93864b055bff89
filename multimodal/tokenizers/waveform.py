"""One conversion for every audio entry point: a waveform in any dtype and layout -> float.

Every path that takes a waveform (the audio front end of :class:`~multimodal.Encoder` and
the audio classifiers, the audio data modules, the speech codec, text-to-speech prompts)
goes through :func:`pcm_to_float` (and, for one clip, :func:`as_mono`), so integer PCM is
handled the same everywhere:

* **integer PCM of every width is rescaled** to ``[-1, 1)``: a signed ``b``-bit sample
  ``x`` becomes ``x / 2**(b-1)`` (int16 from ``scipy.io.wavfile``: ``/ 32768``; int32, as
  24- and 32-bit WAV are read: ``/ 2**31``; int8 ``/ 128``); unsigned samples (8-bit WAV is
  unsigned, silence at 128) become ``(x - 2**(b-1)) / 2**(b-1)``;
* floating point (float16, bfloat16, float32, float64) is taken as it is, as float32;
* bool and complex waveforms are refused (``ValueError``);
* NumPy arrays are accepted like tensors.

One clip may be ``(samples,)``, ``(channels, samples)`` (torchaudio's layout) or
``(samples, channels)`` (soundfile's): the shorter side of a 2-D clip is its channels, which
are averaged.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["as_mono", "pcm_to_float"]

_UNSIGNED = {torch.uint8: 8, torch.uint16: 16, torch.uint32: 32, torch.uint64: 64}


def pcm_to_float(waveform: Any, what: str = "waveform") -> Tensor:
    """``waveform`` (tensor or NumPy array, any shape) as float32, integer PCM rescaled to
    ``[-1, 1)`` by its width (see the module doc). Float input is returned as float32
    (a float tensor is not copied)."""
    if isinstance(waveform, np.ndarray):
        if waveform.dtype.kind not in "biuf":
            raise ValueError(f"{what}: unsupported NumPy dtype {waveform.dtype}")
        if not waveform.flags.writeable:  # torch wants writable memory (scipy's mmap reads)
            waveform = waveform.copy()
        waveform = torch.from_numpy(np.ascontiguousarray(waveform))
    if not isinstance(waveform, Tensor):
        raise TypeError(f"{what} must be a tensor or a NumPy array, got "
                        f"{type(waveform).__name__}")
    dtype = waveform.dtype
    if dtype.is_floating_point:
        return waveform.float()
    if dtype == torch.bool or dtype.is_complex:
        raise ValueError(f"{what} is {dtype}: expected float samples in [-1, 1] or integer "
                         "PCM")
    if dtype in _UNSIGNED:
        half = 2.0 ** (_UNSIGNED[dtype] - 1)
        return ((waveform.double() - half) / half).float()
    bits = torch.iinfo(dtype).bits
    return (waveform.double() / 2.0 ** (bits - 1)).float()


def as_mono(waveform: Any, what: str = "waveform") -> Tensor:
    """One clip -> float32 mono ``(samples,)``: :func:`pcm_to_float`, then the channels of a
    2-D clip averaged, whichever layout: ``(channels, samples)`` or soundfile's
    ``(samples, channels)`` (the shorter side is the channels)."""
    x = pcm_to_float(waveform, what)
    if x.dim() == 1:
        return x
    if x.dim() == 2:
        return x.mean(dim=0) if x.shape[0] <= x.shape[1] else x.mean(dim=1)
    raise ValueError(f"{what} must be one clip shaped (samples,), (channels, samples) or "
                     f"(samples, channels), got a tensor of shape {tuple(x.shape)}")
