"""Samplers and the training DataLoader that make a resumed run see the batches of an
uninterrupted one, and the evaluation sampler that scores every example exactly once.

What holds (tested in ``tests/cli/test_resume.py``):

* The training order depends only on ``(seed, epoch)`` (:class:`EpochShuffleSampler`).
* :class:`ResumableDataLoader` saves its position in the epoch (batches handed to the
  training loop) and the random-number state of the process at that moment; a run resumed
  from a checkpoint taken at *any* training step skips exactly the batches already trained
  on (from the index list, without reading them), then restores the random state, so it
  sees every example of the interrupted epoch once, in the uninterrupted order, and on one
  process with one CPU thread ends with bit-identical weights. The restored random state
  covers what runs in the main process: dropout, masking, and augmentation when
  ``num_workers == 0``. With ``num_workers > 0`` (and ``item_seed`` given, as
  :class:`~multimodal.data.splits.SplitDataModule` does) each item is read in its worker
  with the random generators seeded from ``(item_seed, epoch, index)``
  (:class:`SeededItems`), so augmentation depends on neither the worker nor the resume.
* On several processes (DDP) the position is the same on every rank (all step together),
  so the interrupted epoch is still covered once; the restored random state is rank 0's.
* :class:`EvalShardSampler`: each of ``world`` processes takes every ``world``-th example
  from its rank, without padding, so evaluation counts every example exactly once.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler
from torch.utils.data.distributed import DistributedSampler


class EpochShuffleSampler(Sampler[int]):
    """A random permutation of ``range(n)`` drawn from ``seed + epoch``.

    Lightning calls ``set_epoch`` at the start of every epoch (also after resuming from a
    checkpoint), so the order never depends on how much global RNG state was used before.
    Where in the epoch a run stands is kept by :class:`ResumableDataLoader`, not here: with
    worker processes the loader reads indices ahead of the batches trained on.
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


class EvalShardSampler(DistributedSampler):
    """``range(n)[rank::world]``: every example on exactly one process, none repeated.

    Lightning's own ``DistributedSampler`` pads the last round with repeats so that every
    rank gets as many batches; scores averaged over such a split count some examples twice.
    Being a ``DistributedSampler`` this one is kept by Lightning as it is. ``world`` and
    ``rank`` default to the initialised process group (1 and 0 without one). Metrics must
    then be summed over ranks weighted by their counts (``sync_dist=True`` on mean-reduced
    ``self.log`` values does that, and torchmetrics states are summed).
    """

    def __init__(self, n: int, world: int | None = None, rank: int | None = None) -> None:
        grouped = dist.is_available() and dist.is_initialized()
        world = world if world is not None else (dist.get_world_size() if grouped else 1)
        rank = rank if rank is not None else (dist.get_rank() if grouped else 0)
        if not 0 <= rank < world:
            raise ValueError(f"rank must be in [0, {world}), got {rank}")
        # not DistributedSampler.__init__: it needs a dataset and an initialised group
        self.n, self.num_replicas, self.rank = n, world, rank
        self.epoch, self.shuffle, self.drop_last, self.seed = 0, False, False, 0
        self.num_samples = len(range(rank, n, world))
        self.total_size = n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.n, self.num_replicas))

    def __len__(self) -> int:
        return self.num_samples


def rng_state() -> dict[str, Any]:
    """The process's random states (torch CPU and CUDA, Python, NumPy) in plain types that
    ``torch.load(weights_only=True)`` reads back."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [kind, torch.from_numpy(np.asarray(keys).astype(np.int64)), int(pos),
                  int(has_gauss), float(gauss)],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, gauss_value = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss_value))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class LoaderPosition:
    """Where a :class:`ResumableDataLoader` stands: the epoch of its pass in progress and
    how many batches it has handed out in it; and a position to resume from.

    One object is shared by the loader and its data module, and survives Lightning
    rebuilding the loader (it does so to insert a distributed sampler): the new loader is
    made with the same arguments, hence the same position.
    """

    def __init__(self) -> None:
        self.epoch: int | None = None
        self.batches = 0
        self.pending: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "batches": self.batches, "rng": rng_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("epoch", "batches", "rng"):
            if key not in state:
                raise ValueError(f"not a loader position: no {key!r} in {sorted(state)}")
        self.pending = dict(state)


def item_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit seed for item ``index`` of ``epoch`` (BLAKE2b of the three numbers)."""
    digest = hashlib.blake2b(f"{seed}:{epoch}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class SeededItems(Dataset):
    """``dataset`` read with keys ``(epoch, index)``: before item ``index`` is read, torch's
    (CPU), Python's and NumPy's global generators of the reading process are seeded with
    :func:`item_seed` ``(seed, epoch, index)``. Random augmentation then depends only on the
    item and the epoch: not on which worker process reads it, nor on where a run resumed.
    :class:`ResumableDataLoader` reads through it in worker processes (their generators are
    theirs alone). Other attributes are the dataset's."""

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset, self.seed = dataset, seed

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, index = key
        value = item_seed(self.seed, epoch, index)
        # the CPU generator only (torch.manual_seed also seeds every accelerator: 100x slower)
        torch.default_generator.manual_seed(value)
        random.seed(value)
        np.random.seed(value % 2**32)
        return self.dataset[index]

    def __getattr__(self, name: str) -> Any:
        if name in ("dataset", "seed") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.dataset, name)


class _SkipFirst(Sampler[Any]):
    """The index sampler of a :class:`ResumableDataLoader`: the loader's own, less its
    first ``skip`` entries (batches of indices); with ``epoch`` set, each index ``i``
    becomes ``(epoch, i)`` (the keys of :class:`SeededItems`). The loader sets both only
    while it makes a pass's iterator (torch's iterator calls ``iter`` more than once)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.skip = inner, 0
        self.epoch: int | None = None

    def __iter__(self) -> Iterator[Any]:
        entries = itertools.islice(iter(self.inner), self.skip, None)
        epoch = self.epoch
        if epoch is None:
            return entries
        return ([(epoch, i) for i in entry] if isinstance(entry, list) else (epoch, entry)
                for entry in entries)

    def __len__(self) -> int:
        return len(self.inner)


def _sampler_epoch(loader: DataLoader) -> int | None:
    for sampler in (loader.sampler, getattr(loader.batch_sampler, "sampler", None)):
        epoch = getattr(sampler, "epoch", None)
        if isinstance(epoch, int):
            return epoch
    return None


class ResumableDataLoader(DataLoader):
    """A DataLoader with ``state_dict`` / ``load_state_dict`` (so Lightning saves it in
    every checkpoint): its position in the epoch and the random state at that moment.

    After :meth:`load_state_dict`, the next pass (when its sampler is at the saved epoch)
    starts after the batches already handed out, and restores the random state before its
    first batch is read. A position saved at the end of a pass skips nothing (the next
    epoch starts whole) but still restores the random state. Passes start lazily, at the
    first ``next``: Lightning makes the iterator before it calls ``set_epoch``.

    ``position``: the :class:`LoaderPosition` to keep the position in (default: its own).
    ``item_seed``: with worker processes (``num_workers > 0``), read a map-style dataset
    through :class:`SeededItems` with this seed, so that augmentation in the workers is
    replayed exactly after a resume (None: the workers' own generators, as torch seeds them).
    """

    def __init__(self, dataset: Dataset, *args: Any, position: LoaderPosition | None = None,
                 item_seed: int | None = None, **kwargs: Any) -> None:
        workers = kwargs.get("num_workers", args[4] if len(args) > 4 else 0)
        if item_seed is not None and workers and not isinstance(dataset, SeededItems) \
                and not isinstance(dataset, IterableDataset):
            dataset = SeededItems(dataset, item_seed)
        super().__init__(dataset, *args, **kwargs)
        self.position = position if position is not None else LoaderPosition()
        self.item_seed = item_seed
        self._skipper: _SkipFirst | None = None

    @property
    def _index_sampler(self) -> Any:  # type: ignore[override]
        inner = super()._index_sampler
        if self._skipper is None or self._skipper.inner is not inner:
            self._skipper = _SkipFirst(inner)
        return self._skipper

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        return _CountingIterator(self)

    def _start_pass(self) -> Iterator[Any]:
        position, epoch = self.position, _sampler_epoch(self)
        pending, position.pending = position.pending, None
        skip = 0
        if pending is not None and (pending["epoch"] is None or pending["epoch"] == epoch) \
                and pending["batches"] < len(self):
            skip = int(pending["batches"])
        skipper = self._index_sampler
        skipper.skip = skip
        skipper.epoch = (epoch or 0) if isinstance(self.dataset, SeededItems) else None
        try:
            iterator = DataLoader.__iter__(self)
        finally:
            skipper.skip, skipper.epoch = 0, None
        if pending is not None:
            set_rng_state(pending["rng"])
        position.epoch, position.batches = epoch, skip
        return iterator

    def state_dict(self) -> dict[str, Any]:
        return self.position.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position.load_state_dict(state)


class _CountingIterator(Iterator[Any]):
    def __init__(self, loader: ResumableDataLoader) -> None:
        self.loader = loader
        self.iterator: Iterator[Any] | None = None

    def __next__(self) -> Any:
        if self.iterator is None:
            self.iterator = self.loader._start_pass()
        batch = next(self.iterator)
        self.loader.position.batches += 1
        return batch

    def __len__(self) -> int:
        return len(self.loader)


__all__ = ["EpochShuffleSampler", "EvalShardSampler", "LoaderPosition", "ResumableDataLoader",
           "SeededItems", "item_seed", "rng_state", "set_rng_state"]
