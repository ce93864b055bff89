"""Lightning callbacks that the ``multimodal`` command adds to every run, and the checks
that pick a checkpoint to resume from."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import FrameType
from typing import IO, Any
from weakref import proxy

import lightning as L
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only, rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from multimodal.cli.saving import write_checkpoint
from multimodal.files import ZIP_MAGIC, sniff_torch_file, starts_with
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


MIN_VAL_EXAMPLES = 50
"""Below this many validation examples a metric such as accuracy moves in steps of ``1/n``
and ties between epochs are the rule: the run warns that the split is too small to rank
checkpoints."""


class RunCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` with a ``last.ckpt`` that is the latest state, always,
    and a best checkpoint that is the best, ties included. The ``multimodal`` CLI's default.

    * ``last.ckpt`` (``save_last``, on by default) is written at the end of every validation
      and every training epoch, whatever the monitored metric does. (Lightning 2.6 writes
      it only at a step where a top-k checkpoint is saved too, i.e. when the metric
      improves, so a metric that stops improving left ``last.ckpt`` at that epoch.) It is
      written to a temporary file and renamed, so a kill while writing leaves the previous
      one whole: a run killed with no signal (SIGKILL, a dead node) loses at most the epoch in
      progress (or the minutes, with :class:`Preemption`'s ``every_minutes``).
    * Ranking: a checkpoint's key is ``(metric, -tie_break, step)`` (``metric`` negated for
      ``mode="min"``; ``tie_break``, default ``val/loss``, only when it is logged and is not
      the monitored metric itself): an equal metric goes to the lower validation loss and
      then to the later step, where Lightning kept the first. So a validation accuracy of
      1.0 from the first epoch on keeps the epoch with the lowest validation loss, not the
      first one.
    * ``last_every_seconds`` (default 0: every epoch end): an epoch end less than that many
      seconds after the previous ``last.ckpt`` is skipped, so that 200 one-step epochs of a
      small data set do not write 200 whole checkpoints (a fine-tuned MiniLM with its AdamW
      state is 270 MB); the end of training is always written. A kill then loses at most the
      epoch in progress or that many seconds, whichever is longer. The CLI sets 60.
    * The first validation counts its examples (:attr:`val_examples`); below
      ``min_val_examples`` it warns once that the split is too small to rank checkpoints.
    """

    def __init__(self, *args: Any, tie_break: str | None = "val/loss",
                 min_val_examples: int = MIN_VAL_EXAMPLES, last_every_seconds: float = 0.0,
                 **kwargs: Any) -> None:
        kwargs.setdefault("save_last", True)
        super().__init__(*args, **kwargs)
        if last_every_seconds < 0:
            raise ValueError(f"last_every_seconds must be >= 0, got {last_every_seconds}")
        self.tie_break = tie_break
        self.last_every_seconds = last_every_seconds
        self._last_written_at = -float("inf")
        self.min_val_examples = min_val_examples
        self.val_examples: int | None = None
        self.rank_keys: dict[str, tuple[float, float, int]] = {}
        self._candidates: dict[str, torch.Tensor] = {}
        self._last_written_step = -1

    # -- ranking ------------------------------------------------------------------------
    def rank_key(self, current: torch.Tensor | float, candidates: dict[str, Any],
                 step: int) -> tuple[float, float, int]:
        """``(metric, -tie_break, step)``, larger is better (see the class docstring)."""
        value = float(current)
        if value != value:  # nan: the worst
            value = float("-inf") if self.mode == "max" else float("inf")
        score = value if self.mode == "max" else -value
        second = 0.0
        if self.tie_break and self.tie_break != self.monitor and self.tie_break in candidates:
            tie = float(candidates[self.tie_break])
            second = -tie if tie == tie else float("-inf")
        return score, second, int(step)

    def _save_monitor_checkpoint(self, trainer: L.Trainer,
                                 monitor_candidates: dict[str, torch.Tensor]) -> None:
        self._candidates = monitor_candidates
        super()._save_monitor_checkpoint(trainer, monitor_candidates)

    def check_monitor_top_k(self, trainer: L.Trainer,
                            current: torch.Tensor | None = None) -> bool:
        if current is None:
            return False
        if self.save_top_k == -1 or len(self.best_k_models) < self.save_top_k:
            return True
        worst = self.rank_keys.get(self.kth_best_model_path)
        new = self.rank_key(current, self._candidates, trainer.global_step)
        if worst is None:  # ranked before these keys existed: Lightning's rule
            better = bool(super().check_monitor_top_k(trainer, current))
        else:
            better = new > worst
        return trainer.strategy.reduce_boolean_decision(bool(better))

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        """Lightning's, through :func:`~multimodal.cli.saving.write_checkpoint`: never
        non-finite weights, a temporary file and a rename, a failed write named (or, with
        ``--on_save_error continue``, skipped: the file being replaced is then kept)."""
        if write_checkpoint(trainer, filepath, self.save_weights_only) is None:
            self._failed_save = filepath
            return
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))

    def _remove_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        if getattr(self, "_failed_save", None) is None:  # never delete for a failed save
            super()._remove_checkpoint(trainer, filepath)

    def _update_best_and_save(self, current: torch.Tensor, trainer: L.Trainer,
                              monitor_candidates: dict[str, torch.Tensor]) -> None:
        self._failed_save: str | None = None
        super()._update_best_and_save(current, trainer, monitor_candidates)
        failed, self._failed_save = self._failed_save, None
        if failed is not None:  # not on disk: not ranked
            self.best_k_models.pop(failed, None)
            if not self.best_k_models:
                self.best_model_path, self.best_model_score = "", None
                self.kth_best_model_path = ""
                return
        path = self._last_checkpoint_saved
        if path in self.best_k_models:
            self.rank_keys[path] = self.rank_key(current, monitor_candidates,
                                                 trainer.global_step)
        self.rank_keys = {p: k for p, k in self.rank_keys.items() if p in self.best_k_models}
        ranked = sorted(self.best_k_models, key=lambda p: self.rank_keys.get(
            p, self.rank_key(self.best_k_models[p], {}, -1)))
        self.best_model_path = ranked[-1]
        self.best_model_score = self.best_k_models[self.best_model_path]
        k = len(self.best_k_models) + 1 if self.save_top_k == -1 else self.save_top_k
        if len(self.best_k_models) == k:
            self.kth_best_model_path = ranked[0]
            self.kth_value = self.best_k_models[self.kth_best_model_path]

    def best_reason(self) -> str:
        """Why :attr:`best_model_path` is the best, in words (for the test after fit)."""
        if not self.best_model_path:
            return "no checkpoint was ranked (no validation metric)"
        key = self.rank_keys.get(self.best_model_path)
        word = "highest" if self.mode == "max" else "lowest"
        value = "" if self.best_model_score is None else f" {float(self.best_model_score):.4f}"
        at = "" if key is None else f" at step {key[2]}"
        tie = f"the lower {self.tie_break}, then " if self.tie_break and \
            self.tie_break != self.monitor else ""
        return (f"the {word} {self.monitor}{value}{at}; an equal value goes to {tie}"
                "the later step")

    # -- last.ckpt ----------------------------------------------------------------------
    def _save_last_checkpoint(self, trainer: L.Trainer,
                              monitor_candidates: dict[str, torch.Tensor]) -> None:
        """``<dirpath>/last.ckpt``, through a temporary file and a rename, at every call; a
        hard link to (else a copy of) the top-k checkpoint saved at this very step, if any."""
        if not self.save_last:
            return
        path = Path(self.format_checkpoint_name(monitor_candidates, self.CHECKPOINT_NAME_LAST))
        partial = path.with_name(f".{path.name}.partial")
        self.last_model_path = str(path)  # before saving: it is part of the saved state
        same_step = self._last_global_step_saved == trainer.global_step and \
            bool(self._last_checkpoint_saved) and not self.save_weights_only
        if trainer.is_global_zero:
            path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
        if same_step:  # the same weights and state: no second serialisation
            if trainer.is_global_zero:
                try:
                    os.link(self._last_checkpoint_saved, partial)
                except OSError:
                    shutil.copyfile(self._last_checkpoint_saved, partial)
                os.replace(partial, path)
        else:  # finite weights only, atomic, a failed write named (multimodal.cli.faults)
            write_checkpoint(trainer, path, self.save_weights_only)
        trainer.strategy.barrier("last_checkpoint")
        # (not Lightning's _last_global_step_saved: that one says a top-k checkpoint of this
        # step exists, and would stop the epoch-end hook from ranking this step)
        self._last_written_step = trainer.global_step
        self._last_written_at = time.monotonic()

    def _save_latest(self, trainer: L.Trainer, final: bool = False) -> None:
        from lightning.pytorch.trainer.states import TrainerFn

        if not self.save_last or trainer.fast_dev_run or trainer.sanity_checking \
                or trainer.state.fn != TrainerFn.FITTING \
                or self._last_written_step == trainer.global_step:
            return
        recent = time.monotonic() - self._last_written_at < self.last_every_seconds
        if not final and trainer.strategy.broadcast(recent):  # ranks agree (rank 0's clock)
            return
        self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._save_latest(trainer, final=True)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and self.val_examples is None:
            self._count_val_examples(trainer)
        super().on_validation_end(trainer, pl_module)
        at_epoch_end = trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
        if not (at_epoch_end and self._should_save_on_train_epoch_end(trainer)):
            self._save_latest(trainer)  # else on_train_epoch_end, after ranking, writes it

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        self._save_latest(trainer)

    def _count_val_examples(self, trainer: L.Trainer) -> None:
        loaders = trainer.val_dataloaders
        loaders = loaders if isinstance(loaders, (list, tuple)) else \
            [] if loaders is None else [loaders]
        try:
            self.val_examples = sum(len(loader.dataset) for loader in loaders)
        except (TypeError, AttributeError):  # an iterable dataset: unknown
            self.val_examples = -1
            return
        if 0 < self.val_examples < self.min_val_examples and self.monitor:
            rank_zero_warn(
                f"the validation split has {self.val_examples} examples (< "
                f"{self.min_val_examples}): too few to rank checkpoints by {self.monitor} "
                "(it moves in coarse steps and ties are common): the CLI's test after fit "
                "reads last.ckpt, the latest weights, not the best. More validation data (a "
                "val file, or a larger val fraction) ranks better")

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["rank_keys"] = {p: list(k) for p, k in self.rank_keys.items()}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        keys = state_dict.get("rank_keys") or {}
        self.rank_keys = {p: (float(k[0]), float(k[1]), int(k[2])) for p, k in keys.items()
                          if p in self.best_k_models}


class StepBudget(L.Callback):
    """Make ``trainer.min_steps`` a promise: at least that many optimiser steps, whatever the
    size of the data, within the limits the user set. Lightning's ``min_steps`` only keeps
    early stopping from ending the run sooner; ``max_epochs`` still ends it. Once the
    training loader's length is known (in ``setup``, before the optimiser and its schedule
    are made, so a warm-up + cosine schedule spans the whole run), ``max_epochs`` is raised
    to::

        ceil(budget / steps_per_epoch),  steps_per_epoch = ceil(batches / accumulate)

    when it is below that. A run of 36 labelled texts (2 steps an epoch) with
    ``min_steps: 300`` trains 150 epochs; one of 10 000 keeps its ``max_epochs``.

    The budget actually applied is ``min_steps`` capped by ``trainer.max_steps``, and, when
    ``given`` (the limits typed on the command line, ``{"max_epochs": 1}``) names
    ``max_epochs``, by that many epochs, which are not raised: a limit on the command line
    is the user's, and wins over a config's budget. Logs one line saying what it chose and
    which limit ends the run, with the early stopping that may end it after the budget (an
    ``EarlyStopping`` callback's metric and patience).

    ``minutes`` (``--budget_minutes``; the own-data configs set it): the budget is sized by
    time as well. Once the first steps are timed (:attr:`TIME_AFTER_STEPS` steps and
    :attr:`TIME_AFTER_SECONDS` s of training, validation included), a run whose epochs were
    raised for the budget and would outlast ``minutes`` is cut to the steps that fit (never
    below the config's own ``max_epochs``), and every per-step ``LambdaLR`` schedule is
    rescaled so that what was left of it spans what is left of the run (the cosine still
    ends at its floor); a run that kept its ``max_epochs`` keeps them, and early stopping
    may end it once the steps that fit in ``minutes`` are done. Not applied when a limit was
    given on the command line. One line says what it did.
    """

    TIME_AFTER_STEPS = 10
    TIME_AFTER_SECONDS = 5.0

    def __init__(self, minutes: float | None = None,
                 given: dict[str, int] | None = None) -> None:
        if minutes is not None and minutes <= 0:
            raise ValueError(f"budget minutes must be > 0 or None, got {minutes}")
        self.minutes, self.given = minutes, dict(given or {})
        self.message: str | None = None
        self.time_message: str | None = None
        self._chosen: tuple[int, str] | None = None  # (min_steps, what setup chose)
        self._raised: tuple[int, int] | None = None  # (config's max_epochs, steps an epoch)
        self._cut: list[float] | None = None  # [at step, old total, new total]: the schedule
        self._timer: tuple[float, int] | None = None

    def _given(self, trainer: L.Trainer) -> dict[str, int]:
        return self.given or dict(getattr(trainer, "command_line_limits", None) or {})

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.message = self._chosen = self._raised = self.time_message = None
        if stage != "fit":
            return
        loop = trainer.fit_loop
        min_steps = loop.min_steps
        if not min_steps or min_steps <= 0 or trainer.fast_dev_run:
            return
        given = self._given(trainer)
        max_steps = loop.max_steps if loop.max_steps is not None and loop.max_steps >= 0 \
            else None
        budget, head = min_steps, f"at least {min_steps} optimiser steps (trainer.min_steps)"
        if max_steps is not None and max_steps < min_steps:
            who = f"--trainer.max_steps {max_steps} on the command line" \
                if "max_steps" in given else f"trainer.max_steps {max_steps}"
            budget = max_steps
            head = f"{max_steps} optimiser steps ({who} caps trainer.min_steps {min_steps})"
        if loop.max_epochs in (None, -1):
            loop.epoch_loop.min_steps = budget
            self._chosen = (budget, f"step budget: {head}, no epoch limit "
                                    f"(max_steps {loop.max_steps})")
            return
        loop.setup_data()  # what estimated_stepping_batches does: the loader is reused
        batches = trainer.num_training_batches
        if not batches or batches == float("inf"):
            return
        per_epoch = math.ceil(batches / trainer.accumulate_grad_batches)
        old = loop.max_epochs
        if "max_epochs" in given:
            steps = min(budget, old * per_epoch)
            loop.epoch_loop.min_steps = steps
            self._chosen = (steps, f"step budget: {steps} optimiser steps: --trainer.max_epochs "
                                   f"{old} on the command line limits the run ({per_epoch} an "
                                   f"epoch), not trainer.min_steps {min_steps}")
            return
        needed = math.ceil(budget / per_epoch)
        if needed > old:
            loop.max_epochs = needed
            self._raised = (old, per_epoch)
        loop.epoch_loop.min_steps = budget
        chosen = f"max_epochs {old} raised to {needed}" if needed > old else \
            f"max_epochs {old} already gives {old * per_epoch}"
        self._chosen = (budget, f"step budget: {head}, {per_epoch} an epoch: {chosen}")

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The line, once the task's own ``setup`` has run: a task that sets its own length
        (a solved or fixed-length regime clears ``min_steps``, and says so) gets none, and
        the early stopping named is the one the run keeps."""
        if self._chosen is None or trainer.fit_loop.min_steps != self._chosen[0]:
            self._raised = None
            return
        stops = [c for c in trainer.callbacks if isinstance(c, EarlyStopping)]
        loop = trainer.fit_loop
        ends = loop.max_steps is not None and 0 <= loop.max_steps <= self._chosen[0]
        after = "; then early stopping on " + ", ".join(
            f"{c.monitor} (patience {c.patience} validations)" for c in stops) \
            if stops and not ends else ""
        self.message = self._chosen[1] + after
        rank_zero_info(self.message)

    # -- the time budget -------------------------------------------------------------------
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._timer = None
        if self._cut is not None and self._raised is not None:  # resumed after a cut
            at, old_total, new_total = self._cut
            self._apply_cut(trainer, int(at), int(old_total), int(new_total))
            return
        if self.minutes is None or self._chosen is None or self._given(trainer) \
                or self.message is None:
            return
        self._timer = (time.monotonic(), trainer.global_step)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._timer is None or self.minutes is None:
            return
        start, first = self._timer
        elapsed, done = time.monotonic() - start, trainer.global_step - first
        if done < self.TIME_AFTER_STEPS or elapsed < self.TIME_AFTER_SECONDS:
            return
        self._timer = None
        per_step = elapsed / done
        fit = trainer.global_step + int(max(self.minutes * 60 - elapsed, 0) / per_step)
        loop = trainer.fit_loop
        if fit >= loop.min_steps:
            return
        wanted = loop.min_steps
        if self._raised is None:  # the config's own epochs: early stopping may come sooner
            loop.epoch_loop.min_steps = max(fit, trainer.global_step)
            self.time_message = (
                f"time budget: {wanted} steps would take ~{wanted * per_step / 60:.1f} min at "
                f"{per_step:.2f} s a step; early stopping may end the run after "
                f"{loop.min_steps} steps ({self.minutes:g} min, --budget_minutes)")
            rank_zero_info(self.time_message)
            return
        config_epochs, per_epoch = self._raised
        old_total = loop.max_epochs * per_epoch
        if loop.max_steps is not None and loop.max_steps >= 0:
            old_total = min(old_total, loop.max_steps)
        epochs = max(math.ceil(fit / per_epoch), config_epochs,
                     trainer.current_epoch + 1)
        new_total = epochs * per_epoch
        if new_total >= old_total:
            return
        self._cut = [trainer.global_step, old_total, new_total]
        rescaled = self._apply_cut(trainer, trainer.global_step, old_total, new_total)
        self.time_message = (
            f"time budget: {wanted} steps would take ~{wanted * per_step / 60:.1f} min at "
            f"{per_step:.2f} s a step; the run is cut to {new_total} steps ({epochs} epochs) "
            f"to fit {self.minutes:g} min (--budget_minutes)"
            + ("; the learning-rate schedule is rescaled to end with it" if rescaled else
               "; the learning-rate schedule is not a per-step LambdaLR and is kept"))
        rank_zero_info(self.time_message)

    def _apply_cut(self, trainer: L.Trainer, at: int, old_total: int, new_total: int
                   ) -> bool:
        """Run ``new_total`` steps instead of ``old_total`` from step ``at`` on; ``True``
        when every scheduler could be rescaled."""
        loop = trainer.fit_loop
        per_epoch = self._raised[1] if self._raised else 1
        loop.max_epochs = math.ceil(new_total / per_epoch)
        loop.epoch_loop.min_steps = min(loop.min_steps or 0, new_total)
        rescaled = True
        for config in trainer.lr_scheduler_configs:
            scheduler = config.scheduler
            if config.interval != "step" or not isinstance(
                    scheduler, torch.optim.lr_scheduler.LambdaLR):
                rescaled = False
                continue
            scheduler.lr_lambdas = [_warp(f, at, old_total, new_total)
                                    for f in scheduler.lr_lambdas]
        return rescaled

    def state_dict(self) -> dict[str, Any]:
        return {"cut": self._cut} if self._cut is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        cut = state_dict.get("cut")
        self._cut = [float(x) for x in cut] if cut else None


def _warp(factor: Any, at: int, old_total: int, new_total: int) -> Any:
    """A schedule over ``old_total`` steps made to span ``new_total``: unchanged before step
    ``at``; after it, step ``s`` reads the old schedule at
    ``at + (s - at) (old_total - at) / (new_total - at)``, so the rest of the old schedule
    (the cosine's decay to its floor) fits in the steps that are left."""
    scale = (old_total - at) / max(new_total - at, 1)

    def warped(step: int) -> float:
        return factor(step if step <= at else at + (step - at) * scale)

    return warped


class Preemption(L.Callback):
    """Save a resumable checkpoint and stop when the scheduler says the job must end; and,
    with ``every_minutes``, save one every N minutes of training.

    ``signals`` (default SIGTERM and SIGUSR1, SLURM's ``--signal=USR1@90`` warning): the
    handler only notes the signal; at the end of the training step in progress (or, if the
    signal came during validation, when Lightning stops there) the callback writes
    ``<dir>/last.ckpt`` (``dir``: the first ``ModelCheckpoint``'s folder, else
    ``<default_root_dir>/checkpoints``), the name ``--ckpt_path last`` resumes from, and the
    process exits with status 128 + the signal (143 for SIGTERM, 138 for SIGUSR1), so a
    scheduler or wrapper sees that the run did not finish. After SIGUSR1 inside a SLURM job
    (``SLURM_JOB_ID`` set) with ``requeue``, rank 0 runs ``scontrol requeue <job>`` and the
    process exits with 0 once the job is requeued (the requeued job resumes with
    ``--ckpt_path last``); if requeueing fails the exit status is 138.

    Every checkpoint it writes is written to a temporary file first and renamed, so a kill
    while writing leaves the previous ``last.ckpt`` whole. On several processes the ranks
    agree (a logical OR of their flags, one all-reduce, a host sync) every
    ``sync_every_n_steps`` training batches (default 10: a signal is acted on within 10
    steps, while the steps in between run without that sync), at the end of every epoch and
    of every validation, so all save and stop together, also when only one rank got the
    signal. One process checks its own flag every step (no collective, no sync).

    The handlers replace Lightning's own for these signals once training starts: Lightning's
    SIGTERM handler broadcasts from inside the handler, a collective call that the other
    ranks are not making then (gloo aborts), and it stops a single process only at the end
    of the epoch; its SLURM SIGUSR1 handler saves from inside the step in progress. A
    launcher that started worker processes (``strategy: ddp`` on one machine) still passes
    the signal on to them.
    """

    def __init__(self, signals: tuple[str, ...] = ("SIGTERM", "SIGUSR1"),
                 every_minutes: float | None = None, requeue: bool = True,
                 sync_every_n_steps: int = 10) -> None:
        if every_minutes is not None and every_minutes <= 0:
            raise ValueError(f"every_minutes must be > 0 or None, got {every_minutes}")
        if sync_every_n_steps < 1:
            raise ValueError(f"sync_every_n_steps must be >= 1, got {sync_every_n_steps}")
        self.sync_every_n_steps = sync_every_n_steps
        self._batches = 0  # training batches ended (the same count on every rank)
        names = {s.name for s in signal.Signals}
        for name in signals:
            if name not in names:
                raise ValueError(f"unknown signal {name!r} (e.g. SIGTERM, SIGUSR1)")
        self.signals, self.every_minutes, self.requeue = tuple(signals), every_minutes, requeue
        self.received: int | None = None  # the signal number noted by the handler
        self.saved_path: str | None = None
        self._previous: dict[int, Any] = {}
        self._active = False  # between setup("fit") and the end of the fit
        self._launcher: Any = None
        self._last_save = time.monotonic()

    # -- signals -------------------------------------------------------------------------
    def _handle(self, signum: int, frame: FrameType | None) -> None:
        previous = self._previous.get(signum, signal.SIG_DFL)
        if self._active:
            first = self.received is None
            if first:
                self.received = signum
                kill = getattr(self._launcher, "kill", None)  # pass it on to worker processes
                if callable(kill):
                    kill(signum)
            if callable(previous):
                previous(signum, frame)
            return
        # outside a fit (Lightning puts this handler back after an exception): as before
        signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        elif previous in (signal.SIG_DFL, None):
            os.kill(os.getpid(), signum)

    def _stop_now(self, signum: int, frame: FrameType | None) -> None:
        """Outside a fit (predict, test, validate): nothing to save; stop now, through the
        trainer's teardown (loader workers shut down), with 128 + the signal."""
        raise SystemExit(128 + signum)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            if trainer.is_global_zero and trainer.world_size == 1:
                for name in self.signals:
                    signum = int(getattr(signal, name))
                    with contextlib.suppress(ValueError):  # not the main thread
                        previous = signal.signal(signum, self._stop_now)
                        if previous not in (self._stop_now, self._handle):
                            self._previous[signum] = previous
            return
        self.received, self.saved_path, self._active = None, None, True
        self._last_save, self._batches = time.monotonic(), 0
        for name in self.signals:
            signum = int(getattr(signal, name))
            try:
                previous = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread: the launcher's handlers do the job
                continue
            if previous != self._handle:  # (still ours after an interrupted fit)
                self._previous[signum] = previous

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # after Lightning registered its handlers (see the class docstring): ours again
        self._launcher = trainer.strategy.launcher
        for signum in self._previous:
            with contextlib.suppress(ValueError):
                signal.signal(signum, self._handle)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._active = False
        for signum, previous in self._previous.items():
            with contextlib.suppress(ValueError):
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)

    # -- saving --------------------------------------------------------------------------
    @staticmethod
    def folder(trainer: L.Trainer) -> Path:
        """Where the checkpoints of ``trainer`` go: the first ModelCheckpoint's folder,
        else ``<default_root_dir>/checkpoints``."""
        for callback in trainer.checkpoint_callbacks:
            if isinstance(callback, ModelCheckpoint) and callback.dirpath:
                return Path(callback.dirpath)
        return Path(trainer.default_root_dir) / "checkpoints"

    def save(self, trainer: L.Trainer, why: str) -> str:
        """Write ``last.ckpt`` (through a temporary file and a rename); returns its path."""
        path = self.folder(trainer) / "last.ckpt"
        write_checkpoint(trainer, path)  # every rank: a collective call under DDP
        trainer.strategy.barrier("preemption_save")
        self._last_save = time.monotonic()
        rank_zero_info(f"{why}: saved {path} at step {trainer.global_step}")
        return str(path)

    def _agreed(self, trainer: L.Trainer, *flags: bool) -> list[bool]:
        """Each flag OR-ed over the ranks (one all-reduce for all of them)."""
        if trainer.world_size <= 1:
            return list(flags)
        votes = torch.tensor([float(f) for f in flags], device=trainer.strategy.root_device)
        votes = trainer.strategy.reduce(votes, reduce_op="sum")
        return [v > 0 for v in votes.tolist()]

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        self._batches += 1
        if trainer.world_size > 1 and self._batches % self.sync_every_n_steps:
            return  # the ranks agree every sync_every_n_steps batches only
        self._check(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.world_size > 1 and self._batches % self.sync_every_n_steps:
            self._check(trainer)  # (else checked at this epoch's last batch already)

    def _check(self, trainer: L.Trainer) -> None:
        """Stop on a noted signal, save when ``every_minutes`` is due (agreed over ranks)."""
        due = self.every_minutes is not None and \
            time.monotonic() - self._last_save >= 60 * self.every_minutes
        stop, due = self._agreed(trainer, self.received is not None, due)
        if stop:
            self._stop(trainer)
        if due:
            self.save(trainer, f"every {self.every_minutes:g} minutes")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._active or trainer.sanity_checking:
            return
        (stop,) = self._agreed(trainer, self.received is not None)
        if stop:
            self._stop(trainer)

    def _stop(self, trainer: L.Trainer) -> None:
        signum = self.received if self.received is not None else int(signal.SIGTERM)
        name = signal.Signals(signum).name
        self.saved_path = self.save(trainer, f"received {name}")
        raise SIGTERMException(self.exit_status(trainer, signum))

    def exit_status(self, trainer: L.Trainer, signum: int) -> int:
        """128 + ``signum``, or 0 when SIGUSR1 requeued the SLURM job (rank 0 asks)."""
        if signum != int(signal.SIGUSR1) or not self.requeue:
            return 128 + signum
        job = os.environ.get("SLURM_JOB_ID")
        if os.environ.get("SLURM_ARRAY_JOB_ID") and os.environ.get("SLURM_ARRAY_TASK_ID"):
            job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
        if job is None:
            return 128 + signum
        ok = True
        if trainer.is_global_zero:
            try:
                done = subprocess.run(["scontrol", "requeue", job], check=False,
                                      capture_output=True, text=True)
                ok = done.returncode == 0
                if not ok:
                    rank_zero_warn(f"scontrol requeue {job} failed (exit status "
                                   f"{done.returncode}): {done.stderr.strip()}")
            except FileNotFoundError:
                ok = False
                rank_zero_warn("scontrol not found: the job is not requeued")
            if ok:
                rank_zero_info(f"requeued SLURM job {job}")
        ok = bool(trainer.strategy.broadcast(ok, src=0)) if trainer.world_size > 1 else ok
        return 0 if ok else 128 + signum

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule,
                     exception: BaseException) -> None:
        """A signal that came outside a training step: Lightning stops by itself (with a
        ``SIGTERMException``, exit status 0); save here and give the status its code."""
        active, self._active = self._active, False
        # Lightning puts back the handlers it found (ours) after this: make them the ones
        # found before the fit instead
        originals = getattr(getattr(trainer, "_signal_connector", None), "_original_handlers",
                            None)
        if isinstance(originals, dict):
            for signum, previous in self._previous.items():
                if signum in originals:
                    originals[signum] = previous if previous is not None else signal.SIG_DFL
        if not active or self.received is None or self.saved_path is not None \
                or not isinstance(exception, SystemExit):
            return
        self.saved_path = self.save(trainer, f"received {signal.Signals(self.received).name}")
        if not exception.code:
            exception.code = self.exit_status(trainer, self.received)


def checkpoint_problem(path: str | os.PathLike[str]) -> str | None:
    """Why the checkpoint file ``path`` cannot be read, or None when it is whole.

    A checkpoint written by ``torch.save`` is a zip archive with a CRC-32 of every entry;
    this reads it through (no unpickling, no tensor allocated) and so finds a file cut
    short (a full disk, a kill while writing) or with changed bytes. Legacy (pre-zip)
    ``torch.save`` files are not checked.
    """
    file = Path(path)
    if file.is_dir():
        return "a folder, not a checkpoint file"
    if not file.is_file():
        return "no such file"
    size = file.stat().st_size
    if size == 0:
        return "empty file (0 bytes)"
    what = sniff_torch_file(file)
    if what is not None:
        return f"not a checkpoint: {what} ({size} bytes)"
    if not starts_with(file, ZIP_MAGIC):  # a legacy (pickle) torch.save file: not checked
        return None
    try:
        with zipfile.ZipFile(file) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
        return f"truncated or corrupted ({size} bytes): {err}"
    if bad is not None:
        return f"corrupted: entry {bad} fails its CRC check"
    return None


def resume_checkpoint(trainer: L.Trainer, ckpt_path: str | os.PathLike[str] | None
                      ) -> str | None:
    """The checkpoint to resume ``trainer`` from for ``ckpt_path``.

    ``"last"``: the newest whole checkpoint (``*.ckpt`` by modification time) in the
    folders of the trainer's ``ModelCheckpoint`` callbacks, in every
    ``<default_root_dir>/version_*/checkpoints`` (one per run, the CLI's layout; and every
    ``version_*`` beside a callback's ``version_N/checkpoints``) and in
    ``<default_root_dir>/checkpoints``; a newer damaged one is skipped with a warning naming
    it and what is wrong; none at all (or none whole): None, the run starts afresh, with a
    warning. A path: checked, and a damaged file is an error naming it. Anything else
    (``"best"``, ``"hpc"``, None) is passed through.
    """
    if ckpt_path is None or str(ckpt_path) in ("best", "hpc", "registry"):
        return None if ckpt_path is None else str(ckpt_path)
    if str(ckpt_path) != "last":
        problem = checkpoint_problem(ckpt_path)
        if problem is not None:
            raise ValueError(f"cannot resume from {ckpt_path}: {problem}")
        return str(ckpt_path)
    root = Path(trainer.default_root_dir)
    folders = {Preemption.folder(trainer), root / "checkpoints",
               *root.glob("version_*/checkpoints")}
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath:
            folders.add(Path(callback.dirpath))
    for folder in list(folders):  # a run's version_N/checkpoints: every version's
        if folder.name == "checkpoints" and folder.parent.name.startswith("version_"):
            folders.update(folder.parent.parent.glob("version_*/checkpoints"))
    found = [p for folder in folders if folder.is_dir() for p in folder.glob("*.ckpt")
             if p.is_file()]
    found.sort(key=lambda p: (p.stat().st_mtime, p.name.startswith("last")), reverse=True)
    for path in found:
        problem = checkpoint_problem(path)
        if problem is None:
            return str(path)
        rank_zero_warn(f"--ckpt_path last: skipping {path}: {problem}")
    where = ", ".join(sorted(str(f) for f in folders))
    rank_zero_warn(f"--ckpt_path last: no whole checkpoint in {where}; starting afresh"
                   if found else f"--ckpt_path last: no checkpoint in {where}; starting afresh")
    return None


__all__ = ["EpochSummary", "Preemption", "RunCheckpoint", "StepBudget", "checkpoint_problem",
           "resume_checkpoint"]
