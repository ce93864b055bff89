"""Image classification data: one LightningDataModule over any image source.

Sources: the built-in datasets of :mod:`multimodal.data.sources` (Fashion-MNIST, MNIST-5k,
8x8 digits; each module says how its offline copy is obtained and read), your own files
(class-per-subfolder folders or manifests, :mod:`multimodal.data.readers`) or LitData shards
(:mod:`multimodal.data.shards`). The datasets it builds live in
:mod:`multimodal.data.vision_datasets`, the pipelines in :mod:`multimodal.data.vision_transforms`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch.utils.data import DataLoader, Dataset

from multimodal.data.batch_augment import AffineNormalise, BatchImageTransform, DivideNormalise
from multimodal.data.device_batches import ResidentSplit, resident_setting
from multimodal.data.readers import (
    FileList,
    find_classes,
    is_manifest,
    read_labelled_manifest,
    scan_class_folders,
    undecodable_images,
)
from multimodal.data.shards import ShardLoaderMixin
from multimodal.data.sources import digits, fashion_mnist, mnist5k
from multimodal.data.splits import (
    SplitDataModule,
    check_min_per_class,
    held_out,
    predict_source,
    resolve_workers,
)
from multimodal.data.vision_datasets import (
    FileImageDataset,
    ImageFolderDataset,
    ImageSet,
    ImageSource,
    SkippedFilesMixin,
    TensorImageDataset,
    collate_skipping,
    pixel_statistics,
    resize_images,
)
from multimodal.data.vision_transforms import (
    ImageTransformConfig,
    ShiftFlip,
    geometry_steps,
    image_transform,
    per_channel,
)
from multimodal.files import IMAGE_EXTENSIONS, CorruptFileError, read_image

__all__ = ["DATASETS", "ImageClassificationDataModule"]

log = logging.getLogger(__name__)

# A split resized to image_size is kept in memory if it fits in this; else resized per item.
_PRE_RESIZE_MAX_BYTES = 512 * 2**20

# The built-in sources by name; a new one is a module of multimodal.data.sources + a line here.
DATASETS: dict[str, ImageSource] = {
    "fashion_mnist": fashion_mnist.SOURCE,
    "mnist5k": mnist5k.SOURCE,
    "digits": digits.SOURCE,
}

# ------------------------------------------------------------------------- data module


class ImageClassificationDataModule(ShardLoaderMixin, SkippedFilesMixin, SplitDataModule):
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
    image files of ``predict``. Pixels are normalised with ``mean`` / ``std`` when given,
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
        num_workers: DataLoader worker processes (persistent), or ``auto``: one per core
            but one, at most 4, and none for a split of at most two batches
            (:func:`~multimodal.data.splits.machine_workers`).
        val_size: fraction (< 1) or number of training images held out for validation.
        min_held_out_per_class: hold no validation (test) split out of ``train`` where a
            fractional ``val_size`` (``test_size``) gives fewer images than this per
            class: they train (:func:`~multimodal.data.splits.held_out`); 0: always.
        test_size: fraction or number held out for testing (no official/given test split).
        augment: random shifts by image_size // 8 pixels (+ horizontal flips if ``flip``).
        flip: random horizontal flips in training, with or without ``augment`` when set;
            unset: with ``augment`` for files and clothes, never for digits.
        random_resized_crop: RandomResizedCrop's smallest area fraction instead of a plain
            resize in training (files only; None: off).
        auto_augment: ``rand`` (RandAugment) or ``trivial`` (TrivialAugmentWide) in training
            (files only; None: off).
        color_jitter: strength of SimCLR's colour distortion in training (brightness,
            contrast, saturation, hue; grey 1 time in 5) for classes colour does not define
            (files only; None: off; see ImageTransformConfig).
        invert: probability of training on the negative image (255 - x) for classes that
            neither colour nor lightness defines (files only; 0: off).
        mean: per-channel normalisation mean (one value or one per channel); default: the
            training statistics.
        std: per-channel normalisation std; given together with ``mean``.
        stats_samples: how many training files the statistics are computed from.
        skip_corrupt: skip files that cannot be decoded (their count per epoch is logged)
            instead of raising an error naming the file.
        verify_files: your own images (train / val / test) are each decoded once when the
            splits are made, so a file that cannot be decoded is named before the first
            step (or, with skip_corrupt, left out of its split); false skips that pass.
        image_size: resize to this square size (default: the native size; needed for files).
        seed: seed of the split permutation.
        download: fetch Fashion-MNIST with torchvision if missing (needs internet).
        limit_train: keep only this many training images (quick runs).
        predict: folder of images for ``predict`` (the same key in every data module).
        predict_dir: the old name of ``predict`` (deprecated; still read).
        resize: resize the shorter side to this (aspect kept), then centre-crop
            ``image_size`` (a pretrained model's preprocessing; None: plain resize).
        interpolation: ``bilinear`` (default), ``bicubic``, ``nearest``, ``lanczos``, ...
        device_resident: ``auto`` (default): on an accelerator (the trainer's device is not
            the CPU), a built-in dataset whose splits take at most ``device_resident_max_mb``
            is held there whole as uint8, and batches are taken by index from the seeded
            epoch permutation, shifted / flipped and normalised there in batches, with no
            loader workers (:mod:`multimodal.data.device_batches`; one log line says so);
            on the CPU the DataLoader path. ``true``: held also on the CPU (an error where
            the data cannot be: your files, shards, ``random_resized_crop``,
            ``auto_augment``); ``false``: always the DataLoader path. The same order, the
            same augmentation distributions and the same exact mid-epoch resume either way.
        device_resident_max_mb: the most the held splits may take for ``auto`` (MiB).
    """

    modality = "image"

    def __init__(
        self,
        dataset: str = "fashion_mnist",
        root: str | None = None,
        batch_size: int = 128,
        num_workers: int | Literal["auto"] = 0,
        val_size: int | float = 0.1,
        test_size: int | float = 0.2,
        augment: bool = True,
        image_size: int | None = None,
        seed: int = 0,
        download: bool = False,
        limit_train: int | None = None,
        predict_dir: str | None = None,
        predict: str | None = None,
        train: str | None = None,
        val: str | None = None,
        test: str | None = None,
        classes: list[str] | None = None,
        in_channels: int | None = None,
        flip: bool | None = None,
        random_resized_crop: float | None = None,
        auto_augment: str | None = None,
        color_jitter: float | None = None,
        invert: float = 0.0,
        mean: float | list[float] | None = None,
        std: float | list[float] | None = None,
        stats_samples: int = 5000,
        skip_corrupt: bool = False,
        shards: str | None = None,
        resize: int | None = None,
        interpolation: str = "bilinear",
        min_held_out_per_class: int = 0,
        device_resident: bool | str = "auto",
        device_resident_max_mb: float = 2048.0,
        verify_files: bool = True,
    ) -> None:
        super().__init__()
        self.device_resident = resident_setting(device_resident)
        if device_resident_max_mb < 0:
            raise ValueError(f"device_resident_max_mb must be >= 0, got {device_resident_max_mb}")
        self.device_resident_max_mb = float(device_resident_max_mb)
        self.min_held_out_per_class = check_min_per_class(min_held_out_per_class)
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
        self.batch_size = batch_size
        self.num_workers, self.auto_workers = resolve_workers(num_workers)
        self.val_size, self.test_size = val_size, test_size
        self.augment, self.seed, self.download = augment, seed, download
        self.limit_train = limit_train
        self.predict = predict_source(predict, predict_dir)
        self.files = {"train": train, "val": val, "test": test}
        self.skip_corrupt, self.stats_samples = skip_corrupt, stats_samples
        self.verify_files = verify_files
        self.random_resized_crop, self.auto_augment = random_resized_crop, auto_augment
        self.color_jitter, self.invert = color_jitter, invert
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
            if (classes is not None or random_resized_crop is not None or auto_augment
                    or color_jitter is not None or invert):
                raise ValueError(
                    "classes, random_resized_crop, auto_augment, color_jitter and invert apply "
                    "to your own images (train: ...), not to the built-in datasets"
                )
            self.class_names = list(source.class_names)
            self.in_channels = source.in_channels
            self.image_size = image_size or source.image_size
            self._native_size = source.image_size
            self.flip = source.flip if flip is None else flip
            self._source = source
        ImageTransformConfig(1, (0.0,), (1.0,), auto_augment=auto_augment,
                             random_resized_crop=random_resized_crop, color_jitter=color_jitter,
                             invert=invert,
                             interpolation=interpolation)  # validates early
        if resize is not None and resize < self.image_size:
            raise ValueError(f"resize ({resize}) must be >= image_size ({self.image_size})")
        self.resize, self.interpolation = resize, interpolation
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
        # Row indices of each split in the source's training file (test: None when official).
        self.split_indices: dict[str, torch.Tensor | None] = {}

    # -- data ----------------------------------------------------------------------------

    def _read(self, split: str) -> ImageSet:
        if self._source is None:
            raise RuntimeError("your own images are read as files, not held in memory")
        return self._source.read(self.root, split, self.download)

    def prepare_data(self) -> None:
        if self._source is not None and self._source.downloadable and self.download:
            for split in ("train", "test"):
                self._source.read(self.root, split, True)

    def _held_out(
        self, n: int, has_test: bool, has_val: bool = False,
        labels: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor | None]:
        """Seeded row indices of train / val / test within ``n`` training rows (None for a
        split that is given separately), stratified by ``labels`` when given; see
        :func:`~multimodal.data.splits.held_out`."""
        return held_out(n, self.seed, self.val_size, self.test_size, has_test, has_val,
                        self.limit_train, labels=labels,
                        min_held_out_per_class=self.min_held_out_per_class)

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
        idx = self._held_out(len(full), has_test="test" in given, has_val="val" in given,
                             labels=full.labels)  # your own images: stratified by class
        self.split_indices = idx
        splits = {k: full.subset(v) for k, v in idx.items() if v is not None}
        for k, path in given.items():
            splits[k] = _read_files(path, classes)  # type: ignore[arg-type]
        self._file_splits = self._decodable(splits) if self.verify_files else splits
        return self._file_splits

    def _decodable(self, splits: dict[str, FileList]) -> dict[str, FileList]:
        """Every file of every split decoded once before training
        (:func:`~.readers.undecodable_images`): a file that cannot be decoded is an error
        naming it now, not mid-epoch or in the test after fit; with ``skip_corrupt`` it is
        left out of its split (counted in one log line), so every later read decodes.
        ``verify_files: false`` skips this (a folder too large to read twice)."""
        start, kept = time.perf_counter(), {}
        for name, files in splits.items():
            bad = undecodable_images(files.paths, self.in_channels)
            if bad and not self.skip_corrupt:
                more = f" ({len(bad)} of the {len(files)} {name} files cannot be decoded; " \
                    "--data.init_args.skip_corrupt true leaves them out)" if len(bad) > 1 else ""
                raise CorruptFileError(f"{bad[0][1]}{more}") from bad[0][1]
            if bad:
                log.warning("%s: left out %d corrupt image file(s) of %d (skip_corrupt), e.g. "
                            "%s", name, len(bad), len(files), files.paths[bad[0][0]])
                keep = torch.ones(len(files), dtype=torch.bool)
                keep[[i for i, _ in bad]] = False
                files = files.subset(keep.nonzero().flatten())
            kept[name] = files
        log.info("checked %d image files: each decodes (%.1f s; verify_files: false skips "
                 "this)", sum(len(f) for f in splits.values()), time.perf_counter() - start)
        return kept

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
        choice), each resized to ``image_size`` (:func:`~.vision_datasets.pixel_statistics`)."""
        resize = image_transform(
            ImageTransformConfig(self.image_size, (0.0,) * self.in_channels,
                                 (1.0,) * self.in_channels), train=False
        )
        if self.shards is not None:
            dataset = self._shard_dataset("train", resize, shuffle=False)
        else:
            dataset = FileImageDataset(self._load_file_splits()["train"], self.in_channels,
                                       resize, self.skip_corrupt)
        n = min(len(dataset), self.stats_samples)
        pick = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(self.seed))
        return pixel_statistics((dataset[i] for i in pick[:n].tolist()), self.in_channels)

    @property
    def mean(self) -> tuple[float, ...]:
        return self._normalisation()[0]

    @property
    def std(self) -> tuple[float, ...]:
        return self._normalisation()[1]

    @property
    def model_sizes(self) -> dict[str, int]:
        """The sizes a model of these data must have, by config field name (the
        ``multimodal`` CLI links them into the task's ``data_sizes``: a preset takes them)."""
        return {"image_size": int(self.image_size), "in_channels": int(self.in_channels)}

    def transform_config(self) -> ImageTransformConfig:
        """The image pipeline of this module's settings (see
        :mod:`~multimodal.data.vision_transforms`)."""
        return ImageTransformConfig(
            self.image_size, self.mean, self.std, shift=self.augment,
            flip=self.flip and (self.augment or self._flip_given),
            random_resized_crop=self.random_resized_crop,
            auto_augment=self.auto_augment, color_jitter=self.color_jitter,
            invert=self.invert, resize=self.resize, interpolation=self.interpolation,
        )

    def _shard_dataset(self, split: str, transform: Callable, shuffle: bool) -> Any:
        from multimodal.data.shards import shard_image_dataset

        return shard_image_dataset(self.shards, split, self.in_channels,  # type: ignore[arg-type]
                                   transform, shuffle, self.seed, self.skip_corrupt)

    def _images_at_size(self, split: str) -> torch.Tensor:
        """A built-in split's uint8 images resized once to ``image_size`` (cached)."""
        images = self._load_splits()[split].images
        if self.image_size == self._native_size:
            return images
        if split not in self._resized:
            self._resized[split] = torch.cat(
                [resize_images(chunk, self.image_size) for chunk in images.split(4096)]
            )
        return self._resized[split]

    def resident_refusal(self) -> str | None:
        if self.shards is not None:
            return "shards are streamed, not held in memory"
        if self._source is None and (self.random_resized_crop is not None
                                     or self.auto_augment or self.color_jitter is not None
                                     or self.invert):
            return ("random_resized_crop, auto_augment, color_jitter and invert are applied "
                    "image by image")
        return None

    def resident_bytes(self) -> int:
        """Bytes of the uint8 splits at ``image_size`` and their int64 labels, known before
        any file is decoded."""
        if self._source is None:
            sizes = [len(files) for files in self._load_file_splits().values()]
        else:
            sizes = [len(data) for data in self._load_splits().values()]
        return sum(sizes) * (self.in_channels * self.image_size**2 + 8)

    def _decoded_files(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Your images of ``split`` decoded once and resized (uint8 (N, C, S, S), labels);
        an undecodable file raises, or with ``skip_corrupt`` is left out and counted in one
        log line."""
        from torchvision.transforms import v2

        decoded = self.__dict__.setdefault("_decoded", {})
        if split not in decoded:
            files = self._load_file_splits()[split]
            geometry = v2.Compose(geometry_steps(self.transform_config()))
            images, labels, skipped = [], [], 0
            for path, label in zip(files.paths, files.labels.tolist(), strict=True):  # type: ignore[union-attr]
                try:
                    image = read_image(str(path), self.in_channels)
                except CorruptFileError:
                    if not self.skip_corrupt:
                        raise
                    skipped += 1
                    continue
                images.append(geometry(image))
                labels.append(label)
            if skipped:
                log.warning("%s: skipped %d corrupt image file(s) of %d", split, skipped,
                            len(files))
            shape = (0, self.in_channels, self.image_size, self.image_size)
            stacked = torch.stack(images) if images else torch.empty(shape, dtype=torch.uint8)
            decoded[split] = (stacked, torch.tensor(labels, dtype=torch.int64))
        return decoded[split]

    def resident_split(self, split: str) -> ResidentSplit | None:
        """A split held whole for :class:`~.device_batches.DeviceBatches`: a built-in one
        resized once, your files decoded and resized once; in training the random shifts /
        flips of :class:`ShiftFlip`, then the normalisation of the DataLoader path
        (:class:`TensorImageDataset`'s, or torchvision's for files), done in batches
        (:mod:`.batch_augment`)."""
        if self.resident_refusal() is not None:
            return None
        config = self.transform_config()
        pad, flip = 0, False
        if split == "train" and (config.shift or config.flip):
            pad = max(1, self.image_size // 8) if config.shift else 0
            flip = config.flip
        if self._source is None:
            if split not in self._load_file_splits():
                return None
            images, labels = self._decoded_files(split)
            normalise: AffineNormalise | DivideNormalise = DivideNormalise(
                self.mean, self.std, self.in_channels, torchvision=True)
        else:
            images, labels = self._images_at_size(split), self._load_splits()[split].labels
            normalise = AffineNormalise(self.mean, self.std, self.in_channels)
        return ResidentSplit([images, labels], BatchImageTransform(pad, flip, normalise))

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
                        [resize_images(chunk, self.image_size) for chunk in images.split(4096)]
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

    def setup(self, stage: str | None = None) -> None:
        if self.shards is not None:
            pass
        elif self._source is None:
            self._load_file_splits()
        else:
            self._load_splits()
        self._normalisation()

    def predict_dataloader(self) -> DataLoader:
        if self.predict is None:
            raise ValueError("predict needs predict: a folder of images (" +
                             " ".join(IMAGE_EXTENSIONS) + "; --data.init_args.predict)")
        dataset = ImageFolderDataset(  # the evaluation transform of fit, whatever its settings
            self.predict, self.image_size, self.in_channels, self.mean, self.std,
            transform=image_transform(self.transform_config(), train=False),
            skip_corrupt=self.skip_corrupt,
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
