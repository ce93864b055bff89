"""Lightning callbacks that the ``multimodal`` command adds to every run."""

from __future__ import annotations

import sys
import time
from typing import IO

import lightning as L
from lightning.pytorch.utilities import rank_zero_only

from multimodal.progress import is_terminal


class EpochSummary(L.Callback):
    """One plain line per validation pass, for logs that are not a terminal.

    A progress bar redraws one line in place; written to a file (``nohup``, a SLURM
    job's output) it leaves nothing readable until the run ends. When ``stream`` is not a
    terminal (or ``always``), this prints after every validation::

        epoch 7/45  step 3440  12m31s  train/loss 0.731  val/acc 0.8612  val/loss 0.802
    """

    def __init__(self, stream: IO[str] | None = None, always: bool = False) -> None:
        self._stream = stream  # None: whatever sys.stdout is when a line is printed
        self.always = always
        self._start = time.monotonic()

    @property
    def stream(self) -> IO[str]:
        return self._stream if self._stream is not None else sys.stdout

    @property
    def active(self) -> bool:
        return self.always or not is_terminal(self.stream)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = time.monotonic()

    @rank_zero_only
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or not self.active:
            return
        minutes, seconds = divmod(int(time.monotonic() - self._start), 60)
        epochs = "" if trainer.max_epochs in (None, -1) else f"/{trainer.max_epochs}"
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()
                   if k.startswith(("train/", "val/")) and v.numel() == 1}
        values = "  ".join(f"{k} {v:.4g}" for k, v in sorted(metrics.items()))
        print(f"epoch {trainer.current_epoch + 1}{epochs}  step {trainer.global_step}  "
              f"{minutes}m{seconds:02d}s  {values}", file=self.stream, flush=True)


__all__ = ["EpochSummary"]
