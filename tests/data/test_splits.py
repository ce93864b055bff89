"""The loader recipe every data module shares (multimodal.data.splits)."""

from __future__ import annotations

import pytest
import torch

from multimodal.data.captions import CaptionDataModule
from multimodal.data.numbers import NumberWordsDataModule
from multimodal.data.sampling import EpochShuffleSampler
from multimodal.data.splits import SplitDataModule


def _first_sources(loader, epoch: int, batches: int = 3) -> list[list[int]]:
    loader.sampler.set_epoch(epoch)
    return [b["source_ids"][:, 1].tolist() for b, _ in zip(loader, range(batches), strict=False)]


def test_training_order_depends_only_on_seed_and_epoch() -> None:
    """A resumed run builds a fresh loader and calls set_epoch(k): it must see the batches
    of epoch k of the uninterrupted run, whatever global RNG was used in between."""
    dm = NumberWordsDataModule(train_size=2000, held_out=500, val_size=100, test_size=100)
    dm.setup()
    loader = dm.train_dataloader()
    assert isinstance(loader.sampler, EpochShuffleSampler)
    uninterrupted = [_first_sources(loader, e) for e in range(3)]
    torch.rand(1000)  # consume global RNG, as a training run would
    resumed = NumberWordsDataModule(train_size=2000, held_out=500, val_size=100, test_size=100)
    resumed.setup()
    assert _first_sources(resumed.train_dataloader(), 2) == uninterrupted[2]
    assert uninterrupted[0] != uninterrupted[1]  # and epochs differ from one another


@pytest.mark.parametrize("split", ["val", "test"])
def test_evaluation_splits_keep_their_order(split: str) -> None:
    dm = CaptionDataModule(num_train=16, num_val=16, num_test=16, batch_size=8)
    loader = getattr(dm, f"{split}_dataloader")()
    # in order on one process; each rank its own share, unpadded, on several
    assert loader.sampler.__class__.__name__ == "EvalShardSampler"
    assert list(loader.sampler) == list(range(16))
    first = next(iter(loader))
    assert first["captions"] == [c for _, c in (dm.split_dataset(split)[i] for i in range(8))]


def test_a_module_without_split_dataset_says_so() -> None:
    class NoSplits(SplitDataModule):
        batch_size = 4

    with pytest.raises(NotImplementedError, match="NoSplits must implement split_dataset"):
        NoSplits().train_dataloader()
