"""Position information added to tokens: sinusoidal, learned, 2-D sin-cos, and resampling.

Sinusoidal (Vaswani et al., reference notes): for position n and channel pair i,
``r[n, 2i] = sin(n / L^(2i/D))`` and ``r[n, 2i+1] = cos(n / L^(2i/D))`` with L = 10000.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from multimodal.nn.init import off_meta


def sinusoidal_positions(num_positions: int, dim: int, base: float = 10000.0) -> Tensor:
    """(num_positions, dim) table ``r[n,2i] = sin(n / base^(2i/dim))``, ``r[n,2i+1] = cos(...)``."""
    if dim % 2 != 0:
        raise ValueError(f"sinusoidal positions need an even dim, got {dim}")
    n = torch.arange(num_positions, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, dim, 2, dtype=torch.float64)[None, :]
    angle = n / base ** (two_i / dim)
    table = torch.empty(num_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle)
    return table.float()


def sincos_2d_positions(grid_h: int, grid_w: int, dim: int, base: float = 10000.0) -> Tensor:
    """(grid_h * grid_w, dim) fixed positions for a patch grid in raster order.

    The first half of the channels encodes the row with a 1-D sinusoidal table of width
    dim/2, the second half the column (as in MAE and "Simple ViT" baselines).
    """
    if dim % 4 != 0:
        raise ValueError(f"2-D sin-cos positions need dim divisible by 4, got {dim}")
    rows = sinusoidal_positions(grid_h, dim // 2, base)
    cols = sinusoidal_positions(grid_w, dim // 2, base)
    return torch.cat(
        [rows[:, None, :].expand(grid_h, grid_w, -1), cols[None, :, :].expand(grid_h, grid_w, -1)],
        dim=-1,
    ).reshape(grid_h * grid_w, dim)


def resample_grid(
    pos: Tensor, old_grid: tuple[int, int], new_grid: tuple[int, int], mode: str = "bicubic"
) -> Tensor:
    """Resample a learned (old_h * old_w, D) position grid to (new_h * new_w, D).

    Used for images of another size (or audio of another length) than training. The
    identity when the grid is unchanged. Interpolates in float32 and casts back, with
    ``antialias=True`` at every scale (the PIL-style bicubic kernel, a = -0.5), as timm's
    ``resample_abs_pos_embed`` does, so converted timm checkpoints resize identically.
    """
    old_h, old_w = old_grid
    new_h, new_w = new_grid
    if pos.dim() != 2 or pos.shape[0] != old_h * old_w:
        raise ValueError(f"expected a ({old_h * old_w}, dim) grid for {old_grid}, "
                         f"got {tuple(pos.shape)}")
    if (old_h, old_w) == (new_h, new_w):
        return pos
    grid = pos.float().reshape(1, old_h, old_w, -1).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=(new_h, new_w), mode=mode,
                         align_corners=False, antialias=mode in ("bilinear", "bicubic"))
    return grid.permute(0, 2, 3, 1).reshape(new_h * new_w, -1).to(pos.dtype)


class SinusoidalPositions(nn.Module):
    """Adds the fixed sinusoidal table to (B, N, D) tokens starting at ``offset``."""

    def __init__(self, max_len: int, dim: int, base: float = 10000.0) -> None:
        super().__init__()
        self.max_len = max_len
        with off_meta():  # a function of the config: real even in a meta build
            table = sinusoidal_positions(max_len, dim, base)
        self.register_buffer("table", table, persistent=False)

    def forward(self, x: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """Add rows ``offset .. offset + N - 1``, or the rows ``positions`` (B, N) if given."""
        return _add_rows(x, self.table, offset, positions, self.max_len)


class LearnedPositions(nn.Module):
    """A learned (max_len, D) table added to (B, N, D) tokens starting at ``offset``."""

    def __init__(self, max_len: int, dim: int, init_std: float = 0.02) -> None:
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.randn(max_len, dim) * init_std)

    def forward(self, x: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """Add rows ``offset .. offset + N - 1``, or the rows ``positions`` (B, N) if given."""
        return _add_rows(x, self.weight, offset, positions, self.max_len)


def _add_rows(x: Tensor, table: Tensor, offset: int, positions: Tensor | None,
              max_len: int) -> Tensor:
    if positions is not None:
        _check_tokens(x, table.shape[1], 0, max_len)
        if positions.shape != x.shape[:2]:
            raise ValueError(f"positions must be (batch, tokens) = {tuple(x.shape[:2])}, "
                             f"got {tuple(positions.shape)}")
        if positions.numel() and int(positions.max()) >= max_len:
            raise ValueError(f"position {int(positions.max())} is beyond the position table "
                             f"({max_len}); raise max_len in the config or truncate the input")
        return x + table[positions].to(x.dtype)
    _check_tokens(x, table.shape[1], offset, max_len)
    return x + table[offset : offset + x.shape[1]].to(x.dtype)


def _check_tokens(x: Tensor, dim: int, offset: int, max_len: int) -> None:
    if x.dim() != 3 or x.shape[-1] != dim:
        raise ValueError(f"expected tokens of shape (batch, tokens, {dim}), got {tuple(x.shape)}")
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    length = x.shape[1] + offset
    if length > max_len:
        raise ValueError(f"sequence of {length} tokens is longer than the position table "
                         f"({max_len}); raise max_len in the config or truncate the input")


# -- rotary position embeddings (RoPE, Su et al. 2021) -----------------------------------
def rotary_angles(positions: Tensor, head_dim: int, base: float = 10000.0) -> Tensor:
    """Rotation angles ``theta[..., s, i] = p_s * base^(-2i / (d / S))`` for each axis s.

    ``positions`` (..., S): the position of each token along S axes (S = 1 for text, 2 for
    a patch grid: row, column). Each axis owns ``d / S`` of the head's ``d`` channels,
    rotated in ``d / 2S`` pairs; returns angles of shape (..., S, d / 2S) in float32.
    """
    axes = positions.shape[-1]
    if head_dim % (2 * axes) != 0:
        raise ValueError(f"rotary embeddings over {axes} axes need head_dim divisible by "
                         f"{2 * axes}, got {head_dim}")
    half = head_dim // (2 * axes)
    inv_freq = base ** (-torch.arange(half, dtype=torch.float64, device=positions.device)
                        / half)
    return (positions.double()[..., None] * inv_freq).float()


def apply_rotary(x: Tensor, angles: Tensor) -> Tensor:
    """Rotate channel pairs of ``x`` (B, H, N, d) by ``angles`` (B or 1, 1, N, S, d / 2S).

    The head's channels are cut into S equal sections (one per axis); in each section of
    width w, channel j < w/2 pairs with channel j + w/2 (the "rotate half" layout of
    GPT-NeoX and Llama) and the pair turns by ``theta_j``:
    ``(a, b) -> (a cos theta - b sin theta, b cos theta + a sin theta)``.
    Dot products of rotated queries and keys then depend on position differences only.
    """
    b, h, n, d = x.shape
    axes, half = angles.shape[-2], angles.shape[-1]
    if axes * 2 * half != d or angles.shape[-3] != n:
        raise ValueError(f"rotary angles {tuple(angles.shape)} do not fit heads of shape "
                         f"{tuple(x.shape)} (want (..., {n}, axes, {d} / (2 * axes)))")
    pairs = x.float().reshape(b, h, n, axes, 2, half)
    first, second = pairs[..., 0, :], pairs[..., 1, :]
    cos, sin = angles.cos(), angles.sin()
    out = torch.stack([first * cos - second * sin, second * cos + first * sin], dim=-2)
    return out.reshape(b, h, n, d).to(x.dtype)


def grid_positions(grid_h: int, grid_w: int, prefix: int = 0,
                   device: torch.device | None = None) -> Tensor:
    """(prefix + grid_h * grid_w, 2) (row, column) of patch tokens in raster order.

    The ``prefix`` tokens (class token, registers) come first at (0, 0), so a 2-D rotary
    embedding leaves them unrotated relative to each other.
    """
    rows = torch.arange(grid_h, device=device).repeat_interleave(grid_w)
    cols = torch.arange(grid_w, device=device).repeat(grid_h)
    patches = torch.stack([rows, cols], dim=-1)
    return torch.cat([patches.new_zeros(prefix, 2), patches])
