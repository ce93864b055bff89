"""Your own labelled texts and text pairs, read row by row with the place of every row kept.

Labelled texts (text classification), one of:

* a ``.csv`` (or ``.tsv``) with a header naming a ``text`` and a ``label`` column;
* a ``.jsonl`` file, one object per line with ``text`` and ``label`` fields;
* a folder with one subfolder of ``.txt`` files per class (``root/<class>/<file>.txt``,
  searched recursively; one file = one text; classes sorted by name, as torchvision's
  ``ImageFolder``).

Labels are class names or integer class ids: when every training label is an integer (a
JSON integer, or a CSV cell such as ``"3"``) the label *is* the class index, else labels are
names, sorted. A folder's labels are always names.

Text pairs (sequence to sequence), one of:

* a ``.tsv`` file: ``source<TAB>target`` per line; the first line is a header when it names
  a ``source`` and a ``target`` column (other columns are then ignored), else every line is a
  pair and columns after the second are ignored (the layout of Tatoeba-style exports);
* a ``.csv`` with a header naming ``source`` and ``target``;
* a ``.jsonl`` file with ``source`` and ``target`` fields.

Errors name the file and the line (``data.csv:17: ...``): a missing ``text`` / ``label``
column or field, a row with the wrong number of fields, text that is not UTF-8, an empty
text, a label that is neither a name nor an integer, a negative class id, an empty class
folder, an empty file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from multimodal.data.readers import scan_class_folders
from multimodal.files import TABLE_EXTENSIONS, read_rows

__all__ = [
    "LabelledTexts",
    "TextPairs",
    "encode_labels",
    "read_labelled_texts",
    "read_predict_texts",
    "read_text_pairs",
    "resolve_classes",
]

_INTEGER = re.compile(r"[+-]?\d+")


@dataclass(frozen=True)
class LabelledTexts:
    """Texts, their labels as read (``str``, or ``int`` from JSON) and where each row is
    (``file:line`` or the ``.txt`` file). ``names_only``: labels are class names whatever
    they look like (a folder's subfolder names)."""

    texts: list[str]
    labels: list[str | int]
    where: list[str]
    source: str
    names_only: bool = False

    def __len__(self) -> int:
        return len(self.texts)

    def subset(self, index: Sequence[int]) -> LabelledTexts:
        return LabelledTexts([self.texts[i] for i in index], [self.labels[i] for i in index],
                             [self.where[i] for i in index], self.source, self.names_only)


@dataclass(frozen=True)
class TextPairs:
    """Sources, targets and where each pair is (``file:line``)."""

    sources: list[str]
    targets: list[str]
    where: list[str]
    source: str

    def __len__(self) -> int:
        return len(self.sources)

    def subset(self, index: Sequence[int]) -> TextPairs:
        return TextPairs([self.sources[i] for i in index], [self.targets[i] for i in index],
                         [self.where[i] for i in index], self.source)


# --------------------------------------------------------------------------- row readers


def _rows(path: Path, columns: Sequence[str],
          header: Literal["required", "optional"] = "required"
          ) -> Iterator[tuple[int, dict]]:  # fmt: skip
    """The rows of a ``.csv`` / ``.tsv`` / ``.jsonl`` file (:func:`multimodal.files.read_rows`)."""
    if path.suffix.lower() not in TABLE_EXTENSIONS:
        raise ValueError(f"{path}: expected a .csv, .tsv or .jsonl file or a folder")
    return read_rows(path, columns, header=header, what="text data")


def _text(value: object, where: str, key: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where}: {key!r} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise ValueError(f"{where}: empty {key!r}")
    return value


def _label(value: object, where: str, key: str) -> str | int:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"{where}: {key!r} must be a class name or an integer class id, "
                         f"got {value!r}")
    if isinstance(value, str) and not value.strip():
        raise ValueError(f"{where}: empty {key!r}")
    return value.strip() if isinstance(value, str) else value


# --------------------------------------------------------------------------- public readers


def read_labelled_texts(source: str | os.PathLike, text_key: str = "text",
                        label_key: str = "label") -> LabelledTexts:
    """The labelled texts of a ``.csv`` / ``.tsv`` / ``.jsonl`` file or a class-per-subfolder
    folder of ``.txt`` files (see the module docstring)."""
    path = Path(source)
    if path.is_dir():
        return _read_folder(path)
    texts: list[str] = []
    labels: list[str | int] = []
    where: list[str] = []
    for line, row in _rows(path, (text_key, label_key)):
        at = f"{path}:{line}"
        texts.append(_text(row[text_key], at, text_key))
        labels.append(_label(row[label_key], at, label_key))
        where.append(at)
    if not texts:
        raise ValueError(f"{path} holds no labelled text")
    return LabelledTexts(texts, labels, where, str(path))


def _read_folder(root: Path) -> LabelledTexts:
    files = scan_class_folders(root, (".txt",))  # empty / hidden class folders: errors
    texts, labels, where = [], [], []
    for file, label in zip(files.paths, files.labels.tolist(), strict=True):  # type: ignore[union-attr]
        try:
            text = Path(file).read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"{file} is not UTF-8 text: {err}") from err
        if not text.strip():
            raise ValueError(f"{file} holds no text")
        texts.append(text.strip())
        labels.append(files.class_names[label])
        where.append(str(file))
    return LabelledTexts(texts, labels, where, str(root), names_only=True)


def read_text_pairs(source: str | os.PathLike, source_key: str = "source",
                    target_key: str = "target") -> TextPairs:
    """The ``(source, target)`` pairs of a ``.tsv`` / ``.csv`` / ``.jsonl`` file (see the
    module docstring)."""
    path = Path(source)
    if path.is_dir():
        raise ValueError(f"{path} is a folder: text pairs are a .tsv, .csv or .jsonl file")
    header = "optional" if path.suffix.lower() == ".tsv" else "required"
    sources, targets, where = [], [], []
    for line, row in _rows(path, (source_key, target_key), header):
        at = f"{path}:{line}"
        sources.append(_text(row[source_key], at, source_key))
        targets.append(_text(row[target_key], at, target_key))
        where.append(at)
    if not sources:
        raise ValueError(f"{path} holds no text pairs")
    return TextPairs(sources, targets, where, str(path))


# --------------------------------------------------------------------------------- labels


def _as_int(label: str | int) -> int | None:
    if isinstance(label, int):
        return label
    return int(label) if _INTEGER.fullmatch(label) else None


def resolve_classes(train: LabelledTexts, classes: Sequence[str] | None = None
                    ) -> tuple[list[str], bool]:  # fmt: skip
    """``(class names, integer labels?)`` of the training texts.

    Integer labels (every one an integer, not a folder): class ``i`` is label ``i``; there
    are ``max + 1`` classes named ``"0" ...`` unless ``classes`` names them (then labels must
    be below ``len(classes)``). Names: ``classes`` in its order, else the sorted labels.
    """
    ints = None if train.names_only else [_as_int(lab) for lab in train.labels]
    if ints is not None and all(i is not None for i in ints):
        for i, at in zip(ints, train.where, strict=True):
            if i < 0:  # type: ignore[operator]
                raise ValueError(f"{at}: class id {i} is negative (ids are 0, 1, ...)")
        n = max(ints) + 1  # type: ignore[type-var,operator]
        if classes is not None:
            if n > len(classes):
                at = train.where[ints.index(n - 1)]
                raise ValueError(f"{at}: class id {n - 1} but classes names only "
                                 f"{len(classes)} classes")
            return list(classes), True
        return [str(i) for i in range(n)], True
    names = [str(lab) for lab in train.labels]
    if classes is None:
        return sorted(set(names)), False
    known = set(classes)
    for name, at in zip(names, train.where, strict=True):
        if name not in known:
            raise ValueError(f"{at}: label {name!r} is not in classes {list(classes)[:20]}")
    return list(classes), False


def encode_labels(data: LabelledTexts, class_names: Sequence[str], integer: bool,
                  allowed: set[int] | None = None, split: str = "train") -> list[int]:
    """Class indices of ``data``'s labels. ``allowed``: the indices the training data
    holds; a label outside them is an error naming where it is (a label never seen in
    training cannot be learnt, and its accuracy would be silently 0)."""
    index = {c: i for i, c in enumerate(class_names)}
    out = []
    for label, at in zip(data.labels, data.where, strict=True):
        if integer:
            value = None if data.names_only else _as_int(label)
            if value is None:
                raise ValueError(f"{at}: label {label!r} is not an integer class id, but the "
                                 f"training labels are")
            ok = 0 <= value < len(class_names)
        else:
            value = index.get(str(label), -1)
            ok = value >= 0
        if not ok or (allowed is not None and value not in allowed):
            shown = label if integer else str(label)
            raise ValueError(f"{at}: the {split} label {shown!r} never appears in the "
                             f"training data (classes: {list(class_names)[:20]})")
        out.append(value)
    return out


def read_predict_texts(source: str | os.PathLike, text_key: str = "text"
                       ) -> tuple[list[str], list[str]]:  # fmt: skip
    """``(texts, names)`` to classify: a ``.txt`` file (one text per non-empty line, named
    ``file:line``), a ``.csv`` / ``.tsv`` / ``.jsonl`` with a ``text`` column (``file:line``),
    or a folder of ``.txt`` files (one text each, named by the file)."""
    path = Path(source)
    texts, names = [], []
    if path.is_dir():
        for file in sorted(p for p in path.rglob("*.txt") if not p.name.startswith(".")):
            try:
                text = file.read_text(encoding="utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(f"{file} is not UTF-8 text: {err}") from err
            texts.append(_text(text, str(file), "text").strip())
            names.append(str(file.relative_to(path)))
    elif path.suffix.lower() == ".txt":
        if not path.is_file():
            raise FileNotFoundError(f"text to predict not found: {path}")
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as err:
            raise ValueError(f"{path} is not UTF-8 text: {err}") from err
        for n, line in enumerate(lines, start=1):
            if line.strip():
                texts.append(line.strip())
                names.append(f"{path}:{n}")
    else:
        for n, row in _rows(path, (text_key,)):
            texts.append(_text(row[text_key], f"{path}:{n}", text_key))
            names.append(f"{path}:{n}")
    if not texts:
        raise ValueError(f"{path} holds no text to predict")
    return texts, names
