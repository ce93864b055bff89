"""A split held whole on the accelerator, and the loader that batches it there.

:class:`DeviceBatches` stands in for a DataLoader (Lightning takes any iterable with a
length): it keeps a split's tensors (uint8 images, labels, ...) on one device and yields
batches already there, taken by index, transformed in batches
(:mod:`multimodal.data.batch_augment`). No worker processes, no per-item Python, no copy
from the host per step: the pattern of airbench (Keller Jordan's CIFAR-10 speed runs).

What holds (tested in ``tests/data/test_device_batches.py``):

* Training order: epoch ``e`` is the permutation of
  :class:`~multimodal.data.sampling.EpochShuffleSampler` (``torch.randperm`` from
  ``seed * 1_000_003 + e`` on the host, once per epoch), so a run sees its examples in the
  order of the DataLoader path on any device; the random shifts and flips of the epoch are
  drawn right after it from the same generator, one call for all items. Both are copied to
  the device once an epoch; a batch is then an index slice on the device (no host sync).
* Several processes (DDP): the permutation is padded to a multiple of ``world`` by
  repeating its head (as ``DistributedSampler`` does) and rank ``r`` takes positions
  ``r, r + world, ...``: the ranks' batches together are the epoch. Evaluation: rank ``r``
  takes items ``r, r + world, ...`` in order, none repeated
  (:class:`~multimodal.data.sampling.EvalShardSampler`).
* Resume: the training loader shares the data module's
  :class:`~multimodal.data.sampling.LoaderPosition` (the epoch, the batches handed out, the
  random state); after ``load_state_dict`` the next pass of that epoch skips the batches
  already trained on and restores the random state, as
  :class:`~multimodal.data.sampling.ResumableDataLoader` does. The permutation and the
  augmentation draws are functions of ``(seed, epoch)``, so they are recomputed, not stored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.utils.data import SequentialSampler

from multimodal.data.sampling import LoaderPosition, set_rng_state

__all__ = ["BatchTransform", "DeviceBatches", "EpochCounter", "ResidentSplit",
           "resident_setting"]


class BatchTransform(Protocol):
    """What a held split's batches go through (e.g.
    :class:`~multimodal.data.batch_augment.BatchImageTransform`,
    :class:`~multimodal.data.audio_batches.BatchAudioCrop`): :meth:`draw` makes the random
    choices of a whole epoch at once (two tensors with one row per item, or None), in the
    permutation's order, from the epoch's generator; :meth:`apply` transforms a batch's
    arrays (as held, indexed) with its rows of those draws."""

    @property
    def random(self) -> bool: ...

    def to(self, device: torch.device | str) -> BatchTransform: ...

    def draw(self, n: int, generator: torch.Generator
             ) -> tuple[torch.Tensor | None, torch.Tensor | None]: ...

    def apply(self, arrays: list[torch.Tensor], first: torch.Tensor | None,
              second: torch.Tensor | None) -> list[torch.Tensor]: ...

RESIDENT_SETTINGS = ("auto", "true", "false")


def resident_setting(value: bool | str) -> str:
    """A data module's ``device_resident``: ``"auto"``, ``"true"`` or ``"false"`` (bools and
    their spellings accepted)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value).strip().lower()
    text = {"on": "true", "yes": "true", "1": "true", "off": "false", "no": "false",
            "0": "false"}.get(text, text)
    if text not in RESIDENT_SETTINGS:
        raise ValueError(f"device_resident must be auto, true or false, got {value!r}")
    return text


@dataclass
class ResidentSplit:
    """A split as a data module hands it to :class:`DeviceBatches`: host tensors (items
    along dim 0; e.g. the uint8 images and labels, or waveforms, their lengths and labels),
    the batch ``transform`` (:class:`BatchTransform`), and optionally
    per-item host values and how a batch is assembled (see :class:`DeviceBatches`)."""

    arrays: list[torch.Tensor]
    transform: BatchTransform | None = None
    host_items: Sequence[Any] | None = None
    assemble: Callable[[list[torch.Tensor], list[Any] | None], Any] | None = None


class EpochCounter:
    """The ``sampler`` of a :class:`DeviceBatches`: only there for Lightning's
    ``set_epoch`` call at the start of every epoch."""

    def __init__(self) -> None:
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


class DeviceBatches:
    """Batches of one split whose tensors live on one device.

    ``arrays``: tensors with the items along dim 0, all on the device (indexed, then given
    to ``transform.apply`` with the batch's draws: an image transform changes the first,
    the uint8 images; labels are indexed only).
    ``host_items``: a per-item sequence kept on the host (e.g. caption strings), indexed
    with the host copy of the same indices. ``assemble(arrays, host_items)`` makes the batch
    (default: the tuple of arrays). ``shuffle``: training (epoch permutations, augmentation,
    a resumable position); else evaluation order. ``drop_last`` as DataLoader's.
    """

    def __init__(
        self,
        arrays: Sequence[torch.Tensor],
        batch_size: int,
        shuffle: bool,
        seed: int = 0,
        transform: BatchTransform | None = None,
        position: LoaderPosition | None = None,
        world: int = 1,
        rank: int = 0,
        host_items: Sequence[Any] | None = None,
        assemble: Callable[[list[torch.Tensor], list[Any] | None], Any] | None = None,
        drop_last: bool = False,
    ) -> None:
        if not arrays:
            raise ValueError("DeviceBatches needs at least one tensor")
        n = len(arrays[0])
        if any(len(a) != n for a in arrays) or (host_items is not None and len(host_items) != n):
            raise ValueError("DeviceBatches: every array (and host_items) needs one row per item")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 0 <= rank < world:
            raise ValueError(f"rank must be in [0, {world}), got {rank}")
        self.arrays, self.n = list(arrays), n
        self.device = arrays[0].device
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.transform = transform
        self.position = position if position is not None else LoaderPosition()
        self.world, self.rank = world, rank
        self.host_items, self.assemble = host_items, assemble
        self.drop_last = drop_last
        # what Lightning looks at: set_epoch is called on ``sampler`` every epoch, and an
        # evaluation loader must not look shuffled (a SequentialSampler says so)
        self.sampler: EpochCounter | SequentialSampler = \
            EpochCounter() if shuffle else SequentialSampler(range(self.items_per_rank))
        self.batch_sampler = None
        # ``len(loader.dataset)`` is how the tasks and callbacks count a split's examples
        self.dataset = range(n)

    # -- sizes ----------------------------------------------------------------------------
    @property
    def items_per_rank(self) -> int:
        """Items this rank sees a pass: training ``ceil(n / world)`` (padded), evaluation
        ``len(range(rank, n, world))``."""
        if self.shuffle:
            return -(-self.n // self.world)
        return len(range(self.rank, self.n, self.world))

    def __len__(self) -> int:
        k = self.items_per_rank
        return k // self.batch_size if self.drop_last else -(-k // self.batch_size)

    # -- the order of a pass -----------------------------------------------------------
    def epoch_order(self, epoch: int) -> tuple[torch.Tensor, torch.Tensor | None,
                                               torch.Tensor | None]:
        """This rank's item indices for ``epoch`` (host, int64) and their augmentation draws
        (flips, offsets; None where the transform draws nothing)."""
        flips = offsets = None
        if not self.shuffle:
            return torch.arange(self.rank, self.n, self.world), None, None
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        order = torch.randperm(self.n, generator=gen)  # EpochShuffleSampler's order
        if self.transform is not None and self.transform.random:
            flips, offsets = self.transform.draw(self.n, gen)
        total = self.items_per_rank * self.world
        # padded by repeating the head (as DistributedSampler does), then this rank's share
        pick = (torch.arange(total) % self.n)[self.rank:total:self.world]
        order = order[pick]
        flips = flips[pick] if flips is not None else None
        offsets = offsets[pick] if offsets is not None else None
        return order, flips, offsets

    # -- iteration -------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        return self._pass()

    def _pass(self) -> Iterator[Any]:
        epoch = getattr(self.sampler, "epoch", 0)
        skip = 0
        pending = None
        if self.shuffle:
            position = self.position
            pending, position.pending = position.pending, None
            if pending is not None and (pending["epoch"] is None or pending["epoch"] == epoch) \
                    and pending["batches"] < len(self):
                skip = int(pending["batches"])
        order, flips, offsets = self.epoch_order(epoch)
        index = order.to(self.device, non_blocking=True)
        flips = flips.to(self.device, non_blocking=True) if flips is not None else None
        offsets = offsets.to(self.device, non_blocking=True) if offsets is not None else None
        if pending is not None:
            set_rng_state(pending["rng"])
        if self.shuffle:
            self.position.epoch, self.position.batches = epoch, skip
        size = self.batch_size
        for b in range(skip, len(self)):
            lo, hi = b * size, min((b + 1) * size, len(order))
            rows = index[lo:hi]
            arrays = [a.index_select(0, rows) for a in self.arrays]
            if self.transform is not None:
                arrays = self.transform.apply(arrays,
                                              flips[lo:hi] if flips is not None else None,
                                              offsets[lo:hi] if offsets is not None else None)
            host = None
            if self.host_items is not None:
                host = [self.host_items[i] for i in order[lo:hi].tolist()]
            batch = self.assemble(arrays, host) if self.assemble is not None else tuple(arrays)
            if self.shuffle:
                self.position.batches += 1
            yield batch

    # -- resume ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return self.position.state_dict() if self.shuffle else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.shuffle and state:
            self.position.load_state_dict(state)
