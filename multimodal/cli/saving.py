"""How the CLI writes a checkpoint: :func:`write_checkpoint`, the one way its callbacks
(``RunCheckpoint``'s last and top-k files, ``Preemption``'s signal save, ``RunGuard``'s save
at divergence) write one: never a file with non-finite weights (:class:`TrainingDiverged`
instead), always through a temporary file and a rename (a failed or killed write leaves the
previous file whole), and a failed write (``ENOSPC``, ``EIO``) is
:class:`CheckpointWriteError` naming the path and the free space, or a warning when the run
was told to go on (``on_save_error="continue"``, :class:`~multimodal.cli.faults.RunGuard`)."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn

__all__ = ["CheckpointWriteError", "TrainingDiverged", "nonfinite_parameter",
           "write_checkpoint"]


class TrainingDiverged(RuntimeError):
    """Training stopped at a non-finite loss or gradient norm; the message is the line the
    CLI prints (no ``RuntimeError:`` prefix)."""

    plain = True


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, an I/O error); the previous files are
    kept whole."""

    plain = True


def nonfinite_parameter(module: torch.nn.Module) -> str | None:
    """The name of the first parameter or floating buffer of ``module`` holding a NaN or an
    infinity, or None when all are finite (one fused check, then a search on failure)."""
    tensors = [(n, t) for n, t in (*module.named_parameters(), *module.named_buffers())
               if t.is_floating_point() and t.numel()]
    if not tensors:
        return None
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for _, t in tensors:
        by_device.setdefault(t.device, []).append(t.detach())
    bad = any(not bool(torch.stack([torch.isfinite(x).all() for x in group]).all())
              for group in by_device.values())
    if not bad:
        return None
    return next(n for n, t in tensors if not bool(torch.isfinite(t.detach()).all()))


def _save_policy(trainer: L.Trainer) -> Any:
    """The callback that says what a failed save does (``on_save_error``, with a
    ``failed_saves`` count: :class:`~multimodal.cli.faults.RunGuard`), or None."""
    return next((c for c in trainer.callbacks if hasattr(c, "on_save_error")), None)


def _free_space(folder: Path) -> str:
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return "free space unknown"
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if free < 1024 or unit == "TB":
            return f"{free:.0f} {unit} free" if unit == "bytes" else f"{free:.1f} {unit} free"
        free /= 1024
    return ""  # unreachable


def write_checkpoint(trainer: L.Trainer, path: str | os.PathLike[str],
                     weights_only: bool = False) -> str | None:
    """Write ``trainer``'s checkpoint to ``path`` through ``.<name>.partial`` and a rename.

    Refused (:class:`TrainingDiverged`) when a weight is not finite: no checkpoint with NaN
    weights is ever written. A failed write removes the partial file and raises
    :class:`CheckpointWriteError` (``error: could not write PATH: No space left on device
    (12.0 MB free in FOLDER) ...``); when the run's :class:`RunGuard` says
    ``on_save_error="continue"`` it warns instead and returns None. Returns the path."""
    path = Path(path)
    guard = _save_policy(trainer)
    if callable(getattr(guard, "settle", None)):
        guard.settle(trainer)  # a non-finite step not yet read stops the run here
    module = trainer.lightning_module
    bad = nonfinite_parameter(module) if module is not None else None
    if bad is not None:
        raise TrainingDiverged(
            f"the weights are not finite at step {trainer.global_step} ({bad}): not writing "
            f"{path}; the checkpoints already written are kept")
    partial = path.with_name(f".{path.name}.partial")
    if trainer.is_global_zero:
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
    try:
        trainer.save_checkpoint(partial, weights_only)  # every rank: collective under DDP
        if trainer.is_global_zero:
            os.replace(partial, path)
    except (OSError, RuntimeError) as err:
        if isinstance(err, TrainingDiverged) or (
                isinstance(err, RuntimeError) and "writ" not in str(err).lower()):
            raise
        with contextlib.suppress(OSError):
            partial.unlink()
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        kept = "the previous checkpoints are kept"
        guard = _save_policy(trainer)
        if guard is not None and guard.on_save_error == "continue":
            rank_zero_warn(f"could not write {path}: {reason} ({_free_space(path.parent)} "
                           f"in {path.parent}); {kept}; the run goes on without this save")
            guard.failed_saves += 1
            return None
        raise CheckpointWriteError(
            f"could not write {path}: {reason} ({_free_space(path.parent)} in "
            f"{path.parent}): the run stopped; {kept} (free some space and resume with "
            "--ckpt_path last, or --on_save_error continue to train on without saving)"
        ) from err
    return str(path)
