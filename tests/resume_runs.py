"""Helpers of the resume tests (not a test module): run a small fit uninterrupted, or
killed after a given step and resumed from the checkpoint of that step, recording the
examples of every training batch; compare the two."""

from __future__ import annotations

import contextlib
import hashlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint


class Killed(Exception):
    """Stands for a job killed (kill -9) between two training steps."""


def example_ids(batch: Any) -> list[str]:
    """One id per example of a collated batch: a digest of its rows in every tensor."""
    tensors: list[torch.Tensor] = []

    def collect(value: Any) -> None:
        if isinstance(value, torch.Tensor) and value.ndim >= 1:
            tensors.append(value)
        elif isinstance(value, dict):
            for key in sorted(value):
                collect(value[key])
        elif isinstance(value, (list, tuple)):
            for item in value:
                collect(item)

    collect(batch)
    n = tensors[0].shape[0]
    ids = []
    for i in range(n):
        digest = hashlib.sha1()
        for t in tensors:
            if t.shape[0] == n:
                digest.update(t[i].detach().cpu().contiguous().numpy().tobytes())
        ids.append(digest.hexdigest()[:16])
    return ids


class Record(L.Callback):
    """Records the example ids of every training batch as ``(epoch, step, ids)``; with
    ``kill_at`` raises :class:`Killed` before the batch after step ``kill_at`` runs (the
    checkpoint of step ``kill_at`` is on disk then)."""

    def __init__(self, kill_at: int | None = None) -> None:
        self.kill_at, self.seen = kill_at, []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.kill_at is not None and trainer.global_step == self.kill_at:
            raise Killed
        self.seen.append((trainer.current_epoch, trainer.global_step, example_ids(batch)))


def fit(make: Callable[[], tuple[L.LightningModule, L.LightningDataModule]], folder: Path,
        epochs: int, kill_at: int | None = None, ckpt_path: str | None = None,
        every: int = 1, **trainer_args: Any) -> tuple[L.LightningModule, Record]:
    """One CPU fit of ``make()``'s (task, data) for ``epochs``, checkpointing every
    ``every`` steps to ``folder`` (``step=N.ckpt``)."""
    L.seed_everything(0, verbose=False)
    task, data = make()
    record = Record(kill_at)
    checkpoints = ModelCheckpoint(dirpath=folder, filename="{step}", every_n_train_steps=every,
                                  save_top_k=-1, save_last=True)
    args = dict(accelerator="cpu", devices=1, max_epochs=epochs, logger=False,
                enable_progress_bar=False, enable_model_summary=False, default_root_dir=folder,
                callbacks=[record, checkpoints], num_sanity_val_steps=0, limit_val_batches=2)
    trainer = L.Trainer(**{**args, **trainer_args})
    with contextlib.suppress(Killed):
        trainer.fit(task, data, ckpt_path=ckpt_path)
    return task, record


def interrupted(make: Callable[[], tuple[L.LightningModule, L.LightningDataModule]],
                folder: Path, epochs: int, kills: list[int], **trainer_args: Any
                ) -> tuple[L.LightningModule, list[tuple[int, int, list[str]]]]:
    """The run killed after each step of ``kills`` (increasing) and resumed from that
    step's checkpoint; returns the final task and the batches trained on, in order."""
    seen: list[tuple[int, int, list[str]]] = []
    ckpt = None
    for kill in [*kills, None]:
        task, record = fit(make, folder, epochs, kill_at=kill, ckpt_path=ckpt, **trainer_args)
        seen += record.seen
        ckpt = str(folder / f"step={kill}.ckpt") if kill is not None else None
    return task, seen


def assert_same_run(a: L.LightningModule, b: L.LightningModule) -> None:
    """Bit-identical parameters and buffers."""
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), \
            f"{key} differs by {(sa[key].float() - sb[key].float()).abs().max():.3g}"


def assert_each_once_per_epoch(seen: list[tuple[int, int, list[str]]],
                               expected: int | Counter[str]) -> None:
    """Every epoch trains on each example once: ``expected`` distinct ids, or exactly the
    ids (with their multiplicity) of the training split (data with repeated examples)."""
    by_epoch: dict[int, list[str]] = {}
    for epoch, _, ids in seen:
        by_epoch.setdefault(epoch, []).extend(ids)
    for epoch, ids in by_epoch.items():
        if isinstance(expected, Counter):
            assert Counter(ids) == expected, f"epoch {epoch}: not each example once"
            continue
        assert len(ids) == expected, f"epoch {epoch}: {len(ids)} examples, not {expected}"
        assert len(set(ids)) == expected, f"epoch {epoch}: {expected - len(set(ids))} twice"


class Slow(L.Callback):
    """Sleeps ``seconds`` after every training step (gives a kill from outside time to
    land anywhere in a run); changes nothing else."""

    def __init__(self, seconds: float = 0.05) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        import time

        time.sleep(self.seconds)

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx,
                             dataloader_idx=0) -> None:
        import time

        time.sleep(self.seconds)


class Mark(L.Callback):
    """Writes the number of finished training steps to ``path`` after every step (a test
    outside the process knows when training runs)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        Path(self.path).write_text(str(trainer.global_step))

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx,
                             dataloader_idx=0) -> None:
        Path(self.path).write_text(str(batch_idx + 1))
