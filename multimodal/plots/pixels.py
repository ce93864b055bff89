"""Figures for pixel generation: class-conditional samples, and completions of test images
from their top half (original / prompt / completion), from a trained ImageGPT checkpoint::

    python -m multimodal.plots.pixels \\
        runs/igpt_mnist5k/checkpoints/last.ckpt \\
        --out docs/figures --name igpt_mnist5k

writes ``<name>_samples.png`` (one row per class, or a grid) and ``<name>_completion.png``.
The data module is rebuilt from the checkpoint's hyper-parameters, so the prompts are test
images the model never trained on.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from multimodal.plots.figures import _pyplot, save_figure


def _show(ax, image: Tensor) -> None:
    ax.imshow(image.squeeze(0).float().cpu().numpy(), cmap="gray", vmin=0, vmax=255)
    ax.set_xticks([])
    ax.set_yticks([])


def plot_samples(images: Tensor, path: str | Path, row_labels: Sequence[str] | None = None,
                 title: str | None = None) -> Path:
    """uint8 images (rows, cols, 1, H, W) as a grid, one label per row, saved as a PNG."""
    if images.dim() != 5:
        raise ValueError(f"expected images (rows, cols, 1, H, W), got {tuple(images.shape)}")
    plt = _pyplot()
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


def main(argv: Sequence[str] | None = None) -> None:
    from multimodal.checkpoints import datamodule_arguments, model_from_checkpoint, read_checkpoint
    from multimodal.data.pixels import PixelDataModule
    from multimodal.tasks.autoregressive import evenly_spaced_items
    from multimodal.tokenizers.image import PixelTokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--out", default="docs/figures")
    parser.add_argument("--name", default="igpt")
    parser.add_argument("--per-class", type=int, default=8, help="samples per class")
    parser.add_argument("--num", type=int, default=10, help="test images to complete")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    ckpt = read_checkpoint(args.checkpoint)
    model = model_from_checkpoint(ckpt, args.checkpoint)
    data = datamodule_arguments(ckpt)
    cfg = model.config
    tokenizer = PixelTokenizer(levels=cfg.vocab_size)
    gen = torch.Generator().manual_seed(args.seed)
    out = Path(args.out)

    k = cfg.num_classes
    if k:
        labels = torch.arange(k).repeat_interleave(args.per_class)
        tokens = model.generate(num_images=len(labels), do_sample=True,
                                temperature=args.temperature, generator=gen, class_label=labels)
        images = tokenizer.decode(tokens)[:, None].view(k, args.per_class, 1, *cfg.grid)
        names = [str(i) for i in range(k)]
    else:
        tokens = model.generate(num_images=4 * args.per_class, do_sample=True,
                                temperature=args.temperature, generator=gen)
        images = tokenizer.decode(tokens)[:, None].view(4, args.per_class, 1, *cfg.grid)
        names = None
    print(plot_samples(images, out / f"{args.name}_samples.png", names))

    dm = PixelDataModule(**data)
    dm.setup("test")
    originals, labels = evenly_spaced_items(dm.split_dataset("test"), args.num)
    half = cfg.grid[0] // 2
    tokens = tokenizer.encode(originals, flatten=True)
    done = model.generate(prompt=tokens[:, : half * cfg.grid[1]], do_sample=True,
                          temperature=args.temperature, generator=gen,
                          class_label=labels if k else None)
    quantised = tokenizer.decode(tokens.view(-1, *cfg.grid))
    print(plot_completions(quantised[:, None], tokenizer.decode(done)[:, None], half,
                           out / f"{args.name}_completion.png"))


if __name__ == "__main__":
    main()
