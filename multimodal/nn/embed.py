"""Learned embeddings that turn images and spectrograms into transformer tokens.

Images ``(B, C, H, W) -> (B, N, D)``, ``N = (H/p)(W/p)`` in raster order:
:class:`PatchEmbed` (each patch mapped linearly, a stride-p convolution) and
:class:`ConvPatchEmbed` (a stack of 3x3 stride-2 convolutions over the same grid).

Log-mel features ``(B, frames, n_mels) -> (B, tokens, D)``: :class:`FrameEmbed` (``k``
stacked frames, one linear map), :class:`SpectrogramPatchEmbed` (AST-style ``p x p``
patches), :class:`WhisperConvStem` (Whisper's two 1-D convolutions); :func:`audio_embed`
builds the one an audio feature mode names. :class:`SpecAugment` masks bands of mel bins
and runs of frames while training.

The tokenizers (:mod:`multimodal.tokenizers`) hold no weights: they turn pixels and
waveforms into the tensors these modules read.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = [
    "ConvPatchEmbed", "FrameEmbed", "PatchEmbed", "SpecAugment", "SpectrogramPatchEmbed",
    "WhisperConvStem", "as_pair", "audio_embed", "check_images", "mask_bands",
]


def as_pair(x: int | tuple[int, int]) -> tuple[int, int]:
    """A size as ``(height, width)``: an int is a square."""
    return (x, x) if isinstance(x, int) else (int(x[0]), int(x[1]))


def check_images(images: Tensor, in_channels: int, patch_size: int | tuple[int, int]) -> None:
    """Raise a ValueError unless ``images`` is a float (B, in_channels, H, W) batch whose
    sides are multiples of the patch size."""
    if not isinstance(images, Tensor):
        raise ValueError(f"expected a torch.Tensor of images, got {type(images).__name__}")
    if images.dim() != 4:
        raise ValueError(f"expected images of shape (batch, {in_channels}, height, width), "
                         f"got a {images.dim()}-d tensor of shape {tuple(images.shape)}")
    if images.shape[1] != in_channels:
        raise ValueError(f"expected {in_channels} channel(s), got {images.shape[1]} "
                         f"(images of shape {tuple(images.shape)})")
    if not images.is_floating_point():
        raise ValueError(f"expected floating-point images (normalised), got {images.dtype}; "
                         "convert uint8 images with .float() / 255 and normalise")
    ph, pw = as_pair(patch_size)
    h, w = images.shape[-2:]
    if h % ph or w % pw:
        raise ValueError(f"image size {h}x{w} is not a multiple of the patch size {ph}x{pw}")


class _GridEmbed(nn.Module):
    """What every image-to-tokens embedding shares: ``self.proj`` maps (B, C, H, W) to a
    (B, D, H/p, W/p) feature grid, read out as (B, N, D) tokens in raster order."""

    patch_size: tuple[int, int]
    in_channels: int
    proj: nn.Module

    def grid_size(self, height: int, width: int) -> tuple[int, int]:
        return height // self.patch_size[0], width // self.patch_size[1]

    def forward(self, images: Tensor) -> Tensor:
        check_images(images, self.in_channels, self.patch_size)
        return self.proj(images).flatten(2).transpose(1, 2)


class PatchEmbed(_GridEmbed):
    """(B, C, H, W) -> (B, N, D) with N = (H/p)(W/p): each patch flattened and mapped
    linearly to D dims (``x_n = W vec(patch_n) + b``, as a stride-p convolution)."""

    def __init__(self, patch_size: int | tuple[int, int] = 16, in_channels: int = 3,
                 dim: int = 768, bias: bool = True) -> None:
        super().__init__()
        self.patch_size = as_pair(patch_size)
        self.in_channels = in_channels
        self.proj = nn.Conv2d(in_channels, dim, kernel_size=self.patch_size,
                              stride=self.patch_size, bias=bias)


class ConvPatchEmbed(_GridEmbed):
    """A convolutional patch embedding ("early convolutions", Xiao et al. 2021): the same
    (B, C, H, W) -> (B, N, D) map and grid as :class:`PatchEmbed`, but through
    log2(p) 3x3 stride-2 convolutions (BatchNorm, ReLU), channels doubling from
    ``dim / 2**log2(p)`` up to ``dim / 2``, then a 1x1 convolution to ``dim``. Local,
    translation-equivariant features make shapes easier to read than one linear map of
    each patch. Square, power-of-two patches only."""

    def __init__(self, patch_size: int | tuple[int, int] = 16, in_channels: int = 3,
                 dim: int = 768) -> None:
        super().__init__()
        ph, pw = as_pair(patch_size)
        if ph != pw or ph < 2 or ph & (ph - 1):
            raise ValueError(f"ConvPatchEmbed needs a square power-of-two patch size >= 2, got "
                             f"{ph}x{pw}")
        self.patch_size = (ph, pw)
        self.in_channels = in_channels
        steps = ph.bit_length() - 1
        layers: list[nn.Module] = []
        channels = in_channels
        for i in range(steps):
            out = max(dim >> (steps - i), 8)
            layers += [nn.Conv2d(channels, out, 3, stride=2, padding=1, bias=False),
                       nn.BatchNorm2d(out), nn.ReLU(inplace=True)]
            channels = out
        layers.append(nn.Conv2d(channels, dim, kernel_size=1))
        self.proj = nn.Sequential(*layers)


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


class WhisperConvStem(nn.Module):
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


def mask_bands(features: Tensor, max_width: int, dim: int, value: float = 0.0) -> Tensor:
    """One band of ``features`` along ``dim`` (-1 or -2) set to ``value``, drawn
    independently for every example: width ``w = floor(u_1 * max_width)``, start
    ``floor(u_2 * (L - u_1 * max_width))`` with ``u_1, u_2 ~ U[0, 1)`` and ``L`` the length
    of ``dim``. Draws and masks are torchaudio's ``mask_along_axis_iid`` (the same masks
    for the same generator state), written on torch so audio models need no torchaudio."""
    if max_width < 1:
        return features
    batch = features.shape[:-2]
    width = torch.rand(batch, device=features.device, dtype=features.dtype) * max_width
    start = torch.rand(batch, device=features.device, dtype=features.dtype) * (
        features.size(dim) - width)
    first = start.long()[..., None, None]
    end = first + width.long()[..., None, None]
    index = torch.arange(features.size(dim), device=features.device, dtype=features.dtype)
    moved = features.transpose(dim, -1)
    return moved.masked_fill((index >= first) & (index < end), value).transpose(dim, -1)


class SpecAugment(nn.Module):
    """SpecAugment on ``(B, frames, n_mels)`` features, only in training mode.

    Applies ``num_masks`` frequency masks (each a band of up to ``freq_mask_param`` mel
    bins) and ``num_masks`` time masks (up to ``time_mask_param`` frames), independently
    per example, filling with ``mask_value`` (0 = the mean after normalisation); the bands
    are drawn as :func:`mask_bands` says. In ``eval()`` mode the input is returned unchanged.
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
        self.freq_mask_param, self.time_mask_param = freq_mask_param, time_mask_param

    def forward(self, features: Tensor) -> Tensor:
        if not self.training or self.num_masks == 0:
            return features
        if features.dim() != 3:
            raise ValueError(f"features must be (B, frames, n_mels), got {tuple(features.shape)}")
        spec = features.transpose(1, 2).unsqueeze(1)  # (B, 1, n_mels, F)
        for _ in range(self.num_masks):
            spec = mask_bands(spec, self.freq_mask_param, -2, self.mask_value)
            spec = mask_bands(spec, self.time_mask_param, -1, self.mask_value)
        return spec.squeeze(1).transpose(1, 2)


def audio_embed(mode: str, n_mels: int, dim: int, *, stack_frames: int = 1,
                patch_size: int = 16, patch_stride: int = 10, freq_stride: int | None = None,
                ) -> FrameEmbed | SpectrogramPatchEmbed | WhisperConvStem:
    """The frames -> tokens module for an audio feature ``mode``: ``"frames"``
    (:class:`FrameEmbed`), ``"conv"`` (:class:`WhisperConvStem`), otherwise patches
    (:class:`SpectrogramPatchEmbed`)."""
    if mode == "frames":
        return FrameEmbed(n_mels, dim, stack_frames=stack_frames)
    if mode == "conv":
        return WhisperConvStem(n_mels, dim)
    return SpectrogramPatchEmbed(n_mels, dim, patch_size=patch_size, stride=patch_stride,
                                 freq_stride=freq_stride)
