"""The inputs of the pipelines: what ``embed`` / ``zero-shot`` / ``caption`` / ``transcribe``
read.

Inputs (:func:`collect_inputs`) are a folder, searched recursively in sorted order (images
``.png .jpg .jpeg .webp .bmp .gif .tif .tiff``, audio ``.wav .flac .ogg .mp3 .raw`` (``.raw``:
headerless 16 kHz 16-bit mono PCM), texts ``.txt``: one text per file; :mod:`multimodal.files`'
lists), a manifest (``.csv`` / ``.tsv`` / ``.jsonl`` with a ``path`` column, relative to the
manifest's folder, or a ``text`` column; an optional ``id`` column; read by
:func:`multimodal.files.read_rows`), a ``.txt`` manifest of one text per line, or a Python
list of paths (a folder among them gives its files) / strings. Every input has an id (its
path relative to the folder, the manifest's ``id``, or ``line N``) that travels with its
result, and a place (``file`` or ``manifest:line``) that every error about it names. An input
that cannot be read is an error naming it (:class:`UnreadableInput`), or, with
``skip_corrupt``, is left out (:class:`Skipped`), reported at the end and recorded in the
output.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from multimodal.convert.hf_preprocess import ImagePreprocessor
from multimodal.convert.hf_preprocess import data_image_preprocessor as _preprocessor_of
from multimodal.files import (
    IMAGE_EXTENSIONS,
    SPEECH_EXTENSIONS,
    TABLE_EXTENSIONS,
    TEXT_EXTENSIONS,
    CorruptFileError,
    read_image,
    read_rows,
)
from multimodal.tokenizers.audio import load_audio

if TYPE_CHECKING:
    from multimodal.encoder import Encoder

__all__ = ["InputItem", "Reader", "Skipped", "UnreadableInput", "check_kind", "collect_inputs",
           "item_kind", "measured_image_preprocessor", "read_batch"]


class UnreadableInput(ValueError):
    """An input that cannot be read; the message names it and why."""


@dataclass(frozen=True)
class InputItem:
    """One input: its ``id`` (kept with its result), a file ``path`` or a ``text``, and
    ``where`` it came from (what an error names)."""

    id: str
    where: str
    path: Path | None = None
    text: str | None = None


# ======================================================================================
# inputs
# ======================================================================================

def _kind_of_file(path: Path) -> str | None:
    suffix = path.suffix.lower()
    if suffix in IMAGE_EXTENSIONS:
        return "image"
    if suffix in SPEECH_EXTENSIONS:
        return "audio"
    if suffix in TEXT_EXTENSIONS:
        return "text"
    return None


def _folder_items(folder: Path, kinds: Sequence[str], relative: bool = True
                  ) -> list[InputItem]:
    """The files of the first of ``kinds`` that ``folder`` holds; ids relative to the folder
    (else the paths as they are: a folder among a list of inputs)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")
                   and _kind_of_file(p) is not None)
    found = {_kind_of_file(p) for p in files}
    for kind in kinds:  # the first kind the model reads that the folder holds
        if kind in found:
            return [InputItem(p.relative_to(folder).as_posix() if relative else str(p),
                              str(p), path=p)
                    for p in files if _kind_of_file(p) == kind]
    wanted = " or ".join({"image": "images (" + " ".join(IMAGE_EXTENSIONS) + ")",
                          "audio": "audio (" + " ".join(SPEECH_EXTENSIONS) + ")",
                          "text": "texts (.txt)"}[k] for k in kinds)
    raise ValueError(f"{folder} holds no {wanted}")


def _manifest_items(path: Path) -> list[InputItem]:
    if path.suffix.lower() == ".txt":  # one text per line
        lines = path.read_text(encoding="utf-8").splitlines()
        return [InputItem(f"line {n}", f"{path}:{n}", text=line)
                for n, line in enumerate(lines, 1) if line.strip()]
    items = []
    for n, row in read_rows(path, what="manifest"):
        where = f"{path}:{n}"
        if isinstance(row.get("text"), str) and row.get("path") in (None, ""):
            items.append(InputItem(str(row.get("id") or f"line {n}"), where, text=row["text"]))
        elif isinstance(row.get("path"), str) and row["path"]:
            file = Path(row["path"])
            file = file if file.is_absolute() else path.parent / file
            items.append(InputItem(str(row.get("id") or row["path"]), where, path=file))
        else:
            raise ValueError(f"{where}: a row needs a 'path' (a file) or a 'text' field, got "
                             f"fields {sorted(row)}")
    return items


def collect_inputs(inputs: Any, kinds: Sequence[str] = ("image", "audio", "text")
                   ) -> list[InputItem]:
    """The inputs of a folder, a manifest (``.csv`` / ``.tsv`` / ``.jsonl`` / ``.txt``), one
    image or audio file, or a list of paths / texts (see the module docstring); ``kinds``
    are what the model reads, in order of preference (a folder holding several kinds gives
    the first one it holds)."""
    if isinstance(inputs, (str, os.PathLike)):
        path = Path(inputs)
        if path.is_dir():
            items = _folder_items(path, kinds)
        elif path.is_file():
            if _kind_of_file(path) in ("image", "audio"):  # one file
                items = [InputItem(str(path), str(path), path=path)]
            elif path.suffix.lower() in (*TABLE_EXTENSIONS, *TEXT_EXTENSIONS):
                items = _manifest_items(path)
            else:
                raise ValueError(f"{path}: neither a manifest (.csv, .tsv, .jsonl, or .txt: one "
                                 "text per line) nor an image or audio file; give a folder "
                                 "for a set of files")
        else:
            raise FileNotFoundError(f"inputs {path} do not exist")
    elif isinstance(inputs, Sequence):
        items = []
        for i, x in enumerate(inputs):
            if isinstance(x, Path) or (isinstance(x, str) and "text" not in kinds):
                if Path(x).is_dir():
                    items.extend(_folder_items(Path(x), kinds, relative=False))
                else:  # a file that is missing or unreadable is named when it is read
                    items.append(InputItem(str(x), str(x), path=Path(x)))
            elif isinstance(x, str):
                items.append(InputItem(str(i), f"text {i}", text=x))
            else:
                raise ValueError(f"inputs[{i}] is a {type(x).__name__}: give file paths or "
                                 "strings")
    else:
        raise ValueError(f"inputs must be a folder, a manifest or a list, got "
                         f"{type(inputs).__name__}")
    if not items:
        raise ValueError(f"no inputs found in {inputs}")
    seen: dict[str, str] = {}
    for item in items:
        if item.id in seen:
            raise ValueError(f"input id {item.id!r} appears twice ({seen[item.id]} and "
                             f"{item.where}); ids must be unique")
        seen[item.id] = item.where
    return items


def item_kind(item: InputItem) -> str:
    return "text" if item.text is not None else (_kind_of_file(item.path) or "?")


def check_kind(items: Sequence[InputItem], kinds: Sequence[str], reader: str) -> str:
    """The kind of the inputs (that of the first), when ``reader`` (``"the model (ViT)"``)
    reads it; else an error naming the first input."""
    kind = item_kind(items[0])
    if kind not in kinds:
        raise ValueError(f"{items[0].where} is {'a text' if kind == 'text' else kind} but "
                         f"{reader} reads {' and '.join(kinds)}")
    return kind


@dataclass(frozen=True)
class Reader:
    """How files are read for a model: image ``channels`` (3 RGB, 1 grey) and the audio
    ``sample_rate`` clips are resampled to."""

    channels: int = 3
    sample_rate: int | None = None

    @classmethod
    def of(cls, encoder: Encoder) -> Reader:
        rate = getattr(encoder.backbone.config, "sample_rate", None)
        return cls(getattr(encoder.preprocessor, "channels", 3), rate)


def _read_item(item: InputItem, kind: str, reader: Reader) -> Any:
    """The loaded input: a text, a uint8 image (C, H, W) or a mono clip at the model's rate."""
    if kind == "text":
        if item.text is not None:
            return item.text
        try:
            return item.path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as err:
            raise UnreadableInput(f"{item.where}: cannot read as UTF-8 text ({err})") from None
    if item.path is None:
        raise UnreadableInput(f"{item.where}: expected a file path for {kind}, got a text")
    if not item.path.is_file():
        raise UnreadableInput(f"{item.where}: file {item.path} not found")
    if kind == "image":  # the reader fit's data modules use
        try:
            return read_image(item.path, reader.channels)
        except CorruptFileError as err:  # "<file>: not a readable image (...)"
            where = "" if item.where == str(item.path) else f"{item.where}: "
            raise UnreadableInput(f"{where}{err}") from None
    try:
        wave, rate = load_audio(item.path)
    except (ValueError, OSError, RuntimeError) as err:
        raise UnreadableInput(f"{item.where}: cannot read {item.path} as audio ({err})"
                              ) from None
    mono = wave.mean(dim=0)
    target = reader.sample_rate or rate
    if rate != target:
        from multimodal.deps import require

        torchaudio = require("torchaudio")

        mono = torchaudio.functional.resample(mono, rate, target)
    return mono


@dataclass
class Skipped:
    """Inputs left out with ``skip_corrupt``, and why."""

    items: list[tuple[str, str]] = field(default_factory=list)

    def add(self, item: InputItem, reason: str) -> None:
        self.items.append((item.id, reason))

    def report(self, stream: IO[str]) -> None:
        if self.items:
            print(f"skipped {len(self.items)} unreadable input(s):", file=stream)
            for _, reason in self.items:
                print(f"  {reason}", file=stream)


def read_batch(items: Sequence[InputItem], kind: str, reader: Reader, skip_corrupt: bool,
                skipped: Skipped) -> tuple[list[InputItem], list[Any]]:
    kept, values = [], []
    for item in items:
        try:
            values.append(_read_item(item, kind, reader))
        except UnreadableInput as err:
            if not skip_corrupt:
                raise
            skipped.add(item, str(err))
            continue
        kept.append(item)
    return kept, values


def measured_image_preprocessor(data_class: str | None, data_arguments: dict[str, Any],
                                path: Path, channels: int,
                                image_size: int | None = None) -> ImagePreprocessor:
    """The preprocessing of the run that wrote the checkpoint ``path`` when its arguments
    hold no ``mean`` / ``std``: its data module (``data_class(**data_arguments)``) measures
    them again on the training images (``setup("fit")``), and the one map
    :func:`~multimodal.convert.hf_preprocess.data_image_preprocessor` turns the module into
    the preprocessor (size, resize + centre crop, interpolation, the measured statistics);
    ``image_size`` (the model's) when the data keep the native size."""
    import importlib

    class_path = data_class or "multimodal.data.captions.CaptionDataModule"
    module, name = class_path.rsplit(".", 1)
    try:
        dm = getattr(importlib.import_module(module), name)(**data_arguments)
        dm.setup("fit")
        mean, std = dm.mean, dm.std
    except Exception as err:  # any failure becomes one clear message
        raise ValueError(f"{path}: the image normalisation is not in the checkpoint and "
                         f"its data module ({class_path}) could not measure it again ({err}); "
                         "give --image_size, --mean and --std") from None
    size = getattr(dm, "image_size", None) or image_size
    if not isinstance(size, int):
        raise ValueError(f"{path}: the image size is recorded neither by the data "
                         "module nor by the model; give --image_size")
    settings = {"image_size": size, "mean": mean, "std": std,
                "resize": getattr(dm, "resize", None),
                "interpolation": getattr(dm, "interpolation", None)}
    preprocessor = _preprocessor_of(settings, channels=channels)
    if preprocessor is None:
        raise ValueError(f"{path}: images of {channels} channel(s) have no preprocessor "
                         "(1 or 3)")
    return preprocessor


def __getattr__(name: str) -> Any:
    """``data_image_preprocessor`` (this module's name for :func:`measured_image_preprocessor`
    before the one map of data arguments moved to :mod:`multimodal.convert.hf_preprocess`),
    for one release."""
    if name == "data_image_preprocessor":
        import warnings

        warnings.warn("multimodal.pipelines.inputs.data_image_preprocessor(data_class, "
                      "data_arguments, path, channels) is deprecated and goes in 0.2: use "
                      "measured_image_preprocessor (same arguments), or "
                      "multimodal.convert.hf_preprocess.data_image_preprocessor(arguments)",
                      DeprecationWarning, stacklevel=2)
        return measured_image_preprocessor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
