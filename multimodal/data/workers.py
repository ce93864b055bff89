"""Loader worker processes and the job's signals.

A scheduler ends a job by signalling every process of it (``timeout``, ``kill -- -PGID``,
SLURM's ``--signal``): DataLoader workers too. A worker left with the default action dies,
and the main process, which handles the signal to save a checkpoint first
(:class:`multimodal.cli.callbacks.Preemption`), then fails on the dead worker instead. Every
loader of the data modules starts its workers with :func:`ignore_job_signals`: the workers
ignore :data:`JOB_SIGNALS` and stop when the main process stops them (or, when it is gone,
by torch's watchdog). At interpreter exit, workers still running are killed
(:func:`reap_loader_workers`): ``multiprocessing`` would send them a SIGTERM, now ignored, and
wait for them.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import signal
from collections.abc import Callable

__all__ = ["JOB_SIGNALS", "ignore_job_signals", "reap_loader_workers", "worker_init"]

JOB_SIGNALS = ("SIGTERM", "SIGUSR1")
"""The signals the main process handles (save, then exit 128 + the signal)."""


def ignore_job_signals(worker_id: int) -> None:
    """A DataLoader ``worker_init_fn``: this worker ignores :data:`JOB_SIGNALS`."""
    for name in JOB_SIGNALS:
        with contextlib.suppress(ValueError, OSError, AttributeError):
            signal.signal(getattr(signal, name), signal.SIG_IGN)


class _Both:
    """``ignore_job_signals`` then another ``worker_init_fn`` (picklable, for spawn)."""

    def __init__(self, other: Callable[[int], None]) -> None:
        self.other = other

    def __call__(self, worker_id: int) -> None:
        ignore_job_signals(worker_id)
        self.other(worker_id)


def worker_init(other: Callable[[int], None] | None = None) -> Callable[[int], None]:
    """The ``worker_init_fn`` for a loader: :func:`ignore_job_signals`, then ``other``."""
    return ignore_job_signals if other is None else _Both(other)


def reap_loader_workers(grace: float = 0.5) -> None:
    """At exit: end this process's daemon children (DataLoader workers among them) still
    alive. ``multiprocessing`` would send them SIGTERM and wait; loader workers ignore it, so
    after ``grace`` seconds the ones left are killed."""
    import time

    children = [p for p in multiprocessing.active_children() if p.daemon]
    for process in children:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            process.terminate()
    end = time.monotonic() + grace
    for process in children:
        with contextlib.suppress(OSError, ValueError, AttributeError, AssertionError):
            process.join(max(0.0, end - time.monotonic()))
            if process.is_alive():
                process.kill()


atexit.register(reap_loader_workers)  # after multiprocessing's own: it runs first
