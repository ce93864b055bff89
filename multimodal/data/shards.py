"""Streaming shards with LitData: write any image source once (``litdata.optimize``), read
it from every rank (``litdata.StreamingDataset`` / ``StreamingDataLoader``).

Layout written by :func:`write_image_shards` (``OUT`` a local folder or an object-store URL)::

    OUT/train/  OUT/val/  OUT/test/     one LitData dataset per split (index.json + chunks)
    OUT/multimodal.json                 {"kind": "images", "classes": [...], "sizes": {...}}

An item is ``{"image": <encoded PNG/JPEG/WebP/... bytes>, "label": int}``: images stay
compressed in the shards and are decoded (to ``in_channels``) and transformed per item when
read, exactly as files of a folder are. Under DDP each rank streams its own disjoint share
(LitData splits the chunks by rank and worker); ``StreamingDataLoader.state_dict`` is saved
in Lightning checkpoints, so a run resumed mid-epoch continues with the items it had not
seen.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from multimodal.data.readers import (
    CorruptFileError,
    FileList,
    decode_image_bytes,
    image_to_channels,
)

__all__ = ["ShardLoaderMixin", "read_shard_meta", "shard_image_dataset", "write_image_shards"]

META = "multimodal.json"


def _litdata() -> Any:
    try:  # optional dependency: only shard users need it
        import litdata
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(
            "streaming shards need litdata: `pip install litdata` "
            "(or `pip install multimodal[shards]`)"
        ) from err
    return litdata


def _is_url(path: str) -> bool:
    return "://" in path


def _encode_item(
    path: str, label: int, image_size: int | None
) -> dict[str, Any]:
    """The file's bytes unchanged, or (with ``image_size``) its image resized so that the
    shorter side is ``image_size`` and re-encoded as lossless PNG."""
    from torchvision.io import ImageReadMode, decode_image, encode_png, read_file
    from torchvision.transforms.v2 import functional as TF

    data = read_file(path)
    if image_size is None:
        return {"image": data.numpy().tobytes(), "label": int(label)}
    try:
        image = decode_image(data, mode=ImageReadMode.UNCHANGED)
    except RuntimeError as err:
        raise CorruptFileError(f"{path} could not be decoded as an image: {err}") from err
    if image.ndim == 4:
        image = image[0]
    if image.shape[0] not in (1, 2, 3, 4) or image.dtype != torch.uint8:
        image = image_to_channels(image, 3 if image.shape[0] >= 3 else 1)
    image = TF.resize(image, image_size, antialias=True)
    return {"image": encode_png(image).numpy().tobytes(), "label": int(label)}


class _Encoder:
    """Picklable per-item function for ``litdata.optimize`` (runs in its worker processes)."""

    def __init__(self, files: FileList, image_size: int | None) -> None:
        self.paths, self.labels = files.paths, files.labels
        self.image_size = image_size

    def __call__(self, index: int) -> dict[str, Any]:
        return _encode_item(str(self.paths[index]), int(self.labels[index]), self.image_size)


def write_image_shards(
    splits: dict[str, FileList],
    out: str,
    image_size: int | None = None,
    num_workers: int = 1,
    chunk_bytes: str = "64MB",
) -> dict[str, int]:
    """Write each split's images as a LitData dataset under ``out/<split>``; returns sizes.

    ``image_size``: store images resized (shorter side) and re-encoded as PNG; None keeps
    each file's own encoded bytes.
    """
    litdata = _litdata()
    classes = next(iter(splits.values())).class_names
    sizes = {}
    for split, files in splits.items():
        if files.class_names != classes:
            raise ValueError(f"split {split} has other classes than {classes}")
        target = f"{out.rstrip('/')}/{split}"
        litdata.optimize(
            fn=_Encoder(files, image_size),
            inputs=list(range(len(files))),
            output_dir=target,
            chunk_bytes=chunk_bytes,
            num_workers=num_workers,
            mode="overwrite",
        )
        sizes[split] = len(files)
    meta = {"kind": "images", "classes": list(classes), "sizes": sizes,
            "image_size": image_size}
    if _is_url(out):
        import fsspec

        with fsspec.open(f"{out.rstrip('/')}/{META}", "w") as f:
            json.dump(meta, f)
    else:
        Path(out, META).write_text(json.dumps(meta, indent=1))
    return sizes


def read_shard_meta(shards: str) -> dict[str, Any]:
    """The ``multimodal.json`` beside the splits (class list, split sizes)."""
    path = f"{shards.rstrip('/')}/{META}"
    if _is_url(shards):
        import fsspec

        with fsspec.open(path, "r") as f:
            return json.load(f)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path} not found: shards are written by `multimodal-prepare images ROOT OUT`"
        )
    return json.loads(Path(path).read_text())


class _ShardDecoder:
    """``StreamingDataset`` transform: an item's encoded image -> ``(x, label)``, or None
    for an undecodable image with ``skip_corrupt`` (picklable for loader workers)."""

    def __init__(
        self, in_channels: int, transform: Callable[[torch.Tensor], torch.Tensor],
        skip_corrupt: bool,
    ) -> None:
        self.in_channels, self.transform, self.skip_corrupt = in_channels, transform, skip_corrupt

    def __call__(self, item: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor] | None:
        data = torch.frombuffer(bytearray(item["image"]), dtype=torch.uint8)
        try:
            image = decode_image_bytes(data, self.in_channels, f"shard item {item['label']}")
        except CorruptFileError:
            if self.skip_corrupt:
                return None
            raise
        return self.transform(image), torch.tensor(item["label"], dtype=torch.int64)


def shard_image_dataset(
    shards: str,
    split: str,
    in_channels: int,
    transform: Callable[[torch.Tensor], torch.Tensor],
    shuffle: bool,
    seed: int,
    skip_corrupt: bool = False,
) -> Any:
    """A ``litdata.StreamingDataset`` of ``shards/split`` yielding ``(x, label)`` items."""
    litdata = _litdata()
    return litdata.StreamingDataset(
        f"{shards.rstrip('/')}/{split}", shuffle=shuffle, seed=seed,
        transform=_ShardDecoder(in_channels, transform, skip_corrupt),
    )


class ShardLoaderMixin:
    """Loaders of a :class:`~multimodal.data.splits.SplitDataModule` that may read shards.

    With ``shards`` set, every split is read by LitData's ``StreamingDataLoader``, and the
    training loader's position in its epoch travels in the data module's ``state_dict``;
    without, the shared recipe of :class:`~multimodal.data.splits.SplitDataModule`. List it
    before ``SplitDataModule`` in the bases.
    """

    shards: str | None = None
    _train_loader: Any = None  # the StreamingDataLoader of shards, for its state
    _loader_state: dict[str, Any] | None = None

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
