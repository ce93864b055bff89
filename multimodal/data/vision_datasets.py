"""Image datasets shared by every source: the in-memory split (:class:`ImageSet`), what a
built-in source declares (:class:`ImageSource`), and the torch datasets over tensors, files
and a prediction folder.

Every built-in reader (:mod:`multimodal.data.sources`) returns an :class:`ImageSet`: the whole
split as one uint8 tensor kept in memory, int64 labels and the class names. Transforms run
per item on tensors (no PIL).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from multimodal.data.readers import FileList
from multimodal.files import IMAGE_EXTENSIONS, CorruptFileError, check_image_header, read_image

__all__ = [
    "FileImageDataset",
    "ImageFolderDataset",
    "ImageSet",
    "ImageSource",
    "SkippedFilesMixin",
    "TensorImageDataset",
    "collate_skipping",
    "pixel_statistics",
    "resize_images",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ImageSet:
    """One split of an image classification dataset, held in memory.

    ``images``: uint8, (N, H, W) or (N, C, H, W); ``labels``: int64, (N,), values in
    ``[0, len(class_names))``.
    """

    images: torch.Tensor
    labels: torch.Tensor
    class_names: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.images.dtype != torch.uint8 or self.images.ndim not in (3, 4):
            raise ValueError(
                "images must be uint8 of shape (N, H, W) or (N, C, H, W), got "
                f"{self.images.dtype} {tuple(self.images.shape)}"
            )
        if self.labels.shape != (self.images.shape[0],):
            raise ValueError(
                f"expected {self.images.shape[0]} labels (one per image), got shape "
                f"{tuple(self.labels.shape)}"
            )

    def __len__(self) -> int:
        return self.images.shape[0]



@dataclass(frozen=True)
class ImageSource:
    """A built-in image dataset: what a model needs to know before reading it, and how to
    read it.

    ``read(root, split, download)`` returns the ``"train"`` or ``"test"`` :class:`ImageSet`
    (``root`` None: the source's offline default); a source without an official test split
    (``has_test_split=False``) returns all its images for ``"train"`` and the data module
    holds a seeded part out. ``flip``: horizontal flips keep the label (clothes yes, digits
    no). ``downloadable``: ``download=True`` can fetch missing files.
    """

    image_size: int
    in_channels: int
    class_names: tuple[str, ...]
    has_test_split: bool  # an official test split; otherwise a seeded held-out one
    flip: bool  # horizontal flips keep the label (clothes yes, digits no)
    read: Callable[[str | os.PathLike | None, str, bool], ImageSet]
    downloadable: bool = False


def _per_channel(value: float | Sequence[float], channels: int, name: str) -> torch.Tensor:
    values = [float(value)] if isinstance(value, (int, float)) else [float(v) for v in value]
    if len(values) == 1:
        values = values * channels
    if len(values) != channels:
        raise ValueError(f"{name} needs 1 or {channels} values, got {len(values)}")
    return torch.tensor(values).view(channels, 1, 1)



def resize_images(images: torch.Tensor, size: int) -> torch.Tensor:
    """Bilinear, antialiased resize of uint8 (..., C, H, W) to (..., C, size, size)."""
    from torchvision.transforms.v2 import functional as TF

    if images.shape[-2:] == (size, size):
        return images
    return TF.resize(images, [size, size], antialias=True)


class TensorImageDataset(Dataset):
    """Items ``(image, label)`` from an in-memory uint8 (N, C, H, W) tensor.

    Per item: optional resize, optional ``augment`` (uint8 tensor -> uint8 tensor), then
    ``x = (pixel / 255 - mean) / std`` as float32 (C, H, W).
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        mean: float | Sequence[float],
        std: float | Sequence[float],
        image_size: int | None = None,
        augment: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        if images.dtype != torch.uint8 or images.ndim != 4:
            raise ValueError(
                f"images must be uint8 (N, C, H, W), got {images.dtype} {tuple(images.shape)}"
            )
        if len(labels) != len(images):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        channels = images.shape[1]
        self.images, self.labels = images, labels
        self.image_size = image_size
        self.augment = augment
        # Fold the 1/255 into the affine map: x = pixel * scale + shift.
        std_t = _per_channel(std, channels, "std")
        self._scale = 1.0 / (255.0 * std_t)
        self._shift = -_per_channel(mean, channels, "mean") / std_t

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.images[index]
        if self.image_size is not None:
            image = resize_images(image, self.image_size)
        if self.augment is not None:
            image = self.augment(image)
        return image.float().mul_(self._scale).add_(self._shift), self.labels[index]


class ImageFolderDataset(Dataset):
    """The image files of a folder (every extension ``fit`` reads,
    :data:`~multimodal.files.IMAGE_EXTENSIONS`), in sorted file-name order, as model inputs,
    read by the one image reader (:func:`~multimodal.files.read_image`).

    Items are ``(x, filename)`` with ``x`` float32 (in_channels, image_size, image_size)
    normalised as ``(pixel / 255 - mean) / std`` (or ``transform(uint8 image)`` when given).
    Hidden files are skipped; any other file whose name is not an image's, or whose first
    bytes are no image format's, raises ValueError naming it (:class:`CorruptFileError`
    for the latter), or with ``skip_corrupt`` is left out (each file is decoded once here
    to find out) and listed in ``skipped`` and in a logged warning.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        image_size: int,
        in_channels: int = 1,
        mean: float | Sequence[float] = 0.0,
        std: float | Sequence[float] = 1.0,
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
        skip_corrupt: bool = False,
    ) -> None:
        folder = Path(path)
        if not folder.is_dir():
            raise FileNotFoundError(f"image folder not found: {folder}")
        self.skipped: list[str] = []
        self.transform = transform
        if in_channels not in (1, 3):
            raise ValueError(f"in_channels must be 1 (grey) or 3 (RGB), got {in_channels}")
        if image_size < 1:
            raise ValueError(f"image_size must be positive, got {image_size}")
        self.files = sorted(
            p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")
        )
        if not self.files:
            raise ValueError(f"no image files in {folder}")
        self.image_size, self.in_channels = image_size, in_channels
        kept = []
        for file in self.files:
            try:
                if file.suffix.lower() not in IMAGE_EXTENSIONS:
                    raise ValueError(f"{file}: not an image file (expected one of "
                                     f"{' '.join(IMAGE_EXTENSIONS)})")
                check_image_header(file)
                if skip_corrupt:
                    self._decode(file)
                kept.append(file)
            except ValueError:
                if not skip_corrupt:
                    raise
                self.skipped.append(file.name)
        if self.skipped:
            log.warning("skipped %d unreadable file(s) of %s: %s", len(self.skipped), folder,
                        ", ".join(self.skipped))
        if not kept:
            raise ValueError(f"no readable image files in {folder}")
        self.files = kept
        self._mean = _per_channel(mean, in_channels, "mean")
        self._std = _per_channel(std, in_channels, "std")

    def __len__(self) -> int:
        return len(self.files)

    def _decode(self, file: Path) -> torch.Tensor:
        return read_image(file, self.in_channels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, str]:
        file = self.files[index]
        image = self._decode(file)
        if self.transform is not None:  # uint8 (C, H, W) -> the model's input
            return self.transform(image), file.name
        image = resize_images(image, self.image_size)
        return (image.float() / 255.0 - self._mean) / self._std, file.name

class FileImageDataset(Dataset):
    """Items ``(x, label)`` decoded from image files: ``read_image`` to uint8
    (in_channels, H, W), then ``transform`` (see :mod:`multimodal.data.vision_transforms`).

    A file that cannot be decoded raises :class:`CorruptFileError` naming it, or with
    ``skip_corrupt`` yields ``None`` (dropped by :func:`collate_skipping`, which counts it).
    """

    def __init__(
        self,
        files: FileList,
        in_channels: int,
        transform: Callable[[torch.Tensor], torch.Tensor],
        skip_corrupt: bool = False,
    ) -> None:
        if files.labels is None:
            raise ValueError("FileImageDataset needs labelled files")
        self.files, self.in_channels = files, in_channels
        self.transform, self.skip_corrupt = transform, skip_corrupt

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        try:
            image = read_image(str(self.files.paths[index]), self.in_channels)
        except CorruptFileError:
            if self.skip_corrupt:
                return None
            raise
        return self.transform(image), self.files.labels[index]  # type: ignore[index]


def collate_skipping(items: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Default collation of the items that are not ``None``, plus how many were ``None``."""
    from torch.utils.data import default_collate

    kept = [item for item in items if item is not None]
    skipped = torch.tensor(len(items) - len(kept))
    if not kept:
        return torch.empty(0), torch.empty(0, dtype=torch.int64), skipped
    x, y = default_collate(kept)
    return x, y, skipped


def pixel_statistics(
    items: Iterable[tuple[torch.Tensor, Any] | None], channels: int
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std over every pixel of the ``(image (C, H, W), label)`` items
    (``None`` items, skipped corrupt files, are passed over), accumulated in float64:
    ``std = sqrt(E[x^2] - E[x]^2)``, at least 1e-6."""
    total = torch.zeros(channels, dtype=torch.float64)
    squares = torch.zeros_like(total)
    count = 0
    for item in items:
        if item is None:
            continue
        x = item[0].double()
        total += x.sum(dim=(1, 2))
        squares += x.square().sum(dim=(1, 2))
        count += x.shape[1] * x.shape[2]
    if count == 0:
        raise ValueError("no training image could be decoded to compute statistics")
    mean = total / count
    std = (squares / count - mean.square()).clamp_min(1e-12).sqrt().clamp_min(1e-6)
    return tuple(mean.tolist()), tuple(std.tolist())


class SkippedFilesMixin:
    """For a data module whose loaders collate with :func:`collate_skipping` when
    ``skip_corrupt`` is set and the images are files (``_source`` None): the count it adds to
    each batch is dropped before the batch reaches the model and summed per epoch in
    ``skipped``; an epoch's count is logged when the next epoch starts and at teardown."""

    skipped: dict[int, int]  # epoch -> files skipped as corrupt
    _logged: set[int]
    skip_corrupt: bool
    _source: ImageSource | None  # None: the images are files
    trainer: Any

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Drops the skipped-file count that ``collate_skipping`` adds, counting it per
        epoch; an epoch's count is logged when the next epoch starts and at teardown."""
        if not (self.skip_corrupt and self._source is None and len(batch) == 3):
            return batch
        x, y, skipped = batch
        epoch = self.trainer.current_epoch if self.trainer is not None else 0
        if epoch not in self.skipped:
            self._log_skipped()
            self.skipped[epoch] = 0
        self.skipped[epoch] += int(skipped)
        return x, y

    def _log_skipped(self) -> None:
        for epoch, n in sorted(self.skipped.items()):
            if epoch not in self._logged and n:
                log.warning("epoch %d: skipped %d corrupt image file(s)", epoch, n)
                self._logged.add(epoch)

    def teardown(self, stage: str) -> None:
        self._log_skipped()
