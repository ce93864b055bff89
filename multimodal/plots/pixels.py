"""Figures for pixel generation: class-conditional samples, and completions of test images
from their top half (original / prompt / completion), from a trained ImageGPT checkpoint,
drawn by ``multimodal plot pixels CKPT`` (:mod:`multimodal.cli.plots`)::

    multimodal plot pixels \\
        runs/igpt_mnist5k/version_0/checkpoints/last.ckpt \\
        --out docs/figures --name igpt_mnist5k

writes ``<name>_samples.png`` (one row per class, or a grid) and ``<name>_completion.png``.
The data module is rebuilt from the checkpoint's hyper-parameters, so the prompts are test
images the model never trained on.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from multimodal.plots.figures import pyplot, save_figure


def _show(ax, image: Tensor) -> None:
    ax.imshow(image.squeeze(0).float().cpu().numpy(), cmap="gray", vmin=0, vmax=255)
    ax.set_xticks([])
    ax.set_yticks([])


def plot_samples(images: Tensor, path: str | Path, row_labels: Sequence[str] | None = None,
                 title: str | None = None) -> Path:
    """uint8 images (rows, cols, 1, H, W) as a grid, one label per row, saved as a PNG."""
    if images.dim() != 5:
        raise ValueError(f"expected images (rows, cols, 1, H, W), got {tuple(images.shape)}")
    plt = pyplot()
    rows, cols = images.shape[:2]
    fig, axes = plt.subplots(rows, cols, figsize=(0.8 * cols + 0.6, 0.8 * rows + 0.4),
                             dpi=110, squeeze=False)
    for r in range(rows):
        for c in range(cols):
            _show(axes[r, c], images[r, c])
        if row_labels is not None:
            axes[r, 0].set_ylabel(row_labels[r], rotation=0, ha="right", va="center")
    if title:
        fig.suptitle(title, fontsize=9)
    return save_figure(fig, path)


def plot_completions(originals: Tensor, completions: Tensor, prompt_rows: int,
                     path: str | Path) -> Path:
    """Three rows: the originals, the prompts (their top ``prompt_rows`` rows, the rest
    grey) and the completions; uint8 images (N, 1, H, W), saved as a PNG."""
    if originals.shape != completions.shape or originals.dim() != 4:
        raise ValueError(f"originals and completions must both be (N, 1, H, W), got "
                         f"{tuple(originals.shape)} and {tuple(completions.shape)}")
    prompts = originals.clone()
    prompts[:, :, prompt_rows:] = 128
    grid = torch.stack([originals, prompts, completions])  # (3, N, 1, H, W)
    return plot_samples(grid, path, ["original", "prompt", "completion"])
