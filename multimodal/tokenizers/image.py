"""Images as tokens: 16x16 (configurable) patches, and pixel levels for generation.

``patchify`` / ``unpatchify`` move between (B, C, H, W) images and (B, N, p*p*C) patch
vectors in raster order (N = (H/p)(W/p)); ``PatchEmbed`` is the learned linear map of
each patch to a D-dim token (a stride-p convolution, the layout torchvision/timm use).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
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
        self.patch_size = _pair(patch_size)
        self.in_channels = in_channels
        self.proj = nn.Conv2d(in_channels, dim, kernel_size=self.patch_size,
                              stride=self.patch_size, bias=bias)


class ConvStem(_GridEmbed):
    """A convolutional patch embedding ("early convolutions", Xiao et al. 2021): the same
    (B, C, H, W) -> (B, N, D) map and grid as :class:`PatchEmbed`, but through
    log2(p) 3x3 stride-2 convolutions (BatchNorm, ReLU), channels doubling from
    ``dim / 2**log2(p)`` up to ``dim / 2``, then a 1x1 convolution to ``dim``. Local,
    translation-equivariant features make shapes easier to read than one linear map of
    each patch. Square, power-of-two patches only."""

    def __init__(self, patch_size: int | tuple[int, int] = 16, in_channels: int = 3,
                 dim: int = 768) -> None:
        super().__init__()
        ph, pw = _pair(patch_size)
        if ph != pw or ph < 2 or ph & (ph - 1):
            raise ValueError(f"ConvStem needs a square power-of-two patch size >= 2, got "
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


# ------------------------------------------------------------------- pixel tokens (ImageGPT)

_PIXEL_FORMAT = "multimodal.PixelTokenizer"


def _check_pixel_values(images: object, name: str = "images") -> Tensor:
    if not isinstance(images, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of 8-bit pixel values, "
                         f"got {type(images).__name__}")
    if images.is_floating_point() or images.is_complex() or images.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer pixel values 0..255 (uint8), got "
                         f"{images.dtype}; convert [0, 1] floats with (x * 255).round().byte()")
    if images.numel():
        lo, hi = (int(v) for v in torch.aminmax(images))
        if lo < 0 or hi > 255:
            raise ValueError(f"{name} pixel values must lie in 0..255, got min {lo}, max {hi}")
    return images


def kmeans(points: Tensor, k: int, iters: int = 30, seed: int = 0,
           chunk: int = 65536) -> Tensor:
    """Lloyd's k-means on (P, C) float points; returns (k, C) centres.

    Initialisation: k-means++ (each next centre drawn with probability proportional to
    the squared distance to the nearest chosen one) from a ``torch.Generator`` seeded with
    ``seed``, so the result is a function of (points, k, iters, seed) only. Each iteration
    assigns every point to its nearest centre and moves each centre to the mean of its
    points; a centre left without points keeps its place.
    """
    if points.dim() != 2 or points.shape[0] < k:
        raise ValueError(f"k-means needs (points, channels) with at least k={k} points, "
                         f"got {tuple(points.shape)}")
    gen = torch.Generator().manual_seed(seed)
    x = points.double().cpu()
    centres = x[torch.randint(len(x), (1,), generator=gen)]
    nearest = ((x - centres[0]) ** 2).sum(-1)
    for _ in range(1, k):
        probs = nearest / nearest.sum() if nearest.sum() > 0 else torch.ones_like(nearest)
        pick = torch.multinomial(probs, 1, generator=gen)
        centres = torch.cat([centres, x[pick]])
        nearest = torch.minimum(nearest, ((x - x[pick]) ** 2).sum(-1))
    for _ in range(iters):
        assign = _nearest(x, centres, chunk)
        sums = torch.zeros_like(centres).index_add_(0, assign, x)
        counts = torch.bincount(assign, minlength=k).to(x.dtype)[:, None]
        new = torch.where(counts > 0, sums / counts.clamp_min(1), centres)
        if torch.equal(new, centres):
            break
        centres = new
    return centres.to(points.dtype if points.is_floating_point() else torch.float32)


def _nearest(x: Tensor, centres: Tensor, chunk: int = 65536) -> Tensor:
    """Index of the nearest centre (squared Euclidean distance) for each row of ``x``."""
    return torch.cat([torch.cdist(part, centres).argmin(-1) for part in x.split(chunk)])


class PixelTokenizer:
    """Pixels <-> tokens for ImageGPT, in raster order.

    Two kinds:

    * grey levels (``PixelTokenizer(levels=K)``): a pixel value v in 0..255 becomes
      ``floor(v K / 256)`` (K uniform bins); a token t decodes to the centre of its bin
      of integers ``[ceil(256 t / K), ceil(256 (t + 1) / K) - 1]`` (rounded up). With
      K = 256 the token *is* the pixel value, so 8-bit images round-trip exactly.
    * a colour palette (``PixelTokenizer.fit_palette(images, num_colors=512)``, as in
      ImageGPT): k-means over training pixels (RGB); a pixel becomes the index of the
      nearest palette colour, a token decodes to its colour.

    ``encode`` takes uint8 (or integer 0..255) images, grey (..., H, W) / (B, 1, H, W) or
    colour (B, 3, H, W) for a palette, and returns int64 tokens (B, H, W) (``flatten=True``:
    (B, H*W) in raster order). ``decode`` is the inverse: grey (B, H, W) or RGB (B, 3, H, W)
    uint8. ``save`` / ``load`` use JSON.
    """

    def __init__(self, levels: int | None = 256, palette: Tensor | None = None) -> None:
        if palette is not None:
            palette = torch.as_tensor(palette)
            if palette.dim() != 2 or palette.shape[1] != 3 or len(palette) < 2:
                raise ValueError(f"palette must be (colours >= 2, 3) RGB values, got "
                                 f"{tuple(palette.shape)}")
            _check_pixel_values(palette.round().long() if palette.is_floating_point()
                                else palette, "palette")
            self.palette: Tensor | None = palette.round().to(torch.uint8) \
                if palette.is_floating_point() else palette.to(torch.uint8)
            if len(torch.unique(self.palette, dim=0)) != len(self.palette):
                raise ValueError("palette colours must be distinct")
            self.levels: int | None = None
        else:
            if not isinstance(levels, int) or not 2 <= levels <= 256:
                raise ValueError(f"levels must be an int in 2..256, got {levels!r}")
            self.levels, self.palette = levels, None

    # -- construction ------------------------------------------------------------------
    @classmethod
    def fit_palette(cls, images: Tensor, num_colors: int = 512, iters: int = 30,
                    seed: int = 0, max_pixels: int = 200_000) -> PixelTokenizer:
        """Fit a ``num_colors`` palette by k-means on the RGB pixels of ``images``
        (B, 3, H, W) uint8; at most ``max_pixels`` pixels (a seeded random subset) are used.
        Deterministic for a given seed. Colours that round to the same 8-bit value are
        merged, so the palette may come out slightly smaller than ``num_colors``."""
        _check_pixel_values(images)
        if images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"fit_palette needs RGB images (batch, 3, H, W), got "
                             f"{tuple(images.shape)}")
        pixels = images.permute(0, 2, 3, 1).reshape(-1, 3).float()
        if len(pixels) > max_pixels:
            gen = torch.Generator().manual_seed(seed)
            pixels = pixels[torch.randperm(len(pixels), generator=gen)[:max_pixels]]
        distinct = torch.unique(pixels, dim=0)
        if len(distinct) <= num_colors:
            return cls(palette=distinct.to(torch.uint8))
        centres = kmeans(pixels, num_colors, iters, seed)
        colours = torch.unique(centres.round().clamp(0, 255).to(torch.uint8), dim=0)
        return cls(palette=colours)

    @property
    def vocab_size(self) -> int:
        return self.levels if self.palette is None else len(self.palette)

    @property
    def channels(self) -> int:
        return 1 if self.palette is None else 3

    # -- encode / decode ---------------------------------------------------------------
    def encode(self, images: Tensor, flatten: bool = False) -> Tensor:
        """Images -> int64 tokens (..., H, W), or (B, H*W) in raster order if ``flatten``."""
        _check_pixel_values(images)
        if self.palette is None:
            if images.dim() == 4:
                if images.shape[1] != 1:
                    raise ValueError(f"a grey-level tokenizer takes (B, 1, H, W) or (B, H, W) "
                                     f"images, got {tuple(images.shape)}")
                images = images[:, 0]
            tokens = images.long() * self.levels // 256
        else:
            if images.dim() < 3 or images.shape[-3] != 3:
                raise ValueError(f"a palette tokenizer takes RGB images (B, 3, H, W), got "
                                 f"{tuple(images.shape)}")
            rgb = images.movedim(-3, -1)
            flat = rgb.reshape(-1, 3).float()
            palette = self.palette.to(flat.device).float()
            tokens = _nearest(flat, palette).view(rgb.shape[:-1])
        if flatten:
            if tokens.dim() < 2:
                raise ValueError(f"flatten needs (…, H, W) images, got {tuple(images.shape)}")
            tokens = tokens.flatten(-2)
        return tokens.to(torch.long)

    def decode(self, tokens: Tensor, image_size: int | tuple[int, int] | None = None
               ) -> Tensor:
        """Tokens (B, H, W) — or (B, N) with ``image_size`` — -> uint8 images: grey
        (B, H, W), or RGB (B, 3, H, W) for a palette."""
        if not isinstance(tokens, torch.Tensor) or tokens.is_floating_point():
            raise ValueError(f"tokens must be an integer tensor, got "
                             f"{getattr(tokens, 'dtype', type(tokens).__name__)}")
        if tokens.numel():
            lo, hi = (int(v) for v in torch.aminmax(tokens))
            if lo < 0 or hi >= self.vocab_size:
                raise ValueError(f"tokens must lie in [0, {self.vocab_size}), "
                                 f"got min {lo}, max {hi}")
        if image_size is not None:
            h, w = _pair(image_size)
            if tokens.shape[-1] != h * w:
                raise ValueError(f"{tokens.shape[-1]} tokens per image do not fill {h}x{w}")
            tokens = tokens.reshape(*tokens.shape[:-1], h, w)
        tokens = tokens.long()
        if self.palette is None:
            k = self.levels
            lo = -(-256 * tokens // k)  # ceil(256 t / K): first value of bin t
            hi = -(-256 * (tokens + 1) // k) - 1  # last value of bin t
            return ((lo + hi + 1) // 2).to(torch.uint8)
        return self.palette.to(tokens.device)[tokens].movedim(-1, -3)

    # -- files -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, object]:
        if self.palette is None:
            return {"format": _PIXEL_FORMAT, "kind": "levels", "levels": self.levels}
        return {"format": _PIXEL_FORMAT, "kind": "palette", "palette": self.palette.tolist()}

    def save(self, path: str | os.PathLike) -> Path:
        """Write the tokenizer as JSON (levels, or the palette's RGB rows)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict()))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> PixelTokenizer:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"pixel tokenizer file {path} not found (write one with "
                                    "PixelTokenizer.save)")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not a PixelTokenizer JSON file: {err}") from None
        if not isinstance(data, dict) or data.get("format") != _PIXEL_FORMAT:
            raise ValueError(f"{path} is not a PixelTokenizer file (no format "
                             f"{_PIXEL_FORMAT!r})")
        if data.get("kind") == "palette":
            return cls(palette=torch.tensor(data["palette"], dtype=torch.uint8))
        return cls(levels=int(data["levels"]))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PixelTokenizer) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        kind = f"levels={self.levels}" if self.palette is None else f"colors={len(self.palette)}"
        return f"PixelTokenizer({kind})"


__all__ = ["ConvStem", "PatchEmbed", "PixelTokenizer", "check_images", "kmeans", "patchify",
           "unpatchify"]
