"""The King James Bible of the Debian package ``bible-kjv``, read through its
``bible -f gen1:1-rev22:21`` command (one verse a line, ``Ge1:1 In the beginning ...``).
One document per chapter (1189 documents). ``bash data/get_text.sh`` installs it.
"""

from __future__ import annotations

import re
import shutil
import subprocess

from multimodal.data.documents import Document
from multimodal.data.sources import GET_TEXT

__all__ = ["parse_bible", "read_bible"]

_VERSE_RE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+)\s+(.*)$")


def parse_bible(raw: str) -> list[Document]:
    """Group ``bible -f`` output (``<Book><chapter>:<verse> <text>`` lines) into chapters."""
    chapters: dict[tuple[str, str], list[str]] = {}
    for line in raw.splitlines():
        match = _VERSE_RE.match(line.strip())
        if match:
            book, chapter, _verse, text = match.groups()
            chapters.setdefault((book, chapter), []).append(text.strip())
    return [Document(" ".join(verses), "bible", f"{book} {chapter}")
            for (book, chapter), verses in chapters.items()]


def read_bible(command: str = "bible", verses: str = "gen1:1-rev22:21") -> list[Document]:
    """The King James Bible, one :class:`Document` per chapter, via the ``bible`` command."""
    exe = shutil.which(command)
    if exe is None:
        raise FileNotFoundError(
            f"the '{command}' command of the Debian package bible-kjv is not installed; "
            f"run `{GET_TEXT}`"
        )
    result = subprocess.run([exe, "-f", verses], capture_output=True, text=True, check=False,
                            stdin=subprocess.DEVNULL, timeout=120)
    docs = parse_bible(result.stdout)
    if result.returncode != 0 or not docs:
        raise FileNotFoundError(
            f"`{command} -f {verses}` gave no verses (exit {result.returncode}: "
            f"{result.stderr.strip()[:200]}); reinstall with `{GET_TEXT}`"
        )
    return docs
