"""Samplers whose order depends only on (seed, epoch), so that a resumed run sees the
same batches as an uninterrupted one."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class EpochShuffleSampler(Sampler[int]):
    """A random permutation of ``range(n)`` drawn from ``seed + epoch``.

    Lightning calls ``set_epoch`` at the start of every epoch (also after resuming from a
    checkpoint), so the order never depends on how much global RNG state was used before.
    """

    def __init__(self, n: int, seed: int = 0) -> None:
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return iter(torch.randperm(self.n, generator=gen).tolist())

    def __len__(self) -> int:
        return self.n
