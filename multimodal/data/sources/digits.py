"""scikit-learn's 8x8 handwritten digits (1797 images, 10 classes): the tests' tiny set.

Offline copy: ships inside the ``scikit-learn`` package (``sklearn.datasets.load_digits``).
No official test split: the data module holds a seeded part out.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from multimodal.data.vision_datasets import ImageSet, ImageSource

__all__ = ["DIGIT_CLASSES", "SOURCE", "load_digits"]

DIGIT_CLASSES = tuple(str(i) for i in range(10))


def load_digits() -> ImageSet:
    """scikit-learn's 1797 8x8 digits, values 0..16 rescaled to uint8 as round(v * 255 / 16)."""
    try:
        from sklearn.datasets import load_digits as sk_load_digits
    except ModuleNotFoundError as err:
        raise FileNotFoundError(
            "The 8x8 digits ship with scikit-learn, which is not installed. Get it with "
            "`pip install scikit-learn` (or `pip install -e .[data]`, or `make data`)."
        ) from err
    bunch = sk_load_digits()
    images = np.rint(bunch.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    return ImageSet(
        torch.from_numpy(images), torch.from_numpy(bunch.target.astype(np.int64)), DIGIT_CLASSES
    )


def _read(root: str | os.PathLike | None, split: str, download: bool) -> ImageSet:
    return load_digits()


SOURCE = ImageSource(8, 1, DIGIT_CLASSES, has_test_split=False, flip=False, read=_read)
