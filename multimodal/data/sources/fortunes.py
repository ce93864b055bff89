"""The Debian package ``fortunes``: ``/usr/share/games/fortunes/<name>`` files whose
entries are separated by lines holding only ``%`` (the ``.dat`` index and ``.u8`` link files
are skipped). One document per entry. ``bash data/get_text.sh`` installs it.
"""

from __future__ import annotations

from pathlib import Path

from multimodal.data.documents import Document
from multimodal.data.sources import GET_TEXT

__all__ = ["DEFAULT_FORTUNES_DIR", "read_fortunes", "split_fortunes"]

DEFAULT_FORTUNES_DIR = Path("/usr/share/games/fortunes")


def _resolve_backspaces(text: str) -> str:
    if "\x08" not in text:
        return text
    out: list[str] = []
    for ch in text:
        if ch == "\x08":
            if out and out[-1] != "\n":
                out.pop()
        else:
            out.append(ch)
    return "".join(out)


def split_fortunes(raw: str) -> list[str]:
    """Entries of a fortune file: blocks separated by lines holding only ``%``.

    Terminal overstrike is resolved as a terminal prints it (a backspace erases the previous
    character: ``"___\b\b\band"`` -> ``"and"``) and blank entries are dropped.
    """
    raw = _resolve_backspaces(raw.replace("\r\n", "\n"))
    entries, current = [], []
    for line in raw.split("\n"):
        if line.strip() == "%":
            entries.append("\n".join(current))
            current = []
        else:
            current.append(line)
    entries.append("\n".join(current))
    return [e.strip("\n") for e in entries if e.strip()]


def read_fortunes(directory: str | Path = DEFAULT_FORTUNES_DIR) -> list[Document]:
    """Every fortune entry of every file in ``directory`` (skipping ``.dat`` / ``.u8``)."""
    directory = Path(directory)
    files = sorted(
        p for p in directory.glob("*") if p.is_file() and p.suffix not in (".dat", ".u8")
    ) if directory.is_dir() else []
    if not files:
        raise FileNotFoundError(
            f"no fortune files in {directory} (Debian package fortunes); run `{GET_TEXT}`"
        )
    docs = []
    for path in files:
        raw = path.read_text(encoding="utf-8", errors="replace")
        docs.extend(Document(entry, "fortunes", f"{path.name} #{i}")
                    for i, entry in enumerate(split_fortunes(raw)))
    return docs
