"""Progress that reads well both on a terminal and in a log file.

On a terminal a tqdm bar redraws one line in place. Written to a file (CI, ``nohup``, a
SLURM job's output) the same bar leaves one carriage-return frame per update: thousands
of them for a long loop. :func:`progress` therefore draws a bar only when its stream is a
terminal, and otherwise prints a few plain lines, one each time another ``every`` of the
work is done (10 % by default) and one at the end::

    spoken words: 540/5400 clips (10%) 0m12s
    ...
    spoken words: 5400/5400 clips (100%) 2m03s

:func:`is_terminal` is the one test for "is this a terminal" that the package uses (the
training loop's plain epoch lines and its progress bar follow it too).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any, TypeVar

T = TypeVar("T")


def is_terminal(stream: IO[str] | None) -> bool:
    """Whether ``stream`` is an interactive terminal (``False`` for files, pipes, ``None``)."""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(callable(isatty) and isatty())
    except ValueError:  # a closed stream
        return False


class PlainProgress:
    """Counts work done and prints ``desc: n/total unit (p%) XmYYs`` at every ``every`` of it.

    The tqdm subset the package uses: ``update(n)``, ``close()``, a context manager, and
    iteration over a wrapped iterable. With an unknown ``total`` it prints nothing until
    :meth:`close`, which prints the final count.
    """

    def __init__(self, iterable: Iterable[Any] | None = None, *, total: int | None = None,
                 desc: str = "", unit: str = "it", stream: IO[str] | None = None,
                 every: float = 0.1, disable: bool = False) -> None:
        if not 0 < every <= 1:
            raise ValueError(f"every must be in (0, 1], a fraction of the total, got {every}")
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.iterable, self.total, self.desc, self.unit = iterable, total, desc, unit
        self.every, self.disable = every, disable
        self.stream = stream if stream is not None else sys.stderr
        self.n = 0
        self._printed_step = 0  # number of ``every`` steps already reported
        self._printed_n = 0  # the count the latest line showed
        self._start = time.monotonic()
        self._closed = False

    def _line(self) -> str:
        minutes, seconds = divmod(int(time.monotonic() - self._start), 60)
        count = f"{self.n}/{self.total}" if self.total else f"{self.n}"
        share = f" ({100 * self.n // self.total}%)" if self.total else ""
        prefix = f"{self.desc}: " if self.desc else ""
        return f"{prefix}{count} {self.unit}{share} {minutes}m{seconds:02d}s"

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.disable or not self.total:
            return
        step = math.floor(self.n / self.total / self.every + 1e-9)  # every-steps completed
        if step > self._printed_step:
            self._printed_step = step
            self._print()

    def _print(self) -> None:
        self._printed_n = self.n
        print(self._line(), file=self.stream, flush=True)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self.disable and self._printed_n != self.n:
            self._print()  # where it ended (or stopped), unless the last line said so already

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Any]:
        if self.iterable is None:
            raise TypeError("nothing to iterate: pass an iterable to progress()")
        try:
            for item in self.iterable:
                yield item
                self.update()
        finally:
            self.close()


def progress(iterable: Iterable[T] | None = None, *, total: int | None = None, desc: str = "",
             unit: str = "it", stream: IO[str] | None = None, every: float = 0.1,
             disable: bool = False) -> Any:
    """A tqdm bar on a terminal, else a :class:`PlainProgress` printing every ``every``.

    ``stream`` defaults to ``sys.stderr`` (as tqdm's). Use it as tqdm:
    ``for x in progress(items, desc="clips"): ...`` or
    ``with progress(total=n, desc="clips") as bar: ... bar.update()``.
    """
    stream = stream if stream is not None else sys.stderr
    if is_terminal(stream):
        from tqdm.auto import tqdm

        return tqdm(iterable, total=total, desc=desc, unit=unit, file=stream, disable=disable)
    return PlainProgress(iterable, total=total, desc=desc, unit=unit, stream=stream,
                         every=every, disable=disable)


__all__ = ["PlainProgress", "is_terminal", "progress"]
