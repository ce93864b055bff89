"""The log-mel front ends of imported audio models, as their sources compute them.

Both give a fixed number of frames (``num_frames``): the models were trained on padded,
fixed-length inputs and attend to the padding, so the padding is part of the input.

- :func:`kaldi_fbank` (AST): Kaldi's filter bank of each clip (``torchaudio.compliance.kaldi
  .fbank`` with a Hann window, 25 ms frames every 10 ms, ``snip_edges``, pre-emphasis 0.97,
  DC removal, 512-point FFT, mel bins from 20 Hz to Nyquist, ``log`` of the power), then
  zero frames appended (or frames cut) to ``num_frames``. AST normalises afterwards with
  ``(x - mean) / (2 std)`` (mean -4.2677393, std 4.5689974 for AudioSet), so its padding
  frames are ``-mean / (2 std)``, not 0.
- :func:`whisper_log_mel` (Whisper): the waveform zero-padded (or cut) to
  ``num_frames * hop`` samples, a centred STFT (reflect padding, periodic Hann window of
  ``n_fft`` = 400, hop 160) without its last frame, power through Slaney-normalised
  Slaney-scale mel filters (0 to 8 kHz), ``L = log10(max(mel, 1e-10))``, a dynamic range
  of 8 per clip (``max(L, max L - 8)``); Whisper then normalises with ``(L + 4) / 4``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from multimodal.deps import require

__all__ = ["AST_MEAN", "AST_STD", "kaldi_fbank", "whisper_log_mel", "whisper_mel_filters"]

#: AST's AudioSet statistics of the fbank (its feature extractor's defaults)
AST_MEAN, AST_STD = -4.2677393, 4.5689974


def _fit(frames: Tensor, num_frames: int) -> Tensor:
    """``(F, n)`` -> ``(num_frames, n)``: zero rows appended, or rows cut."""
    if frames.shape[0] >= num_frames:
        return frames[:num_frames]
    return torch.cat([frames, frames.new_zeros(num_frames - frames.shape[0], frames.shape[1])])


def kaldi_fbank(clip: Tensor, sample_rate: int, n_mels: int, num_frames: int) -> Tensor:
    """Kaldi log filter bank of one mono clip ``(T,)`` -> ``(num_frames, n_mels)``."""
    kaldi = require("torchaudio").compliance.kaldi
    fbank = kaldi.fbank(
        clip.float()[None], sample_frequency=sample_rate, window_type="hanning",
        num_mel_bins=n_mels, dither=0.0, frame_length=25.0, frame_shift=10.0)
    return _fit(fbank, num_frames)


def _hz_to_slaney_mel(f: Tensor) -> Tensor:
    """Slaney's mel scale: linear ``3 f / 200`` below 1 kHz, logarithmic above
    (``15 + 27 ln(f / 1000) / ln 6.4``)."""
    log_part = 15.0 + 27.0 * torch.log(f.clamp(min=1e-10) / 1000.0) / torch.log(torch.tensor(6.4,
                                                                                     dtype=f.dtype))
    return torch.where(f < 1000.0, 3.0 * f / 200.0, log_part)


def _slaney_mel_to_hz(m: Tensor) -> Tensor:
    return torch.where(m < 15.0, 200.0 * m / 3.0,
                       1000.0 * torch.exp(torch.log(torch.tensor(6.4, dtype=m.dtype)) * (m - 15.0)
                                          / 27.0))


def whisper_mel_filters(n_mels: int, sample_rate: int = 16000, n_fft: int = 400,
                        f_max: float = 8000.0) -> Tensor:
    """``(n_fft // 2 + 1, n_mels)`` Slaney-scale triangles from 0 Hz to ``f_max``, each
    scaled by ``2 / (f_right - f_left)`` (Slaney's area normalisation); computed in float64
    (as Whisper's feature extractor does), returned as float32.

    Filter ``m`` rises linearly from ``f_m`` to ``f_{m+1}`` and falls to ``f_{m+2}``, where
    ``f_0 .. f_{M+1}`` are equally spaced on the mel scale."""
    freqs = torch.linspace(0, sample_rate / 2, n_fft // 2 + 1, dtype=torch.float64)
    edges = _slaney_mel_to_hz(torch.linspace(0.0, float(_hz_to_slaney_mel(
        torch.tensor(f_max, dtype=torch.float64))), n_mels + 2, dtype=torch.float64))
    left, centre, right = edges[:-2], edges[1:-1], edges[2:]
    up = (freqs[:, None] - left) / (centre - left)
    down = (right - freqs[:, None]) / (right - centre)
    tri = torch.clamp(torch.minimum(up, down), min=0.0)
    return (tri * (2.0 / (right - left))).float()


def whisper_log_mel(batch: Tensor, filters: Tensor, num_frames: int, n_fft: int = 400,
                    hop: int = 160) -> Tensor:
    """Whisper's log-mel of a ``(B, T)`` batch -> ``(B, num_frames, n_mels)`` (before the
    ``(L + 4) / 4`` normalisation). Each row is one clip; samples past ``T`` are 0."""
    samples = num_frames * hop
    batch = batch.float()
    if batch.shape[-1] >= samples:
        batch = batch[:, :samples]
    else:
        batch = torch.nn.functional.pad(batch, (0, samples - batch.shape[-1]))
    window = torch.hann_window(n_fft, device=batch.device)
    stft = torch.stft(batch, n_fft, hop, window=window, return_complex=True)
    power = stft[..., :-1].abs() ** 2  # (B, n_fft // 2 + 1, num_frames)
    mel = filters.to(batch.device).T @ power
    log_spec = mel.clamp(min=1e-10).log10()
    peak = log_spec.amax(dim=(1, 2), keepdim=True)
    return torch.maximum(log_spec, peak - 8.0).transpose(1, 2)
