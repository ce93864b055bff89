"""Background-noise augmentation of audio clips: white, pink (1/f) or recorded ambience."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor

from multimodal.data.audio_transforms import Resampler
from multimodal.data.sources import GET_AUDIO
from multimodal.data.sources.sonic_pi import SONIC_PI_DIR
from multimodal.tokenizers.audio import load_audio

__all__ = ["NoiseMixer", "pink_noise"]


def pink_noise(n: int, generator: torch.Generator | None) -> Tensor:
    """Noise with power spectrum ~ 1/f: white noise shaped by 1/sqrt(f) in the rfft domain."""
    spectrum = torch.fft.rfft(torch.randn(n, generator=generator))
    f = torch.arange(spectrum.shape[0], dtype=torch.float32)
    spectrum = spectrum / f.clamp(min=1.0).sqrt()
    return torch.fft.irfft(spectrum, n=n)


class NoiseMixer:
    """Mix background noise at a random SNR: ``y = x + g n`` with
    ``g = sqrt(P_x / (P_n 10^(snr/10)))`` (``P`` = mean power), ``snr ~ U[snr_min, snr_max]``.

    ``kind``: ``"white"``, ``"pink"`` (1/f) or ``"ambient"`` (random crops of the Sonic Pi
    ``ambi_*`` and ``vinyl_*`` recordings, loaded once).
    """

    def __init__(
        self,
        kind: Literal["white", "pink", "ambient"] = "pink",
        snr_db: tuple[float, float] = (5.0, 20.0),
        samples_dir: str | os.PathLike = SONIC_PI_DIR,
    ) -> None:
        if kind not in ("white", "pink", "ambient"):
            raise ValueError(f"noise must be 'none', 'white', 'pink' or 'ambient', got {kind!r}")
        if snr_db[0] > snr_db[1]:
            raise ValueError(f"snr_db must be (low, high), got {snr_db}")
        self.kind, self.snr_db = kind, (float(snr_db[0]), float(snr_db[1]))
        self._beds: list[Tensor] = []
        if kind == "ambient":
            folder = Path(samples_dir)
            paths = sorted([*folder.glob("ambi_*.flac"), *folder.glob("vinyl_*.flac")])
            if not paths:
                raise FileNotFoundError(f"no ambi_*/vinyl_* samples in {folder}. {GET_AUDIO}")
            resample = Resampler()
            self._beds = [resample(*load_audio(p)) for p in paths]

    def noise(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        if self.kind == "white":
            return torch.randn(n, generator=generator)
        if self.kind == "pink":
            return pink_noise(n, generator)
        bed = self._beds[int(torch.randint(len(self._beds), (1,), generator=generator))]
        if bed.shape[0] < n:
            bed = bed.repeat(math.ceil(n / bed.shape[0]))
        start = int(torch.randint(bed.shape[0] - n + 1, (1,), generator=generator))
        return bed[start : start + n]

    def __call__(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        lo, hi = self.snr_db
        snr = lo + (hi - lo) * torch.rand((), generator=generator)
        n = self.noise(x.shape[-1], generator)
        p_x, p_n = x.pow(2).mean(), n.pow(2).mean().clamp(min=1e-12)
        if p_x == 0:
            return x
        return x + n * torch.sqrt(p_x / (p_n * 10 ** (snr / 10)))
