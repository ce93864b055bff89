"""The one DataLoader recipe that every data module's train / val / test loaders share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from multimodal.data.sampling import EpochShuffleSampler


class SplitDataModule(L.LightningDataModule):
    """A LightningDataModule whose loaders differ only in the split.

    Subclasses set ``batch_size``, ``seed`` and ``num_workers``, and implement
    :meth:`split_dataset` (and :meth:`collate_fn` when items need batching help). The
    training split is shuffled by :class:`EpochShuffleSampler`, whose order depends only on
    ``(seed, epoch)``: a run resumed from a checkpoint sees the batches of an uninterrupted
    one, and the order never depends on how much global RNG state was used before.
    """

    batch_size: int
    seed: int = 0
    num_workers: int = 0

    def split_dataset(self, split: str) -> Dataset:
        """The dataset of ``split`` ("train", "val" or "test")."""
        raise NotImplementedError(f"{type(self).__name__} must implement split_dataset(split)")

    def collate_fn(self) -> Callable[[list[Any]], Any] | None:
        """How items become a batch; ``None``: torch's default collation."""
        return None

    def loader(self, dataset: Dataset, shuffle: bool) -> DataLoader:
        sampler = EpochShuffleSampler(len(dataset), self.seed) if shuffle else None  # type: ignore[arg-type]
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            collate_fn=self.collate_fn(),
            pin_memory=torch.cuda.is_available(),
        )

    def train_dataloader(self) -> DataLoader:
        return self.loader(self.split_dataset("train"), shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self.loader(self.split_dataset("val"), shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self.loader(self.split_dataset("test"), shuffle=False)


__all__ = ["SplitDataModule"]
