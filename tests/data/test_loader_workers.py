"""``num_workers: auto`` (#52): loader processes chosen for the machine, persistent, and
none for a split of a batch or two, where starting them costs more than they save."""

from __future__ import annotations

import os

import pytest

from multimodal.data.splits import SMALL_SPLIT_BATCHES, machine_workers, resolve_workers
from multimodal.data.vision import ImageClassificationDataModule
from tests.cli.test_first_run import _photos


def test_auto_is_one_per_core_but_one_at_most_four(monkeypatch):
    for cores, want in ((1, 0), (2, 1), (3, 2), (8, 4), (64, 4)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cores: set(range(n)))
        assert machine_workers() == want
        assert resolve_workers("auto") == (want, True)
    assert resolve_workers(3) == (3, False)
    for bad in (-1, "two", 1.5, True):
        with pytest.raises(ValueError, match="num_workers must be an int >= 0 or 'auto'"):
            resolve_workers(bad)


def test_auto_reads_small_splits_in_process_and_keeps_workers_for_larger(tmp_path,
                                                                        monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})  # 3 cores: 2
    _photos(tmp_path / "photos", per_class=20)  # 40 images
    data = ImageClassificationDataModule(train=str(tmp_path / "photos"), image_size=16,
                                         in_channels=3, batch_size=4, num_workers="auto",
                                         val_size=0.2, test_size=0, augment=False)
    data.setup("fit")
    train, val = data.train_dataloader(), data.val_dataloader()
    assert len(train) > SMALL_SPLIT_BATCHES >= len(val)  # 32 in 8 batches, 8 in 2
    assert (train.num_workers, train.persistent_workers) == (2, True)
    assert (val.num_workers, val.persistent_workers) == (0, False)
    fixed = ImageClassificationDataModule(train=str(tmp_path / "photos"), image_size=16,
                                          in_channels=3, batch_size=4, num_workers=1,
                                          val_size=0.2, test_size=0, augment=False)
    fixed.setup("fit")
    assert fixed.val_dataloader().num_workers == 1  # a number is taken as given
