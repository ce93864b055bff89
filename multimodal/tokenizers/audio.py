"""Audio tokenizer: waveform -> normalised log-mel frames -> D-dim tokens.

Two stages, kept apart on purpose:

1. :class:`AudioFrameTokenizer` (no learnable weights): any sample rate, mono or
   multi-channel waveform -> mono -> 16 kHz -> log-mel spectrogram, normalised with
   per-mel-bin statistics fitted on a training set (integer PCM of any width is rescaled
   to [-1, 1) first: :mod:`multimodal.tokenizers.waveform`). Output ``(B, frames, n_mels)``
   plus the number of valid frames of each clip (for key-padding masks).
2. The learnable embedding that turns those frames into transformer tokens lives in
   :mod:`multimodal.nn.embed` (:class:`~multimodal.nn.embed.FrameEmbed`,
   :class:`~multimodal.nn.embed.SpectrogramPatchEmbed`,
   :class:`~multimodal.nn.embed.WhisperConvStem`); :meth:`AudioFrameTokenizer.build_embed`
   builds the one its ``config.mode`` names.

Frame maths (``center=False``, so no frame reaches past the clip): with window
``W = sample_rate * win_ms / 1000`` samples (400 at 16 kHz), hop
``H = sample_rate * hop_ms / 1000`` (160) and ``n_fft = W``, a clip of ``T >= W``
samples has ``1 + (T - W) // H`` frames; a clip shorter than one window is an error.
The feature of mel bin ``m`` at frame ``t`` is ``log(sum_f |X_t(f)|^2 M_m(f) + offset)``
with ``M`` the HTK-scale triangular filter bank, then ``(x - mean_m) / std_m``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from multimodal.deps import require
from multimodal.nn.embed import (
    FrameEmbed,
    SpectrogramPatchEmbed,
    WhisperConvStem,
    audio_embed,
)
from multimodal.tokenizers.audio_frontends import kaldi_fbank, whisper_log_mel, whisper_mel_filters
from multimodal.tokenizers.waveform import as_mono, pcm_to_float

__all__ = [
    "AudioFeatureConfig",
    "AudioFrameTokenizer",
    "load_audio",
]


def load_audio(path: str | Path) -> tuple[Tensor, int]:
    """Read a WAV / FLAC / OGG / MP3 file with ``soundfile``, or a ``.raw`` file as
    headerless 16 kHz 16-bit little-endian mono PCM (pocketsphinx's test files).

    Returns ``(waveform, sample_rate)`` with ``waveform`` float32 shaped
    ``(channels, samples)`` in [-1, 1]. A missing file raises FileNotFoundError, a file
    that is not audio raises ValueError naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"audio file not found: {path}")
    import soundfile as sf  # here, not at import: text and image models need no libsndfile

    raw = {"format": "RAW", "samplerate": 16000, "channels": 1, "subtype": "PCM_16",
           "endian": "LITTLE"} if path.suffix.lower() == ".raw" else {}
    try:
        data, sample_rate = sf.read(str(path), dtype="float32", always_2d=True, **raw)
    except (sf.LibsndfileError, RuntimeError, TypeError) as err:
        raise ValueError(
            f"{path} is not a readable audio file (expected WAV, FLAC, OGG or MP3): {err}"
        ) from err
    return torch.from_numpy(data.T.copy()), int(sample_rate)


@dataclass
class AudioFeatureConfig:
    """Log-mel feature settings and how frames become tokens.

    ``mode="frames"`` groups ``stack_frames`` consecutive frames into one token
    (:class:`FrameEmbed`); ``mode="patches"`` cuts the (mel, time) image into
    ``patch_size`` squares every ``patch_stride`` frames and ``freq_stride`` bins (default
    ``patch_stride``) (:class:`SpectrogramPatchEmbed`); ``mode="conv"`` is Whisper's stem of
    two 1-D convolutions, the second with stride 2 (:class:`~multimodal.nn.embed.WhisperConvStem`).
    ``max_frames`` (optional) truncates long clips.

    ``frontend``: ``"logmel"`` (this package's, the default), or an imported model's own:
    ``"kaldi_fbank"`` (AST) or ``"whisper"`` (see :mod:`multimodal.tokenizers.audio_frontends`).
    Those two give exactly ``max_frames`` frames per clip (padding included: the models
    attend to it), all counted as valid.
    """

    sample_rate: int = 16000
    n_mels: int = 80
    win_ms: float = 25.0
    hop_ms: float = 10.0
    f_min: float = 0.0
    f_max: float | None = None  # None: sample_rate / 2
    log_offset: float = 1e-6
    mode: Literal["frames", "patches", "conv"] = "frames"
    stack_frames: int = 1
    patch_size: int = 16
    patch_stride: int = 10
    freq_stride: int | None = None  # None: patch_stride
    max_frames: int | None = None
    frontend: Literal["logmel", "kaldi_fbank", "whisper"] = "logmel"

    def __post_init__(self) -> None:
        if self.frontend not in ("logmel", "kaldi_fbank", "whisper"):
            raise ValueError(f"frontend must be 'logmel', 'kaldi_fbank' or 'whisper', got "
                             f"{self.frontend!r}")
        if self.frontend != "logmel" and self.max_frames is None:
            raise ValueError(f"frontend={self.frontend!r} gives a fixed number of frames: set "
                             "max_frames (AST: max_length, Whisper: 2 * max_source_positions)")
        if self.mode not in ("frames", "patches", "conv"):
            raise ValueError(f"mode must be 'frames', 'patches' or 'conv', got {self.mode!r}")
        if self.freq_stride is not None and (not isinstance(self.freq_stride, int)
                                             or self.freq_stride < 1):
            raise ValueError(f"freq_stride must be None or a positive int, got "
                             f"{self.freq_stride!r}")
        for name in ("sample_rate", "n_mels", "stack_frames", "patch_size", "patch_stride"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.win_length < 2 or self.hop_length < 1:
            raise ValueError(
                f"win_ms={self.win_ms} / hop_ms={self.hop_ms} give a window of "
                f"{self.win_length} and a hop of {self.hop_length} samples; need >= 2 and >= 1"
            )
        if self.max_frames is not None and self.max_frames < 1:
            raise ValueError(f"max_frames must be None or >= 1, got {self.max_frames}")
        f_max = self.sample_rate / 2 if self.f_max is None else self.f_max
        if not 0 <= self.f_min < f_max <= self.sample_rate / 2:
            raise ValueError(
                f"need 0 <= f_min < f_max <= sample_rate/2 = {self.sample_rate / 2}, "
                f"got f_min={self.f_min}, f_max={self.f_max}"
            )
        if self.log_offset <= 0:
            raise ValueError(f"log_offset must be > 0, got {self.log_offset}")

    @property
    def win_length(self) -> int:
        """Window length in samples: ``round(sample_rate * win_ms / 1000)`` (400 at 16 kHz)."""
        return round(self.sample_rate * self.win_ms / 1000)

    @property
    def hop_length(self) -> int:
        """Hop in samples: ``round(sample_rate * hop_ms / 1000)`` (160 at 16 kHz)."""
        return round(self.sample_rate * self.hop_ms / 1000)

    @property
    def n_fft(self) -> int:
        """FFT size = window length, so the minimum clip is exactly one window."""
        return self.win_length

    def num_frames(self, num_samples: int) -> int:
        """Frames of a clip of ``num_samples`` samples at ``sample_rate``: ``1 + (T - W) // H``
        (0 when ``T < W``), capped at ``max_frames``."""
        if num_samples < self.win_length:
            return 0
        frames = 1 + (num_samples - self.win_length) // self.hop_length
        return frames if self.max_frames is None else min(frames, self.max_frames)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AudioFeatureConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown AudioFeatureConfig fields {sorted(unknown)}")
        return cls(**data)


WaveInput = Tensor | np.ndarray | Sequence[Tensor | np.ndarray]


class AudioFrameTokenizer(nn.Module):
    """Waveforms -> normalised log-mel frames ``(B, frames, n_mels)`` and valid lengths.

    Accepted inputs of :meth:`forward` (``sample_rate`` is the rate of the input):

    * a 1-D tensor ``(T,)``: one mono clip (batch of one);
    * a 2-D tensor ``(B, T)``: a batch of mono clips, padded at the end; ``lengths``
      (``(B,)``, samples) tells each clip's true length, default all ``T``;
    * a 3-D tensor ``(B, C, T)``: a batch of multi-channel clips;
    * a list of tensors ``(T_i,)`` or ``(C_i, T_i)`` (as :func:`load_audio` returns) of
      different lengths: they are padded here.

    Processing: channels are averaged to mono; the signal is resampled to
    ``config.sample_rate`` with :func:`torchaudio.functional.resample` (a clip of ``T``
    samples at rate ``r`` becomes ``ceil(T * 16000 / r)`` samples); the log-mel
    spectrogram is taken with ``center=False``; each mel bin is normalised with the
    fitted mean/std; frames past a clip's end are set to 0.

    Errors (ValueError): NaN or inf samples; a clip shorter than one window (400 samples
    = 25 ms at 16 kHz); a tensor of rank other than 1-3 (list items: 1-2).
    """

    def __init__(self, config: AudioFeatureConfig | None = None) -> None:
        super().__init__()
        self.config = config or AudioFeatureConfig()
        c = self.config
        with warnings.catch_warnings():
            if c.frontend != "logmel":  # kept for the state-dict layout, unused: its
                # "empty mel filter" warning (128 bins on a 400-point FFT) would mislead
                warnings.simplefilter("ignore", UserWarning)
            self.melspec = require("torchaudio").transforms.MelSpectrogram(
                sample_rate=c.sample_rate,
                n_fft=c.n_fft,
                win_length=c.win_length,
                hop_length=c.hop_length,
                f_min=c.f_min,
                f_max=c.f_max,
                n_mels=c.n_mels,
                power=2.0,
                center=False,
            )
        if c.frontend == "whisper":  # not saved: a function of the config
            self.register_buffer("whisper_filters", whisper_mel_filters(
                c.n_mels, c.sample_rate, c.n_fft), persistent=False)
        self.register_buffer("mean", torch.zeros(c.n_mels))
        self.register_buffer("std", torch.ones(c.n_mels))
        self.register_buffer("fitted", torch.tensor(False))

    # ------------------------------------------------------------------ input checks
    def _to_batch(
        self, waveform: WaveInput, lengths: Tensor | Sequence[int] | None
    ) -> tuple[Tensor, Tensor]:
        """Bring any accepted input to a padded mono batch ``(B, T)`` and lengths ``(B,)``;
        integer PCM rescaled to [-1, 1) (:mod:`multimodal.tokenizers.waveform`)."""
        if isinstance(waveform, np.ndarray):
            waveform = pcm_to_float(waveform)
        if isinstance(waveform, Tensor):
            waveform = pcm_to_float(waveform)
            if waveform.dim() == 1:
                batch = waveform.unsqueeze(0)
            elif waveform.dim() == 2:
                batch = waveform
            elif waveform.dim() == 3:
                batch = waveform.float().mean(dim=1)
            else:
                raise ValueError(
                    "waveform must be (T,), (B, T) or (B, C, T), got a tensor of shape "
                    f"{tuple(waveform.shape)}"
                )
            batch = batch.float()
            if lengths is None:
                lens = torch.full((batch.shape[0],), batch.shape[-1], dtype=torch.long)
            else:
                lens = torch.as_tensor(lengths, dtype=torch.long).flatten().cpu()
                if lens.numel() != batch.shape[0] or (lens > batch.shape[-1]).any():
                    raise ValueError(
                        f"lengths must hold {batch.shape[0]} values <= {batch.shape[-1]}, "
                        f"got {lens.tolist()}"
                    )
            return batch, lens
        if isinstance(waveform, (list, tuple)):
            if len(waveform) == 0:
                raise ValueError("got an empty list of waveforms")
            if lengths is not None:
                raise ValueError("lengths is only for padded tensors, not for a list of clips")
            monos = []
            for i, clip in enumerate(waveform):
                if not isinstance(clip, (Tensor, np.ndarray)) or clip.ndim not in (1, 2):
                    shape = tuple(clip.shape) if isinstance(clip, (Tensor, np.ndarray)) \
                        else type(clip).__name__
                    raise ValueError(f"clip {i} must be a (T,), (C, T) or (T, C) tensor, got "
                                     f"{shape}")
                monos.append(as_mono(clip, f"clip {i}"))
            lens = torch.tensor([m.shape[0] for m in monos], dtype=torch.long)
            batch = torch.zeros(len(monos), int(lens.max()), device=monos[0].device)
            for i, m in enumerate(monos):
                batch[i, : m.shape[0]] = m
            return batch, lens
        raise ValueError(
            f"waveform must be a tensor or a list of tensors, got {type(waveform).__name__}"
        )

    def _check_finite(self, batch: Tensor) -> None:
        if not torch.isfinite(batch).all():
            bad = (~torch.isfinite(batch)).any(dim=-1).nonzero().flatten().tolist()
            more = f" and {len(bad) - 20} more" if len(bad) > 20 else ""
            raise ValueError(f"waveform has NaN or inf samples (clips {bad[:20]}{more}); clean "
                             "the input")

    # ------------------------------------------------------------------ features
    def resample(self, batch: Tensor, lengths: Tensor, sample_rate: int) -> tuple[Tensor, Tensor]:
        """Resample a padded ``(B, T)`` batch to ``config.sample_rate``; lengths become
        ``ceil(len * new / old)``."""
        target = self.config.sample_rate
        if isinstance(sample_rate, bool) or not isinstance(sample_rate, int) or sample_rate <= 0:
            raise ValueError(f"sample_rate must be a positive int, got {sample_rate!r}")
        if sample_rate == target:
            return batch, lengths
        out = require("torchaudio").functional.resample(batch, sample_rate, target)
        new_lengths = torch.tensor(
            [resampled_length(int(n), sample_rate, target) for n in lengths], dtype=torch.long
        )
        return out, new_lengths.clamp(max=out.shape[-1])

    def frame_lengths(self, sample_lengths: Tensor) -> Tensor:
        """Valid frames of clips with ``sample_lengths`` samples at ``config.sample_rate``:
        ``1 + (T - W) // H``, capped at ``max_frames`` (the imported front ends:
        ``max_frames`` for every clip)."""
        c = self.config
        if c.frontend != "logmel":
            return torch.full_like(sample_lengths, int(c.max_frames))
        frames = 1 + torch.div(sample_lengths - c.win_length, c.hop_length, rounding_mode="floor")
        frames = frames.clamp(min=0)
        return frames if c.max_frames is None else frames.clamp(max=c.max_frames)

    def log_mel(self, batch: Tensor) -> Tensor:
        """Unnormalised log(mel power + offset) of a 16 kHz (B, T) batch -> (B, F, n_mels)."""
        mel = self.melspec(batch)  # (B, n_mels, F)
        return torch.log(mel + self.config.log_offset).transpose(1, 2)

    def _features(
        self,
        waveform: WaveInput,
        sample_rate: int | None,
        lengths: Tensor | Sequence[int] | None,
    ) -> tuple[Tensor, Tensor]:
        c = self.config
        sample_rate = c.sample_rate if sample_rate is None else sample_rate
        batch, lens = self._to_batch(waveform, lengths)
        batch = batch.to(self.mean.device)
        self._check_finite(batch)
        batch, lens = self.resample(batch, lens, sample_rate)
        too_short = (lens < c.win_length).nonzero().flatten().tolist()
        if too_short:
            got = lens[too_short[0]].item()
            shown = ", ".join(map(str, too_short[:20])) + (
                f", ... and {len(too_short) - 20} more" if len(too_short) > 20 else "")
            layout = ""
            if isinstance(waveform, (Tensor, np.ndarray)) and waveform.ndim == 2 and \
                    waveform.shape[1] <= 8 < waveform.shape[0]:
                layout = (f"; a 2-D waveform is a batch (B, T): for one clip in soundfile's "
                          f"(samples, channels) layout, {tuple(waveform.shape)}, pass "
                          "waveform.T or [waveform]")
            raise ValueError(
                f"clip(s) [{shown}] too short: need at least {c.win_length} samples at "
                f"{c.sample_rate} Hz (one {c.win_ms:g} ms window), clip {too_short[0]} has "
                f"{got}{layout}"
            )
        frame_lens = self.frame_lengths(lens)
        if c.frontend == "kaldi_fbank":
            return torch.stack([kaldi_fbank(clip[: int(n)], c.sample_rate, c.n_mels,
                                            int(c.max_frames))
                                for clip, n in zip(batch, lens, strict=True)]), frame_lens
        if c.frontend == "whisper":
            clips = [whisper_log_mel(clip[None, : int(n)], self.whisper_filters,
                                     int(c.max_frames), c.n_fft, c.hop_length)
                     for clip, n in zip(batch, lens, strict=True)]
            return torch.cat(clips), frame_lens
        feats = self.log_mel(batch)
        if c.max_frames is not None:
            feats = feats[:, : c.max_frames]
        return feats, frame_lens

    def forward(
        self,
        waveform: WaveInput,
        sample_rate: int | None = None,
        lengths: Tensor | Sequence[int] | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Return ``(features (B, F, n_mels), frame_lengths (B,) long)``; see the class doc."""
        feats, frame_lens = self._features(waveform, sample_rate, lengths)
        feats = (feats - self.mean) / self.std
        frame_idx = torch.arange(feats.shape[1], device=feats.device)
        valid = frame_idx < frame_lens.to(feats.device)[:, None]
        feats = feats * valid.unsqueeze(-1)
        return feats, frame_lens

    encode = forward

    # ------------------------------------------------------------------ statistics
    @torch.no_grad()
    def fit_stats(
        self,
        waveforms: Iterable[Tensor | tuple[Tensor, int]],
        sample_rate: int | None = None,
        min_std: float = 1e-5,
    ) -> AudioFrameTokenizer:
        """Fit per-mel-bin mean and std of the log-mel frames of ``waveforms``.

        Each item is a clip tensor ``(T,)`` / ``(C, T)`` at ``sample_rate`` (default the
        config's) or a ``(clip, rate)`` pair. Only valid frames count (no padding):
        ``mean_m = S1_m / N``, ``std_m = sqrt(S2_m / N - mean_m^2)`` (floored at ``min_std``)
        with ``S1, S2`` the sums of ``x`` and ``x^2`` over all ``N`` frames, in float64.
        """
        total = torch.zeros(self.config.n_mels, dtype=torch.float64)
        total_sq = torch.zeros_like(total)
        count = 0
        for item in waveforms:
            clip, rate = item if isinstance(item, tuple) else (item, sample_rate)
            feats, frame_lens = self._features([clip], rate, None)
            valid = feats[0, : int(frame_lens[0])].double().cpu()
            total += valid.sum(dim=0)
            total_sq += (valid**2).sum(dim=0)
            count += valid.shape[0]
        if count == 0:
            raise ValueError("fit_stats got no clips")
        mean = total / count
        std = (total_sq / count - mean**2).clamp(min=0).sqrt().clamp(min=min_std)
        self.mean.copy_(mean.float())
        self.std.copy_(std.float())
        self.fitted.fill_(True)
        return self

    @property
    def is_fitted(self) -> bool:
        return bool(self.fitted)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict: the config plus the fitted statistics."""
        return {
            "config": self.config.to_dict(),
            "mean": self.mean.tolist(),
            "std": self.std.tolist(),
            "fitted": self.is_fitted,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AudioFrameTokenizer:
        tok = cls(AudioFeatureConfig.from_dict(data["config"]))
        n = tok.config.n_mels
        mean, std = torch.tensor(data["mean"]), torch.tensor(data["std"])
        if mean.shape != (n,) or std.shape != (n,):
            raise ValueError(
                f"stats must have {n} values each, got mean {tuple(mean.shape)}, "
                f"std {tuple(std.shape)}"
            )
        tok.mean.copy_(mean)
        tok.std.copy_(std)
        tok.fitted.fill_(bool(data.get("fitted", True)))
        return tok

    def build_embed(self, dim: int) -> FrameEmbed | SpectrogramPatchEmbed | WhisperConvStem:
        """The learnable frames -> tokens module that ``config.mode`` names."""
        c = self.config
        return audio_embed(c.mode, c.n_mels, dim, stack_frames=c.stack_frames,
                           patch_size=c.patch_size, patch_stride=c.patch_stride,
                           freq_stride=c.freq_stride)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def resampled_length(num_samples: int, orig_rate: int, new_rate: int) -> int:
    """Length after :func:`torchaudio.functional.resample`: ``ceil(T * new / orig)``."""
    g = math.gcd(orig_rate, new_rate)
    return _ceil_div(num_samples * (new_rate // g), orig_rate // g)
