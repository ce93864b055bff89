"""LitData shards: written by ``multimodal-prepare``, read by the image DataModule, split
between DDP ranks (2 CPU processes, gloo), resumed mid-epoch through a Lightning checkpoint.

Every image is flat with pixel value ``5 * id + 3``, so each batch says which items it holds.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("litdata")
# litdata.optimize starts a worker process per split: the fixture alone takes ~10-140 s here.
pytestmark = pytest.mark.slow

import multimodal as mm  # noqa: E402
from multimodal.data.vision import ImageClassificationDataModule  # noqa: E402
from multimodal.tasks import ClassificationTask  # noqa: E402
from tests.shard_runs import Killed, Record, trainer  # noqa: E402

N_PER_CLASS, CLASSES = 12, ("ant", "bee", "cat")
VIT = dict(image_size=8, patch_size=4, in_channels=3, num_classes=3, dim=16, depth=1,
           heads=2, mlp_dim=32, pool="mean")


def ids_of(x: torch.Tensor) -> list[int]:
    """Item ids of a batch normalised with mean 0, std 1: pixel = 255 x = 5 id + 3."""
    return ((x[:, 0, 0, 0] * 255 - 3) / 5).round().long().tolist()


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> tuple[Path, dict[int, int]]:
    from multimodal.cli.prepare import main

    root = tmp_path_factory.mktemp("shards")
    labels = {}
    for c, cls in enumerate(CLASSES):
        (root / "in" / cls).mkdir(parents=True)
        for i in range(N_PER_CLASS):
            item = c * N_PER_CLASS + i
            labels[item] = c
            pixels = np.full((8, 8, 3), 5 * item + 3, dtype=np.uint8)
            fmt = "png" if i % 2 else "webp"
            Image.fromarray(pixels).save(root / "in" / cls / f"{i:02d}.{fmt}", lossless=True)
    sizes = main(["images", str(root / "in"), str(root / "out"), "--val-size", "6",
                  "--test-size", "6"])
    assert sizes == {"train": 24, "val": 6, "test": 6}
    return root / "out", labels


def module(path: Path, **kwargs) -> ImageClassificationDataModule:
    args = dict(shards=str(path), image_size=8, batch_size=4, mean=0.0, std=1.0,
                augment=False)
    return ImageClassificationDataModule(**{**args, **kwargs})


def test_shards_hold_the_folder_split(shards):
    path, labels = shards
    dm = module(path)
    assert dm.class_names == list(CLASSES)
    folder = ImageClassificationDataModule(train=str(path.parent / "in"), image_size=8,
                                           val_size=6, test_size=6)
    folder.setup("fit")
    splits = folder._load_file_splits()
    dm.setup("fit")
    for split in ("train", "val", "test"):
        seen, seen_labels = [], []
        for x, y in dm.loader(dm.split_dataset(split), shuffle=split == "train"):
            seen += ids_of(x)
            seen_labels += y.tolist()
        expected = [int(Path(p).stem) + N_PER_CLASS * int(lab)
                    for p, lab in zip(splits[split].paths, splits[split].labels, strict=True)]
        assert sorted(seen) == sorted(expected), split
        assert seen_labels == [labels[i] for i in seen]


def batch_ids(batch) -> list[int]:
    return ids_of(batch[0])


def task() -> ClassificationTask:
    return ClassificationTask(mm.ViT(mm.ViTConfig(**VIT)), optimizer={"lr": 1e-3})


def test_ddp_ranks_stream_disjoint_shares_covering_the_epoch(shards, tmp_path):
    path, _ = shards
    L.seed_everything(0)
    trainer(tmp_path, Record(batch_ids, tmp_path), devices=2, strategy="ddp_spawn").fit(
        task(), module(path))
    r0 = [i for batch in torch.load(tmp_path / "seen0.pt") for i in batch]
    r1 = [i for batch in torch.load(tmp_path / "seen1.pt") for i in batch]
    dm = module(path)
    every = sorted(ids_of(torch.cat([x for x, _ in dm.loader(dm.split_dataset("train"),
                                                                 shuffle=False)])))
    assert len(r0) == len(r1) == 12
    assert not set(r0) & set(r1)
    assert sorted(r0 + r1) == every


def test_resume_mid_epoch_continues_with_unseen_items(shards, tmp_path):
    path, _ = shards
    first = Record(batch_ids, tmp_path, stop_after=2)
    L.seed_everything(0)
    with pytest.raises(Killed):
        trainer(tmp_path, first).fit(task(), module(path))
    before = [i for batch in first.seen for i in batch]
    assert len(before) == 8
    second = Record(batch_ids)
    trainer(tmp_path, second).fit(task(), module(path), ckpt_path=tmp_path / "mid.ckpt")
    after = [i for batch in second.seen for i in batch]
    assert len(after) == 16 and not set(before) & set(after)
    dm = module(path)
    every = ids_of(torch.cat([x for x, _ in dm.loader(dm.split_dataset("train"), False)]))
    assert sorted(before + after) == sorted(every)
