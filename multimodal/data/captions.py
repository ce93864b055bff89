"""Image-caption pairs for the captioning task: procedural scenes or Twitter emoji.

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

from multimodal.data.emoji import find_package_dir, load_emoji
from multimodal.data.scenes import (
    Scene,
    SceneConfig,
    caption_matches_scene,
    describe,
    render_scenes,
    sample_scenes,
)
from multimodal.data.splits import SplitDataModule

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


def channel_stats(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std of uint8 images (N, 3, H, W) scaled to [0, 1]."""
    x = images.float().div_(255.0)
    mean = x.mean(dim=(0, 2, 3))
    std = x.std(dim=(0, 2, 3)).clamp_min(1e-6)
    return mean, std


class CaptionDataModule(SplitDataModule):
    """Captioned images from ``dataset`` = "scenes" (generated, held-out colour-shape pairs
    in test) or "emoji" (local copy made by ``bash data/get_emoji.sh``).

    ``num_train`` / ``num_val`` / ``num_test``, ``min_shapes`` / ``max_shapes`` and ``order``
    (how a caption orders the shapes: "random" or "left_to_right", see
    :class:`~multimodal.data.scenes.SceneConfig`) apply to scenes;
    ``val_fraction`` / ``test_fraction`` and ``root`` to emoji (split by emoji).
    """

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
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        batch_size: int = 64,
        num_workers: int = 0,
        seed: int = 0,
        root: str | None = None,
    ) -> None:
        super().__init__()
        if dataset not in DATASETS:
            raise ValueError(f"dataset must be one of {DATASETS}, got {dataset!r}")
        if image_size < 8:
            raise ValueError(f"image_size must be >= 8, got {image_size}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.save_hyperparameters()
        self.dataset = dataset
        self.image_size = image_size
        self.in_channels = 3
        self.batch_size, self.num_workers, self.seed = batch_size, num_workers, seed
        self._splits: dict[str, tuple[torch.Tensor, list[str]]] | None = None
        self._stats: tuple[torch.Tensor, torch.Tensor] | None = None
        self._scenes: dict[str, list[Scene]] = {}
        self.metadata: dict[str, list[Any]] = {}
        if dataset == "scenes":
            self.scene_config()  # a bad scene option fails here, not at the first batch

    # ------------------------------------------------------------------ data

    def _load(self) -> dict[str, tuple[torch.Tensor, list[str]]]:
        if self._splits is not None:
            return self._splits
        hp = self.hparams
        if self.dataset == "scenes":
            config = self.scene_config()
            sizes = {"train": hp.num_train, "val": hp.num_val, "test": hp.num_test}
            self._scenes = {s: sample_scenes(n, config, s, hp.seed) for s, n in sizes.items()}
            self._splits = {s: (render_scenes(scenes, config), [describe(x) for x in scenes])
                            for s, scenes in self._scenes.items()}
        else:
            root = Path(hp.root) if hp.root is not None else None
            data = load_emoji(root, hp.image_size, hp.val_fraction, hp.test_fraction, hp.seed)
            self._splits = {s: (images, captions) for s, (images, captions, _) in data.items()}
            self.metadata = {s: recs for s, (_, _, recs) in data.items()}
        if len(self._splits["train"][1]) == 0:
            raise ValueError("the training split is empty; raise num_train or lower the "
                             "val/test fractions")
        self._stats = channel_stats(self._splits["train"][0])
        return self._splits

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
        (:func:`~multimodal.data.scenes.caption_matches_scene`, the caption names exactly
        the scene's shapes and every stated relation holds, in any naming order)."""
        if self.dataset != "scenes":
            return {}
        scenes = self.scenes(split)
        return {"scene_match": lambda caption, index: caption_matches_scene(caption,
                                                                           scenes[index])}

    def prepare_data(self) -> None:
        if self.dataset == "emoji":  # fail early, with the recipe, when the copy is missing
            find_package_dir(self.hparams.root)

    def setup(self, stage: str | None = None) -> None:
        self._load()

    @property
    def mean(self) -> torch.Tensor:
        """Per-channel mean of the training images in [0, 1], shape (3,)."""
        self._load()
        assert self._stats is not None
        return self._stats[0]

    @property
    def std(self) -> torch.Tensor:
        """Per-channel std of the training images in [0, 1], shape (3,)."""
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
        """uint8 images (N, 3, H, W) of a split, before normalisation."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return self._load()[split][0]

    def denormalize(self, images: torch.Tensor) -> torch.Tensor:
        """Inverse of the normalisation: float images in [0, 1]."""
        return (images * self.std.view(3, 1, 1) + self.mean.view(3, 1, 1)).clamp(0, 1)

    def split_dataset(self, split: str) -> CaptionDataset:
        """The normalised dataset of one split."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        images, captions = self._load()[split]
        return CaptionDataset(images, captions, self.mean, self.std)

    def collate_fn(self) -> Callable[..., dict[str, Any]]:
        return collate_captions

    def zero_shot_sets(self, n: int = 500) -> dict[str, dict[str, Any]]:
        """The zero-shot classification sets this data offers, by name (the contrastive
        task logs ``{split}/zero_shot_{name}`` for each): scenes ``"heldout"`` and
        ``"seen"`` (:meth:`zero_shot_set`), emoji none."""
        if self.dataset != "scenes":
            return {}
        return {pairs: self.zero_shot_set(pairs, n) for pairs in ("heldout", "seen")}

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
