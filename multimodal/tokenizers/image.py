"""Images as tokens: 16x16 (configurable) patches, and pixel levels for generation.

``patchify`` / ``unpatchify`` move between (B, C, H, W) images and (B, N, p*p*C) patch
vectors in raster order (N = (H/p)(W/p)); ``PatchEmbed`` is the learned linear map of
each patch to a D-dim token (a stride-p convolution, the layout torchvision/timm use).
"""

from __future__ import annotations

from einops import rearrange
from torch import Tensor, nn


def _pair(x: int | tuple[int, int]) -> tuple[int, int]:
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
    ph, pw = _pair(patch_size)
    h, w = images.shape[-2:]
    if h % ph or w % pw:
        raise ValueError(f"image size {h}x{w} is not a multiple of the patch size {ph}x{pw}")


def patchify(images: Tensor, patch_size: int | tuple[int, int]) -> Tensor:
    """(B, C, H, W) -> (B, N, ph*pw*C), patches in raster order, channels last in a patch."""
    ph, pw = _pair(patch_size)
    return rearrange(images, "b c (h ph) (w pw) -> b (h w) (ph pw c)", ph=ph, pw=pw)


def unpatchify(patches: Tensor, patch_size: int | tuple[int, int],
               grid: tuple[int, int], channels: int) -> Tensor:
    """Inverse of :func:`patchify` for a ``grid`` = (H/p, W/p) of patches."""
    ph, pw = _pair(patch_size)
    return rearrange(patches, "b (h w) (ph pw c) -> b c (h ph) (w pw)",
                     h=grid[0], w=grid[1], ph=ph, pw=pw, c=channels)


class PatchEmbed(nn.Module):
    """(B, C, H, W) -> (B, N, D) with N = (H/p)(W/p): each patch flattened and mapped
    linearly to D dims (``x_n = W vec(patch_n) + b``, as a stride-p convolution)."""

    def __init__(self, patch_size: int | tuple[int, int] = 16, in_channels: int = 3,
                 dim: int = 768, bias: bool = True) -> None:
        super().__init__()
        self.patch_size = _pair(patch_size)
        self.in_channels = in_channels
        self.proj = nn.Conv2d(in_channels, dim, kernel_size=self.patch_size,
                              stride=self.patch_size, bias=bias)

    def grid_size(self, height: int, width: int) -> tuple[int, int]:
        return height // self.patch_size[0], width // self.patch_size[1]

    def forward(self, images: Tensor) -> Tensor:
        check_images(images, self.in_channels, self.patch_size)
        return self.proj(images).flatten(2).transpose(1, 2)


__all__ = ["PatchEmbed", "check_images", "patchify", "unpatchify"]

