"""What kind of file a path is: the one place that looks at names, magic bytes and layouts.

Base layer (no package imports). Everything above asks here instead of testing suffixes or
magic bytes itself:

* :data:`IMAGE_EXTENSIONS`, :data:`AUDIO_EXTENSIONS`, :data:`TEXT_EXTENSIONS`,
  :data:`TABLE_EXTENSIONS`: one list per modality, used by training folders, ``embed`` /
  ``zero-shot`` inputs and encoders alike;
* :func:`path_kind`: what a model path holds (:data:`PathKind`), with an error that says
  what the path is instead when it holds no model;
* :func:`sniff_torch_file`: whether a file starts like one ``torch.save`` writes, or what it
  looks like instead (a Git LFS pointer, an HTML page, a text file).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

__all__ = [
    "AUDIO_EXTENSIONS",
    "CONFIG_NAME",
    "GGUF_MAGIC",
    "IMAGE_EXTENSIONS",
    "MODEL_PATHS",
    "SPEECH_EXTENSIONS",
    "TABLE_EXTENSIONS",
    "TEXT_EXTENSIONS",
    "ZIP_MAGIC",
    "PathKind",
    "path_kind",
    "sniff_torch_file",
    "starts_with",
]

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")
AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".mp3")
SPEECH_EXTENSIONS = (*AUDIO_EXTENSIONS, ".raw")
"""What ``transcribe`` reads: audio files, and headerless 16 kHz 16-bit mono PCM (``.raw``)."""
TEXT_EXTENSIONS = (".txt",)
TABLE_EXTENSIONS = (".csv", ".tsv", ".jsonl")

GGUF_MAGIC = b"GGUF"
ZIP_MAGIC = b"PK\x03\x04"
CONFIG_NAME = "config.json"

PathKind = Literal["gguf", "checkpoint", "ctranslate2", "hf", "save_pretrained"]
"""``gguf``: llama.cpp's one file; ``checkpoint``: a ``torch.save`` file (a Lightning
``.ckpt`` of one of our tasks); ``ctranslate2``: a folder with ``model.bin`` (faster-whisper's
layout); ``hf``: a Hugging Face layout folder (``config.json`` naming a ``model_type``);
``save_pretrained``: a folder written by our ``save_pretrained``."""

MODEL_PATHS = ("a Hugging Face folder, a save_pretrained folder, a CTranslate2 folder, a "
               "Lightning .ckpt or a .gguf file")


def sniff_torch_file(path: str | os.PathLike[str]) -> str | None:
    """``None`` when ``path`` starts like a file ``torch.save`` writes (a zip archive, or a
    legacy pickle: protocol byte ``0x80``); else what it looks like instead, for the error:
    a Git LFS pointer (the weights were never pulled), an HTML page (a login or error page
    saved in place of the download), a text file, or unknown bytes."""
    with open(path, "rb") as f:
        head = f.read(512)
    if head.startswith(ZIP_MAGIC) or head[:1] == b"\x80":  # zip, or a legacy pickle
        return None
    text = head.lstrip().lower()
    if text.startswith(b"version https://git-lfs"):
        return "it is a Git LFS pointer (the file itself was never fetched: `git lfs pull`)"
    if text.startswith((b"<!doctype html", b"<html", b"<?xml", b"<head")):
        return "it is an HTML page (a web page saved in place of the file?)"
    if not head:
        return "it is empty"
    try:
        head.decode("utf-8")
        return "it is a text file"
    except UnicodeDecodeError:
        return f"it starts with the bytes {head[:8]!r}, not a zip archive or pickle"


def starts_with(path: str | os.PathLike[str], magic: bytes) -> bool:
    """True for a readable file whose first bytes are ``magic``."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            return f.read(len(magic)) == magic
    except OSError:
        return False


def path_kind(path: str | os.PathLike[str]) -> PathKind:
    """What the model path ``path`` holds (:data:`PathKind`).

    A file: ``gguf`` by its magic bytes (whatever its name), else ``checkpoint`` when it
    starts like a ``torch.save`` file. A folder: ``ctranslate2`` with ``model.bin`` (or
    ``model.bin.part1``), else by its ``config.json``: ``hf`` when it names a
    ``model_type`` and holds no nested ``config`` (ours does), else ``save_pretrained``.

    Raises ``FileNotFoundError`` for a path that does not exist or a folder without
    ``config.json``, ``ValueError`` naming what the path is instead (a text file, an HTML
    page, a Git LFS pointer, a folder of images ...)."""
    p = Path(path).expanduser()
    if p.is_file():
        if starts_with(p, GGUF_MAGIC):
            return "gguf"
        what = sniff_torch_file(p)
        if what is None:
            return "checkpoint"
        named = "a checkpoint file" if p.suffix.lower() in (".ckpt", ".pt", ".pth") \
            else "a model file"
        raise ValueError(f"{p} is not {named}: {what} (expected {MODEL_PATHS})")
    if not p.exists():
        raise FileNotFoundError(f"{p} does not exist (expected {MODEL_PATHS})")
    if not p.is_dir():
        raise ValueError(f"{p} is neither a file nor a folder (expected {MODEL_PATHS})")
    if (p / "model.bin").is_file() or (p / "model.bin.part1").is_file():
        return "ctranslate2"
    config = p / CONFIG_NAME
    if not config.is_file():
        raise FileNotFoundError(f"{p} has no {CONFIG_NAME}: no model in this folder "
                                f"(expected {MODEL_PATHS})")
    try:
        meta = json.loads(config.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{config} is not valid JSON: {err}") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{config}: expected a JSON object, got {type(meta).__name__}")
    if "model_type" in meta and not isinstance(meta.get("config"), dict):
        return "hf"
    return "save_pretrained"
