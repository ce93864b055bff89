"""What a long run does when something goes wrong: a diverged loss, a checkpoint that cannot
be written (a full disk), a dead loader worker, out of memory.

* :func:`~multimodal.cli.saving.write_checkpoint` is the one way the CLI's callbacks write a
  checkpoint (never non-finite weights, always atomic, a failed write named).
* :class:`RunGuard` (added to every CLI run) stops training at the first non-finite training
  loss or gradient norm, before the optimiser applies that step, saves ``last.ckpt`` (the
  last finite state) and raises :class:`TrainingDiverged`; or, with
  ``on_nonfinite="skip"``, skips such steps (counted, logged as ``train/nonfinite_skipped``).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from multimodal.cli.callbacks import Preemption
from multimodal.cli.saving import TrainingDiverged, write_checkpoint

__all__ = ["LoaderWorkerDied", "OutOfMemory", "RunGuard", "out_of_memory_kind",
           "out_of_memory_message", "worker_death"]


class OutOfMemory(RuntimeError):
    """Out of (GPU or CPU) memory, with what to try (:func:`out_of_memory_message`)."""

    plain = True


class LoaderWorkerDied(RuntimeError):
    """A DataLoader worker process died (not of the job's signal)."""

    plain = True


class RunGuard(L.Callback):
    """Stop (or skip) at a non-finite training loss or gradient norm; the run's policy for a
    failed checkpoint write (:func:`write_checkpoint`).

    The loss of every (micro-)batch is checked as it reaches ``backward``, and the gradients'
    total norm :math:`\\sqrt{\\sum_p \\lVert g_p \\rVert^2}` before the optimiser step
    (not under a float16 grad scaler, whose skipped steps at an overflow are its own
    business, not divergence). Under DDP the flag is all-reduced on the device every step
    (no host sync), so every rank stops or skips at the same step.

    No host sync per step (issue 50): with a fused optimiser (the tasks' AdamW, also on
    CPU; ``_step_supports_amp_scaling``) and no grad scaler, the flag stays on the device
    and is handed to the optimiser as its ``found_inf``, so a bad step is not applied (the
    kernel leaves the weights, the moments and the step count as they were) without the
    host looking. The host reads the flags every ``check_every_n_steps`` optimiser steps
    (default: every step on the CPU, where a read costs nothing; ``log_every_n_steps`` on
    an accelerator), at the end of every epoch, before validation, before any checkpoint is
    written and at the end of the fit. Reading every step (the CPU's default), another
    optimiser (not fused) or a grad scaler: the flag is read in the step, which is then not
    taken (stop) or has its gradients dropped (skip), as before.

    ``on_nonfinite="stop"`` (default): from the first non-finite step on, no step is applied
    (the flag is sticky); at the next read ``last.ckpt`` (in the checkpoint folder) is
    written with the weights of the last finite step, and :class:`TrainingDiverged` ends
    the run: ``the training loss is not finite at step 7 (epoch 0, lr 1e+04): the run
    stopped; .../last.ckpt holds step 6, the last finite state``. When the read comes later
    than the step that failed (``check_every_n_steps`` > 1), the checkpoint's step counter
    is the read's, its weights and optimiser state those of the last finite step, and the
    message says which steps were not applied. ``"skip"``: each such step is not applied,
    counted in :attr:`skipped` and logged (``train/nonfinite_skipped``) when read.
    ``on_save_error``: ``"stop"`` (default) or ``"continue"`` (see :func:`write_checkpoint`).
    """

    def __init__(self, on_nonfinite: str = "stop", on_save_error: str = "stop",
                 check_every_n_steps: int | None = None) -> None:
        if on_nonfinite not in ("stop", "skip"):
            raise ValueError(f"on_nonfinite must be stop or skip, got {on_nonfinite!r}")
        if on_save_error not in ("stop", "continue"):
            raise ValueError(f"on_save_error must be stop or continue, got {on_save_error!r}")
        if check_every_n_steps is not None and check_every_n_steps < 1:
            raise ValueError(f"check_every_n_steps must be >= 1 or None, got "
                             f"{check_every_n_steps}")
        self.on_nonfinite, self.on_save_error = on_nonfinite, on_save_error
        self.check_every_n_steps = check_every_n_steps
        self.skipped = 0
        self.failed_saves = 0
        self._bad_loss: torch.Tensor | None = None
        # on the device, between two reads: each step's (loss bad, gradient norm bad) flags;
        # on the host their steps and epochs (no device work for those)
        self._history: torch.Tensor | None = None
        self._slots: list[tuple[int, int]] = []
        self._found_inf: torch.Tensor | None = None
        self._trainer: L.Trainer | None = None
        self._optimizer: torch.optim.Optimizer | None = None

    def every_n_steps(self, trainer: L.Trainer) -> int:
        """How many optimiser steps apart the host reads the flags."""
        if self.check_every_n_steps is not None:
            return self.check_every_n_steps
        if torch.device(trainer.strategy.root_device).type == "cpu":
            return 1
        return max(1, int(getattr(trainer, "log_every_n_steps", 50) or 50))

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           loss: torch.Tensor) -> None:
        bad = ~torch.isfinite(loss.detach()).all()
        self._bad_loss = bad if self._bad_loss is None else self._bad_loss | bad

    @staticmethod
    def _scaler(trainer: L.Trainer) -> Any:
        return getattr(trainer.precision_plugin, "scaler", None)

    def _flags(self, trainer: L.Trainer, pl_module: L.LightningModule,
               optimizer: torch.optim.Optimizer) -> torch.Tensor:
        """(loss bad, gradient norm bad) of this step as a float (2,) tensor on the device,
        summed over the ranks; no host sync."""
        bad_loss, self._bad_loss = self._bad_loss, None
        grads = [p.grad for group in optimizer.param_groups for p in group["params"]
                 if p.grad is not None]
        device = grads[0].device if grads else pl_module.device
        parts = [bad_loss.to(device).float() if bad_loss is not None
                 else torch.zeros((), device=device)]
        if grads and self._scaler(trainer) is None:
            norm = torch.nn.utils.get_total_norm(grads, foreach=True)
            parts.append((~torch.isfinite(norm)).float())
        else:
            parts.append(torch.zeros((), device=device))
        flags = torch.stack(parts)
        if trainer.world_size > 1:
            flags = trainer.strategy.reduce(flags, reduce_op="sum")
        return flags

    def _on_device(self, trainer: L.Trainer, optimizer: torch.optim.Optimizer) -> bool:
        """Whether a bad step can be dropped on the device (a fused optimiser's
        ``found_inf``), so that the host need not look every step."""
        return bool(getattr(optimizer, "_step_supports_amp_scaling", False)) and \
            self._scaler(trainer) is None and not hasattr(optimizer, "grad_scale")

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule,
                                 optimizer: torch.optim.Optimizer) -> None:
        self._trainer, self._optimizer = trainer, optimizer
        flags = self._flags(trainer, pl_module, optimizer)
        if self.every_n_steps(trainer) == 1 or not self._on_device(trainer, optimizer):
            # read now (every step: free on the CPU; or no found_inf to drop a step with)
            if getattr(optimizer, "found_inf", None) is self._found_inf is not None:
                del optimizer.found_inf  # left from an earlier fit with another setting
            loss_bad, grad_bad = (bool(v > 0) for v in flags.tolist())  # the host sync
            if loss_bad or grad_bad:
                self._nonfinite(trainer, optimizer, trainer.global_step,
                                trainer.current_epoch, 1, "gradient norm" if not loss_bad
                                else "training loss", dropped=False)
            return
        n = self.every_n_steps(trainer)
        history = self._history
        if history is None or history.device != flags.device or history.shape[0] < n:
            history = self._history = torch.zeros(n, 2, device=flags.device)
            self._found_inf = torch.zeros((), dtype=torch.float32, device=flags.device)
            self._slots = []
        if len(self._slots) >= history.shape[0]:
            self.settle(trainer, optimizer)  # (not reached: reads come every n steps)
        history[len(self._slots)].copy_(flags)  # this step's flags, read with the window's
        self._slots.append((trainer.global_step, trainer.current_epoch))
        bad = (flags.amax() > 0).float()  # exactly 1 where the step is dropped
        if self.on_nonfinite == "stop":  # sticky: the weights stay the last finite ones
            torch.maximum(self._found_inf, bad, out=self._found_inf)
        else:
            self._found_inf.copy_(bad)
        optimizer.found_inf = self._found_inf  # read by the fused step: not applied if 1
        if (trainer.global_step + 1) % n == 0:
            self.settle(trainer, optimizer)

    def settle(self, trainer: L.Trainer | None = None,
               optimizer: torch.optim.Optimizer | None = None) -> None:
        """Read the flags kept on the device since the last read (one host sync) and act on
        them: stop the run or count the skipped steps. Called at every read point (see the
        class doc)."""
        trainer = trainer if trainer is not None else self._trainer
        optimizer = optimizer if optimizer is not None else self._optimizer
        slots = self._slots
        if not slots or self._history is None or trainer is None or optimizer is None:
            return
        rows = self._history[: len(slots)].tolist()
        self._slots = []  # (a save on the way to a stop must not read them again)
        bad = [i for i, (loss, grad) in enumerate(rows) if loss > 0 or grad > 0]
        if not bad:
            return
        step, epoch = slots[bad[0]]
        what = "training loss" if rows[bad[0]][0] > 0 else "gradient norm"
        self._nonfinite(trainer, optimizer, step, epoch, len(bad), what, dropped=True)

    def _nonfinite(self, trainer: L.Trainer, optimizer: torch.optim.Optimizer, step: int,
                   epoch: int, count: int, what: str, dropped: bool) -> None:
        """``count`` non-finite steps, the first ``step`` (0-based, in ``epoch``): stop, or
        count them as skipped (``dropped``: the optimiser did not apply them already)."""
        if self.on_nonfinite == "skip":
            if not dropped:
                for group in optimizer.param_groups:
                    for p in group["params"]:
                        p.grad = None
            before, self.skipped = self.skipped, self.skipped + count
            if before < 3 or any(math.log2(k).is_integer()
                                 for k in range(before + 1, self.skipped + 1)):
                more = "" if count == 1 else f" and {count - 1} more up to step " \
                    f"{trainer.global_step + (0 if dropped else 1)}"
                rank_zero_warn(f"the {what} is not finite at step {step + 1} (epoch {epoch})"
                               f"{more}: step skipped ({self.skipped} so far)")
            return
        self._stop(trainer, optimizer, what, step, epoch)

    def _put_back(self, trainer: L.Trainer) -> None:
        """The optimisers without our ``found_inf``, as they were, for a later use."""
        for optimizer in trainer.optimizers:
            if self._found_inf is not None and \
                    getattr(optimizer, "found_inf", None) is self._found_inf:
                del optimizer.found_inf

    def _stop(self, trainer: L.Trainer, optimizer: torch.optim.Optimizer, what: str,
              bad_step: int | None = None, epoch: int | None = None) -> None:
        step = trainer.global_step
        bad_step = step if bad_step is None else bad_step
        epoch = trainer.current_epoch if epoch is None else epoch
        lr = optimizer.param_groups[0].get("lr", float("nan"))
        head = (f"the {what} is not finite at step {bad_step + 1} (epoch {epoch}, "
                f"lr {lr:.3g}): the run stopped")
        path = Preemption.folder(trainer) / "last.ckpt"
        try:
            written = write_checkpoint(trainer, path)
        except TrainingDiverged:
            written = None
        if written and bad_step == step:
            where = f"{path} holds step {step}, the last finite state"
        elif written:
            lost = f"step {step} was" if step == bad_step + 1 else \
                f"steps {bad_step + 1}-{step} were"
            where = (f"{path} holds the weights of step {bad_step}, the last finite state "
                     f"({lost} not applied; its step counter is {step})")
        else:
            where = "no checkpoint written now (the weights are not finite); the ones " \
                "already written are kept"
        self._put_back(trainer)
        raise TrainingDiverged(f"{head}; {where} (a lower learning rate, gradient clipping "
                               "--trainer.gradient_clip_val 1.0, or --on_nonfinite skip)")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.on_nonfinite == "skip" and self.skipped:
            pl_module.log("train/nonfinite_skipped", float(self.skipped), on_step=True,
                          on_epoch=False, sync_dist=False)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.settle(trainer)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.settle(trainer)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        self.settle(trainer)  # a diverged state is never saved as a good one

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.settle(trainer)
        if self.skipped:
            rank_zero_info(f"{self.skipped} training steps skipped: non-finite loss or "
                           "gradient norm (--on_nonfinite skip)")

    # -- a dead loader worker ------------------------------------------------------------
    def _quiet_sigchld(self, signum: int, frame: Any) -> None:
        """Note which child died of which signal. torch's own handler raises from wherever
        the main process is (inside an optimiser step, a checkpoint write); without it the
        loader finds the dead worker when it waits for its batch: between two steps."""
        with contextlib.suppress(ChildProcessError, OSError, AttributeError):
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if info is not None and info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
                self._deaths[info.si_pid] = signal.Signals(info.si_status).name

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.worker_died: tuple[str, int | None, str | None] | None = None
        self._deaths: dict[int, str] = {}
        self._sigchld = None
        from torch.utils.data._utils import signal_handling

        with contextlib.suppress(ValueError, AttributeError):  # not the main thread
            self._sigchld = signal.signal(signal.SIGCHLD, self._quiet_sigchld)
            self._torch_flag = signal_handling._SIGCHLD_handler_set
            signal_handling._SIGCHLD_handler_set = True  # torch's is not put back later

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._put_back(trainer)
        previous, self._sigchld = getattr(self, "_sigchld", None), None
        if previous is not None:
            from torch.utils.data._utils import signal_handling

            signal_handling._SIGCHLD_handler_set = getattr(self, "_torch_flag", False)
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signal.SIGCHLD, previous)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule,
                     exception: BaseException) -> None:
        """A loader worker died: note its signal and, unless the job's own signal killed it
        (then :class:`~multimodal.cli.callbacks.Preemption` stops the run as for the
        signal), write ``last.ckpt`` (the steps finished so far) so the run resumes."""
        from lightning.pytorch.trainer.states import TrainerFn

        if not hasattr(self, "_deaths") or trainer.state.fn != TrainerFn.FITTING:
            return
        self._quiet_sigchld(signal.SIGCHLD, None)  # a death not yet noted by the handler
        if not self._deaths and isinstance(exception, (ConnectionError, EOFError)):
            import time  # a worker's socket is reset a moment before it can be waited for

            for _ in range(40):
                time.sleep(0.05)
                self._quiet_sigchld(signal.SIGCHLD, None)
                if self._deaths:
                    break
        name = worker_death(exception)
        if name is None and self._deaths and isinstance(exception, Exception) and \
                not getattr(exception, "plain", False):  # e.g. reading from it as it died
            name = next(iter(self._deaths.values()))
        if name is None:
            return
        import re

        pids = [int(p) for p in re.findall(r"\d+", str(exception))]
        name = next((self._deaths[p] for p in pids if p in self._deaths), name)
        iterator = getattr(trainer.train_dataloader, "_iterator", None)
        for worker in getattr(iterator, "_workers", None) or []:  # persistent workers
            code = getattr(worker, "exitcode", None)
            if name == "unknown" and worker.pid in pids and code is not None and code < 0:
                name = signal.Signals(-code).name
        preemption = next((c for c in trainer.callbacks if isinstance(c, Preemption)), None)
        job = preemption.received if preemption is not None else None
        saved = None
        if job is None and trainer.lightning_module is not None:
            with contextlib.suppress(Exception), _as_at_batch_end(trainer):
                saved = write_checkpoint(trainer, Preemption.folder(trainer) / "last.ckpt")
        self.worker_died = (name, job, saved)

    def worker_death_error(self, step: int) -> BaseException | None:
        """What the CLI raises after a dead worker (:meth:`on_exception`): ``SystemExit(128
        + signal)`` when the job's signal killed it, else :class:`LoaderWorkerDied`."""
        died = getattr(self, "worker_died", None)
        if died is None:
            return None
        name, job, saved = died
        if job is not None:
            rank_zero_info(f"a loader worker ended by {name} after the job's "
                           f"{signal.Signals(job).name}: stopping as for the signal")
            return SystemExit(128 + job)
        kept = f"{saved} holds step {step}: resume with --ckpt_path last" if saved else \
            "the checkpoints written before are kept: resume with --ckpt_path last"
        why = " (the out-of-memory killer? fewer --data.init_args.num_workers or a smaller " \
            "batch use less memory)" if name == "SIGKILL" else ""
        return LoaderWorkerDied(f"a data loader worker died, killed by {name}{why}: the run "
                                f"stopped; {kept}")

    def state_dict(self) -> dict[str, Any]:
        self.settle()  # written into a checkpoint: the count read first
        return {"skipped": self.skipped}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped = int(state_dict.get("skipped", 0))


@contextlib.contextmanager
def _as_at_batch_end(trainer: L.Trainer) -> Any:
    """The loop counters as a checkpoint written in ``on_train_batch_end`` holds them (the
    last batch not yet counted as completed), which is what Lightning's restore expects: a
    checkpoint written between two steps (a failed fetch) then resumes at the next batch."""
    loop = trainer.fit_loop.epoch_loop
    progress = loop.batch_progress
    lag = 0 < progress.current.completed == progress.current.processed
    if lag:
        progress.total.completed -= 1
        progress.current.completed -= 1
        loop._batches_that_stepped -= 1
    try:
        yield
    finally:
        if lag:
            progress.total.completed += 1
            progress.current.completed += 1
            loop._batches_that_stepped += 1


def worker_death(exc: BaseException) -> str | None:
    """For torch's error about a DataLoader worker that died (``killed by signal: Killed``,
    ``exited unexpectedly``), the signal's name (``SIGKILL``) or ``"unknown"``; else None."""
    text = str(exc)
    if not isinstance(exc, RuntimeError) or "DataLoader worker" not in text or not (
            "killed by signal" in text or "exited unexpectedly" in text):
        return None
    named = text.split("killed by signal:", 1)[1].strip().rstrip(".") \
        if "killed by signal:" in text else ""
    for sig in signal.Signals:
        if named and signal.strsignal(sig) == named:
            return sig.name
    return named or "unknown"


def out_of_memory_kind(exc: BaseException) -> str | None:
    """``"GPU"`` or ``"CPU"`` when ``exc`` is running out of that memory (CUDA's
    OutOfMemoryError or a RuntimeError saying "out of memory"; the CPU allocator's
    RuntimeError or a MemoryError), else None: the one test the out-of-memory message and
    the batch-size search share."""
    text = str(exc)
    if isinstance(exc, torch.OutOfMemoryError) or (
            isinstance(exc, RuntimeError) and "out of memory" in text):  # CUDA's older text
        return "GPU"
    if isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and (
            "DefaultCPUAllocator: can't allocate memory" in text
            or "not enough memory" in text)):
        return "CPU"
    return None


def out_of_memory_message(exc: BaseException, batch_size: Any, model: str) -> str | None:
    """The one line for an out-of-memory error (:func:`out_of_memory_kind`), naming the
    batch size, the model and what to try; None for another error."""
    where = out_of_memory_kind(exc)
    if where is None:
        return None
    smaller = max(1, int(batch_size) // 2) if isinstance(batch_size, int) else 64
    return (f"out of {where} memory with batch size {batch_size} ({model}): try "
            f"--data.init_args.batch_size {smaller}, --trainer.accumulate_grad_batches 2 "
            "(the same effective batch), or --trainer.precision bf16-mixed")
