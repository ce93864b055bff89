"""Figures for captioning: generated captions under their images, and the decoder's
cross-attention over the image, one panel per generated token.

Drawn from a trained checkpoint of :class:`~multimodal.tasks.captioning.CaptioningTask` by
``multimodal plot attention CKPT`` (:mod:`multimodal.cli.plots`)::

    multimodal plot attention runs/caption_scenes/version_0/checkpoints/last.ckpt \\
        --out docs/figures --name caption_scenes --split test --num 8

writes ``<name>_captions.png`` and ``<name>_attention.png`` (first image of the split).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch.nn.functional as F
from torch import Tensor

from multimodal.plots.figures import pyplot, save_figure


def _to_hwc(image: Tensor) -> Tensor:
    if image.dim() != 3 or image.shape[0] not in (1, 3):
        raise ValueError(f"expected an image (channels, H, W) with 1 or 3 channels, "
                         f"got shape {tuple(image.shape)}")
    return image.detach().float().clamp(0, 1).permute(1, 2, 0).cpu()


def plot_captions(images: Tensor, captions: Sequence[str], path: str | Path,
                  references: Sequence[str] | None = None, ncols: int = 4) -> Path:
    """Grid of images (N, C, H, W) in [0, 1] with the generated caption under each (and
    the reference in grey when given), saved as a PNG."""
    if len(images) != len(captions) or len(images) == 0:
        raise ValueError(f"need as many captions as images (at least one), got "
                         f"{len(images)} images and {len(captions)} captions")
    if references is not None and len(references) != len(captions):
        raise ValueError(f"{len(captions)} captions but {len(references)} references")
    plt = pyplot()
    import textwrap

    n = len(images)
    ncols = min(ncols, n)
    nrows = (n + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.0 * ncols, 4.0 * nrows), dpi=80,
                             squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i >= n:
            continue
        ax.imshow(_to_hwc(images[i]).numpy(), interpolation="nearest")
        text = "\n".join(textwrap.wrap(captions[i], 32))
        ax.set_title(text, fontsize=8)
        if references is not None:
            ref = "\n".join(textwrap.wrap("ref: " + references[i], 36))
            ax.text(0.5, -0.04, ref, transform=ax.transAxes, ha="center", va="top",
                    fontsize=7, color="0.4")
    return save_figure(fig, path)


def plot_cross_attention(image: Tensor, words: Sequence[str], maps: Tensor,
                         path: str | Path, ncols: int = 6, alpha: float = 0.6) -> Path:
    """The image, then one panel per token: its cross-attention ``maps[t]`` (rows, cols)
    over the patch grid, upsampled to the image (nearest, so each patch is a block) and
    laid over it. ``image`` (C, H, W) in [0, 1]; ``maps`` (T, rows, cols), T = len(words).
    """
    if maps.dim() != 3 or maps.shape[0] != len(words):
        raise ValueError(f"maps must be (tokens, rows, cols) with one row per word "
                         f"({len(words)}), got shape {tuple(maps.shape)}")
    if len(words) == 0:
        raise ValueError("no words to plot")
    plt = pyplot()
    picture = _to_hwc(image)
    h, w = picture.shape[:2]
    heat = F.interpolate(maps[:, None].float().cpu(), size=(h, w), mode="nearest")[:, 0]
    panels = len(words) + 1
    ncols = min(ncols, panels)
    nrows = (panels + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.0 * ncols, 2.2 * nrows), dpi=80,
                             squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i == 0:
            ax.imshow(picture.numpy(), interpolation="nearest")
            ax.set_title("image", fontsize=9)
        elif i < panels:
            t = i - 1
            ax.imshow(picture.numpy(), interpolation="nearest")
            m = heat[t]
            ax.imshow((m / m.max().clamp_min(1e-12)).numpy(), cmap="inferno", alpha=alpha,
                      vmin=0, vmax=1, interpolation="nearest")
            ax.set_title(words[t], fontsize=9)
    fig.suptitle("decoder cross-attention per generated token", fontsize=10)
    return save_figure(fig, path)
