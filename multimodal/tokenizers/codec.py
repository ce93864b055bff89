"""Audio codec tokenizer: residual vector quantisation (RVQ) of log-mel frames.

The output side of text-to-speech (VALL-E style): a waveform becomes ``Q`` parallel
streams of discrete tokens ``(Q, T)`` (one token per codebook per frame), and tokens go
back to a waveform. This is the cheapest design that can be measured: no learned encoder
or decoder, only codebooks.

Encoding (:meth:`MelRVQCodec.encode`):

1. the waveform is brought to mono 16 kHz and cut into log-mel frames
   ``x_t = log(mel power_t + offset)`` by the package's audio front end
   (:class:`~multimodal.tokenizers.audio.AudioFrameTokenizer`, unnormalised, 10 ms hop);
2. each frame is quantised by ``Q`` codebooks ``E_q`` of ``K`` vectors each (:class:`RVQ`):

   ``r_0 = x``,  ``c_q = argmin_k ||r_{q-1} - e_{q,k}||``,  ``r_q = r_{q-1} - e_{q,c_q}``

   for ``q = 1..Q``; the tokens are ``c_1..c_Q`` and the reconstruction is
   ``x_hat = sum_q e_{q,c_q}`` (so ``x - x_hat = r_Q``).

Frames per token (``config.stack_frames = s``, default 1): ``s`` consecutive frames are
quantised as one vector of ``s * n_mels`` (their concatenation), so a token covers
``s`` hops (``frame_rate = sample_rate / (s * hop)`` tokens per second) while the analysis
and Griffin-Lim keep the short hop that keeps speech intelligible. A clip whose frame count
is not a multiple of ``s`` repeats its last frame to fill the last token; ``T`` tokens
decode to ``s * T`` frames.

Codebooks are fitted by k-means on the residuals (:meth:`RVQ.fit`): codebook 1 by k-means
on the frames, codebook ``q`` by k-means on the residuals ``r_{q-1}`` left by codebooks
``< q``. Each k-means ends with a centroid update, so every centroid is the mean of the
training residuals assigned to it; since ``sum_i ||r_i - m||^2 = sum_i ||r_i||^2 - n ||m||^2``
for the mean ``m`` of ``n`` vectors, and nearest-codeword assignment can only lower the
sum, the mean squared error on the fitted frames never increases with ``q``.

Decoding (:meth:`MelRVQCodec.decode`): ``x_hat`` -> mel power ``exp(x_hat) - offset``
(clamped at 0) -> linear power spectrogram by :class:`torchaudio.transforms.InverseMelScale`
(minimum-norm least squares, ``driver="gelsd"``: with 80 mels over 201 FFT bins some low
filters are empty, so the filter bank is rank deficient) -> waveform by
:class:`torchaudio.transforms.GriffinLim` (phase estimated, so speech sounds
phasey/robotic even with a perfect ``x_hat``). The analysis frames are not centred
(``center=False``), Griffin-Lim's are, so ``W/2`` zeros go on either side: ``T`` frames
decode to ``(T - 1) * H + W`` samples, which encode back to exactly ``T`` frames.

Bad input (``ValueError``, naming the problem): a clip shorter than one window (400 samples
at 16 kHz), a silent clip (RMS below ``config.min_rms``), NaN / inf samples, tokens of the
wrong shape or outside ``[0, K)``. Other sample rates are resampled, channels averaged.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import Tensor, nn

from multimodal.deps import require
from multimodal.tokenizers.audio import AudioFeatureConfig, AudioFrameTokenizer
from multimodal.tokenizers.kmeans import kmeans
from multimodal.tokenizers.waveform import as_mono
from multimodal.weights import save_safetensors

MIN_GRIFFIN_LIM_FRAMES = 3
"""torchaudio's Griffin-Lim (its centred inverse STFT) fails on 1 or 2 frames."""

__all__ = ["RVQ", "CodecConfig", "MelRVQCodec"]

FORMAT_VERSION = 1


class RVQ(nn.Module):
    """Residual vector quantiser: ``Q`` codebooks of ``K`` vectors of size ``D``.

    ``codebooks`` is a ``(Q, K, D)`` buffer. :meth:`encode` maps ``(..., D)`` vectors to
    ``(..., Q)`` codes with ``r_0 = x``, ``c_q = argmin_k ||r_{q-1} - e_{q,k}||``,
    ``r_q = r_{q-1} - e_{q,c_q}``; :meth:`decode` sums ``e_{q,c_q}`` over ``q``.
    ``num_codebooks`` in either call uses only the first ``q`` codebooks.
    """

    def __init__(self, num_codebooks: int, codebook_size: int, dim: int) -> None:
        super().__init__()
        for name, v in (("num_codebooks", num_codebooks), ("codebook_size", codebook_size),
                        ("dim", dim)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        self.num_codebooks, self.codebook_size, self.dim = num_codebooks, codebook_size, dim
        self.register_buffer("codebooks", torch.zeros(num_codebooks, codebook_size, dim))

    def _q(self, num_codebooks: int | None) -> int:
        q = self.num_codebooks if num_codebooks is None else num_codebooks
        if not 1 <= q <= self.num_codebooks:
            raise ValueError(f"num_codebooks must be in [1, {self.num_codebooks}], got {q}")
        return q

    @torch.no_grad()
    def encode(self, x: Tensor, num_codebooks: int | None = None) -> Tensor:
        """Codes ``(..., Q)`` (long) of vectors ``(..., D)``."""
        if x.shape[-1] != self.dim:
            raise ValueError(f"vectors must end in dim {self.dim}, got shape {tuple(x.shape)}")
        residual = x.reshape(-1, self.dim).float()
        codes = []
        for q in range(self._q(num_codebooks)):
            c = torch.cdist(residual, self.codebooks[q]).argmin(dim=1)
            residual = residual - self.codebooks[q][c]
            codes.append(c)
        return torch.stack(codes, dim=-1).reshape(*x.shape[:-1], len(codes))

    def decode(self, codes: Tensor) -> Tensor:
        """Vectors ``(..., D)`` of codes ``(..., q)`` with ``q <= Q``: ``sum_q e_{q,c_q}``."""
        if codes.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
            raise ValueError(f"codes must be integers, got dtype {codes.dtype}")
        q = self._q(codes.shape[-1] if codes.dim() else 0)
        if codes.numel() and (codes.min() < 0 or codes.max() >= self.codebook_size):
            raise ValueError(
                f"codes must be in [0, {self.codebook_size}), got values in "
                f"[{int(codes.min())}, {int(codes.max())}]"
            )
        out = torch.zeros(*codes.shape[:-1], self.dim, device=self.codebooks.device)
        for i in range(q):
            out = out + self.codebooks[i][codes[..., i].long()]
        return out

    @torch.no_grad()
    def fit(
        self, x: Tensor, iters: int = 20, generator: torch.Generator | None = None
    ) -> RVQ:
        """Fit codebook ``q`` by :func:`kmeans` on the residuals of codebooks ``< q``."""
        if x.dim() != 2 or x.shape[1] != self.dim:
            raise ValueError(f"fit expects (N, {self.dim}) vectors, got {tuple(x.shape)}")
        residual = x.float()
        for q in range(self.num_codebooks):
            book = kmeans(residual, self.codebook_size, iters=iters, generator=generator)
            self.codebooks[q].copy_(book)
            residual = residual - book[torch.cdist(residual, book).argmin(dim=1)]
        return self


@dataclass
class CodecConfig:
    """Settings of :class:`MelRVQCodec`.

    ``features``: the log-mel front end (``log_offset`` is the floor of silence in the mel
    power; a higher floor than the classifier's keeps k-means from spending codewords on
    inaudible detail). ``num_codebooks`` = Q, ``codebook_size`` = K. ``stack_frames``: log-mel
    frames per token (see the module doc). ``griffin_lim_iters``:
    Griffin-Lim iterations of :meth:`MelRVQCodec.decode`. ``min_rms``: a clip quieter than
    this (RMS of samples in [-1, 1]) is "silent" and rejected. ``kmeans_iters`` and
    ``max_fit_frames`` (a random subset of that many token vectors is fitted) bound
    :meth:`fit`.
    """

    features: AudioFeatureConfig = field(
        default_factory=lambda: AudioFeatureConfig(n_mels=80, log_offset=1e-5)
    )
    num_codebooks: int = 8
    codebook_size: int = 256
    stack_frames: int = 1
    griffin_lim_iters: int = 32
    min_rms: float = 1e-4
    kmeans_iters: int = 20
    max_fit_frames: int = 50_000

    def __post_init__(self) -> None:
        if isinstance(self.features, dict):
            self.features = AudioFeatureConfig.from_dict(self.features)
        if self.features.max_frames is not None:
            raise ValueError("the codec needs every frame: features.max_frames must be None")
        for name in ("num_codebooks", "codebook_size", "stack_frames", "griffin_lim_iters",
                     "kmeans_iters", "max_fit_frames"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.min_rms < 0:
            raise ValueError(f"min_rms must be >= 0, got {self.min_rms}")

    @property
    def sample_rate(self) -> int:
        return self.features.sample_rate

    @property
    def frame_rate(self) -> float:
        """Tokens per second: ``sample_rate / (stack_frames * hop_length)``."""
        return self.features.sample_rate / (self.stack_frames * self.features.hop_length)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CodecConfig:
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown CodecConfig fields {sorted(unknown)}")
        return cls(**data)


class MelRVQCodec(nn.Module):
    """Waveform <-> ``(Q, T)`` codec tokens by RVQ of log-mel frames; see the module doc.

    ``codec.fit(clips)`` once, then ``tokens = codec.encode(wave, sample_rate)`` (one clip
    ``(samples,)`` or ``(channels, samples)``) and ``wave = codec.decode(tokens)`` (mono,
    ``config.sample_rate``). ``save(path)`` / ``MelRVQCodec.load(path)``: one safetensors
    file, the config in its metadata.
    """

    def __init__(self, config: CodecConfig | None = None) -> None:
        super().__init__()
        self.config = config or CodecConfig()
        f = self.config.features
        self.frontend = AudioFrameTokenizer(f)
        self.rvq = RVQ(self.config.num_codebooks, self.config.codebook_size,
                       f.n_mels * self.config.stack_frames)
        self.register_buffer("fitted", torch.tensor(False))
        f_max = f.f_max if f.f_max is not None else f.sample_rate / 2
        torchaudio = require("torchaudio")
        self.inverse_mel = torchaudio.transforms.InverseMelScale(
            n_stft=f.n_fft // 2 + 1, n_mels=f.n_mels, sample_rate=f.sample_rate,
            f_min=f.f_min, f_max=f_max, driver="gelsd",
        )
        self.griffin_lim = torchaudio.transforms.GriffinLim(
            n_fft=f.n_fft, n_iter=self.config.griffin_lim_iters, win_length=f.win_length,
            hop_length=f.hop_length, power=2.0, rand_init=False,
        )

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    @property
    def frame_rate(self) -> float:
        """Tokens (codec frames) per second."""
        return self.config.frame_rate

    @property
    def num_codebooks(self) -> int:
        return self.config.num_codebooks

    @property
    def codebook_size(self) -> int:
        return self.config.codebook_size

    # ------------------------------------------------------------------ features
    @torch.no_grad()
    def log_mel(self, waveform: Tensor, sample_rate: int | None = None) -> Tensor:
        """Log-mel frames ``(T, n_mels)`` of one clip, after the checks of the module doc."""
        mono = as_mono(waveform, "waveform")
        self.frontend._check_finite(mono[None])
        rate = self.sample_rate if sample_rate is None else sample_rate
        batch, lens = self.frontend.resample(mono[None], torch.tensor([mono.numel()]), rate)
        win = self.config.features.win_length
        if int(lens[0]) < win:
            raise ValueError(
                f"clip too short: {int(lens[0])} samples at {self.sample_rate} Hz, need at "
                f"least one {self.config.features.win_ms:g} ms window ({win} samples)"
            )
        rms = float(batch.pow(2).mean().sqrt())
        if rms < self.config.min_rms:
            raise ValueError(
                f"clip is silent: RMS {rms:.2e} < min_rms={self.config.min_rms:g}; "
                "nothing to encode"
            )
        return self.frontend.log_mel(batch)[0]

    def stack(self, frames: Tensor) -> Tensor:
        """Log-mel frames ``(T, n_mels)`` -> token vectors ``(ceil(T / s), s * n_mels)``, the
        last frame repeated to fill the last token."""
        s = self.config.stack_frames
        extra = -frames.shape[0] % s
        if extra:
            frames = torch.cat([frames, frames[-1:].expand(extra, -1)])
        return frames.reshape(-1, s * frames.shape[1])

    def unstack(self, vectors: Tensor) -> Tensor:
        """Token vectors ``(T, s * n_mels)`` -> log-mel frames ``(s * T, n_mels)``."""
        return vectors.reshape(-1, self.config.features.n_mels)

    # ------------------------------------------------------------------ tokens
    def _check_fitted(self) -> None:
        if not bool(self.fitted):
            raise RuntimeError("the codec has no codebooks yet: call fit(waveforms) or load()")

    @torch.no_grad()
    def encode(
        self, waveform: Tensor, sample_rate: int | None = None, num_codebooks: int | None = None
    ) -> Tensor:
        """Tokens ``(Q, T)`` (long, in ``[0, K)``) of one clip; ``T`` = its log-mel frames
        (``ceil(frames / stack_frames)``)."""
        self._check_fitted()
        return self.rvq.encode(self.stack(self.log_mel(waveform, sample_rate)), num_codebooks).T

    def _check_tokens(self, tokens: Tensor) -> Tensor:
        if not isinstance(tokens, Tensor) or tokens.dim() != 2:
            shape = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens)
            raise ValueError(f"tokens must be (Q, T), got {shape}")
        if not 1 <= tokens.shape[0] <= self.num_codebooks or tokens.shape[1] < 1:
            raise ValueError(
                f"tokens must be (q, T) with 1 <= q <= {self.num_codebooks} and T >= 1, "
                f"got {tuple(tokens.shape)}"
            )
        return tokens

    @torch.no_grad()
    def decode_mel(self, tokens: Tensor) -> Tensor:
        """Quantised log-mel frames ``(s * T, n_mels)`` of tokens ``(q, T)``:
        ``sum_q e_{q,c_q}``, unstacked."""
        self._check_fitted()
        return self.unstack(self.rvq.decode(self._check_tokens(tokens).T))

    @torch.no_grad()
    def mel_to_waveform(self, log_mel: Tensor) -> Tensor:
        """Griffin-Lim waveform ``((T - 1) * H + W,)`` of log-mel frames ``(T, n_mels)``.

        torchaudio's Griffin-Lim needs ``MIN_GRIFFIN_LIM_FRAMES`` frames: a shorter clip (the
        1-2 frames of a 25-45 ms clip) is extended with copies of its last frame and the
        waveform cut back to ``(T - 1) * H + W`` samples, so every clip that encodes
        decodes."""
        f = self.config.features
        frames = log_mel.shape[0]
        if frames < 1:
            raise ValueError("no frames to decode")
        if frames < MIN_GRIFFIN_LIM_FRAMES:
            log_mel = torch.cat([log_mel, log_mel[-1:].expand(
                MIN_GRIFFIN_LIM_FRAMES - frames, -1)])
        power = (log_mel.float().exp() - f.log_offset).clamp(min=0).T  # (n_mels, T)
        linear = self.inverse_mel(power).clamp(min=0)  # (n_fft // 2 + 1, T)
        wave = self.griffin_lim(linear)  # centred frames: (T - 1) * H samples
        half = f.win_length // 2
        wave = nn.functional.pad(wave, (half, f.win_length - half))
        return wave[: (frames - 1) * f.hop_length + f.win_length]

    @torch.no_grad()
    def decode(self, tokens: Tensor) -> Tensor:
        """Mono waveform at ``config.sample_rate`` of tokens ``(q, T)``, ``q <= Q``."""
        return self.mel_to_waveform(self.decode_mel(tokens))

    # ------------------------------------------------------------------ fitting
    @torch.no_grad()
    def fit(
        self,
        waveforms: Iterable[Tensor | tuple[Tensor, int]],
        sample_rate: int | None = None,
        seed: int = 0,
    ) -> MelRVQCodec:
        """Fit the codebooks on the log-mel frames of ``waveforms`` (clips, or ``(clip,
        rate)`` pairs); at most ``config.max_fit_frames`` token vectors, drawn with ``seed``."""
        frames = [
            self.stack(self.log_mel(*(item if isinstance(item, tuple) else (item, sample_rate))))
            for item in waveforms
        ]
        if not frames:
            raise ValueError("fit() got no clips")
        x = torch.cat(frames)
        gen = torch.Generator().manual_seed(seed)
        if x.shape[0] > self.config.max_fit_frames:
            x = x[torch.randperm(x.shape[0], generator=gen)[: self.config.max_fit_frames]]
        self.rvq.fit(x, iters=self.config.kmeans_iters, generator=gen)
        self.fitted.fill_(True)
        return self

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> Path:
        """Write codebooks + config to one safetensors file (parent folders are created)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {"type": "mel_rvq_codec", "format_version": str(FORMAT_VERSION),
                "config": json.dumps(self.config.to_dict()), "fitted": str(bool(self.fitted))}
        save_safetensors({"codebooks": self.rvq.codebooks.contiguous()}, path, metadata=meta)
        return path

    @classmethod
    def load(cls, path: str | Path) -> MelRVQCodec:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"codec file {path} does not exist")
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as fh:
                meta = fh.metadata() or {}
        except Exception as err:  # safetensors raises its own error types
            raise ValueError(f"{path} is not a safetensors codec file: {err}") from None
        if meta.get("type") != "mel_rvq_codec":
            raise ValueError(f"{path} holds no MelRVQCodec (type {meta.get('type')!r})")
        codec = cls(CodecConfig.from_dict(json.loads(meta["config"])))
        books = load_file(str(path))["codebooks"]
        if books.shape != codec.rvq.codebooks.shape:
            raise ValueError(f"{path}: codebooks {tuple(books.shape)}, config says "
                             f"{tuple(codec.rvq.codebooks.shape)}")
        codec.rvq.codebooks.copy_(books)
        codec.fitted.fill_(meta.get("fitted") == "True")
        return codec
