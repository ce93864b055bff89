"""Fashion-MNIST: 70 000 grey 28x28 pictures of clothes in 10 classes.

Offline copy: the IDX files of the Debian package ``dataset-fashion-mnist`` under
``/usr/share/datasets/fashion-mnist/`` (``{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz``;
``bash data/get_images.sh`` installs it). ``download=True`` uses the torchvision download
instead (needs a network). :func:`read_idx` parses the IDX format (the MNIST one).
"""

from __future__ import annotations

import gzip
import math
import os
from pathlib import Path

import numpy as np
import torch

from multimodal.data.vision_datasets import ImageSet, ImageSource

__all__ = ["DEBIAN_FASHION_MNIST_DIR", "FASHION_MNIST_CLASSES", "SOURCE", "load_fashion_mnist",
           "read_idx"]

DEBIAN_FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
DEFAULT_DOWNLOAD_ROOT = Path("data/cache")

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

_HOW_TO_GET_FASHION = (
    "Get it with `make data` (runs data/get_images.sh), or "
    "`sudo apt-get install dataset-fashion-mnist` (installs the IDX files into "
    f"{DEBIAN_FASHION_MNIST_DIR}), or on a machine with internet access pass download=True "
    "(torchvision download)."
)


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


def _read(root: str | os.PathLike | None, split: str, download: bool) -> ImageSet:
    return load_fashion_mnist(root, split, download=download)


SOURCE = ImageSource(28, 1, FASHION_MNIST_CLASSES, has_test_split=True, flip=True, read=_read,
                     downloadable=True)
