"""What kind of file a path is: the one place that looks at names, magic bytes and layouts.

Base layer (no package imports). Everything above asks here instead of testing suffixes or
magic bytes itself:

* :data:`IMAGE_EXTENSIONS`, :data:`AUDIO_EXTENSIONS`, :data:`TEXT_EXTENSIONS`,
  :data:`TABLE_EXTENSIONS`: one list per modality, used by training folders, ``embed`` /
  ``zero-shot`` inputs and encoders alike;
* :func:`path_kind`: what a model path holds (:data:`PathKind`), with an error that says
  what the path is instead when it holds no model;
* :func:`sniff_torch_file`: whether a file starts like one ``torch.save`` writes, or what it
  looks like instead (a Git LFS pointer, an HTML page, a text file);
* :func:`read_rows`: the rows of a ``.csv`` / ``.tsv`` / ``.jsonl`` table (manifests,
  labelled texts, text pairs, captions), every error naming ``path:line``;
* :func:`read_image`: the one image reader (a file, its bytes or a PIL image -> ``uint8``
  ``(C, H, W)``) of training, ``predict``, ``embed``, the converters' preprocessing and the
  server: every format of :data:`IMAGE_EXTENSIONS`, EXIF orientation applied, converted to
  the channels asked for, one :class:`CorruptFileError` naming the file
  (``<file>: not a readable image (<why>)``).
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

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
    "read_path_kind",
    "read_rows",
    "sniff_torch_file",
    "starts_with",
]

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")
AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".mp3")
SPEECH_EXTENSIONS = (*AUDIO_EXTENSIONS, ".raw")
"""What the pipelines (``embed``, ``transcribe``, ...) read as audio: audio files, and headerless
16 kHz 16-bit mono PCM (``.raw``, read by :func:`multimodal.tokenizers.audio.load_audio`;
training folders take :data:`AUDIO_EXTENSIONS`, whose headers are checked before a run)."""
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
    return read_path_kind(path)[0]


def read_path_kind(path: str | os.PathLike[str]) -> tuple[PathKind, dict[str, Any] | None]:
    """:func:`path_kind` and, for a folder of kind ``hf`` or ``save_pretrained``, its
    ``config.json`` as parsed to tell them apart (None otherwise): a caller that goes on to
    build the model reads the file once."""
    p = Path(path).expanduser()
    if p.is_file():
        if starts_with(p, GGUF_MAGIC):
            return "gguf", None
        what = sniff_torch_file(p)
        if what is None:
            return "checkpoint", None
        named = "a checkpoint file" if p.suffix.lower() in (".ckpt", ".pt", ".pth") \
            else "a model file"
        raise ValueError(f"{p} is not {named}: {what} (expected {MODEL_PATHS})")
    if not p.exists():
        raise FileNotFoundError(f"{p} does not exist (expected {MODEL_PATHS})")
    if not p.is_dir():
        raise ValueError(f"{p} is neither a file nor a folder (expected {MODEL_PATHS})")
    if (p / "model.bin").is_file() or (p / "model.bin.part1").is_file():
        return "ctranslate2", None
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
        return "hf", meta
    return "save_pretrained", meta


# ------------------------------------------------------------------------------ tables

TABLE_DELIMITERS = {".csv": ",", ".tsv": "\t"}


def read_rows(path: str | os.PathLike[str], columns: Sequence[str] = (), *,
              header: Literal["required", "optional"] = "required",
              what: str = "table") -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line, row)`` for each row of a table, by its suffix: ``.csv`` (comma, quoted
    fields may span lines), ``.tsv`` (tab, no quoting: a ``"`` is a character) or
    ``.jsonl`` (one JSON object per line). ``line`` is the 1-based line the row starts on.

    A CSV / TSV row is ``{column: str}`` over the header's columns. ``header="required"``:
    the first non-blank line names the columns; ``"optional"``: it is a header only when it
    names every one of ``columns``, else every line is a row whose first ``len(columns)``
    fields are ``columns`` in order (further fields are ignored). A JSONL row is the object
    as it is. Blank lines are skipped; a UTF-8 byte-order mark (a spreadsheet's) is dropped.

    Every row holds every one of ``columns`` with a value that is not an empty or blank
    string. Each error is one ``ValueError`` naming ``path:line``: text that is not UTF-8,
    a header without a column of ``columns``, a row with another number of fields than the
    header, a line that is not a JSON object, a missing field, an empty value. ``what``
    names the file in the ``FileNotFoundError`` of a missing one (``"manifest not found:
    PATH"``).
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in TABLE_EXTENSIONS:
        raise ValueError(f"{path}: expected a {', '.join(TABLE_EXTENSIONS[:-1])} or "
                         f"{TABLE_EXTENSIONS[-1]} file")
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    with path.open("rb") as f:
        lines = _utf8_lines(f, path)
        rows = _json_rows(lines, path) if suffix == ".jsonl" else \
            _delimited_rows(lines, path, TABLE_DELIMITERS[suffix], columns, header)
        for line, row in rows:
            for c in columns:
                if c not in row:
                    raise ValueError(f"{path}:{line}: no {c!r} field (fields: "
                                     f"{sorted(row)[:10]})")
                if isinstance(row[c], str) and not row[c].strip():
                    raise ValueError(f"{path}:{line}: empty {c!r}")
            yield line, row


def _utf8_lines(f: Iterable[bytes], path: Path) -> Iterator[str]:
    """The lines of a binary file as text (line endings kept, as ``csv`` wants them)."""
    for n, raw in enumerate(f, start=1):
        try:
            yield raw.decode("utf-8-sig" if n == 1 else "utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"{path}:{n}: not UTF-8 text ({err.reason}: byte "
                             f"{raw[err.start:err.start + 1]!r} at column {err.start + 1})"
                             ) from None


def _json_rows(lines: Iterable[str], path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    for n, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{n}: not valid JSON ({err.msg} at column {err.colno})"
                             ) from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{n}: expected a JSON object, got {type(row).__name__}")
        yield n, row


def _delimited_rows(lines: Iterable[str], path: Path, delimiter: str, columns: Sequence[str],
                    header: str) -> Iterator[tuple[int, dict[str, str]]]:
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    reader = csv.reader(lines, delimiter=delimiter, quoting=quoting)
    records = _csv_records(reader, path)
    sep = "a tab" if delimiter == "\t" else repr(delimiter)
    line, first = 0, None
    for row in records:  # the first non-blank line
        if row and not (len(row) == 1 and not row[0].strip()):
            first = row
            break
        line = reader.line_num
    if first is None:
        if header == "required":
            raise ValueError(f"{path}:1: empty file, expected a header row naming the columns "
                             f"{list(columns)}")
        return
    start, line = line + 1, reader.line_num
    names = [c.strip() for c in first]
    if header == "required" or all(c in names for c in columns):
        missing = [c for c in columns if c not in names]
        if missing:
            what = " and ".join(repr(c) for c in missing)
            raise ValueError(f"{path}:{start}: no {what} column in the header {first} "
                             f"(expected columns {list(columns)})")
        width: int | None = len(names)
        pending: list[list[str]] = []
    else:
        names, width, pending = list(columns), None, [first]
        line = start - 1
    for row in _chain(pending, records):
        start = line + 1
        line = reader.line_num
        if not row or (len(row) == 1 and not row[0].strip()):
            continue  # a blank line
        if width is not None and len(row) != width:
            raise ValueError(f"{path}:{start}: {len(row)} fields, the header has {width}")
        if width is None and len(row) < len(names):
            raise ValueError(f"{path}:{start}: {len(row)} field(s), expected {len(names)} "
                             f"({', '.join(names)}) separated by {sep}")
        yield start, dict(zip(names, row, strict=False))


def _csv_records(reader: Any, path: Path) -> Iterator[list[str]]:
    """``reader``'s records, its errors (a field over ``csv.field_size_limit()``) named by
    the line where they stop."""
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            raise ValueError(f"{path}:{reader.line_num}: not a valid CSV row ({err})") from None
        yield row


def _chain(first: list[list[str]], rest: Iterable[list[str]]) -> Iterator[list[str]]:
    yield from first
    yield from rest


# ------------------------------------------------------------------------------ images

__all__ += [  # the one image reader
    "IMAGE_CHANNELS",
    "CorruptFileError",
    "check_image_header",
    "image_format",
    "image_to_channels",
    "read_image",
]

class CorruptFileError(ValueError):
    """A file that exists but cannot be decoded; the message names the file."""


IMAGE_CHANNELS = {1: "L", 3: "RGB", 4: "RGBA"}
"""The channel counts :func:`read_image` converts to, with PIL's name for each mode."""

_PNG = b"\x89PNG\r\n\x1a\n"
_FORMATS = "PNG, JPEG, GIF, WebP, BMP or TIFF"


def image_format(head: bytes) -> str | None:
    """``"png" | "jpeg" | "gif" | "webp" | "bmp" | "tiff"`` from the first bytes of a file
    (16 are enough), or None when they start none of these (the formats of
    :data:`IMAGE_EXTENSIONS`)."""
    if head.startswith(_PNG):
        return "png"
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "gif"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:2] == b"BM":
        return "bmp"
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    return None


def _not_an_image(head: bytes) -> str:
    if not head:
        return "the file is empty"
    return f"it starts with the bytes {head[:8]!r}, not those of a {_FORMATS} image"


def check_image_header(path: str | os.PathLike[str]) -> None:
    """Raise :class:`CorruptFileError` (the message of :func:`read_image`) when the file
    does not start like an image of :func:`image_format` (a cheap check: the first bytes,
    nothing decoded)."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as err:
        raise CorruptFileError(f"{path}: not a readable image (could not be read: "
                               f"{err.strerror or err})") from None
    if image_format(head) is None:
        raise CorruptFileError(f"{path}: not a readable image ({_not_an_image(head)})")


def read_image(source: Any, channels: int | None = 3, name: str | None = None
               ) -> torch.Tensor:
    """The one image reader: ``source`` (a path, the bytes of a file as ``bytes`` or a 1-D
    ``uint8`` tensor, or a PIL image) -> ``uint8`` ``(channels, H, W)``.

    * formats: PNG, JPEG, GIF (its first frame) and WebP decoded by ``torchvision.io``
      (the decoders release the GIL: data-loader threads run in parallel); BMP, TIFF, a
      palette PNG wanted with alpha and a WebP carrying EXIF by PIL. What a file is goes
      by its first bytes (:func:`image_format`), never by its name.
    * EXIF orientation is applied (a phone photo taken upright comes out upright), as
      PIL's ``ImageOps.exif_transpose`` does.
    * ``channels``: 3 (RGB), 1 (grey, ITU-R 601 luma) or 4 (RGBA), converted as PIL's
      ``Image.convert`` converts (:func:`image_to_channels`; 16-bit PNGs scaled to 8 bits);
      None keeps the file's own channels (1 to 4).
    * errors: ``FileNotFoundError`` for a path that does not exist; anything else that
      cannot be read or decoded is one :class:`CorruptFileError`, ``"<name>: not a
      readable image (<why>)"``, ``name`` defaulting to the path (``"image bytes"`` /
      ``"PIL image"`` for the others).
    """
    import torch

    if channels is not None and channels not in IMAGE_CHANNELS:
        raise ValueError(f"in_channels must be 1, 3 or 4, got {channels}")
    if _is_pil_image(source):
        image = _from_pil(source, name or "PIL image")
        return image_to_channels(image, channels or image.shape[0])
    if isinstance(source, (str, os.PathLike)):
        name = name or str(source)
        if not os.path.isfile(source):
            if not os.path.exists(source):
                raise FileNotFoundError(f"image file not found: {source}")
            raise CorruptFileError(f"{name}: not a readable image (it is not a file)")
        if os.path.getsize(source) == 0:
            raise CorruptFileError(f"{name}: not a readable image ({_not_an_image(b'')})")
        from torchvision.io import read_file

        try:
            data = read_file(str(source))
        except RuntimeError as err:
            raise CorruptFileError(f"{name}: not a readable image (could not be read: {err})"
                                   ) from None
    elif isinstance(source, (bytes, bytearray, memoryview)):
        name = name or "image bytes"
        if not len(source):
            raise CorruptFileError(f"{name}: not a readable image ({_not_an_image(b'')})")
        data = torch.frombuffer(bytearray(source), dtype=torch.uint8)
    elif isinstance(source, torch.Tensor) and source.dtype == torch.uint8 and source.ndim == 1:
        name, data = name or "image bytes", source
    else:
        raise TypeError(f"read_image reads a path, bytes or a PIL image, got "
                        f"{type(source).__name__}")
    image = _decode(data, channels, name)
    return image_to_channels(image, channels or image.shape[0])


def _decode(data: torch.Tensor, channels: int | None, name: str) -> torch.Tensor:
    """uint8 / uint16 ``(C, H, W)`` of the encoded bytes ``data``, EXIF orientation applied,
    in the channels asked for where the decoder converts itself (else as stored)."""
    from torchvision.io import ImageReadMode, decode_image

    head = bytes(data[:32].tolist())
    kind = image_format(head)
    if kind is None:
        raise CorruptFileError(f"{name}: not a readable image ({_not_an_image(head)})")
    # torchvision.io reads no BMP nor TIFF, turns palette PNGs into wrong RGBA (0.26) and
    # applies EXIF orientation to JPEG and PNG only: PIL for those
    webp_exif = kind == "webp" and head[12:16] == b"VP8X" and len(head) > 20 \
        and head[20] & 0x08
    palette_alpha = channels == 4 and kind == "png" and len(head) > 25 and head[25] == 3
    try:
        if kind in ("bmp", "tiff") or webp_exif or palette_alpha:
            return _decode_with_pil(data.numpy().tobytes(), name)
        mode = ImageReadMode.UNCHANGED if channels is None else \
            ImageReadMode[{1: "GRAY", 3: "RGB", 4: "RGB_ALPHA"}[channels]]
        if channels in (1, 4) and kind == "jpeg":
            # JPEG has no alpha (its 4 channels are CMYK); grey from colour is the luma of
            # the decoded RGB, as PIL's convert("L") (libjpeg's own grey output is its Y
            # plane before chroma upsampling: up to ~10 levels off on a small photo)
            mode = ImageReadMode.RGB
        image = decode_image(data, mode=mode, apply_exif_orientation=kind in ("png", "jpeg"))
    except (RuntimeError, OSError, ValueError, SyntaxError) as err:
        raise CorruptFileError(f"{name}: not a readable image ({_why(err)})") from None
    return image[0] if image.ndim == 4 else image  # an animated GIF: its first frame


def _why(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _is_pil_image(source: Any) -> bool:
    module = type(source).__module__
    if not module.startswith("PIL."):
        return False
    from PIL import Image

    return isinstance(source, Image.Image)


def _decode_with_pil(data: bytes, name: str) -> torch.Tensor:
    import io

    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            return _from_pil(im, name)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as err:
        raise CorruptFileError(f"{name}: not a readable image ({_why(err)})") from None


def _from_pil(im: Any, name: str) -> torch.Tensor:
    """uint8 ``(C, H, W)`` of a PIL image, EXIF orientation applied: grey / grey + alpha /
    RGBA kept, a palette as RGBA, anything else (CMYK, YCbCr, 16-bit ...) as RGB."""
    import numpy as np
    import torch
    from PIL import ImageOps

    try:
        im = ImageOps.exif_transpose(im)
        mode = {"L": "L", "LA": "LA", "RGBA": "RGBA", "P": "RGBA", "PA": "RGBA"}.get(
            im.mode, "RGB")
        array = np.asarray(im.convert(mode))
    except (OSError, ValueError, SyntaxError) as err:
        raise CorruptFileError(f"{name}: not a readable image ({_why(err)})") from None
    array = array[..., None] if array.ndim == 2 else array
    return torch.from_numpy(array.copy()).permute(2, 0, 1)


def image_to_channels(image: torch.Tensor, channels: int) -> torch.Tensor:
    """uint8/uint16 (C, H, W) with C in 1..4 -> uint8 (channels, H, W).

    16-bit values are scaled to 8 bits (``v * 255 / 65535``, rounded). Conversions follow
    PIL's ``Image.convert``: grey -> RGB copies the channel, RGB -> grey is ITU-R 601 luma
    (``0.299 R + 0.587 G + 0.114 B``), alpha is dropped when not wanted and set to 255 when
    wanted but absent.
    """
    import torch
    from torchvision.transforms.v2 import functional as TF

    if image.dtype == torch.uint16:
        image = (image.to(torch.int32) * 255 + 32767).div(65535, rounding_mode="floor")
        image = image.to(torch.uint8)
    elif image.dtype != torch.uint8:
        raise ValueError(f"expected a uint8 or uint16 image, got {image.dtype}")
    c = image.shape[0]
    if c == channels:
        return image
    colour = image[:1].expand(3, -1, -1) if c in (1, 2) else image[:3]
    if channels == 1:
        return image[:1].clone() if c in (1, 2) else TF.rgb_to_grayscale(colour)
    if channels == 3:
        return colour.contiguous()
    if channels == 4:
        alpha = image[-1:] if c in (2, 4) else torch.full_like(image[:1], 255)
        return torch.cat([colour, alpha])
    raise ValueError(f"in_channels must be 1, 3 or 4, got {channels}")
