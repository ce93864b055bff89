"""Tokenizer files: one reader, one from-JSON, one to-JSON.

A ``tokenizer.json`` is either a Hugging Face one (a ``model`` object, read through
:class:`~multimodal.tokenizers.hf_json.HFTokenizer`) or one written by the package's own
tokenizers (a ``type`` field, :func:`~multimodal.tokenizers.text.load_tokenizer`); the file
says which. Task checkpoints and shard sidecars keep the same JSON as a string.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from multimodal.installed import resolve_weights
from multimodal.tokenizers.hf_json import HFTokenizer, is_hf_tokenizer_file
from multimodal.tokenizers.text import load_tokenizer

__all__ = ["TOKENIZER_NAME", "byte_alphabet", "read_tokenizer", "tokenizer_file",
           "tokenizer_from_json", "tokenizer_to_json"]

TOKENIZER_NAME = "tokenizer.json"


def tokenizer_file(spec: str | Path) -> Path:
    """``spec`` itself (a file) or ``spec/tokenizer.json`` (a folder, or an installed model's
    name: ``all-MiniLM-L6-v2``); an error naming the path when neither exists."""
    path = Path(resolve_weights(spec))
    if path.is_dir():
        inner = path / TOKENIZER_NAME
        if not inner.is_file():
            raise FileNotFoundError(f"tokenizer folder {path} holds no {TOKENIZER_NAME}")
        return inner
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer {path} not found (a {TOKENIZER_NAME} or a folder "
                                f"holding one)")
    return path


def read_tokenizer(spec: str | Path) -> Any:
    """The tokenizer of a ``tokenizer.json`` (or a folder holding one): a Hugging Face one as
    :class:`HFTokenizer`, one of the package's own as what it holds."""
    path = tokenizer_file(spec)
    if is_hf_tokenizer_file(path):
        return HFTokenizer.from_file(path)
    try:
        return load_tokenizer(path)
    except ValueError as err:
        raise ValueError(f"{path} is neither a Hugging Face tokenizer.json nor one of the "
                         f"package's own: {err}") from err


def tokenizer_from_json(text: str) -> Any:
    """A tokenizer from the text of its ``tokenizer.json`` (as task checkpoints and shard
    sidecars keep it)."""
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / TOKENIZER_NAME
        file.write_text(text, encoding="utf-8")
        return read_tokenizer(file)


def tokenizer_to_json(tok: Any) -> str:
    """The ``tokenizer.json`` text of ``tok`` (anything with ``save(path)``)."""
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / TOKENIZER_NAME
        tok.save(file)
        return file.read_text(encoding="utf-8")


def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table (byte-level BPE's alphabet): the printable
    bytes ``!``..``~``, ``¡``..``¬``, ``®``..``ÿ`` stand for themselves, the other 68 bytes, in
    order, for ``chr(256)``, ``chr(257)``, ..."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars
