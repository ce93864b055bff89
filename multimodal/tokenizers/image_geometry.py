"""Resize and crop geometry of pretrained image pipelines, to the pixel.

Hugging Face image processors (ViT, DeiT, BiT / DINOv2, CLIP, SigLIP) and torchvision differ
in one rounding each, and a one-pixel shift changes every patch of a ViT: these functions
follow the processors, so a folder's model sees during fine-tuning, ``embed`` and serving the
pixels it saw in transformers.

* Shorter side to ``s`` (aspect kept): the longer side becomes ``int(s * long / short)``
  (truncated, as both transformers and torchvision do).
* Centre crop of ``(h, w)`` from ``(H, W)``: the offsets are ``top = floor((H - h) / 2)``,
  ``left = floor((W - w) / 2)``. torchvision's ``center_crop`` rounds them instead
  (``round((H - h) / 2)``, half to even), which moves the window by one pixel whenever
  ``H - h`` is odd and ``(H - h) // 2`` is odd, about a quarter of real photos.
  A crop larger than the image pads with zeros first, ``(h - H) // 2`` above and
  ``(h - H + 1) // 2`` below (likewise left / right), as transformers' torchvision backend does.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["CenterCrop", "center_crop", "center_crop_offsets", "shortest_edge_size"]


def shortest_edge_size(height: int, width: int, shortest_edge: int) -> tuple[int, int]:
    """``(H', W')`` with the shorter side ``shortest_edge``: ``long' = int(s * long / short)``."""
    if height <= 0 or width <= 0 or shortest_edge <= 0:
        raise ValueError(f"sizes must be positive, got {height}x{width} -> {shortest_edge}")
    if height <= width:
        return shortest_edge, int(shortest_edge * width / height)
    return int(shortest_edge * height / width), shortest_edge


def center_crop_offsets(height: int, width: int, crop_height: int,
                        crop_width: int) -> tuple[int, int]:
    """``(top, left)`` of a centre crop: ``floor((H - h) / 2)``, ``floor((W - w) / 2)``
    (the image already at least the crop's size)."""
    if crop_height > height or crop_width > width:
        raise ValueError(f"crop {crop_height}x{crop_width} is larger than the image "
                         f"{height}x{width}; pad it first (center_crop does)")
    return (height - crop_height) // 2, (width - crop_width) // 2


def center_crop(image: Tensor, size: tuple[int, int] | list[int]) -> Tensor:
    """The centre ``(h, w)`` window of ``image`` ``(..., H, W)``, offsets floored; zero
    padding (split as above) where the crop is larger than the image."""
    crop_h, crop_w = int(size[0]), int(size[1])
    height, width = image.shape[-2:]
    pad_h, pad_w = max(crop_h - height, 0), max(crop_w - width, 0)
    if pad_h or pad_w:
        image = torch.nn.functional.pad(
            image, (pad_w // 2, (pad_w + 1) // 2, pad_h // 2, (pad_h + 1) // 2))
        height, width = image.shape[-2:]
    top, left = center_crop_offsets(height, width, crop_h, crop_w)
    return image[..., top:top + crop_h, left:left + crop_w]


class CenterCrop:
    """:func:`center_crop` as a transform step (for ``torchvision.transforms.v2.Compose``
    on image tensors)."""

    def __init__(self, size: int | tuple[int, int] | list[int]) -> None:
        self.size = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))

    def __call__(self, image: Tensor) -> Tensor:
        return center_crop(image, self.size)

    def __repr__(self) -> str:
        return f"CenterCrop(size={self.size})"
