"""Images as tokens: 16x16 (configurable) patches, and pixel levels for generation.

``patchify`` / ``unpatchify`` move between (B, C, H, W) images and (B, N, p*p*C) patch
vectors in raster order (N = (H/p)(W/p)); the learned map of each patch to a D-dim token
is :class:`multimodal.nn.embed.PatchEmbed`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from einops import rearrange
from torch import Tensor

from multimodal.nn.embed import as_pair
from multimodal.tokenizers.kmeans import kmeans, nearest_centre


def patchify(images: Tensor, patch_size: int | tuple[int, int]) -> Tensor:
    """(B, C, H, W) -> (B, N, ph*pw*C), patches in raster order, channels last in a patch."""
    ph, pw = as_pair(patch_size)
    return rearrange(images, "b c (h ph) (w pw) -> b (h w) (ph pw c)", ph=ph, pw=pw)


def unpatchify(patches: Tensor, patch_size: int | tuple[int, int],
               grid: tuple[int, int], channels: int) -> Tensor:
    """Inverse of :func:`patchify` for a ``grid`` = (H/p, W/p) of patches."""
    ph, pw = as_pair(patch_size)
    return rearrange(patches, "b (h w) (ph pw c) -> b c (h ph) (w pw)",
                     h=grid[0], w=grid[1], ph=ph, pw=pw, c=channels)


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
            tokens = nearest_centre(flat, palette).view(rgb.shape[:-1])
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
            h, w = as_pair(image_size)
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


__all__ = ["PixelTokenizer", "patchify", "unpatchify"]
