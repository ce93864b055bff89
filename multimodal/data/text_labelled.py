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

import csv
import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from multimodal.data.readers import scan_class_folders

__all__ = [
    "LabelledTexts",
    "TextPairs",
    "encode_labels",
    "read_labelled_texts",
    "read_predict_texts",
    "read_text_pairs",
    "resolve_classes",
]

TABLE_SUFFIXES = {".csv": ",", ".tsv": "\t"}
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


def _open_text(path: Path):
    if not path.is_file():
        raise FileNotFoundError(f"text data not found: {path}")
    return open(path, newline="", encoding="utf-8-sig")  # a spreadsheet's BOM is dropped


def _utf8(path: Path, read):
    try:
        yield from read()
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text: {err}") from err


def _table_rows(path: Path, columns: Sequence[str], header: str = "required"
                ) -> Iterator[tuple[int, dict[str, str]]]:  # fmt: skip
    """``(line, {column: value})`` of a CSV / TSV. ``header``: ``"required"`` (the first
    row names the columns), or ``"optional"`` (a header only when it names every column;
    else the columns are the first ``len(columns)`` fields, in order)."""
    delimiter = TABLE_SUFFIXES[path.suffix.lower()]
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL

    def read() -> Iterator[tuple[int, dict[str, str]]]:
        with _open_text(path) as f:
            reader = csv.reader(f, delimiter=delimiter, quoting=quoting)
            first = next(reader, None)
            if first is None:
                raise ValueError(f"{path} is empty")
            has_header = header == "required" or all(c in first for c in columns)
            if header == "required":
                missing = [c for c in columns if c not in first]
                if missing:
                    what = " and ".join(repr(c) for c in missing)
                    raise ValueError(f"{path}: no {what} column in the header {first} "
                                     f"(expected columns {list(columns)})")
            if has_header:
                index = {c: first.index(c) for c in columns}
                width = len(first)
                rows: Iterator[list[str]] = reader
            else:
                index = {c: i for i, c in enumerate(columns)}
                width = None
                rows = _chain_first(first, reader)
            line = reader.line_num if has_header else 0
            for row in rows:
                start = line + 1
                line = reader.line_num
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue  # a blank line
                if width is not None and len(row) != width:
                    raise ValueError(f"{path}:{start}: {len(row)} fields, the header has "
                                     f"{width}")
                if width is None and len(row) < len(columns):
                    raise ValueError(f"{path}:{start}: {len(row)} field(s), expected "
                                     f"{len(columns)} ({', '.join(columns)}) separated by "
                                     f"{'a tab' if delimiter == chr(9) else repr(delimiter)}")
                yield start, {c: row[i] for c, i in index.items()}

    yield from _utf8(path, read)


def _chain_first(first: list[str], rest: Iterator[list[str]]) -> Iterator[list[str]]:
    yield first
    yield from rest


def _jsonl_rows(path: Path, columns: Sequence[str]) -> Iterator[tuple[int, dict]]:
    def read() -> Iterator[tuple[int, dict]]:
        with _open_text(path) as f:
            for line, text in enumerate(f, start=1):
                if not text.strip():
                    continue
                try:
                    row = json.loads(text)
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}:{line}: not valid JSON ({err.msg})") from err
                if not isinstance(row, dict):
                    raise ValueError(f"{path}:{line}: expected a JSON object, got "
                                     f"{type(row).__name__}")
                missing = [c for c in columns if c not in row]
                if missing:
                    what = " and ".join(repr(c) for c in missing)
                    raise ValueError(f"{path}:{line}: no {what} field (fields: "
                                     f"{sorted(row)[:10]})")
                yield line, row

    yield from _utf8(path, read)


def _rows(path: Path, columns: Sequence[str], header: str = "required"
          ) -> Iterator[tuple[int, dict]]:  # fmt: skip
    suffix = path.suffix.lower()
    if suffix in TABLE_SUFFIXES:
        return _table_rows(path, columns, header)
    if suffix == ".jsonl":
        return _jsonl_rows(path, columns)
    raise ValueError(f"{path}: expected a .csv, .tsv or .jsonl file or a folder")


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
