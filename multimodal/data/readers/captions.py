"""Your own image-caption pairs: a CSV / JSONL manifest or a COCO-captions JSON, read into
one array of image paths and one row per caption.

- CSV with a header ``image,caption``: one caption per row; an image may have many rows.
- JSONL: ``{"image": ..., "caption": "..."}`` or ``{"image": ..., "caption": ["...", ...]}``.
- COCO captions (``.json``): ``{"images": [{"id", "file_name"}, ...], "annotations":
  [{"image_id", "caption"}, ...]}``.

Image paths are relative to the manifest's folder (or ``image_root`` when given). Every
image must exist (the error names the first missing and how many), every caption must hold
a visible character (an empty one tokenises to nothing: the error names file and row), and
an image without a caption is an error in COCO (it would silently never be seen).

Splits are drawn over *images*, never captions, so no image is in two splits
(:func:`split_by_image`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from multimodal.data.readers import check_files_exist
from multimodal.data.splits import held_out
from multimodal.files import read_image, read_rows

__all__ = [
    "CaptionFiles",
    "CaptionShardDecoder",
    "CaptionShardEncoder",
    "FileCaptionDataset",
    "read_caption_files",
    "split_by_image",
]


@dataclass(frozen=True)
class CaptionFiles:
    """``images``: unique image paths (numpy str array); ``image_index``: int64 (R,), the
    image of each caption row; ``captions``: the R captions."""

    images: np.ndarray
    image_index: torch.Tensor
    captions: list[str]

    def __len__(self) -> int:
        return len(self.captions)

    def subset_images(self, keep: torch.Tensor) -> CaptionFiles:
        """The images at indices ``keep`` (sorted) and all their captions."""
        remap = torch.full((len(self.images),), -1, dtype=torch.int64)
        remap[keep] = torch.arange(len(keep))
        new = remap[self.image_index]
        rows = (new >= 0).nonzero().squeeze(1)
        return CaptionFiles(self.images[keep.numpy()], new[rows],
                            [self.captions[i] for i in rows.tolist()])


def _caption(text: Any, where: str) -> str:
    if not isinstance(text, str):
        raise ValueError(f"{where}: a caption must be a string, got {type(text).__name__}")
    if not text.strip():
        raise ValueError(f"{where}: empty caption (it would tokenise to nothing)")
    return text.strip()


def _coco_rows(path: Path) -> list[tuple[str, str]]:
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not JSON ({err})") from err
    if not isinstance(data, dict) or "images" not in data or "annotations" not in data:
        raise ValueError(f"{path}: a COCO captions file needs 'images' and 'annotations'")
    names = {}
    for i, im in enumerate(data["images"]):
        if "id" not in im or "file_name" not in im:
            raise ValueError(f"{path}: images[{i}] lacks 'id' or 'file_name'")
        names[im["id"]] = im["file_name"]
    rows, seen = [], set()
    for i, ann in enumerate(data["annotations"]):
        if ann.get("image_id") not in names:
            raise ValueError(f"{path}: annotations[{i}] has image_id {ann.get('image_id')!r} "
                             f"not in 'images'")
        rows.append((names[ann["image_id"]],
                     _caption(ann.get("caption"), f"{path}: annotations[{i}]")))
        seen.add(ann["image_id"])
    bare = [n for k, n in names.items() if k not in seen]
    if bare:
        raise ValueError(f"{path}: {len(bare)} image(s) have no caption, the first is {bare[0]}")
    return rows


def read_caption_files(
    path: str | os.PathLike, image_root: str | os.PathLike | None = None
) -> CaptionFiles:
    """Read a caption manifest (``.csv``, ``.tsv``, ``.jsonl``) or COCO-captions ``.json``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"caption manifest not found: {path}")
    base = Path(image_root) if image_root is not None else path.parent
    rows: list[tuple[str, str]] = []
    if path.suffix.lower() == ".json":
        rows = _coco_rows(path)
    else:
        for line, row in read_rows(path, ("image", "caption"), what="caption manifest"):
            where = f"{path}:{line}"
            texts = row["caption"] if isinstance(row["caption"], list) else [row["caption"]]
            if not texts:
                raise ValueError(f"{where}: an empty list of captions")
            rows.extend((str(row["image"]), _caption(t, where)) for t in texts)
    if not rows:
        raise ValueError(f"{path}: no captions")
    index: dict[str, int] = {}
    image_index = [index.setdefault(str(base / image), len(index)) for image, _ in rows]
    images = list(index)
    check_files_exist(images, str(path))
    return CaptionFiles(np.array(images), torch.tensor(image_index, dtype=torch.int64),
                        [c for _, c in rows])


def split_by_image(
    files: CaptionFiles, seed: int, val_size: float, test_size: float,
    has_val: bool = False, has_test: bool = False,
) -> dict[str, CaptionFiles]:
    """Seeded train / val / test over the images (a split given separately is left out):
    :func:`~multimodal.data.splits.held_out` on the image count, each image with all its
    captions."""
    idx = held_out(len(files.images), seed, val_size, test_size, has_test, has_val)
    return {k: files.subset_images(v) for k, v in idx.items() if v is not None}


class FileCaptionDataset(Dataset):
    """One item per caption: ``(transform(image uint8 (3, H, W)), caption)``."""

    def __init__(self, files: CaptionFiles, transform: Callable[[torch.Tensor], torch.Tensor]
                 ) -> None:  # fmt: skip
        self.files, self.transform = files, transform

    def __len__(self) -> int:
        return len(self.files)

    def image(self, row: int) -> torch.Tensor:
        """The uint8 (3, H, W) image of caption row ``row``, decoded (errors name it)."""
        return read_image(str(self.files.images[int(self.files.image_index[row])]), 3)

    def __getitem__(self, row: int) -> tuple[torch.Tensor, str]:
        return self.transform(self.image(row)), self.files.captions[row]


class CaptionShardEncoder:
    """``multimodal-prepare captions``: item ``i`` is caption row ``i`` with its image's
    encoded bytes (the file's own, or with ``image_size`` resized (shorter side) and stored
    as lossless PNG). An image with k captions is stored k times: resize it when that
    matters."""

    def __init__(self, files: CaptionFiles, image_size: int | None = None) -> None:
        self.files, self.image_size = files, image_size

    def __len__(self) -> int:
        return len(self.files)

    def __call__(self, i: int) -> dict[str, Any]:
        from multimodal.data.shards import encode_image_file

        path = str(self.files.images[int(self.files.image_index[i])])
        return {"image": encode_image_file(path, self.image_size),
                "caption": self.files.captions[i]}


class CaptionShardDecoder:
    """``StreamingDataset`` transform: a shard item -> ``(transform(image uint8 (3, H, W)),
    caption)``, as :class:`FileCaptionDataset` makes it from the file."""

    def __init__(self, transform: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.transform = transform

    @staticmethod
    def image(item: dict[str, Any]) -> torch.Tensor:
        data = torch.frombuffer(bytearray(item["image"]), dtype=torch.uint8)
        return read_image(data, 3, f"shard item of caption {item['caption']!r}")

    def __call__(self, item: dict[str, Any]) -> tuple[torch.Tensor, str]:
        return self.transform(self.image(item)), item["caption"]
