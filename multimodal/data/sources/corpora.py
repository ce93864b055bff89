"""The English text sources by name: :data:`SOURCES` and :func:`load_corpus`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from multimodal.data.documents import Document
from multimodal.data.sources.bible import read_bible
from multimodal.data.sources.fortunes import DEFAULT_FORTUNES_DIR, read_fortunes
from multimodal.data.sources.shakespeare import DEFAULT_ROOT, read_shakespeare

__all__ = ["SOURCES", "check_sources", "load_corpus"]

SOURCES: tuple[str, ...] = ("bible", "fortunes", "shakespeare")
"""Known sources; the label of a source in classification is its index here."""


def load_corpus(
    sources: Sequence[str] = SOURCES,
    root: str | Path = DEFAULT_ROOT,
    fortunes_dir: str | Path = DEFAULT_FORTUNES_DIR,
    bible_command: str = "bible",
) -> list[Document]:
    """Documents of the named sources, in source order then reading order.

    Raises FileNotFoundError (saying to run ``bash data/get_text.sh``) for a missing source.
    """
    sources = check_sources(sources)
    readers = {
        "bible": lambda: read_bible(bible_command),
        "fortunes": lambda: read_fortunes(fortunes_dir),
        "shakespeare": lambda: read_shakespeare(root),
    }
    docs: list[Document] = []
    for source in sources:
        docs.extend(readers[source]())
    return docs


def check_sources(sources: Sequence[str] | str) -> tuple[str, ...]:
    """``sources`` as a tuple of known, distinct source names (a single name is allowed)."""
    if isinstance(sources, str):
        sources = (sources,)
    sources = tuple(sources)
    unknown = [s for s in sources if s not in SOURCES]
    if unknown or not sources:
        raise ValueError(f"sources must be a non-empty subset of {SOURCES}, got {sources}")
    if len(set(sources)) != len(sources):
        raise ValueError(f"sources has duplicates: {sources}")
    return sources
