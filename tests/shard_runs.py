"""Helpers of the shard tests (not a test module): a callback that records which items each
training batch held and can stop a run mid-epoch, and a small CPU trainer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch


class Killed(Exception):
    """Stands for a job killed mid-epoch."""


class Record(L.Callback):
    """Appends ``ids(batch)`` (the item ids of each training batch) to ``seen``, and saves them
    to ``folder/seen<rank>.pt`` at the end; with ``stop_after`` saves ``folder/mid.ckpt``
    after that many batches and raises :class:`Killed`. ``ids`` must be a module-level
    function (ddp_spawn pickles the callback)."""

    def __init__(self, ids: Callable[[Any], list[int]], folder: Path | None = None,
                 stop_after: int | None = None) -> None:
        self.ids, self.folder, self.stop_after, self.seen = ids, folder, stop_after, []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.seen.append(self.ids(batch))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.stop_after is not None and batch_idx + 1 == self.stop_after:
            trainer.save_checkpoint(Path(self.folder) / "mid.ckpt")
            raise Killed

    def on_train_end(self, trainer, pl_module) -> None:
        if self.folder is not None:
            torch.save(self.seen, Path(self.folder) / f"seen{trainer.global_rank}.pt")


def trainer(tmp_path: Path, callback: L.Callback, **kwargs) -> L.Trainer:
    """One CPU epoch, no validation, logging or checkpoints of its own."""
    args = dict(accelerator="cpu", devices=1, max_epochs=1, limit_val_batches=0,
                logger=False, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, default_root_dir=tmp_path, callbacks=[callback])
    return L.Trainer(**{**args, **kwargs})
