"""Progress output: a tqdm bar on a terminal, a few plain lines in a log file."""

from __future__ import annotations

import io
import re
import sys

import pytest

from multimodal.progress import PlainProgress, is_terminal, progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _lines(log: io.StringIO) -> list[str]:
    text = log.getvalue()
    assert "\r" not in text  # no carriage-return frames in a log
    return text.splitlines()


def test_a_log_gets_one_line_per_tenth_not_one_frame_per_update() -> None:
    log = io.StringIO()
    with progress(total=5400, desc="spoken words", unit="clip", stream=log) as bar:
        assert isinstance(bar, PlainProgress)
        for _ in range(5400):
            bar.update()
    lines = _lines(log)
    assert len(lines) == 10
    assert [ln.split()[2] for ln in lines] == [f"{540 * k}/5400" for k in range(1, 11)]
    assert re.fullmatch(r"spoken words: 540/5400 clip \(10%\) \d+m\d\ds", lines[0])
    assert re.fullmatch(r"spoken words: 5400/5400 clip \(100%\) \d+m\d\ds", lines[-1])


def test_wrapping_an_iterable_uneven_steps_and_a_coarser_every() -> None:
    log = io.StringIO()
    items = list(range(7))
    assert list(progress(items, desc="x", stream=log, every=0.25)) == items
    # 7 items, a line each time another quarter is done: after 2 (28%), 4 (57%), 6 (85%), 7
    assert [ln.split()[1] for ln in _lines(log)] == ["2/7", "4/7", "6/7", "7/7"]
    log = io.StringIO()
    with progress(total=3, stream=log) as bar:  # fewer items than steps: one line per item
        bar.update(2)
        bar.update()
    assert [ln.split()[0] for ln in _lines(log)] == ["2/3", "3/3"]


def test_unknown_total_stopped_early_and_disabled() -> None:
    log = io.StringIO()
    assert sum(progress((i for i in range(5)), desc="gen", unit="doc", stream=log)) == 10
    assert [ln.rsplit(" ", 1)[0] for ln in _lines(log)] == ["gen: 5 doc"]  # only at the end
    log = io.StringIO()
    with pytest.raises(KeyboardInterrupt), progress(total=100, desc="d", stream=log) as bar:
        for i in range(100):
            if i == 37:
                raise KeyboardInterrupt
            bar.update()
    assert [ln.split()[1] for ln in _lines(log)] == ["10/100", "20/100", "30/100", "37/100"]
    log = io.StringIO()
    with progress(total=10, stream=log, disable=True) as bar:
        bar.update(10)
    assert log.getvalue() == ""
    with pytest.raises(ValueError, match="every"):
        progress(total=10, stream=log, every=0)


def test_a_terminal_gets_a_tqdm_bar() -> None:
    from tqdm import tqdm

    terminal = Terminal()
    with progress(total=50, desc="bar", stream=terminal) as bar:
        assert isinstance(bar, tqdm)
        bar.update(50)
    assert "\r" in terminal.getvalue() and "50/50" in terminal.getvalue()


def test_is_terminal() -> None:
    assert is_terminal(Terminal()) and not is_terminal(io.StringIO()) and not is_terminal(None)
    closed = io.StringIO()
    closed.close()
    assert not is_terminal(closed)
    assert is_terminal(sys.stdout) is bool(sys.stdout.isatty())
