"""Exact mid-epoch resume: a fit killed after any step and resumed from that step's
checkpoint ends with the weights of the uninterrupted fit, bit for bit (one CPU thread), and
trains on every example of each epoch exactly once (#32). Helpers: tests/resume_runs.py."""

from __future__ import annotations

import multimodal as mm
from multimodal.data.vision import ImageClassificationDataModule
from multimodal.tasks import ClassificationTask
from tests.resume_runs import assert_each_once_per_epoch, assert_same_run, fit, interrupted

DIGITS_VIT = dict(image_size=8, patch_size=2, in_channels=1, num_classes=10, dim=32, depth=2,
                  heads=4, mlp_dim=64, pool="mean")


def digits(num_workers: int = 0, augment: bool = True):
    def make():
        task = ClassificationTask(mm.ViT(mm.ViTConfig(**DIGITS_VIT)), lr=3e-3)
        data = ImageClassificationDataModule("digits", batch_size=16, val_size=32,
                                             limit_train=80, augment=augment, flip=augment,
                                             num_workers=num_workers)
        return task, data
    return make


def test_images_resume_mid_epoch_exactly(tmp_path):
    whole, record = fit(digits(), tmp_path / "whole", epochs=3)
    resumed, seen = interrupted(digits(), tmp_path / "cut", epochs=3, kills=[7, 12])
    assert [s for _, s, _ in seen] == list(range(15))
    assert seen == record.seen  # same batches, same order
    assert_each_once_per_epoch(seen, 80)
    assert_same_run(whole, resumed)
