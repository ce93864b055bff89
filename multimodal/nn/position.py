"""Position information added to tokens: sinusoidal, learned, 2-D sin-cos, and resampling.

Sinusoidal (Vaswani et al., reference notes): for position n and channel pair i,
``r[n, 2i] = sin(n / L^(2i/D))`` and ``r[n, 2i+1] = cos(n / L^(2i/D))`` with L = 10000.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


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
        self.register_buffer("table", sinusoidal_positions(max_len, dim, base), persistent=False)

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
