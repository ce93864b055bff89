"""Positions against their definitions: 1-D sinusoidal (L = 10000), 2-D sin-cos, resampling."""

from __future__ import annotations

import math

import pytest
import torch

from multimodal.nn import (
    LearnedPositions,
    SinusoidalPositions,
    resample_grid,
    sincos_2d_positions,
    sinusoidal_positions,
)


def sinusoid_by_hand(n: int, dim: int) -> list[list[float]]:
    """``r[n, 2i] = sin(n / L^(2i/D))``, ``r[n, 2i+1] = cos(n / L^(2i/D))``, L = 10000."""
    rows = []
    for pos in range(n):
        row = []
        for i in range(dim // 2):
            angle = pos / 10000 ** (2 * i / dim)
            row += [math.sin(angle), math.cos(angle)]
        rows.append(row)
    return rows


def test_sinusoidal_table_matches_definition() -> None:
    table = sinusoidal_positions(50, 12)
    assert table.shape == (50, 12) and table.dtype == torch.float32
    want = torch.tensor(sinusoid_by_hand(50, 12))
    torch.testing.assert_close(table, want, atol=1e-6, rtol=0)
    # r[0] = (0, 1, 0, 1, ...)
    torch.testing.assert_close(table[0], torch.tensor([0.0, 1.0] * 6))


def test_sinusoidal_positions_module_adds_table_with_offset() -> None:
    pos = SinusoidalPositions(20, 6)
    x = torch.randn(2, 4, 6)
    want = torch.tensor(sinusoid_by_hand(20, 6))
    torch.testing.assert_close(pos(x) - x, want[:4].expand(2, 4, 6), atol=1e-6, rtol=0)
    torch.testing.assert_close(pos(x, offset=7) - x, want[7:11].expand(2, 4, 6),
                               atol=1e-6, rtol=0)


def test_learned_positions_add_their_weight() -> None:
    pos = LearnedPositions(10, 4)
    x = torch.randn(3, 5, 4)
    torch.testing.assert_close(pos(x, offset=2) - x, pos.weight[2:7].detach().expand(3, 5, 4))


def test_sincos_2d_first_half_depends_only_on_row() -> None:
    h, w, dim = 3, 4, 16
    table = sincos_2d_positions(h, w, dim)
    assert table.shape == (h * w, dim)
    grid = table.reshape(h, w, dim)
    rows, cols = torch.tensor(sinusoid_by_hand(h, dim // 2)), torch.tensor(
        sinusoid_by_hand(w, dim // 2))
    for r in range(h):
        for c in range(w):
            torch.testing.assert_close(grid[r, c, : dim // 2], rows[r], atol=1e-6, rtol=0)
            torch.testing.assert_close(grid[r, c, dim // 2 :], cols[c], atol=1e-6, rtol=0)
    # raster order: token t is at row t // w, column t % w
    torch.testing.assert_close(table[w + 2], torch.cat([rows[1], cols[2]]), atol=1e-6, rtol=0)


def test_resample_grid_identity_shape_and_constant() -> None:
    pos = torch.randn(4 * 6, 8)
    assert torch.equal(resample_grid(pos, (4, 6), (4, 6)), pos)
    for new in [(8, 12), (2, 3), (5, 3)]:
        out = resample_grid(pos, (4, 6), new)
        assert out.shape == (new[0] * new[1], 8)
    const = torch.arange(8.0).expand(4 * 6, 8).contiguous()
    for new in [(8, 12), (2, 3), (7, 5)]:
        out = resample_grid(const, (4, 6), new)
        torch.testing.assert_close(out, torch.arange(8.0).expand(new[0] * new[1], 8),
                                   atol=1e-5, rtol=1.3e-6)  # values up to 7: float32 rtol


def test_resample_grid_is_interpolation_along_rows() -> None:
    # A grid whose value is its row index, resampled 2x with bilinear, align_corners=False:
    # new row r samples old coordinate (r + 0.5) / 2 - 0.5, clamped to [0, old_h - 1].
    pos = torch.arange(3.0)[:, None, None].expand(3, 2, 1).reshape(6, 1)
    out = resample_grid(pos, (3, 2), (6, 2), mode="bilinear").reshape(6, 2)
    want = [min(max((r + 0.5) / 2 - 0.5, 0.0), 2.0) for r in range(6)]
    torch.testing.assert_close(out[:, 0], torch.tensor(want), atol=1e-6, rtol=1.3e-6)
    torch.testing.assert_close(out[:, 1], torch.tensor(want), atol=1e-6, rtol=1.3e-6)


def test_position_bad_input_raises_value_error() -> None:
    with pytest.raises(ValueError, match=r"even dim, got 5"):
        sinusoidal_positions(4, 5)
    with pytest.raises(ValueError, match=r"divisible by 4, got 6"):
        sincos_2d_positions(2, 2, 6)
    with pytest.raises(ValueError, match=r"\(12, dim\).*\(10, 8\)"):
        resample_grid(torch.randn(10, 8), (3, 4), (6, 8))
    for pos in (SinusoidalPositions(8, 4), LearnedPositions(8, 4)):
        with pytest.raises(ValueError, match=r"9 tokens.*position table \(8\)"):
            pos(torch.randn(1, 9, 4))
        with pytest.raises(ValueError, match=r"9 tokens.*position table \(8\)"):
            pos(torch.randn(1, 3, 4), offset=6)
        with pytest.raises(ValueError, match=r"\(batch, tokens, 4\).*\(1, 3, 6\)"):
            pos(torch.randn(1, 3, 6))
