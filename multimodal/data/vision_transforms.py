"""Per-modality transforms. Images: ``torchvision.transforms.v2`` pipelines on uint8 tensors.

Training: (RandomResizedCrop | Resize) -> [random shift] -> [horizontal flip] ->
[RandAugment | TrivialAugmentWide] -> float in [0, 1] -> Normalize. Evaluation: Resize ->
float -> Normalize. ``Normalize`` computes ``x = (pixel / 255 - mean) / std`` per channel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from multimodal.tokenizers.image_geometry import CenterCrop

__all__ = ["AUTO_AUGMENT", "ImageTransformConfig", "ShiftFlip", "geometry_steps",
           "image_transform"]

AUTO_AUGMENT = ("rand", "trivial")


class ShiftFlip:
    """Random translation by up to ``pad`` pixels (zero fill), optional horizontal flip.

    The same as torchvision's ``RandomCrop(size, padding=pad)`` followed by
    ``RandomHorizontalFlip()``, written with tensor slicing because it runs once per
    training item on the CPU.
    """

    def __init__(self, pad: int, flip: bool) -> None:
        self.pad, self.flip = pad, flip

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        if self.flip and torch.rand(()) < 0.5:
            image = image.flip(-1)
        if self.pad == 0:
            return image
        dy, dx = (torch.randint(-self.pad, self.pad + 1, (2,))).tolist()
        if dy == 0 and dx == 0:
            return image
        h, w = image.shape[-2:]
        out = torch.zeros_like(image)
        out[..., max(dy, 0) : h + min(dy, 0), max(dx, 0) : w + min(dx, 0)] = image[
            ..., max(-dy, 0) : h + min(-dy, 0), max(-dx, 0) : w + min(-dx, 0)
        ]
        return out


INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "lanczos", "box", "hamming")


@dataclass(frozen=True)
class ImageTransformConfig:
    """What the image pipeline does.

    ``shift``: random translation by up to ``image_size // 8`` pixels (the built-in
    datasets' augmentation); ``random_resized_crop``: the smallest area fraction of
    ``RandomResizedCrop`` (None: plain resize); ``auto_augment``: ``"rand"``
    (RandAugment), ``"trivial"`` (TrivialAugmentWide) or None; ``color_jitter``: the
    strength s of SimCLR's colour distortion (None: off): with probability 0.8 brightness,
    contrast and saturation scaled by a factor drawn from [1 - 0.8s, 1 + 0.8s] and hue
    shifted by up to 0.2s of the circle, then grey with probability 0.2 -- for classes that
    colour does not define (a shape in any colour on any ground); ``invert``: the
    probability of the negative image ``255 - x`` (after the colour distortion), for classes
    that lightness does not define either (dark on light as light on dark: drawings, shapes,
    scans).
    """

    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    shift: bool = False
    flip: bool = False
    random_resized_crop: float | None = None
    auto_augment: str | None = None
    color_jitter: float | None = None
    invert: float = 0.0
    # a pretrained model's resizing: the shorter side to ``resize`` (aspect kept), then a
    # centre crop of image_size (None: a plain resize to image_size x image_size)
    resize: int | None = None
    interpolation: str = "bilinear"

    def __post_init__(self) -> None:
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, got "
                             f"{self.interpolation!r}")
        if self.resize is not None and self.resize < self.image_size:
            raise ValueError(f"resize ({self.resize}) must be >= image_size "
                             f"({self.image_size}): it is the side the centre crop is cut from")
        if self.auto_augment not in (None, *AUTO_AUGMENT):
            raise ValueError(
                f"auto_augment must be one of {AUTO_AUGMENT} or None, got {self.auto_augment!r}"
            )
        if self.random_resized_crop is not None and not 0 < self.random_resized_crop <= 1:
            raise ValueError(
                f"random_resized_crop is the smallest crop area in (0, 1], got "
                f"{self.random_resized_crop}"
            )
        if len(self.mean) != len(self.std):
            raise ValueError(f"mean {self.mean} and std {self.std} differ in length")
        if not 0 <= self.invert <= 1:
            raise ValueError(f"invert is a probability in [0, 1], got {self.invert}")
        if self.color_jitter is not None and not 0 < self.color_jitter <= 1.25:
            raise ValueError(f"color_jitter is a strength in (0, 1.25] (1.25: brightness "
                             f"factors down to 0), got {self.color_jitter}")


def image_transform(
    config: ImageTransformConfig, train: bool
) -> Callable[[torch.Tensor], torch.Tensor]:
    """uint8 (C, H, W) of any size -> float32 (C, image_size, image_size), normalised."""
    from torchvision.transforms import v2

    size = [config.image_size, config.image_size]
    mode = v2.InterpolationMode(config.interpolation)
    steps: list[Callable] = []
    if train and config.random_resized_crop is not None:
        steps.append(v2.RandomResizedCrop(size, scale=(config.random_resized_crop, 1.0),
                                          interpolation=mode))
    else:
        steps += geometry_steps(config)
    if train and (config.shift or config.flip):
        steps.append(ShiftFlip(max(1, config.image_size // 8) if config.shift else 0,
                               config.flip))
    if train and config.auto_augment == "rand":
        steps.append(v2.RandAugment())
    elif train and config.auto_augment == "trivial":
        steps.append(v2.TrivialAugmentWide())
    if train and config.color_jitter is not None:
        jitter = 0.8 * config.color_jitter
        steps += [v2.RandomApply([v2.ColorJitter(jitter, jitter, jitter,
                                                 min(0.5, 0.2 * config.color_jitter))], p=0.8),
                  v2.RandomGrayscale(0.2)]
    if train and config.invert > 0:
        steps.append(v2.RandomInvert(config.invert))
    steps += [
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(list(config.mean), list(config.std)),
    ]
    return v2.Compose(steps)


def geometry_steps(config: ImageTransformConfig) -> list[Callable]:
    """The deterministic resizing of :func:`image_transform` (uint8 -> uint8 (C,
    image_size, image_size)): ``Resize`` to the square, or the shorter side to ``resize``
    and a centre crop."""
    from torchvision.transforms import v2

    size = [config.image_size, config.image_size]
    mode = v2.InterpolationMode(config.interpolation)
    if config.resize is not None:
        return [v2.Resize(config.resize, interpolation=mode, antialias=True),
                CenterCrop(size)]  # transformers' offsets (floored), not v2's (rounded)
    return [v2.Resize(size, interpolation=mode, antialias=True)]


def per_channel(value: float | Sequence[float], channels: int, name: str) -> tuple[float, ...]:
    """One value per channel from a scalar or a list of 1 or ``channels`` values."""
    values = [float(value)] if isinstance(value, (int, float)) else [float(v) for v in value]
    if len(values) == 1:
        values = values * channels
    if len(values) != channels:
        raise ValueError(f"{name} needs 1 or {channels} values, got {len(values)}")
    return tuple(values)
