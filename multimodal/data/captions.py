"""Image-caption pairs for the captioning and contrastive tasks: procedural scenes, Twitter
emoji, or your own files (a CSV / JSONL manifest or COCO-captions JSON, read by
:mod:`multimodal.data.readers.captions`).

Batches are ``{"images": float (B, 3, H, W), "captions": list[str]}`` with images
normalised per channel, ``x = (pixel / 255 - mean) / std``, mean and std measured on the
training images. Captions stay strings: the task tokenizes them (a tokenizer can be
trained on :meth:`CaptionDataModule.train_captions`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from multimodal.data.batch_augment import BatchImageTransform, DivideNormalise
from multimodal.data.device_batches import ResidentSplit, resident_setting
from multimodal.data.readers.captions import (
    CaptionFiles,
    CaptionShardDecoder,
    FileCaptionDataset,
    read_caption_files,
    split_by_image,
)
from multimodal.data.shards import ShardLoaderMixin, read_shard_file, read_shard_meta, shard_dataset
from multimodal.data.sources.emoji import find_package_dir, load_emoji
from multimodal.data.sources.scenes import (
    Scene,
    SceneConfig,
    caption_matches_scene,
    describe,
    render_scenes,
    sample_scenes,
)
from multimodal.data.splits import SplitDataModule, held_out_sizes
from multimodal.data.vision_transforms import ImageTransformConfig, image_transform

DATASETS = ("scenes", "emoji")
SPLITS = ("train", "val", "test")


class CaptionDataset(Dataset):
    """uint8 images (N, 3, H, W) with one caption each; items are normalised float images."""

    def __init__(self, images: torch.Tensor, captions: list[str], mean: torch.Tensor,
                 std: torch.Tensor) -> None:
        if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"images must be uint8 (N, 3, H, W), got {images.dtype} "
                             f"{tuple(images.shape)}")
        if len(images) != len(captions):
            raise ValueError(f"{len(images)} images but {len(captions)} captions")
        self.images, self.captions = images, list(captions)
        self.mean, self.std = mean.view(3, 1, 1), std.view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.captions)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, str]:
        image = (self.images[index].float() / 255.0 - self.mean) / self.std
        return image, self.captions[index]


def collate_captions(items: list[tuple[torch.Tensor, str]]) -> dict[str, Any]:
    """Stack images, keep captions as a list of strings."""
    images, captions = zip(*items, strict=True)
    return {"images": torch.stack(images), "captions": list(captions)}


def _caption_batch(arrays: list[torch.Tensor], captions: list[str] | None) -> dict[str, Any]:
    return {"images": arrays[0], "captions": list(captions or [])}


def channel_stats(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std of uint8 images (N, 3, H, W) scaled to [0, 1]."""
    x = images.float().div_(255.0)
    mean = x.mean(dim=(0, 2, 3))
    std = x.std(dim=(0, 2, 3)).clamp_min(1e-6)
    return mean, std


class CaptionDataModule(ShardLoaderMixin, SplitDataModule):
    """Captioned images from ``dataset`` = "scenes" (generated, held-out colour-shape pairs
    in test) or "emoji" (local copy made by ``bash data/get_emoji.sh``).

    ``num_train`` / ``num_val`` / ``num_test``, ``min_shapes`` / ``max_shapes`` and ``order``
    (how a caption orders the shapes: "random" or "left_to_right", see
    :class:`~multimodal.data.sources.scenes.SceneConfig`) apply to scenes;
    ``val_size`` / ``test_size`` (a fraction below 1 or a count) and ``root`` to emoji
    (split by emoji).

    Your own pairs: ``train`` (and optionally ``val`` / ``test``) is an ``image,caption``
    manifest (``.csv`` with a header, one caption per row; ``.jsonl`` whose ``caption`` is a
    string or a list) or a COCO-captions ``.json`` (``images`` + ``annotations``); image
    paths are relative to the manifest (or to ``image_root``). Several captions of one image
    are several items. Without ``val`` / ``test``, ``val_size`` / ``test_size`` of the
    *images* are held out (seeded; an image and all its captions are in one split).
    Images are decoded with ``torchvision.io``, resized to ``image_size`` and normalised
    with the statistics of up to ``stats_samples`` training images (or with ``mean`` / ``std``
    when given: a pretrained model's own). ``dataset`` is then unused.

    ``shards``: a folder or object-store URL written by ``multimodal-prepare captions``
    (one item per caption with its encoded image; the captions also in ``captions.json``
    for the tokenizer), streamed with ``litdata.StreamingDataset``
    (:mod:`multimodal.data.shards`); the same items, statistics and transforms as the
    manifest it was written from.

    ``val_fraction`` / ``test_fraction``: the old names of ``val_size`` / ``test_size``
    (deprecated; still read).

    ``device_resident``: ``auto`` (default) holds the scenes' or emoji's uint8 images on the
    accelerator (the trainer's device, when it is not the CPU and they take at most
    ``device_resident_max_mb``), batched and normalised there, the captions indexed on the
    host with the same permutation (:mod:`multimodal.data.device_batches`; one log line says
    so); ``true`` also on the CPU (an error for your files or shards); ``false``: the
    DataLoader path. The same batches either way.
    """

    modality = "image+text"

    def __init__(
        self,
        dataset: str = "scenes",
        image_size: int = 32,
        num_train: int = 10000,
        num_val: int = 1000,
        num_test: int = 1000,
        max_shapes: int = 3,
        min_shapes: int = 1,
        order: str = "random",
        val_size: int | float = 0.1,
        test_size: int | float = 0.1,
        batch_size: int = 64,
        num_workers: int = 0,
        seed: int = 0,
        root: str | None = None,
        train: str | None = None,
        val: str | None = None,
        test: str | None = None,
        image_root: str | None = None,
        stats_samples: int = 1000,
        shards: str | None = None,
        mean: list[float] | None = None,
        std: list[float] | None = None,
        val_fraction: int | float | None = None,
        test_fraction: int | float | None = None,
        device_resident: bool | str = "auto",
        device_resident_max_mb: float = 2048.0,
    ) -> None:
        super().__init__()
        self.device_resident = resident_setting(device_resident)
        if device_resident_max_mb < 0:
            raise ValueError(f"device_resident_max_mb must be >= 0, got {device_resident_max_mb}")
        self.device_resident_max_mb = float(device_resident_max_mb)
        val_size, test_size = held_out_sizes(val_size, test_size, val_fraction, test_fraction)
        if (mean is None) != (std is None):
            raise ValueError("give mean and std together (or neither: training statistics)")
        for name, values in (("mean", mean), ("std", std)):
            if values is not None and len(values) != 3:
                raise ValueError(f"{name} needs 3 values (R, G, B), got {values}")
        if std is not None and min(std) <= 0:
            raise ValueError(f"std must be positive, got {std}")
        if shards is not None and (train is not None or val is not None or test is not None):
            raise ValueError("give train / val / test (manifests) or shards, not both")
        if train is None and (val is not None or test is not None):
            raise ValueError("val / test captions need train (your own manifest) too")
        if shards is not None:
            read_shard_meta(shards, "captions")  # fails early on a wrong path or kind
            dataset = "shards"
        elif train is not None:
            dataset = "files"
        elif dataset not in DATASETS:
            raise ValueError(f"dataset must be one of {DATASETS}, got {dataset!r}")
        if image_size < 8:
            raise ValueError(f"image_size must be >= 8, got {image_size}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.save_hyperparameters()
        self.record_sizes(val_size, test_size)
        self.dataset = dataset
        self.image_size = image_size
        self.in_channels = 3
        self.batch_size, self.num_workers, self.seed = batch_size, num_workers, seed
        self._splits: dict[str, tuple[torch.Tensor, list[str]]] | None = None
        self._stats: tuple[torch.Tensor, torch.Tensor] | None = None
        self._scenes: dict[str, list[Scene]] = {}
        self.files = {"train": train, "val": val, "test": test}
        self.shards = shards
        self.file_splits: dict[str, CaptionFiles] = {}
        self.metadata: dict[str, list[Any]] = {}
        if dataset == "scenes":
            self.scene_config()  # a bad scene option fails here, not at the first batch

    # ------------------------------------------------------------------ data

    def _load(self) -> dict[str, tuple[torch.Tensor, list[str]]]:
        if self._splits is not None:
            return self._splits
        hp = self.hparams
        if self.dataset == "files":
            return self._load_files()
        if self.dataset == "shards":
            return self._load_shards()
        if self.dataset == "scenes":
            config = self.scene_config()
            sizes = {"train": hp.num_train, "val": hp.num_val, "test": hp.num_test}
            self._scenes = {s: sample_scenes(n, config, s, hp.seed) for s, n in sizes.items()}
            self._splits = {s: (render_scenes(scenes, config), [describe(x) for x in scenes])
                            for s, scenes in self._scenes.items()}
        else:
            root = Path(hp.root) if hp.root is not None else None
            data = load_emoji(root, hp.image_size, self.val_size, self.test_size, hp.seed)
            self._splits = {s: (images, captions) for s, (images, captions, _) in data.items()}
            self.metadata = {s: recs for s, (_, _, recs) in data.items()}
        if len(self._splits["train"][1]) == 0:
            raise ValueError("the training split is empty; raise num_train or lower the "
                             "val/test fractions")
        self._stats = channel_stats(self._splits["train"][0])
        return self._splits

    def read_file_splits(self) -> dict[str, CaptionFiles]:
        """Your manifests' caption rows by split: given, or whole images held out (seeded)."""
        hp = self.hparams
        root = hp.image_root
        full = read_caption_files(self.files["train"], root)  # type: ignore[arg-type]
        given = {k: read_caption_files(v, root) for k, v in self.files.items()
                 if k != "train" and v is not None}
        splits = split_by_image(full, hp.seed, self.val_size, self.test_size,
                                "val" in given, "test" in given)
        splits.update(given)
        return splits

    def _load_files(self) -> dict[str, tuple[torch.Tensor | None, list[str]]]:
        """Your manifests: caption rows per split (images stay files, decoded per item)."""
        splits = self.read_file_splits()
        if len(splits["train"]) == 0:
            raise ValueError(f"{self.files['train']}: the training split has no captions")
        self.file_splits = splits
        self._stats = self._file_stats(splits["train"])
        self._splits = {k: (None, list(v.captions)) for k, v in splits.items()}  # type: ignore[misc]
        return self._splits  # type: ignore[return-value]

    def _load_shards(self) -> dict[str, tuple[None, list[str]]]:
        """Shards: the captions of each split (``captions.json``); images stay streamed."""
        import json

        rows = json.loads(read_shard_file(self.shards, "captions.json"))  # type: ignore[arg-type]
        self._shard_rows = {k: torch.tensor(v["image_index"], dtype=torch.int64)
                            for k, v in rows.items()}
        self._splits = {k: (None, list(rows[k]["captions"]) if k in rows else [])
                        for k in SPLITS}  # type: ignore[misc]
        if not self._splits["train"][1]:
            raise ValueError(f"{self.shards}: the training split has no captions")
        raw = shard_dataset(self.shards, "train", None, False, self.seed)  # type: ignore[arg-type]
        images = lambda row: CaptionShardDecoder.image(raw[row])
        self._stats = self._image_stats(self._shard_rows["train"], images)
        return self._splits  # type: ignore[return-value]

    def _resize(self, mean: Any = (0.0,) * 3, std: Any = (1.0,) * 3) -> Callable:
        return image_transform(ImageTransformConfig(self.image_size, tuple(mean), tuple(std)),
                               train=False)

    def _file_stats(self, files: CaptionFiles) -> tuple[torch.Tensor, torch.Tensor]:
        dataset = FileCaptionDataset(files, lambda x: x)
        return self._image_stats(files.image_index, dataset.image)

    def _image_stats(self, image_index: torch.Tensor, image: Callable[[int], torch.Tensor]
                     ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Per-channel mean / std over the pixels of up to ``stats_samples`` training images
        (seeded choice of images, not captions), each resized to ``image_size``; std =
        sqrt(E[x^2] - E[x]^2). ``image_index``: the image of each caption row; ``image``:
        row -> its uint8 image."""
        from multimodal.data.vision_datasets import pixel_statistics

        n = int(image_index.max()) + 1
        pick = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed))
        resize = self._resize()
        rows = {int(im): r for r, im in enumerate(image_index.tolist())}
        chosen = pick[: self.hparams.stats_samples].tolist()
        mean, std = pixel_statistics(((resize(image(rows[i])), 0) for i in chosen), 3)
        return torch.tensor(mean), torch.tensor(std)

    def scene_config(self) -> SceneConfig:
        """How this module samples scenes (dataset "scenes" only)."""
        if self.dataset != "scenes":
            raise ValueError(f"dataset {self.dataset!r} has no scene config")
        hp = self.hparams
        return SceneConfig(image_size=hp.image_size, min_shapes=hp.min_shapes,
                           max_shapes=hp.max_shapes, order=hp.order)

    def scenes(self, split: str) -> list[Scene]:
        """The scenes behind a split's images and captions, in the same order (to score a
        generated caption against the truth with ``caption_matches_scene``)."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if self.dataset != "scenes":
            raise ValueError(f"dataset {self.dataset!r} has no scenes")
        self._load()
        return list(self._scenes[split])

    def caption_checks(self, split: str) -> dict[str, Callable[[str, int], bool]]:
        """Dataset-specific checks of a generated caption: ``name -> check(caption, index)``,
        ``index`` the item's position in ``split``. The captioning task logs the fraction of
        captions that pass as ``{split}/{name}``. Scenes: ``scene_match``
        (:func:`~multimodal.data.sources.scenes.caption_matches_scene`, the caption names exactly
        the scene's shapes and every stated relation holds, in any naming order)."""
        if self.dataset != "scenes":
            return {}
        scenes = self.scenes(split)
        return {"scene_match": lambda caption, index: caption_matches_scene(caption,
                                                                           scenes[index])}

    def prepare_data(self) -> None:
        if self.dataset in ("files", "shards"):
            return
        if self.dataset == "emoji":  # fail early, with the recipe, when the copy is missing
            find_package_dir(self.hparams.root)

    def setup(self, stage: str | None = None) -> None:
        self._load()

    @property
    def model_sizes(self) -> dict[str, int]:
        """The sizes a model of these data must have, by config field name (the
        ``multimodal`` CLI links them into the task's ``data_sizes``: a preset takes them)."""
        return {"image_size": int(self.image_size), "in_channels": self.in_channels}

    @property
    def mean(self) -> torch.Tensor:
        """Per-channel mean of the training images in [0, 1], shape (3,) (``mean`` when
        given, e.g. a pretrained model's)."""
        if self.hparams.get("mean") is not None:
            return torch.tensor(self.hparams.mean, dtype=torch.float32)
        self._load()
        assert self._stats is not None
        return self._stats[0]

    @property
    def std(self) -> torch.Tensor:
        """Per-channel std of the training images in [0, 1], shape (3,) (``std`` when given)."""
        if self.hparams.get("std") is not None:
            return torch.tensor(self.hparams.std, dtype=torch.float32)
        self._load()
        assert self._stats is not None
        return self._stats[1]

    def train_captions(self) -> list[str]:
        """Every training caption, e.g. to train the tokenizer."""
        return list(self._load()["train"][1])

    def captions(self, split: str) -> list[str]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return list(self._load()[split][1])

    def raw_images(self, split: str) -> torch.Tensor:
        """uint8 images (N, 3, H, W) of a split, before normalisation (your files: one per
        caption row, decoded and resized now)."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        images, captions = self._load()[split]
        if images is None:
            from torchvision.transforms.v2 import functional as TF

            if self.shards is not None:
                raw = shard_dataset(self.shards, split, None, False, self.seed)
                image: Callable[[int], torch.Tensor] = lambda i: CaptionShardDecoder.image(
                    raw[i])
            else:
                image = FileCaptionDataset(self.file_splits[split], lambda x: x).image
            size = [self.image_size] * 2
            return torch.stack([TF.resize(image(i), size, antialias=True)
                                for i in range(len(captions))])
        return images

    def denormalize(self, images: torch.Tensor) -> torch.Tensor:
        """Inverse of the normalisation: float images in [0, 1]."""
        return (images * self.std.view(3, 1, 1) + self.mean.view(3, 1, 1)).clamp(0, 1)

    def split_dataset(self, split: str) -> CaptionDataset:
        """The normalised dataset of one split."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        images, captions = self._load()[split]
        if images is None and self.shards is not None:
            transform = self._resize(self.mean.tolist(), self.std.tolist())
            return shard_dataset(self.shards, split, CaptionShardDecoder(transform),  # type: ignore[return-value]
                                 shuffle=split == "train", seed=self.seed)
        if images is None:  # your files
            return FileCaptionDataset(self.file_splits[split],  # type: ignore[return-value]
                                      self._resize(self.mean.tolist(), self.std.tolist()))
        return CaptionDataset(images, captions, self.mean, self.std)

    def collate_fn(self) -> Callable[..., dict[str, Any]]:
        return collate_captions

    def resident_refusal(self) -> str | None:
        if self.dataset in ("files", "shards"):
            return f"your own {'shards are streamed' if self.shards else 'images are files'}, " \
                   "decoded one by one"
        return None

    def resident_split(self, split: str) -> ResidentSplit | None:
        """The uint8 images of a generated / emoji split with their captions (host), for
        :class:`~multimodal.data.device_batches.DeviceBatches`: normalised in batches as
        :class:`CaptionDataset` does per item."""
        if self.resident_refusal() is not None:
            return None
        images, captions = self._load()[split]
        transform = BatchImageTransform(normalise=DivideNormalise(self.mean, self.std, 3))
        return ResidentSplit([images], transform, host_items=captions,
                             assemble=_caption_batch)

    def zero_shot_set(self, pairs: str = "heldout", n: int = 500) -> dict[str, Any]:
        """Single-shape scenes for zero-shot classification among every colour x shape
        (dataset "scenes"): ``{"images"`` (normalised), ``"labels"`` (index into
        ``"class_names"``, e.g. "red circle"), ``"class_names"}``. ``pairs="heldout"`` draws
        the shapes from the held-out pairs (test-split sampling), ``"seen"`` from the
        training pairs (val-split sampling); both with a seed of their own."""
        import dataclasses

        if pairs not in ("heldout", "seen"):
            raise ValueError(f"pairs must be 'heldout' or 'seen', got {pairs!r}")
        config = dataclasses.replace(self.scene_config(), min_shapes=1, max_shapes=1)
        split = "test" if pairs == "heldout" else "val"
        scenes = sample_scenes(n, config, split, self.hparams.seed + 7919)
        names = [f"{c} {s}" for c, s in config.all_pairs()]
        labels = torch.tensor([names.index(f"{x.shapes[0].colour} {x.shapes[0].shape}")
                               for x in scenes])
        images = render_scenes(scenes, config).float() / 255.0
        images = (images - self.mean.view(1, 3, 1, 1)) / self.std.view(1, 3, 1, 1)
        return {"images": images, "labels": labels, "class_names": names}

    def zero_shot_sets(self, n: int = 500) -> dict[str, dict[str, Any]]:
        """Zero-shot classification sets of this dataset, by name: the contrastive task logs
        its accuracy on each as ``{split}/zero_shot_{name}``. Scenes: ``heldout`` and
        ``seen`` (:meth:`zero_shot_set`); emoji: none."""
        if self.dataset != "scenes":
            return {}
        return {pairs: self.zero_shot_set(pairs, n) for pairs in ("heldout", "seen")}
