"""Figures people would rather look at than read (matplotlib, no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch


def pyplot():
    """``matplotlib.pyplot`` with the Agg backend (files, no display); imported on first use:
    matplotlib costs ~0.5 s to import and only figure-writing code needs it."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | Path) -> Path:
    """Lay out, write ``fig`` as a PNG at ``path`` (folders created) and close it."""
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    pyplot().close(fig)
    return path


def plot_confusion_matrix(matrix: torch.Tensor, class_names: Sequence[str],
                          path: str | Path) -> Path:
    """Row-normalised confusion matrix (rows: true class, columns: predicted), with
    per-class recall on the diagonal, saved as a PNG."""
    plt = pyplot()
    counts = matrix.double()
    rates = counts / counts.sum(dim=1, keepdim=True).clamp(min=1)
    n = len(class_names)
    fig, ax = plt.subplots(figsize=(1.0 + 0.6 * n, 0.8 + 0.6 * n), dpi=120)
    im = ax.imshow(rates.numpy(), cmap="Blues", vmin=0.0, vmax=1.0)
    ax.set_xticks(range(n), class_names, rotation=45, ha="right")
    ax.set_yticks(range(n), class_names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    acc = float(counts.diag().sum() / counts.sum().clamp(min=1))
    ax.set_title(f"confusion matrix (accuracy {acc:.1%})")
    for i in range(n):
        for j in range(n):
            value = float(rates[i, j])
            if round(100 * value) >= 1:
                ax.text(j, i, f"{100 * value:.0f}", ha="center", va="center", fontsize=7,
                        color="white" if value > 0.5 else "black")
    fig.colorbar(im, ax=ax, fraction=0.046)
    return save_figure(fig, path)
