"""The one DataLoader recipe that every data module's train / val / test loaders share."""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, ClassVar

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, Dataset

from multimodal.data.contract import follow_settings
from multimodal.data.device_batches import DeviceBatches, ResidentSplit, resident_setting
from multimodal.data.sampling import (
    EpochShuffleSampler,
    EvalShardSampler,
    LoaderPosition,
    ResumableDataLoader,
)
from multimodal.data.workers import ignore_job_signals


def predict_source(predict: str | None, predict_dir: str | None) -> str | None:
    """A data module's ``predict`` argument, or, when only that is given, ``predict_dir``
    (its old name, read with a warning)."""
    if predict is None and predict_dir is not None:
        warnings.warn("predict_dir is the old name of predict: use --data.init_args.predict",
                      FutureWarning, stacklevel=3)
        return predict_dir
    return predict


RENAMED_SIZES = {"val_fraction": "val_size", "test_fraction": "test_size"}
"""The held-out sizes' old names -> today's (``val_size`` / ``test_size``: a count, or a
fraction below 1, in every data module)."""


def held_out_sizes(val_size: float, test_size: float, val_fraction: float | None = None,
                   test_fraction: float | None = None) -> tuple[float, float]:
    """``(val_size, test_size)``, where an old name given (``val_fraction`` /
    ``test_fraction``, not None) takes the place of the new one, with a DeprecationWarning
    naming it."""
    sizes = {"val_size": val_size, "test_size": test_size}
    for old, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if value is not None:
            new = RENAMED_SIZES[old]
            warnings.warn(f"{old} is deprecated: use {new} (a count, or a fraction below 1)",
                          DeprecationWarning, stacklevel=3)
            sizes[new] = value
    return sizes["val_size"], sizes["test_size"]


def check_min_per_class(value: int) -> int:
    """A data module's ``min_held_out_per_class``, checked (a whole number >= 0)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"min_held_out_per_class must be a whole number >= 0, got {value!r}")
    return value


SMALL_SPLIT_BATCHES = 2
"""With ``num_workers: auto``, a split of at most this many batches is read in the training
process: a worker's start costs more than decoding a batch or two (a 60-image folder)."""


def machine_workers() -> int:
    """The loader processes ``num_workers: auto`` asks for on this machine: one per usable
    core but one (the training process keeps one), at most 4; 0 on one core."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(0, min(4, cores - 1))


def resolve_workers(num_workers: int | str) -> tuple[int, bool]:
    """``(processes, auto)`` for a data module's ``num_workers``: an int as given, ``"auto"``
    :func:`machine_workers`; anything else a ValueError."""
    if num_workers == "auto":
        return machine_workers(), True
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"num_workers must be an int >= 0 or 'auto', got {num_workers!r}")
    return num_workers, False


class SplitDataModule(L.LightningDataModule):
    """A LightningDataModule whose loaders differ only in the split.

    Subclasses set ``batch_size``, ``seed`` and ``num_workers``, and implement
    :meth:`split_dataset` (and :meth:`collate_fn` when items need batching help).

    Training: the split is shuffled by :class:`EpochShuffleSampler` (the order depends only
    on ``(seed, epoch)``) and read by a :class:`ResumableDataLoader`, whose position in the
    epoch and the random state are saved in every checkpoint (by Lightning with the loops,
    and in this module's ``state_dict``). A run resumed from a checkpoint taken at any step
    trains on the rest of the interrupted epoch, each example once, in the uninterrupted
    order; on one process and one CPU thread it ends with the weights of an uninterrupted
    run, bit for bit, also with ``num_workers > 0``: worker processes read each item with
    their random generators seeded from ``(seed, epoch, index)`` (see
    :mod:`multimodal.data.sampling`).

    Evaluation: validation and test splits are read in order; on several processes each
    takes its own share without padding (:class:`EvalShardSampler`), so every example is
    scored exactly once. Every loader has its own seeded ``generator`` for worker seeds:
    making an iterator never draws from the global random state.

    The data-module contract (:mod:`multimodal.data.contract`): each module declares its
    ``modality``, and where it has them its ``class_names`` and ``model_sizes``; ``follow``
    fills in the settings a pretrained model implies.
    """

    modality: ClassVar[str] = ""
    """What an item is: ``image``, ``audio``, ``text``, ``text-text``, ``image+text``,
    ``text-audio`` (:mod:`multimodal.data.contract`)."""
    class_names: list[str] | None = None
    """The classes in label order (None: items have no class)."""
    batch_size: int
    seed: int = 0
    num_workers: int = 0
    auto_workers: bool = False
    """``num_workers: auto`` was given: :func:`machine_workers` processes, none for a split
    of at most :data:`SMALL_SPLIT_BATCHES` batches."""
    predict: str | None = None  # what ``predict`` reads (the same key in every data module)

    @property
    def predict_dir(self) -> str | None:
        """The old name of ``predict`` (deprecated, removed in 0.2)."""
        warnings.warn("predict_dir is deprecated and will be removed in 0.2: use predict",
                      DeprecationWarning, stacklevel=2)
        return self.predict

    @predict_dir.setter
    def predict_dir(self, value: str | None) -> None:
        warnings.warn("predict_dir is deprecated and will be removed in 0.2: use predict",
                      DeprecationWarning, stacklevel=2)
        self.predict = value

    @property
    def model_sizes(self) -> dict[str, int]:
        """The sizes a model of these data must have, by config field name (none here)."""
        return {}

    @classmethod
    def follow(cls, settings: Mapping[str, Any], given: Mapping[str, Any],
               source: str = "the pretrained model") -> tuple[dict[str, Any], list[str]]:
        """The arguments ``given`` with the pretrained model's ``settings`` filled in
        (:func:`multimodal.data.contract.follow_settings`); ``(arguments, warnings)``."""
        return follow_settings(cls, settings, given, source)

    def record_sizes(self, val_size: float, test_size: float) -> None:
        """Keep ``val_size`` / ``test_size`` (read through :func:`held_out_sizes`) as
        attributes and, after ``save_hyperparameters``, in the hyper-parameters by today's
        names, so that a checkpoint rebuilds the module without the old ones."""
        self.val_size, self.test_size = val_size, test_size
        hparams = self.__dict__.get("_hparams")
        if hparams is not None:
            for old in RENAMED_SIZES:
                hparams.pop(old, None)
            hparams.update(val_size=val_size, test_size=test_size)

    def split_dataset(self, split: str) -> Dataset:
        """The dataset of ``split`` ("train", "val" or "test")."""
        raise NotImplementedError(f"{type(self).__name__} must implement split_dataset(split)")

    def collate_fn(self) -> Callable[[list[Any]], Any] | None:
        """How items become a batch; ``None``: torch's default collation."""
        return None

    @property
    def train_position(self) -> LoaderPosition:
        """Where the training loader stands in its epoch (shared with every training loader
        this module makes, so a loader rebuilt by Lightning keeps it)."""
        position = self.__dict__.get("_train_position")
        if position is None:
            position = self.__dict__["_train_position"] = LoaderPosition()
        return position

    def loader(self, dataset: Dataset, shuffle: bool) -> DataLoader:
        """``shuffle``: the training recipe (:class:`ResumableDataLoader` over an
        :class:`EpochShuffleSampler`); else in order, unpadded across processes."""
        n = len(dataset)  # type: ignore[arg-type]
        workers = self.num_workers
        if self.auto_workers and math.ceil(n / max(self.batch_size, 1)) <= SMALL_SPLIT_BATCHES:
            workers = 0  # starting the workers costs more than the few batches they would read
        options: dict[str, Any] = dict(
            batch_size=self.batch_size,
            num_workers=workers,
            persistent_workers=workers > 0,
            collate_fn=self.collate_fn(),
            pin_memory=torch.cuda.is_available(),
            generator=torch.Generator().manual_seed(self.seed),
            worker_init_fn=ignore_job_signals,  # the job's SIGTERM is the main process's
        )
        if shuffle:
            return ResumableDataLoader(dataset, sampler=EpochShuffleSampler(n, self.seed),
                                       position=self.train_position, item_seed=self.seed,
                                       **options)
        return DataLoader(dataset, sampler=EvalShardSampler(n), **options)

    def train_dataloader(self) -> DataLoader:
        resident = self.resident_loader("train")
        if resident is not None:
            return resident  # type: ignore[return-value]
        return self.loader(self.split_dataset("train"), shuffle=True)

    def val_dataloader(self) -> DataLoader:
        resident = self.resident_loader("val")
        if resident is not None:
            return resident  # type: ignore[return-value]
        return self.loader(self.split_dataset("val"), shuffle=False)

    def test_dataloader(self) -> DataLoader:
        resident = self.resident_loader("test")
        if resident is not None:
            return resident  # type: ignore[return-value]
        return self.loader(self.split_dataset("test"), shuffle=False)

    # -- device-resident splits (multimodal.data.device_batches) ----------------------------
    device_resident: str = "false"
    """``auto``: hold the splits on the accelerator when the trainer's device is not the CPU
    and they fit in ``device_resident_max_mb``; ``true``: always where the data allow (also
    on the CPU); ``false``: the DataLoader path. Modules that can hold their data set it from
    their ``device_resident`` argument; the others keep ``false``."""
    device_resident_max_mb: float = 2048.0

    def resident_split(self, split: str) -> ResidentSplit | None:
        """``split`` as host tensors to hold on the device, with its batch transform; None
        where this module cannot hold it (files decoded per item, shards): see
        :meth:`resident_refusal`."""
        return None

    def resident_refusal(self) -> str | None:
        """Why the splits cannot be held on the device (None: they can)."""
        return f"{type(self).__name__} reads its items one by one"

    def resident_bytes(self) -> int:
        """Bytes the train / val / test splits take held as :meth:`resident_split` gives
        them (0 for a split that is empty or absent)."""
        total = 0
        for split in ("train", "val", "test"):
            held = self.resident_split(split)
            if held is not None:
                total += sum(a.numel() * a.element_size() for a in held.arrays)
        return total

    def _trainer_device(self) -> tuple[torch.device, int, int]:
        """The trainer's root device, world size and global rank (without a trainer: the
        CPU, and the initialised process group's world and rank, else 1 and 0)."""
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return torch.device("cpu"), dist.get_world_size(), dist.get_rank()
            return torch.device("cpu"), 1, 0
        device = torch.device(trainer.strategy.root_device)
        connector = getattr(trainer, "_accelerator_connector", None)
        if not getattr(connector, "use_distributed_sampler", True):
            return device, 1, 0  # Trainer(use_distributed_sampler=False): every rank all
        return device, int(trainer.world_size), int(trainer.global_rank)

    def resident_device(self) -> torch.device | None:
        """Where the splits are held (None: not held), decided once per device with
        ``device_resident`` and said in one log line."""
        device, _, _ = self._trainer_device()
        cache = self.__dict__.setdefault("_resident_choice", {})
        if str(device) in cache:
            return cache[str(device)]
        setting = resident_setting(self.device_resident)
        chosen: torch.device | None = None
        if setting != "false":
            refusal = self.resident_refusal()
            if refusal is not None:
                if setting == "true":
                    raise ValueError(f"device_resident=true: {refusal}; use "
                                     f"device_resident=false (or auto)")
            elif setting == "true" or device.type != "cpu":
                mib = self.resident_bytes() / 2**20
                if setting == "true" or mib <= self.device_resident_max_mb:
                    chosen = device
                    rank_zero_info(
                        f"device-resident data: the splits ({mib:.1f} MiB) are held on "
                        f"{device}; batches are indexed and transformed there, no loader "
                        f"workers (device_resident=false: the DataLoader path)")
                else:
                    rank_zero_info(
                        f"device-resident data: not used, the splits take {mib:.1f} MiB, "
                        f"over device_resident_max_mb {self.device_resident_max_mb:g}")
        cache[str(device)] = chosen
        return chosen

    def resident_loader(self, split: str) -> DeviceBatches | None:
        """The :class:`DeviceBatches` of ``split`` where the splits are held on the device
        (:meth:`resident_device`), else None (the DataLoader path)."""
        if resident_setting(self.device_resident) == "false":
            return None
        device = self.resident_device()
        if device is None:
            return None
        held = self.resident_split(split)
        if held is None:
            return None
        _, world, rank = self._trainer_device()
        cache = self.__dict__.setdefault("_resident_arrays", {})
        key = (split, str(device))
        if key not in cache:
            for other in [k for k in cache if k[1] != str(device)]:
                del cache[other]  # one device's copies at a time
            cache[key] = [a.to(device) for a in held.arrays]
        transform = held.transform.to(device) if held.transform is not None else None
        train = split == "train"
        return DeviceBatches(cache[key], self.batch_size, shuffle=train, seed=self.seed,
                             transform=transform,
                             position=self.train_position if train else None,
                             world=world, rank=rank, host_items=held.host_items,
                             assemble=held.assemble)

    def state_dict(self) -> dict[str, Any]:
        """The training loader's position (beside what other bases save). Lightning saves
        it with the loops too, but restores it there only into a loader made after the
        checkpoint is read; a learning-rate schedule makes one before (to count steps)."""
        state = dict(super().state_dict())
        if self.train_position.epoch is not None:
            state["train_position"] = self.train_position.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        if state_dict.get("train_position") is not None:
            self.train_position.load_state_dict(state_dict["train_position"])


def split_size(size: float, total: int, name: str) -> int:
    """A fraction in [0, 1) of ``total``, or an absolute count (an integer >= 1)."""
    if size < 0:
        raise ValueError(f"{name} must be >= 0, got {size}")
    if size < 1:
        return round(size * total)
    if float(size) != int(size):
        raise ValueError(f"{name} must be a fraction below 1 or a whole count, got {size}")
    return int(size)


def held_out(
    n: int,
    seed: int,
    val_size: float,
    test_size: float,
    has_test: bool,
    has_val: bool = False,
    limit_train: int | None = None,
    labels: Sequence[Hashable] | torch.Tensor | None = None,
    min_held_out_per_class: int = 0,
) -> dict[str, torch.Tensor | None]:
    """Seeded, sorted row indices of train / val / test within ``n`` training rows.

    One permutation drawn from ``seed``: its first :func:`split_size` ``(test_size, n)`` rows
    are the test split (unless ``has_test``: a test split is given separately, ``"test"`` is
    None), the next ``split_size(val_size, rest)`` the validation split (unless ``has_val``),
    the rest training, cut to ``limit_train``.

    ``labels`` (one per row): the held-out splits are stratified by class instead, with the
    same sizes. Each split of ``k`` rows takes from class ``c`` (``n_c`` rows) its share
    ``k * n_c / n`` rounded by largest remainder (:func:`stratified_counts`: the counts sum to
    ``k``, each within one of its exact share, and a class keeps at least one row for training
    where the sizes allow), the rows of each class taken in the order of the seeded permutation.

    ``min_held_out_per_class`` (with ``labels``): a split of a fractional size (``test_size``
    or ``val_size`` below 1) that would hold out fewer rows than that many per class is not
    held out: those rows train, the split is empty, and one line says so. A few labelled
    examples a class are worth more as training data than as a score that moves in steps of
    ``1/k`` (at 8 texts a class, 10 % held out is 3 texts; holding them out for validation
    cost up to 7 points of test accuracy: BENCHMARKS.md, "Learning curves on real weights").
    """
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    if labels is not None and len(labels) != n:
        raise ValueError(f"held_out: {len(labels)} labels for {n} rows")
    codes = None if labels is None else _label_codes(labels)

    def take(order: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        if codes is None or k == 0:
            return order[:k], order[k:]
        return _take_stratified(order, codes, k)

    classes = 0 if codes is None else int(codes.unique().numel())

    def spared(size: float, k: int, rows: int, split: str) -> int:
        """``k``, or 0 where ``k`` rows are too few a class to hold out (docstring)."""
        if not k or not classes or size >= 1 or k >= min_held_out_per_class * classes:
            return k
        rank_zero_info(f"{split}_size {size} of {rows} labelled rows is {k} "
                       f"({k / classes:.1f} a class over {classes} classes, below "
                       f"min_held_out_per_class {min_held_out_per_class}): no "
                       f"{'validation' if split == 'val' else split} split, every row trains")
        return 0

    test_idx: torch.Tensor | None = None
    if not has_test:
        n_test = spared(test_size, split_size(test_size, n, "test_size"), n, "test")
        test_idx, order = take(order, n_test)
        test_idx = test_idx.sort().values
    n_val = 0 if has_val else spared(val_size, split_size(val_size, len(order), "val_size"),
                                     len(order), "val")
    if n_val >= len(order):
        raise ValueError(
            f"val_size={val_size} leaves no training images (of {len(order)})"
        )
    val_idx, train_idx = take(order, n_val)
    if limit_train is not None:
        train_idx = train_idx[:limit_train]
    return {"train": train_idx.sort().values,
            "val": None if has_val else val_idx.sort().values, "test": test_idx}


def _label_codes(labels: Sequence[Hashable] | torch.Tensor) -> torch.Tensor:
    """Each row's class as an index into the sorted distinct labels (int64)."""
    values = labels.tolist() if isinstance(labels, torch.Tensor) else list(labels)
    keys = {v: i for i, v in enumerate(sorted(set(values), key=lambda v: (str(type(v)), v)))}
    return torch.tensor([keys[v] for v in values], dtype=torch.long)


def stratified_counts(class_sizes: Sequence[int], k: int) -> list[int]:
    """How many of ``k`` held-out rows each class gives: largest-remainder rounding of
    ``k * n_c / N`` (``N = sum n_c``), ties to the larger class, then the lower index; a class
    gives at most ``n_c - 1`` rows (one stays for training) unless ``k`` needs more."""
    total = sum(class_sizes)
    if not 0 <= k <= total:
        raise ValueError(f"cannot hold out {k} of {total} rows")
    if total == 0:
        return []
    exact = [k * size / total for size in class_sizes]
    counts = [int(e) for e in exact]
    rank = sorted(range(len(class_sizes)),
                  key=lambda c: (-(exact[c] - counts[c]), -class_sizes[c], c))
    for c in rank[:k - sum(counts)]:
        counts[c] += 1
    # keep one row of each class for training: move the excess to classes with room
    cap = [max(size - 1, 0) for size in class_sizes]
    spare = sum(max(n - m, 0) for n, m in zip(counts, cap, strict=True))
    counts = [min(n, m) for n, m in zip(counts, cap, strict=True)]
    if sum(cap) < k:  # too few rows to keep one of each class
        cap = list(class_sizes)
    while spare > 0:
        for c in rank:
            if spare > 0 and counts[c] < cap[c]:
                counts[c] += 1
                spare -= 1
    return counts


def _take_stratified(order: torch.Tensor, codes: torch.Tensor, k: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Split the row indices ``order`` into ``k`` stratified rows and the rest (both in
    ``order``'s order)."""
    classes = codes[order]
    n_classes = int(codes.max()) + 1 if len(codes) else 0
    sizes = torch.bincount(classes, minlength=n_classes).tolist()
    want = stratified_counts(sizes, k)
    taken = torch.zeros(len(order), dtype=torch.bool)
    seen = [0] * n_classes
    for i, c in enumerate(classes.tolist()):
        if seen[c] < want[c]:
            taken[i] = True
            seen[c] += 1
    return order[taken], order[~taken]


def group_count(size: float, n: int, name: str) -> int:
    """How many of a group of ``n`` (a source's documents, an engine's voices, a class's
    files) a held-out ``size`` takes: a fraction ``f`` in (0, 1) takes
    ``max(1, round(f * n))``, a whole count ``k >= 1`` takes ``k``, 0 none."""
    if 0 < size < 1:
        return max(1, round(size * n))
    return split_size(size, n, name)


def check_sizes(val_size: float, test_size: float) -> None:
    """Both sizes >= 0 (a fraction below 1 or a whole count); two fractions sum below 1."""
    split_size(val_size, 0, "val_size")
    split_size(test_size, 0, "test_size")
    if val_size < 1 and test_size < 1 and val_size + test_size >= 1:
        raise ValueError(f"val_size + test_size must be < 1 as fractions, got {val_size} + "
                         f"{test_size}")


def split_counts(n: int, val_size: float, test_size: float) -> tuple[int, int]:
    """``(n_val, n_test)`` of a group of ``n`` (voices, files of a class), each by
    :func:`group_count` (at least one when its size is > 0), at least one left for
    training; none held out below 3."""
    if n < 3:
        return 0, (1 if n == 2 else 0)
    n_test = group_count(test_size, n, "test_size")
    n_val = group_count(val_size, n, "val_size")
    while n_test + n_val >= n:  # keep at least one for training
        if n_val > 0:
            n_val -= 1
        else:
            n_test -= 1
    return n_val, n_test


__all__ = ["RENAMED_SIZES", "SplitDataModule", "check_sizes", "group_count", "held_out",
           "held_out_sizes", "predict_source", "split_counts", "split_size",
           "stratified_counts"]
