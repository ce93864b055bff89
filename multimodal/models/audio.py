"""Audio classifier: waveform or log-mel frames -> tokens -> shared encoder -> logits.

Pipeline (AST, Gong et al. 2021, for ``mode="patches"``; a frame-stacking encoder for
``mode="frames"``)::

    waveform ──AudioFrameTokenizer──▶ normalised log-mel (B, F, n_mels) + frame lengths
             ──SpecAugment (training only)──▶ FrameEmbed | SpectrogramPatchEmbed
             ──+ positions──▶ [CLS] + tokens ──Transformer (key-padding mask)──▶ pool ──▶ head

Normalisation contract. The model holds an :class:`AudioFrameTokenizer` (``.tokenizer``)
whose per-mel-bin ``mean`` / ``std`` are buffers, saved with the weights. ``features``
given to :meth:`AudioClassifier.forward` must already be normalised with *those* stats;
``waveform`` input is turned into such features by ``.tokenizer``. The data module
(:class:`~multimodal.data.audio.AudioClassificationDataModule`) fits the stats on its
training split and normalises the batches it gives; :meth:`AudioClassifier.adopt_stats`
makes the two agree (``ClassificationTask.setup`` calls it): an unfitted model copies the
data module's stats, a fitted model (pretrained / restored) pushes its own stats to the
data module, whose collate function then normalises like the model. Hence the training
path (features from the data module) and ``model(waveform=...)`` on raw files give the
same logits.

Padding. Clips of different lengths share a batch: ``lengths`` gives each clip's valid
frames (features input) or samples (waveform input). Frames past a clip's end are zeroed,
their tokens are masked as keys in every attention layer and left out of the mean pool,
so a clip's logits do not depend on what it is batched with.

Positions. ``pos_embed="sincos"`` (default): fixed sinusoids over the token's time index
(frames mode: ``r[t, 2i] = sin(t / 10000^(2i/D))``, ``r[t, 2i+1] = cos(...)``; patches
mode: the first D/2 channels encode the time patch index, the last D/2 the frequency patch
index), defined for any length. ``pos_embed="learned"``: a learned table covering
``pos_frames`` frames; a longer clip gets the table linearly stretched to its own length
(so padding never changes a clip's positions).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from multimodal.models.api import AttentionMaps, ClassifierHeadMixin
from multimodal.models.backbone import model_config
from multimodal.nn.block import Transformer
from multimodal.nn.embed import FrameEmbed, SpecAugment, SpectrogramPatchEmbed, WhisperConvStem
from multimodal.nn.init import init_weights, off_meta
from multimodal.nn.pool import mean_pool
from multimodal.nn.position import sincos_2d_positions, sinusoidal_positions
from multimodal.registry import register_config_preset, register_model
from multimodal.tokenizers.audio import AudioFeatureConfig, AudioFrameTokenizer
from multimodal.weights import PretrainedMixin

__all__ = ["AudioClassifier", "AudioClassifierConfig"]


@model_config(dim=192, depth=6, heads=3, norm_eps=1e-6, activation="gelu")
class AudioClassifierConfig:
    """An audio classifier on the shared backbone.

    Features: ``n_mels`` log-mel bins of ``win_ms`` windows every ``hop_ms`` at
    ``sample_rate``; ``max_frames`` (optional) truncates longer clips. Tokens:
    ``mode="frames"`` maps ``stack_frames`` frames to one token; ``mode="patches"`` cuts
    ``patch_size`` squares every ``patch_stride`` frames and ``freq_stride`` bins (default
    ``patch_stride``); ``mode="conv"`` is Whisper's two-convolution stem (stride 2 in time).
    Prefix and head (AST): ``distill_token`` adds a second learned token after the class
    token (needs ``pool="cls"``; the pooled vector is then the mean of the two tokens'
    outputs); ``head_norm`` puts a LayerNorm between the pooled vector and the head.
    SpecAugment (training only):
    ``spec_augment_masks`` frequency masks of up to ``freq_mask`` bins and as many time masks
    of up to ``time_mask`` frames (0 masks: off).
    """

    num_classes: int = 20
    pool: Literal["cls", "mean"] = "mean"
    mode: Literal["frames", "patches", "conv"] = "frames"
    n_mels: int = 80
    stack_frames: int = 1
    patch_size: int = 16
    patch_stride: int = 10
    freq_stride: int | None = None
    distill_token: bool = False
    head_norm: bool = False
    max_frames: int | None = None
    sample_rate: int = 16000
    win_ms: float = 25.0
    hop_ms: float = 10.0
    f_min: float = 0.0
    f_max: float | None = None
    pos_embed: Literal["sincos", "learned"] = "sincos"
    pos_frames: int = 100  # frames the learned table covers (1 s at 10 ms hop)
    frontend: Literal["logmel", "kaldi_fbank", "whisper"] = "logmel"
    freq_mask: int = 0
    time_mask: int = 0
    spec_augment_masks: int = 0

    def __post_init__(self) -> None:
        if self.pool not in ("cls", "mean"):
            raise ValueError(f"pool must be 'cls' or 'mean', got {self.pool!r}")
        if self.distill_token and self.pool != "cls":
            raise ValueError("distill_token needs pool='cls' (the pooled vector is the mean "
                             f"of the class and distillation tokens), got pool={self.pool!r}")
        if self.pos_embed not in ("sincos", "learned"):
            raise ValueError(f"pos_embed must be 'sincos' or 'learned', got {self.pos_embed!r}")
        if self.num_classes < 0:
            raise ValueError(f"num_classes must be >= 0 (0: no head), got {self.num_classes}")
        if self.dim % self.heads:
            raise ValueError(f"dim={self.dim} must be divisible by heads={self.heads}")
        need = 4 if self.mode == "patches" and self.pos_embed == "sincos" else 2
        if self.dim % need:
            raise ValueError(f"mode={self.mode!r} with pos_embed={self.pos_embed!r} needs dim "
                             f"divisible by {need}, got {self.dim}")
        if self.pos_frames < 1:
            raise ValueError(f"pos_frames must be >= 1, got {self.pos_frames}")
        if self.mode == "patches" and self.patch_size > self.n_mels:
            raise ValueError(f"patch_size={self.patch_size} is larger than n_mels={self.n_mels}")
        self.feature_config()  # validates mode, n_mels, window, hop, f_min/f_max, ...

    def feature_config(self) -> AudioFeatureConfig:
        """The :class:`AudioFeatureConfig` of the model's tokenizer."""
        return AudioFeatureConfig(
            sample_rate=self.sample_rate, n_mels=self.n_mels, win_ms=self.win_ms,
            hop_ms=self.hop_ms, f_min=self.f_min, f_max=self.f_max, mode=self.mode,
            stack_frames=self.stack_frames, patch_size=self.patch_size,
            patch_stride=self.patch_stride, freq_stride=self.freq_stride,
            max_frames=self.max_frames, frontend=self.frontend,
        )


# Tokenizer settings that must agree for two tokenizers' features to be interchangeable.
_SIGNAL_FIELDS = ("sample_rate", "n_mels", "win_ms", "hop_ms", "f_min", "f_max", "log_offset",
                  "frontend")


@register_model
class AudioClassifier(ClassifierHeadMixin, PretrainedMixin, nn.Module):
    """Waveforms or normalised log-mel features -> logits ``(B, num_classes)``.

    ``forward(features=(B, F, n_mels), lengths=frames)`` or
    ``forward(waveform=(B, T) | (T,) | (B, C, T) | list, lengths=samples, sample_rate=...)``;
    the keyword names are those of the data module's batches, so ``model(**batch)`` works.
    ``return_attention=True`` also returns the
    :class:`~multimodal.models.api.AttentionMaps` (``self_attn``: one ``(B, heads, tokens,
    tokens)`` map per layer, the class token first when ``pool="cls"``).
    """

    config_class = AudioClassifierConfig
    modality = "audio"

    def __init__(self, config: AudioClassifierConfig) -> None:
        super().__init__()
        self.config = config
        with off_meta():  # no parameters; its filter banks and statistics stay real
            self.tokenizer = AudioFrameTokenizer(config.feature_config())
        # torch's periodic Hann window is a view of a longer one; safetensors refuses to save
        # a buffer that does not own its whole storage, so give it its own copy.
        spectrogram = self.tokenizer.melspec.spectrogram
        spectrogram.window = spectrogram.window.clone()
        self.spec_augment = SpecAugment(config.freq_mask, config.time_mask,
                                        config.spec_augment_masks)
        self.embed: FrameEmbed | SpectrogramPatchEmbed | WhisperConvStem = \
            self.tokenizer.build_embed(config.dim)
        self.num_prefix_tokens = (1 + config.distill_token) if config.pool == "cls" else 0
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.dim)) if config.pool == "cls" \
            else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, config.dim)) if config.distill_token \
            else None
        if config.pos_embed == "learned":
            time = self._time_tokens(config.pos_frames)
            shape = (time, config.dim) if config.mode != "patches" else \
                (time, self._freq_tokens, config.dim)
            self.pos_table = nn.Parameter(torch.randn(*shape) * 0.02)
        else:
            self.register_parameter("pos_table", None)
        self.pos_drop = nn.Dropout(config.dropout)
        self.transformer = Transformer(config.backbone)
        self.head_norm = nn.LayerNorm(config.dim, eps=config.norm_eps) if config.head_norm \
            else nn.Identity()
        self.head = nn.Linear(config.dim, config.num_classes) if config.num_classes > 0 \
            else nn.Identity()
        self.apply(partial(init_weights, conv_fan_in=True))

    # -- token geometry ----------------------------------------------------------------
    @property
    def _freq_tokens(self) -> int:
        return self.embed.freq_patches if isinstance(self.embed, SpectrogramPatchEmbed) else 1

    @property
    def _min_frames(self) -> int:
        """Frames the embedding needs to make one token (shorter inputs are zero padded)."""
        c = self.config
        return {"frames": c.stack_frames, "patches": c.patch_size}.get(c.mode, 1)

    def _time_tokens(self, num_frames: int) -> int:
        if isinstance(self.embed, SpectrogramPatchEmbed):
            return max(1, self.embed.time_patches(num_frames))
        return max(1, self.embed.num_tokens(num_frames))

    # -- normalisation stats shared with the data module --------------------------------
    def adopt_stats(self, tokenizer: AudioFrameTokenizer) -> None:
        """Make this model and a data module's ``tokenizer`` normalise alike.

        An unfitted model copies ``tokenizer``'s mean/std; a fitted one (pretrained or
        restored) writes its own into ``tokenizer`` (in place, so collate functions that
        hold it follow). Signal settings (rate, mels, window, hop, ...) must match.
        """
        if not isinstance(tokenizer, AudioFrameTokenizer):
            raise ValueError(f"expected an AudioFrameTokenizer, got {type(tokenizer).__name__}")
        mine, theirs = self.tokenizer.config, tokenizer.config
        diff = {f: (getattr(mine, f), getattr(theirs, f)) for f in _SIGNAL_FIELDS
                if getattr(mine, f) != getattr(theirs, f)}
        if diff:
            detail = ", ".join(f"{k}: model {a} vs data {b}" for k, (a, b) in diff.items())
            raise ValueError(f"the data's audio features do not match the model's ({detail}); "
                             "set the same values in the model config and the data module")
        src, dst = (self.tokenizer, tokenizer) if self.tokenizer.is_fitted else \
            (tokenizer, self.tokenizer)
        if not src.is_fitted:
            return
        with torch.no_grad():
            dst.mean.copy_(src.mean)
            dst.std.copy_(src.std)
            dst.fitted.fill_(True)

    def setup_from_data(self, datamodule: Any) -> None:
        """Hook for training tasks: share normalisation stats with ``datamodule.tokenizer``."""
        tokenizer = getattr(datamodule, "tokenizer", None)
        if isinstance(tokenizer, AudioFrameTokenizer):
            self.adopt_stats(tokenizer)

    # -- input checks --------------------------------------------------------------------
    def _check_features(self, features: Tensor, lengths: Tensor | None) -> tuple[Tensor, Tensor]:
        n_mels = self.config.n_mels
        if not isinstance(features, Tensor) or not features.is_floating_point():
            kind = features.dtype if isinstance(features, Tensor) else type(features).__name__
            raise ValueError(f"features must be a float tensor (B, frames, {n_mels}), got {kind}")
        if features.dim() != 3 or features.shape[-1] != n_mels or features.shape[1] < 1:
            raise ValueError(f"features must be (B, frames, n_mels={n_mels}) with frames >= 1, "
                             f"got shape {tuple(features.shape)}")
        if not torch.isfinite(features).all():
            raise ValueError("features contain NaN or inf values")
        b, f = features.shape[:2]
        if lengths is None:
            lengths = torch.full((b,), f, dtype=torch.long, device=features.device)
        else:
            lengths = torch.as_tensor(lengths, device=features.device)
            if lengths.shape != (b,) or lengths.is_floating_point():
                raise ValueError(f"lengths must be an integer tensor of shape ({b},) (valid "
                                 f"frames per clip), got {lengths.dtype} {tuple(lengths.shape)}")
            if (lengths < 1).any() or (lengths > f).any():
                raise ValueError(f"lengths must be in [1, {f}] frames, got {lengths.tolist()}")
            lengths = lengths.long()
        return features, lengths

    # -- features -> tokens ----------------------------------------------------------------
    def features_from_waveform(
        self, waveform: Any, lengths: Tensor | None = None, sample_rate: int | None = None
    ) -> tuple[Tensor, Tensor]:
        """Normalised log-mel ``(B, F, n_mels)`` and frame lengths, by the model's tokenizer."""
        return self.tokenizer(waveform, sample_rate, lengths)

    def _positions(self, time_tokens: int, ref: Tensor,
                   clip_time_tokens: Tensor | None = None) -> Tensor:
        """Position rows in the embedding's (time-major) token order: ``(1, N, dim)``, or
        ``(B, N, dim)`` for learned positions with ``clip_time_tokens`` (each clip's valid
        time tokens) so that a clip longer than the table gets the table stretched to *its*
        length, whatever the batch's padded length."""
        c, fp = self.config, self._freq_tokens
        if self.pos_table is None:
            if c.mode != "patches":
                return sinusoidal_positions(time_tokens, c.dim).to(ref)[None]
            return sincos_2d_positions(time_tokens, fp, c.dim).to(ref)[None]
        table = self.pos_table.to(ref.dtype).reshape(-1, fp, c.dim)  # (T, fp, dim)
        rows = table[:time_tokens]
        if rows.shape[0] < time_tokens:  # padded part: masked, any value will do
            rows = torch.cat([rows, rows.new_zeros(time_tokens - rows.shape[0], fp, c.dim)])
        if clip_time_tokens is None:
            clip_time_tokens = torch.tensor([time_tokens])
        out = rows[None].repeat(clip_time_tokens.shape[0], 1, 1, 1)
        for n in clip_time_tokens[clip_time_tokens > table.shape[0]].unique().tolist():
            out[clip_time_tokens == n, :n] = stretch_time(table, n)
        return out.flatten(1, 2)

    def embed_tokens(self, features: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """Tokens with positions (and class token) ``(B, prefix + N, dim)`` and the key
        padding mask ``(B, prefix + N)`` (True = padding)."""
        c = self.config
        if c.max_frames is not None and features.shape[1] > c.max_frames:
            features, lengths = features[:, : c.max_frames], lengths.clamp(max=c.max_frames)
        frames = torch.arange(features.shape[1], device=features.device)
        valid = frames[None, :] < lengths[:, None]
        features = features * valid.unsqueeze(-1).to(features.dtype)  # padding -> 0 (the mean)
        features = self.spec_augment(features)
        if features.shape[1] < self._min_frames:
            features = F.pad(features, (0, 0, 0, self._min_frames - features.shape[1]))
        x = self.embed(features)  # (B, N, dim), time-major
        token_lengths = self.embed.output_lengths(lengths)
        time_tokens = x.shape[1] // self._freq_tokens
        x = x + self._positions(time_tokens, x, token_lengths // self._freq_tokens)
        pad = torch.arange(x.shape[1], device=x.device)[None, :] >= token_lengths[:, None]
        prefix = [t for t in (self.cls_token, self.dist_token) if t is not None]
        if prefix:
            x = torch.cat([*(t.expand(x.shape[0], -1, -1).to(x.dtype) for t in prefix), x], dim=1)
            pad = torch.cat([pad.new_zeros(pad.shape[0], len(prefix)), pad], dim=1)
        return self.pos_drop(x), pad

    @property
    def num_features(self) -> int:
        return self.config.dim

    def example_inputs(self, batch_size: int = 2) -> tuple[Tensor, ...]:
        """Random normalised log-mel features ``(B, frames, n_mels)``, frames enough for
        a few tokens."""
        frames = max(4 * self._min_frames, 32)
        if self.config.max_frames is not None:
            frames = min(frames, self.config.max_frames)
        return (torch.randn(batch_size, frames, self.config.n_mels),)

    def _encode(self, features: Tensor, lengths: Tensor | None, return_attention: bool
                ) -> tuple[Tensor, Tensor, AttentionMaps | None]:
        """Tokens ``(B, prefix + N, dim)``, their attention mask (True = real token) and the
        attention maps (None unless ``return_attention``)."""
        features, lengths = self._check_features(features, lengths)
        x, pad = self.embed_tokens(features, lengths)
        mask = pad if pad.any() else None
        out = self.transformer(x, key_padding_mask=mask, return_attention=return_attention)
        if return_attention:
            return out[0], ~pad, AttentionMaps.from_layers(out[1])
        return out, ~pad, None

    def forward_features(
        self, features: Tensor, lengths: Tensor | None = None, return_attention: bool = False,
        return_attention_mask: bool = False,
    ) -> Tensor | tuple[Tensor, ...]:
        """Encoder output ``(B, prefix + N, dim)`` after the final norm; with
        ``return_attention_mask`` also its attention mask ``(B, prefix + N)`` (True = real
        token, False = padding, as :meth:`pool` takes it), with ``return_attention`` also
        the :class:`~multimodal.models.api.AttentionMaps` (in that order)."""
        tokens, valid, maps = self._encode(features, lengths, return_attention)
        out = (tokens, *((valid,) if return_attention_mask else ()),
               *((maps,) if return_attention else ()))
        return out if len(out) > 1 else tokens

    def pool(self, features: Tensor, *, attention_mask: Tensor | None = None) -> Tensor:
        """Class token (with a distillation token: ``(x_cls + x_dist) / 2``, as AST), or
        the mean over real tokens: ``sum_n m_n x_n / sum_n m_n`` (``attention_mask`` m is
        1 at real tokens; None: every token is real), by
        :func:`multimodal.nn.pool.mean_pool`."""
        if self.config.pool == "cls":
            return (features[:, 0] + features[:, 1]) / 2 if self.dist_token is not None \
                else features[:, 0]
        return mean_pool(features, attention_mask)

    def forward_head(self, features: Tensor, pre_logits: bool = False, *,
                     attention_mask: Tensor | None = None) -> Tensor:
        """Class logits ``(B, num_classes)`` of the pooled tokens, ``head(head_norm(pooled))``
        (``pre_logits``: the pooled tokens; ``num_classes=0``: the pooled tokens through
        ``head_norm``)."""
        pooled = self.pool(features, attention_mask=attention_mask)
        return pooled if pre_logits else self.head(self.head_norm(pooled))

    def forward(
        self,
        features: Tensor | None = None,
        lengths: Tensor | None = None,
        waveform: Any = None,
        sample_rate: int | None = None,
        return_attention: bool = False,
    ) -> Tensor | tuple[Tensor, AttentionMaps]:
        """Logits ``(B, num_classes)`` (pooled features when ``num_classes == 0``).

        Give exactly one of ``features`` (normalised log-mel, ``lengths`` in frames) or
        ``waveform`` (``lengths`` in samples, ``sample_rate`` default the config's).
        """
        if (features is None) == (waveform is None):
            raise ValueError("give exactly one of features=(B, frames, n_mels) or "
                             "waveform=(B, samples)")
        if waveform is not None:
            features, lengths = self.features_from_waveform(waveform, lengths, sample_rate)
        tokens, valid, maps = self._encode(features, lengths, return_attention)
        logits = self.forward_head(tokens, attention_mask=valid)
        return (logits, maps) if return_attention else logits

    @torch.no_grad()
    def predict_waveform(self, waveform: Any, sample_rate: int | None = None) -> Tensor:
        """Class probabilities ``(B, num_classes)`` of raw clips, in eval mode."""
        was_training = self.training
        self.eval()
        try:
            return self(waveform=waveform, sample_rate=sample_rate).softmax(dim=-1)
        finally:
            self.train(was_training)


def stretch_time(table: Tensor, length: int) -> Tensor:
    """Linearly resample a ``(T, ...)`` table to ``(length, ...)`` along its first axis,
    ends aligned: row ``j`` is the table at ``j (T - 1) / (length - 1)``."""
    flat = table.reshape(table.shape[0], -1).t()[None].float()  # (1, C, T)
    out = F.interpolate(flat, size=length, mode="linear", align_corners=True)
    return out[0].t().reshape(length, *table.shape[1:]).to(table.dtype)


def _audio_preset(name: str, **defaults: object) -> None:
    register_config_preset(name, AudioClassifier, AudioClassifierConfig, **defaults)


# A small frame-stacking encoder that trains on a CPU in minutes (spoken words, ~1 s clips).
_audio_preset("audio_frames_small", num_classes=20, dim=128, depth=4, heads=4, mlp_dim=256,
              mode="frames", n_mels=40, stack_frames=2, pool="mean")
# AST-style overlapping 16x16 patches (stride 10), ViT-Tiny width (Gong et al., 2021).
_audio_preset("ast_tiny_patch16", num_classes=527, dim=192, depth=12, heads=3, mode="patches",
              n_mels=128, patch_size=16, patch_stride=10, pool="cls")
# configs/audio_spoken_words.yaml (also audio_folder.yaml, speaker_id.yaml): the small
# frame-stacking encoder with sinusoidal positions, dropout and SpecAugment (two frequency
# masks of up to 8 bins, two time masks of up to 10 frames, training only).
_audio_preset("audio_spoken_words", num_classes=20, dim=128, depth=4, heads=4, mlp_dim=256,
              mode="frames", n_mels=40, stack_frames=2, pool="mean", pos_embed="sincos",
              dropout=0.1, freq_mask=8, time_mask=10, spec_augment_masks=2)
# configs/audio_sonic_pi.yaml: 64 mel bins, 4 frames per token, width 96, 3 blocks.
_audio_preset("audio_sonic_pi", num_classes=10, dim=96, depth=3, heads=4, mlp_dim=192,
              mode="frames", n_mels=64, stack_frames=4, pool="mean", pos_embed="sincos",
              dropout=0.1, freq_mask=8, time_mask=10, spec_augment_masks=2)
