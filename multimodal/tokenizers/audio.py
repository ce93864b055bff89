"""Audio tokenizer: waveform -> normalised log-mel frames -> D-dim tokens.

Two stages, kept apart on purpose:

1. :class:`AudioFrameTokenizer` (no learnable weights): any sample rate, mono or
   multi-channel waveform -> mono -> 16 kHz -> log-mel spectrogram, normalised with
   per-mel-bin statistics fitted on a training set (integer PCM of any width is rescaled
   to [-1, 1) first: :mod:`multimodal.tokenizers.waveform`). Output ``(B, frames, n_mels)``
   plus the number of valid frames of each clip (for key-padding masks).
2. The learnable embedding that turns those frames into transformer tokens:
   :class:`FrameEmbed` (linear map of ``k`` stacked frames, one token per ``k`` frames)
   or :class:`SpectrogramPatchEmbed` (AST-style ``p x p`` patches of the (mel, time)
   image with stride ``s``, possibly overlapping).

:class:`SpecAugment` masks bands of mel bins and runs of frames while training.

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
import soundfile as sf
import torch
import torchaudio
from torch import Tensor, nn

from multimodal.tokenizers.audio_frontends import kaldi_fbank, whisper_log_mel, whisper_mel_filters
from multimodal.tokenizers.waveform import as_mono, pcm_to_float

__all__ = [
    "AudioFeatureConfig",
    "AudioFrameTokenizer",
    "ConvStem",
    "FrameEmbed",
    "SpecAugment",
    "SpectrogramPatchEmbed",
    "load_audio",
]


def load_audio(path: str | Path) -> tuple[Tensor, int]:
    """Read a WAV / FLAC / OGG / MP3 file with ``soundfile``.

    Returns ``(waveform, sample_rate)`` with ``waveform`` float32 shaped
    ``(channels, samples)`` in [-1, 1]. A missing file raises FileNotFoundError, a file
    that is not audio raises ValueError naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"audio file not found: {path}")
    try:
        data, sample_rate = sf.read(str(path), dtype="float32", always_2d=True)
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
    two 1-D convolutions, the second with stride 2 (:class:`ConvStem`).
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
            self.melspec = torchaudio.transforms.MelSpectrogram(
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
        out = torchaudio.functional.resample(batch, sample_rate, target)
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

    def build_embed(self, dim: int) -> FrameEmbed | SpectrogramPatchEmbed | ConvStem:
        """The learnable frames -> tokens module that ``config.mode`` names."""
        c = self.config
        if c.mode == "frames":
            return FrameEmbed(c.n_mels, dim, stack_frames=c.stack_frames)
        if c.mode == "conv":
            return ConvStem(c.n_mels, dim)
        return SpectrogramPatchEmbed(c.n_mels, dim, patch_size=c.patch_size, stride=c.patch_stride,
                                     freq_stride=c.freq_stride)


def _check_features(features: Tensor, n_mels: int) -> None:
    if features.dim() != 3 or features.shape[-1] != n_mels:
        raise ValueError(
            f"features must be (B, frames, n_mels={n_mels}), got {tuple(features.shape)}"
        )


class FrameEmbed(nn.Module):
    """``k`` consecutive mel frames -> one D-dim token by a linear map.

    ``(B, F, n_mels) -> (B, F // k, dim)``: frames ``[j k, (j+1) k)`` are concatenated to a
    ``k * n_mels`` vector and mapped with ``W x + b``; the last ``F mod k`` frames are
    dropped. Valid token lengths: ``max(1, L // k)`` for a clip of ``L >= 1`` frames.
    """

    def __init__(self, n_mels: int, dim: int, stack_frames: int = 1) -> None:
        super().__init__()
        if stack_frames < 1:
            raise ValueError(f"stack_frames must be >= 1, got {stack_frames}")
        self.n_mels, self.dim, self.stack_frames = n_mels, dim, stack_frames
        self.proj = nn.Linear(n_mels * stack_frames, dim)

    def num_tokens(self, num_frames: int) -> int:
        return num_frames // self.stack_frames

    def output_lengths(self, frame_lengths: Tensor) -> Tensor:
        """Valid tokens per clip: ``L // k``, at least 1 where ``L >= 1``."""
        tokens = torch.div(frame_lengths, self.stack_frames, rounding_mode="floor")
        return torch.where(frame_lengths > 0, tokens.clamp(min=1), tokens)

    def forward(self, features: Tensor) -> Tensor:
        _check_features(features, self.n_mels)
        b, f, m = features.shape
        k = self.stack_frames
        if f < k:
            raise ValueError(f"need at least stack_frames={k} frames, got {f}")
        n = f // k
        stacked = features[:, : n * k].reshape(b, n, k * m)
        return self.proj(stacked)


class SpectrogramPatchEmbed(nn.Module):
    """AST-style patches of the log-mel image -> tokens, with a Conv2d.

    The features ``(B, F, n_mels)`` are seen as a one-channel image ``(n_mels, F)``; a
    ``patch_size x patch_size`` convolution with stride ``(freq_stride, stride)`` (a stride
    below ``patch_size`` overlaps patches, AST uses 10 with 16; ``freq_stride`` defaults to
    ``stride``) gives a grid of ``freq_patches = (n_mels - p) // s_f + 1`` by
    ``time_patches = (F - p) // s + 1``.
    Tokens are ordered time-major (token ``t * freq_patches + f``) so that the valid tokens
    of a shorter clip form a prefix: ``max(1, time_patches(L)) * freq_patches``.
    """

    def __init__(self, n_mels: int, dim: int, patch_size: int = 16, stride: int = 10,
                 freq_stride: int | None = None) -> None:
        super().__init__()
        freq_stride = stride if freq_stride is None else freq_stride
        if not 1 <= patch_size <= n_mels:
            raise ValueError(f"patch_size must be in [1, n_mels={n_mels}], got {patch_size}")
        if stride < 1 or freq_stride < 1:
            raise ValueError(f"strides must be >= 1, got stride={stride}, "
                             f"freq_stride={freq_stride}")
        self.n_mels, self.dim, self.patch_size, self.stride = n_mels, dim, patch_size, stride
        self.freq_stride = freq_stride
        self.proj = nn.Conv2d(1, dim, kernel_size=patch_size, stride=(freq_stride, stride))

    @property
    def freq_patches(self) -> int:
        return (self.n_mels - self.patch_size) // self.freq_stride + 1

    def time_patches(self, num_frames: int) -> int:
        return max(0, (num_frames - self.patch_size) // self.stride + 1)

    def grid(self, num_frames: int) -> tuple[int, int]:
        """``(freq_patches, time_patches)`` for ``num_frames`` frames."""
        return self.freq_patches, self.time_patches(num_frames)

    def num_tokens(self, num_frames: int) -> int:
        f, t = self.grid(num_frames)
        return f * t

    def output_lengths(self, frame_lengths: Tensor) -> Tensor:
        """Valid tokens per clip: ``max(1, (L - p) // s + 1) * freq_patches`` for ``L >= 1``.

        A clip shorter than one patch still keeps its first column of patches (partly over
        padding) so that no row of a key-padding mask is empty."""
        t = torch.div(frame_lengths - self.patch_size, self.stride, rounding_mode="floor") + 1
        t = torch.where(frame_lengths > 0, t.clamp(min=1), torch.zeros_like(t))
        return t * self.freq_patches

    def forward(self, features: Tensor) -> Tensor:
        _check_features(features, self.n_mels)
        if features.shape[1] < self.patch_size:
            raise ValueError(
                f"need at least patch_size={self.patch_size} frames, got {features.shape[1]}"
            )
        image = features.transpose(1, 2).unsqueeze(1)  # (B, 1, n_mels, F)
        grid = self.proj(image)  # (B, dim, freq_patches, time_patches)
        return grid.permute(0, 3, 2, 1).flatten(1, 2)  # time-major (B, T*Fp, dim)


class ConvStem(nn.Module):
    """Whisper's convolutional stem: ``(B, F, n_mels) -> (B, ceil(F / 2), dim)``.

    ``h = GELU(conv1(x))``, ``y = GELU(conv2(h))`` with 1-D convolutions over time, kernel
    3, padding 1; ``conv1`` maps ``n_mels -> dim`` with stride 1, ``conv2`` ``dim -> dim``
    with stride 2. A clip of ``L`` frames gives ``(L - 1) // 2 + 1`` tokens.
    """

    def __init__(self, n_mels: int, dim: int) -> None:
        super().__init__()
        self.n_mels, self.dim = n_mels, dim
        self.conv1 = nn.Conv1d(n_mels, dim, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(dim, dim, kernel_size=3, stride=2, padding=1)
        self.act = nn.GELU()

    def num_tokens(self, num_frames: int) -> int:
        return (num_frames - 1) // 2 + 1 if num_frames > 0 else 0

    def output_lengths(self, frame_lengths: Tensor) -> Tensor:
        """Valid tokens per clip: ``(L - 1) // 2 + 1`` for ``L >= 1``."""
        tokens = torch.div(frame_lengths - 1, 2, rounding_mode="floor") + 1
        return torch.where(frame_lengths > 0, tokens, torch.zeros_like(tokens))

    def forward(self, features: Tensor) -> Tensor:
        _check_features(features, self.n_mels)
        x = self.act(self.conv1(features.transpose(1, 2)))
        return self.act(self.conv2(x)).transpose(1, 2)


class SpecAugment(nn.Module):
    """SpecAugment on ``(B, frames, n_mels)`` features, only in training mode.

    Applies ``num_masks`` frequency masks (each a band of up to ``freq_mask_param`` mel
    bins) and ``num_masks`` time masks (up to ``time_mask_param`` frames), independently
    per example, filling with ``mask_value`` (0 = the mean after normalisation).
    In ``eval()`` mode the input is returned unchanged.
    """

    def __init__(
        self,
        freq_mask_param: int = 15,
        time_mask_param: int = 20,
        num_masks: int = 2,
        mask_value: float = 0.0,
    ) -> None:
        super().__init__()
        if freq_mask_param < 0 or time_mask_param < 0 or num_masks < 0:
            raise ValueError(
                "freq_mask_param, time_mask_param and num_masks must be >= 0, got "
                f"{freq_mask_param}, {time_mask_param}, {num_masks}"
            )
        self.num_masks, self.mask_value = num_masks, mask_value
        self.freq_mask = torchaudio.transforms.FrequencyMasking(freq_mask_param, iid_masks=True)
        self.time_mask = torchaudio.transforms.TimeMasking(time_mask_param, iid_masks=True)

    def forward(self, features: Tensor) -> Tensor:
        if not self.training or self.num_masks == 0:
            return features
        if features.dim() != 3:
            raise ValueError(f"features must be (B, frames, n_mels), got {tuple(features.shape)}")
        spec = features.transpose(1, 2).unsqueeze(1)  # (B, 1, n_mels, F)
        for _ in range(self.num_masks):
            spec = self.freq_mask(spec, self.mask_value)
            spec = self.time_mask(spec, self.mask_value)
        return spec.squeeze(1).transpose(1, 2)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def resampled_length(num_samples: int, orig_rate: int, new_rate: int) -> int:
    """Length after :func:`torchaudio.functional.resample`: ``ceil(T * new / orig)``."""
    g = math.gcd(orig_rate, new_rate)
    return _ceil_div(num_samples * (new_rate // g), orig_rate // g)
