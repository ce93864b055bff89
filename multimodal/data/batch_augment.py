"""Image transforms of whole batches, on whatever device the batch is on.

The batched twins of the per-item transforms that a DataLoader applies one image at a time
(:class:`~multimodal.data.vision_transforms.ShiftFlip`, the normalisation of
:class:`~multimodal.data.vision_datasets.TensorImageDataset` and of torchvision's
``ToDtype(scale=True)`` + ``Normalize``), for batches taken from a split held on the
accelerator (:mod:`multimodal.data.device_batches`).

Random shift and flip (``RandomCrop(size, padding=pad)`` + ``RandomHorizontalFlip()``):
for each image, ``flip ~ Bernoulli(1/2)`` and the offsets ``dy, dx ~ U{-pad, ..., pad}``
independently, then ``out[y, x] = f[y - dy, x - dx]`` (0 outside the image) with ``f`` the
image, mirrored (``f[y, x] = image[y, W - 1 - x]``) when ``flip``. The draws come in one
call per epoch from a seeded generator (:meth:`BatchImageTransform.draw`), the pixels are
moved by two gathers over the zero-padded batch: the same distributions as the per-item
transform, and, for the same draws, the same images bit for bit.

Normalisation, per channel, in float32: ``x = pixel * (1 / (255 std)) + (-mean / std)``
(:class:`AffineNormalise`, the in-memory image datasets' order of operations) or
``x = (pixel / 255 - mean) / std`` (:class:`DivideNormalise`, the caption datasets'); each
gives the bits of the per-item path it stands for.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["AffineNormalise", "BatchImageTransform", "DivideNormalise", "shift_flip"]


def _channels(value: float | Sequence[float] | torch.Tensor, channels: int, name: str
              ) -> torch.Tensor:
    values = value.flatten().tolist() if isinstance(value, torch.Tensor) else \
        [float(value)] if isinstance(value, (int, float)) else [float(v) for v in value]
    if len(values) == 1:
        values = values * channels
    if len(values) != channels:
        raise ValueError(f"{name} needs 1 or {channels} values, got {len(values)}")
    return torch.tensor(values, dtype=torch.float32).view(channels, 1, 1)


class AffineNormalise:
    """uint8 (B, C, H, W) -> float32 ``pixel * scale + shift``, ``scale = 1 / (255 std)``,
    ``shift = -mean / std`` (what :class:`~multimodal.data.vision_datasets.TensorImageDataset`
    computes per item)."""

    def __init__(self, mean: float | Sequence[float], std: float | Sequence[float],
                 channels: int) -> None:
        std_t = _channels(std, channels, "std")
        self.scale = 1.0 / (255.0 * std_t)
        self.shift = -_channels(mean, channels, "mean") / std_t

    def to(self, device: torch.device | str) -> AffineNormalise:
        self.scale, self.shift = self.scale.to(device), self.shift.to(device)
        return self

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return images.float().mul_(self.scale).add_(self.shift)


class DivideNormalise:
    """uint8 (B, C, H, W) -> float32 ``(pixel / 255 - mean) / std``: what
    :class:`~multimodal.data.captions.CaptionDataset` computes per item, or with
    ``torchvision=True`` as torchvision's ``ToDtype(float32, scale=True)`` + ``Normalize``
    round it (``pixel * (1 / 255)``, your image files' pipeline)."""

    def __init__(self, mean: float | Sequence[float] | torch.Tensor,
                 std: float | Sequence[float] | torch.Tensor, channels: int,
                 torchvision: bool = False) -> None:
        self.mean = _channels(mean, channels, "mean")
        self.std = _channels(std, channels, "std")
        self.torchvision = torchvision

    def to(self, device: torch.device | str) -> DivideNormalise:
        self.mean, self.std = self.mean.to(device), self.std.to(device)
        return self

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        x = images.float()
        x = x.mul_(1.0 / 255) if self.torchvision else x.div_(255.0)
        return x.sub_(self.mean).div_(self.std)


def shift_flip(images: torch.Tensor, flips: torch.Tensor | None, offsets: torch.Tensor | None,
               pad: int) -> torch.Tensor:
    """Each image of ``images`` (B, C, H, W) mirrored where ``flips`` (B,) is true, then
    moved by ``offsets`` (B, 2) = ``(dy, dx)`` with zero fill (``|dy|, |dx| <= pad``):
    ``out[b, :, y, x] = f_b[y - dy, x - dx]``. Two gathers over the batch padded by ``pad``
    on every side; no loop over the images."""
    b, c, h, w = images.shape
    device = images.device
    if offsets is None:
        offsets = torch.zeros(b, 2, dtype=torch.long, device=device)
    if pad:
        images = torch.nn.functional.pad(images, (pad, pad, pad, pad))
    rows = torch.arange(h, device=device) + pad - offsets[:, :1]  # (B, H)
    x = torch.arange(w, device=device)
    cols = x + pad - offsets[:, 1:]  # (B, W)
    if flips is not None:
        cols = torch.where(flips[:, None], (w - 1 - x) + pad + offsets[:, 1:], cols)
    out = images.gather(2, rows.view(b, 1, h, 1).expand(b, c, h, images.shape[3]))
    return out.gather(3, cols.view(b, 1, 1, w).expand(b, c, h, w))


class BatchImageTransform:
    """What a batch of uint8 images goes through: random shift by up to ``pad`` pixels and
    horizontal flips (training only), then ``normalise`` (None: the uint8 pixels as they
    are, e.g. for a pixel likelihood model).

    :meth:`draw` makes the random choices of ``n`` images at once (flip first, then the
    offsets: ``flips`` (n,) bool or None, ``offsets`` (n, 2) int64 or None);
    :meth:`__call__` applies a batch's share of them.
    """

    def __init__(self, pad: int = 0, flip: bool = False,
                 normalise: AffineNormalise | DivideNormalise | None = None) -> None:
        if pad < 0:
            raise ValueError(f"pad must be >= 0, got {pad}")
        self.pad, self.flip, self.normalise = pad, flip, normalise

    @property
    def random(self) -> bool:
        """Whether the transform draws anything."""
        return bool(self.pad or self.flip)

    def to(self, device: torch.device | str) -> BatchImageTransform:
        if self.normalise is not None:
            self.normalise = self.normalise.to(device)
        return self

    def draw(self, n: int, generator: torch.Generator
             ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Flips ``~ Bernoulli(1/2)`` and offsets ``~ U{-pad..pad}^2`` of ``n`` images."""
        flips = torch.rand(n, generator=generator) < 0.5 if self.flip else None
        offsets = torch.randint(-self.pad, self.pad + 1, (n, 2), generator=generator) \
            if self.pad else None
        return flips, offsets

    def apply(self, arrays: list[torch.Tensor], flips: torch.Tensor | None,
              offsets: torch.Tensor | None) -> list[torch.Tensor]:
        """A held batch's arrays with the first (the images) transformed
        (:class:`~multimodal.data.device_batches.BatchTransform`)."""
        return [self(arrays[0], flips, offsets), *arrays[1:]]

    def __call__(self, images: torch.Tensor, flips: torch.Tensor | None = None,
                 offsets: torch.Tensor | None = None) -> torch.Tensor:
        if flips is not None or offsets is not None:
            images = shift_flip(images, flips, offsets, self.pad)
        return images if self.normalise is None else self.normalise(images)
