"""Your own text as documents: ``.txt`` files (one file, a folder of them searched
recursively, or a glob such as ``books/**/*.txt``) or JSONL with a ``text`` field.

A ``.txt`` file is cut at blank lines and its paragraphs grouped, in order, into documents
of at least ``chunk_chars`` characters (the last one may be shorter), so that one long book
still splits into train / val / test by whole passages; a JSONL row is one document.
Documents are :class:`~multimodal.data.documents.Document` with ``source="files"`` and a
title naming the file (and chunk or line), so an error or a split can be traced to it.

Errors name the file: a pattern matching nothing, text that is not UTF-8, an empty file,
a JSONL row without a string ``text`` or with an empty one.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence
from pathlib import Path

from multimodal.data.documents import Document
from multimodal.files import read_rows

__all__ = ["FILES_SOURCE", "read_text_documents", "text_files"]

FILES_SOURCE = "files"


def text_files(spec: str | os.PathLike) -> list[Path]:
    """The files ``spec`` names: itself (a ``.txt`` or ``.jsonl`` file), the ``.txt`` /
    ``.jsonl`` files under a folder (recursively), or a glob's matches; sorted."""
    text = str(spec)
    path = Path(text)
    if any(c in text for c in "*?["):
        files = [Path(p) for p in sorted(glob.glob(text, recursive=True)) if Path(p).is_file()]
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*")
                       if p.is_file() and p.suffix.lower() in (".txt", ".jsonl")
                       and not p.name.startswith("."))  # fmt: skip
    elif path.is_file():
        files = [path]
    else:
        raise FileNotFoundError(f"text source not found: {text}")
    if not files:
        raise FileNotFoundError(f"no .txt or .jsonl files in {text}")
    return files


def _chunks(text: str, chunk_chars: int) -> list[str]:
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    out, current, size = [], [], 0
    for p in paragraphs:
        current.append(p)
        size += len(p)
        if size >= chunk_chars:
            out.append("\n\n".join(current))
            current, size = [], 0
    if current:
        out.append("\n\n".join(current))
    return out


def read_text_documents(
    specs: str | os.PathLike | Sequence[str | os.PathLike], chunk_chars: int = 4000
) -> list[Document]:
    """Documents of every file ``specs`` names (one spec or a list; see :func:`text_files`)."""
    if chunk_chars < 1:
        raise ValueError(f"chunk_chars must be >= 1, got {chunk_chars}")
    if isinstance(specs, (str, os.PathLike)):
        specs = [specs]
    docs: list[Document] = []
    for spec in specs:
        for path in text_files(spec):
            if path.suffix.lower() == ".jsonl":
                for line, row in read_rows(path, ("text",)):
                    text = row["text"]
                    if not isinstance(text, str):
                        raise ValueError(f"{path}:{line}: 'text' must be a string, got "
                                         f"{type(text).__name__}")
                    docs.append(Document(text, FILES_SOURCE, f"{path}:{line}"))
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(f"{path} is not UTF-8 text: {err}") from err
            chunks = _chunks(text, chunk_chars)
            if not chunks:
                raise ValueError(f"{path} holds no text")
            docs.extend(Document(c, FILES_SOURCE, f"{path}#{k}") for k, c in enumerate(chunks))
    return docs
