"""Raw 8-bit pixels for pixel-level generative models (ImageGPT).

:class:`PixelDataModule` reads the same datasets and splits as
:class:`~multimodal.data.vision.ImageClassificationDataModule` (Fashion-MNIST, MNIST-5k,
8x8 digits; same seeded train / val / test split), but yields the images as they are:
uint8 (B, C, H, W) with labels, never normalised or augmented, because a likelihood
model must see the exact pixel values it scores.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from multimodal.data.device_batches import ResidentSplit
from multimodal.data.vision import ImageClassificationDataModule

__all__ = ["PixelDataModule", "RawImageDataset"]


class RawImageDataset(Dataset):
    """Items ``(image uint8 (C, H, W), label int64)`` from in-memory tensors."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        if images.dtype != torch.uint8 or images.ndim != 4:
            raise ValueError(f"images must be uint8 (N, C, H, W), got {images.dtype} "
                             f"{tuple(images.shape)}")
        if len(labels) != len(images):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[index], self.labels[index]


def resize_uint8(images: torch.Tensor, size: int) -> torch.Tensor:
    """Resize uint8 (N, C, H, W) images to (size, size) with antialiasing, back to uint8."""
    from torchvision.transforms.v2 import functional as TF

    if images.shape[-2:] == (size, size):
        return images
    return torch.cat([TF.resize(part, [size, size], antialias=True)
                      for part in images.split(4096)])


class PixelDataModule(ImageClassificationDataModule):
    """Fashion-MNIST, MNIST-5k or 8x8 digits as uint8 (B, C, H, W) batches + int64 labels.

    Arguments as :class:`ImageClassificationDataModule` (``augment`` is always off);
    ``image_size`` resizes (antialiased) once, in memory. ``device_resident`` /
    ``device_resident_max_mb`` as there: on an accelerator (``auto``) the uint8 splits are
    held on it and batched there (:mod:`multimodal.data.device_batches`); the pixels reach
    the task unchanged either way (the task quantises them to its levels on the device).
    """

    def __init__(
        self,
        dataset: str = "fashion_mnist",
        root: str | None = None,
        batch_size: int = 64,
        num_workers: int = 0,
        val_size: int | float = 0.1,
        test_size: int | float = 0.2,
        image_size: int | None = None,
        seed: int = 0,
        download: bool = False,
        limit_train: int | None = None,
        limit_eval: int | None = None,
        device_resident: bool | str = "auto",
        device_resident_max_mb: float = 2048.0,
    ) -> None:
        super().__init__(dataset=dataset, root=root, batch_size=batch_size,
                         num_workers=num_workers, val_size=val_size, test_size=test_size,
                         augment=False, image_size=image_size, seed=seed, download=download,
                         limit_train=limit_train, device_resident=device_resident,
                         device_resident_max_mb=device_resident_max_mb)
        if limit_eval is not None and limit_eval < 1:
            raise ValueError(f"limit_eval must be >= 1 or None, got {limit_eval}")
        self.limit_eval = limit_eval
        self._raw: dict[str, RawImageDataset] = {}

    def split_dataset(self, split: str) -> RawImageDataset:  # type: ignore[override]
        if split not in self._raw:
            data = self._load_splits()[split]
            images, labels = resize_uint8(data.images, self.image_size), data.labels
            if split != "train" and self.limit_eval is not None:
                images, labels = images[: self.limit_eval], labels[: self.limit_eval]
            self._raw[split] = RawImageDataset(images, labels)
        return self._raw[split]

    def resident_split(self, split: str) -> ResidentSplit | None:
        """The uint8 split of :meth:`split_dataset`, untransformed."""
        data = self.split_dataset(split)
        return ResidentSplit([data.images, data.labels])

    def predict_dataloader(self) -> None:  # type: ignore[override]
        raise ValueError("PixelDataModule has no predict split; sample images with "
                         "ImageGPT.generate instead")
