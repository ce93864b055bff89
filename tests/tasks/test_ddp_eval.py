"""Exact metrics on several processes (#32): evaluation loaders give every example to exactly
one rank (no padding repeats), and losses are averaged over all ranks' examples, so a test
on 3 CPU processes (gloo) of a split that 3 does not divide scores like one process."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data.distributed import DistributedSampler

import multimodal as mm
from multimodal.data.sampling import EvalShardSampler
from multimodal.data.vision import ImageClassificationDataModule
from multimodal.tasks import ClassificationTask
from tests.cli.test_resume import DIGITS_VIT


@pytest.mark.parametrize("n", [0, 1, 7, 100, 101])
@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_eval_shards_partition_the_split_without_padding(n, world):
    shares = [list(EvalShardSampler(n, world=world, rank=r)) for r in range(world)]
    assert sorted(i for s in shares for i in s) == list(range(n))
    assert [len(EvalShardSampler(n, world=world, rank=r)) for r in range(world)] == \
        [len(s) for s in shares]
    # Lightning keeps a DistributedSampler as it is (it would pad a plain loader's)
    assert isinstance(EvalShardSampler(n, world=world, rank=0), DistributedSampler)


def test_eval_shards_reject_a_bad_rank():
    with pytest.raises(ValueError, match="rank"):
        EvalShardSampler(10, world=2, rank=2)


def test_eval_loaders_use_the_unpadded_sampler():
    data = ImageClassificationDataModule("digits", batch_size=16, val_size=32, test_size=100,
                                         augment=False)
    data.setup("fit")
    data.setup("test")
    for loader in (data.val_dataloader(), data.test_dataloader()):
        assert isinstance(loader.sampler, EvalShardSampler)
        assert list(loader.sampler) == list(range(len(loader.dataset)))


def _test_metrics(devices: int, state: dict, folder) -> dict[str, float]:
    task = ClassificationTask(mm.ViT(mm.ViTConfig(**DIGITS_VIT)))
    task.load_state_dict(state)
    data = ImageClassificationDataModule("digits", batch_size=16, val_size=32, test_size=100,
                                         augment=False)
    strategy = "ddp_spawn" if devices > 1 else "auto"
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy=strategy, logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=folder)
    (metrics,) = trainer.test(task, data, verbose=False)
    return {k: float(v) for k, v in metrics.items()}


@pytest.mark.slow
def test_three_processes_score_the_test_split_like_one(tmp_path):
    torch.manual_seed(0)
    state = ClassificationTask(mm.ViT(mm.ViTConfig(**DIGITS_VIT))).state_dict()
    one = _test_metrics(1, state, tmp_path / "one")
    three = _test_metrics(3, state, tmp_path / "three")
    assert 100 % 3 != 0
    assert three.keys() == one.keys() >= {"test/acc", "test/loss"}
    for key in one:
        assert three[key] == pytest.approx(one[key], rel=1e-5, abs=1e-6), key
