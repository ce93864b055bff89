"""Streaming shards with LitData: write any source once (``litdata.optimize``), read it from
every rank (``litdata.StreamingDataset`` / ``StreamingDataLoader``). One writer, one reader
and one loader mixin for every task; what an item holds is the task's:

=========  ===============================================  ==================================
kind       item                                             written from
=========  ===============================================  ==================================
images     ``{"image": encoded bytes, "label": int}``       class folders / ``path,label``
audio      ``{"audio": encoded file bytes, "label": int,    class folders / ``path,label``
           "index": int}``
captions   ``{"image": encoded bytes, "caption": str}``     ``image,caption`` / COCO JSON
text       ``{"ids": int32 (block_size + 1,)}``             ``.txt`` / JSONL ``text``
labelled-  ``{"ids": int32 (<= max_length,), "label":       ``text,label`` CSV / JSONL, class
text       int}``                                           folders of ``.txt``
text-      ``{"source": int32, "target": int32}``           ``source<TAB>target`` TSV,
pairs                                                       ``source,target`` CSV / JSONL
=========  ===============================================  ==================================

Layout written by :func:`write_shards` (``OUT`` a local folder or an object-store URL)::

    OUT/train/  OUT/val/  OUT/test/     one LitData dataset per split (index.json + chunks)
    OUT/multimodal.json                 {"kind": ..., "sizes": {...}, + the kind's own keys}
    OUT/<sidecar>                       text the module needs up front (captions.json,
                                        tokenizer.json, {source,target}_tokenizer.json)

Images and audio stay compressed in the shards (the file's own bytes, or for images a
resized lossless PNG) and are decoded per item when read, exactly as files of a folder are.
Under DDP each rank streams its own disjoint share (LitData splits the chunks by rank and
worker); ``StreamingDataLoader.state_dict`` travels in Lightning checkpoints (and in the
data module's ``state_dict``, :class:`ShardLoaderMixin`), so a run resumed mid-epoch
continues with the items it had not seen.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch
from torch.utils.data import DataLoader, Dataset

from multimodal.data.readers import FileList
from multimodal.data.workers import ignore_job_signals
from multimodal.files import CorruptFileError, read_image

__all__ = [
    "ShardLoaderMixin",
    "auto_chunk_bytes",
    "encode_image_file",
    "item_bytes",
    "read_shard_file",
    "read_shard_meta",
    "shard_dataset",
    "shard_image_dataset",
    "shard_splits",
    "write_image_shards",
    "write_shards",
]

META = "multimodal.json"
MIN_CHUNKS = 64  # per split, when the items allow: whole chunks for every rank x worker
MIN_CHUNK_BYTES = 64 * 2**10
MAX_CHUNK_BYTES = 64 * 2**20  # LitData's own default size


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


def encode_image_file(path: str, image_size: int | None) -> bytes:
    """The file's bytes unchanged, or (with ``image_size``) its image resized so that the
    shorter side is ``image_size`` and re-encoded as lossless PNG."""
    from torchvision.io import encode_png, read_file
    from torchvision.transforms.v2 import functional as TF

    data = read_file(path)
    if image_size is None:
        return data.numpy().tobytes()
    image = read_image(data, None, path)  # its own channels, 8 bits, EXIF orientation applied
    image = TF.resize(image, image_size, antialias=True)
    return encode_png(image).numpy().tobytes()


class _Encoder:
    """Picklable per-item function for ``litdata.optimize`` (runs in its worker processes)."""

    def __init__(self, files: FileList, image_size: int | None) -> None:
        self.paths, self.labels = files.paths, files.labels
        self.image_size = image_size

    def __len__(self) -> int:
        return len(self.paths)

    def __call__(self, index: int) -> dict[str, Any]:
        return {"image": encode_image_file(str(self.paths[index]), self.image_size),
                "label": int(self.labels[index])}


class ItemEncoder(Protocol):
    """What :func:`write_shards` writes for one split: ``len`` items, item ``i`` a dict of
    bytes / str / int / numpy values (picklable: ``litdata.optimize`` runs it in workers)."""

    def __len__(self) -> int: ...

    def __call__(self, index: int) -> dict[str, Any]: ...


def item_bytes(item: dict[str, Any]) -> int:
    """Payload bytes of one item: the length of its bytes / str values, the size of its
    arrays, 8 for any other scalar."""
    total = 0
    for value in item.values():
        if isinstance(value, bytes | str):
            total += len(value)
        elif hasattr(value, "nbytes"):
            total += int(value.nbytes)
        else:
            total += 8
    return total


def auto_chunk_bytes(encode: ItemEncoder, sample: int = 32) -> int:
    """A chunk size that cuts the split into at least :data:`MIN_CHUNKS` chunks, within
    [:data:`MIN_CHUNK_BYTES`, :data:`MAX_CHUNK_BYTES`]: ``clamp(n * mean_item_bytes /
    MIN_CHUNKS)``, the mean taken over ``sample`` evenly spaced items (encoded once here).

    Why not LitData's 64 MB for everything: a split smaller than one chunk is then a single
    chunk, and every loader worker (and rank) reading a share of the same chunk costs more
    per item than reading whole chunks of its own. Measured on 10 000 Fashion-MNIST PNGs
    (5.6 MB, ``benchmarks/data_throughput.py``), 2 workers: one chunk 2 000 images/s at
    800 us of CPU an item, 23 chunks 3 900 images/s at 490 us; 0 workers 420-470 us either way.
    """
    n = len(encode)
    if n == 0:
        return MAX_CHUNK_BYTES
    picks = sorted({round(i * (n - 1) / max(1, sample - 1)) for i in range(min(n, sample))})
    mean = sum(item_bytes(encode(i)) for i in picks) / len(picks)
    return int(min(MAX_CHUNK_BYTES, max(MIN_CHUNK_BYTES, n * mean / MIN_CHUNKS)))


def write_shards(
    kind: str,
    splits: dict[str, ItemEncoder],
    out: str,
    meta: dict[str, Any] | None = None,
    num_workers: int = 1,
    chunk_bytes: int | str | None = None,
    sidecars: dict[str, str] | None = None,
) -> dict[str, int]:
    """Write each split's items as a LitData dataset under ``out/<split>``, then
    ``out/multimodal.json`` (``kind``, split sizes, ``meta``) and each sidecar text file
    (name -> content); returns the split sizes. A split with no item is not written.

    ``chunk_bytes``: the size of a chunk (``"64MB"`` or bytes); None picks one per split
    with :func:`auto_chunk_bytes`.
    """
    litdata = _litdata()
    sizes = {}
    # litdata.optimize forces the process-wide start method to spawn; the caller's own
    # multiprocessing (DataLoader workers of a later fit, say) should not change with it
    start_method = multiprocessing.get_start_method(allow_none=True)
    try:
        for split, encode in splits.items():
            if len(encode) == 0:
                continue
            litdata.optimize(
                fn=encode,
                inputs=list(range(len(encode))),
                output_dir=f"{out.rstrip('/')}/{split}",
                chunk_bytes=auto_chunk_bytes(encode) if chunk_bytes is None else chunk_bytes,
                num_workers=num_workers,
                mode="overwrite",
            )
            sizes[split] = len(encode)
    finally:
        multiprocessing.set_start_method(start_method, force=True)
    files = {META: json.dumps({"kind": kind, "sizes": sizes, **(meta or {})}, indent=1),
             **(sidecars or {})}
    for name, text in files.items():
        _write_text(f"{out.rstrip('/')}/{name}", text)
    return sizes


def write_image_shards(
    splits: dict[str, FileList],
    out: str,
    image_size: int | None = None,
    num_workers: int = 1,
    chunk_bytes: int | str | None = None,
) -> dict[str, int]:
    """Write each split's images as a LitData dataset under ``out/<split>``; returns sizes.

    ``image_size``: store images resized (shorter side) and re-encoded as PNG; None keeps
    each file's own encoded bytes.
    """
    classes = next(iter(splits.values())).class_names
    for split, files in splits.items():
        if files.class_names != classes:
            raise ValueError(f"split {split} has other classes than {classes}")
    encoders = {k: _Encoder(v, image_size) for k, v in splits.items()}
    return write_shards("images", encoders, out,  # type: ignore[arg-type]
                        {"classes": list(classes), "image_size": image_size},
                        num_workers, chunk_bytes)


def _write_text(path: str, text: str) -> None:
    if _is_url(path):
        import fsspec

        with fsspec.open(path, "w") as f:
            f.write(text)
    else:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text, encoding="utf-8")


def read_shard_file(shards: str, name: str) -> str:
    """The text of ``shards/name`` (a local path or an object-store URL)."""
    path = f"{shards.rstrip('/')}/{name}"
    if _is_url(shards):
        import fsspec

        with fsspec.open(path, "r") as f:
            return f.read()
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path} not found: shards are written by `multimodal-prepare KIND SOURCE OUT` "
            f"(KIND: images, audio, captions, text, labelled-text or text-pairs)"
        )
    return Path(path).read_text(encoding="utf-8")


def read_shard_meta(shards: str, kind: str | None = None) -> dict[str, Any]:
    """The ``multimodal.json`` beside the splits (kind, split sizes, the kind's own keys);
    with ``kind``, an error unless the shards hold that kind."""
    meta = json.loads(read_shard_file(shards, META))
    if kind is not None and meta.get("kind") != kind:
        raise ValueError(
            f"{shards} holds {meta.get('kind')!r} shards, not {kind!r}: write them with "
            f"`multimodal-prepare {kind} SOURCE OUT`"
        )
    return meta


def shard_dataset(
    shards: str,
    split: str,
    transform: Callable[[dict[str, Any]], Any] | None,
    shuffle: bool,
    seed: int,
) -> Any:
    """A ``litdata.StreamingDataset`` of ``shards/split`` whose items go through
    ``transform`` (picklable; None: the raw item dicts)."""
    litdata = _litdata()
    kwargs = {} if transform is None else {"transform": transform}
    return litdata.StreamingDataset(f"{shards.rstrip('/')}/{split}", shuffle=shuffle,
                                    seed=seed, **kwargs)



def shard_splits(
    shards: str, splits: Any, transform: Callable[[dict[str, Any]], Any], seed: int
) -> dict[str, Any]:
    """``split -> StreamingDataset`` of each of ``splits`` (the names in a shard meta's
    ``sizes``); only ``train`` is shuffled."""
    return {split: shard_dataset(shards, split, transform, shuffle=split == "train", seed=seed)
            for split in splits}

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
            image = read_image(data, self.in_channels, f"shard item {item['label']}")
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
    return shard_dataset(shards, split, _ShardDecoder(in_channels, transform, skip_corrupt),
                         shuffle, seed)


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
        and its ``state_dict`` makes mid-epoch resumption exact); else the shared recipe,
        also for a dataset that is not streamed (``predict_dir``'s files after training on
        shards)."""
        if self.shards is None:
            return super().loader(dataset, shuffle)  # type: ignore[misc]
        from litdata import StreamingDataLoader, StreamingDataset

        if not isinstance(dataset, StreamingDataset):
            return super().loader(dataset, shuffle)  # type: ignore[misc]

        return StreamingDataLoader(
            dataset, batch_size=self.batch_size, num_workers=self.num_workers,
            collate_fn=self.collate_fn(), pin_memory=torch.cuda.is_available(),
            worker_init_fn=ignore_job_signals,
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
        """With shards: the training ``StreamingDataLoader``'s position in its epoch (beside
        what the module's other bases save).

        Lightning saves stateful loaders itself, but restores them only into a loader made
        after the checkpoint is read; the learning-rate schedule makes one before (to count
        the steps), so the position travels here as well.
        """
        state = dict(super().state_dict())  # type: ignore[misc]
        if self.shards is not None and self._train_loader is not None:
            state["train_loader"] = self._train_loader.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)  # type: ignore[misc]
        state = state_dict.get("train_loader")
        if state is None:
            return
        if self._train_loader is not None:
            self._train_loader.load_state_dict(state)
        else:
            self._loader_state = state
