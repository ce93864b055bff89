"""Generic readers of a user's own files: class-per-subfolder trees, CSV/JSONL manifests,
and the check that every image of a split decodes (by the one image reader,
:func:`multimodal.files.read_image`).

Nothing here knows a task or a model. A reader returns *file lists*: paths as one
:class:`PathArray` (UTF-8 bytes in one buffer, relative to a root, plus two offset arrays)
and labels as one int64 tensor, so a million-item manifest costs a few arrays, not a million
Python objects; manifests are parsed row by row without keeping each row's strings.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from multimodal.files import TABLE_EXTENSIONS, CorruptFileError, read_image, read_rows

__all__ = [
    "FileList",
    "PathArray",
    "PathArrayBuilder",
    "check_files_exist",
    "find_classes",
    "is_manifest",
    "read_labelled_manifest",
    "scan_class_folders",
    "undecodable_images",
]


class PathArray:
    """File paths stored compactly: ``root`` + each path's UTF-8 bytes in one ``uint8``
    buffer, found by ``starts`` / ``ends`` (int64). About ``len(relative path) + 16`` bytes
    a path, against ``4 * longest path`` for a numpy unicode array or ~100 for a Python
    string. A path that is absolute is stored whole (``root`` is not prefixed to it).

    Indexing with an int gives a ``str``; with an index array, a :class:`PathArray` sharing
    the buffer. Iterates as ``str``; ``tolist()`` gives a list of ``str``.
    """

    def __init__(self, data: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                 root: str = "") -> None:  # fmt: skip
        self.data, self.starts, self.ends, self.root = data, starts, ends, root

    @classmethod
    def from_strings(cls, paths: Iterable[str], root: str = "") -> PathArray:
        """Paths relative to ``root`` (a folder prefix ending in a separator, or "")."""
        builder = PathArrayBuilder(root)
        for path in paths:
            builder.append(path)
        return builder.build()

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index):
        if isinstance(index, (int, np.integer)):
            i = int(index)
            text = self.data[self.starts[i] : self.ends[i]].tobytes().decode("utf-8")
            return text if not self.root or os.path.isabs(text) else self.root + text
        index = np.asarray(index)
        return PathArray(self.data, self.starts[index], self.ends[index], self.root)

    def __iter__(self) -> Iterator[str]:
        return (self[i] for i in range(len(self)))

    def tolist(self) -> list[str]:
        return list(self)

    def __repr__(self) -> str:
        return f"PathArray({len(self)} paths under {self.root!r})"


class PathArrayBuilder:
    """Collects paths one at a time into a :class:`PathArray` (no Python string kept)."""

    def __init__(self, root: str = "") -> None:
        self.root, self.data, self.ends = root, bytearray(), array("q")

    def append(self, path: str) -> None:
        self.data += path.encode("utf-8")
        self.ends.append(len(self.data))

    def __len__(self) -> int:
        return len(self.ends)

    def build(self) -> PathArray:
        # the arrays take over the builder's buffers (no copy)
        ends = np.frombuffer(self.ends, dtype=np.int64) if self.ends else np.zeros(
            0, dtype=np.int64)
        starts = np.concatenate([np.zeros(1, dtype=np.int64), ends[:-1]])[: len(ends)]
        data = np.frombuffer(self.data, dtype=np.uint8) if self.data else np.zeros(
            0, dtype=np.uint8)
        self.data, self.ends = bytearray(), array("q")
        return PathArray(data, starts, ends, self.root)


@dataclass(frozen=True)
class FileList:
    """Files of one split: ``paths`` (:class:`PathArray`), ``labels`` (int64 or None)."""

    paths: PathArray
    labels: torch.Tensor | None
    class_names: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.paths)

    def subset(self, index: torch.Tensor) -> FileList:
        idx = index.numpy()
        labels = None if self.labels is None else self.labels[index]
        return FileList(self.paths[idx], labels, self.class_names)


# ----------------------------------------------------------------------- class folders


def find_classes(root: str | os.PathLike) -> tuple[str, ...]:
    """Subfolder names of ``root``, sorted as torchvision's ``ImageFolder`` sorts them
    (plain ``sorted``), so class indices match it. A hidden subfolder (``.ipynb_checkpoints``)
    would silently become a class there; here it is an error."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"class folder root not found: {root}")
    names = sorted(e.name for e in os.scandir(root) if e.is_dir())
    hidden = [n for n in names if n.startswith(".")]
    if hidden:
        raise ValueError(f"{root}: hidden class folder(s) {hidden}; remove or rename them")
    if not names:
        raise ValueError(f"{root}: no class subfolders (expected root/<class>/<file>)")
    return tuple(names)


def scan_class_folders(
    root: str | os.PathLike,
    extensions: Sequence[str],
    class_names: Sequence[str] | None = None,
) -> FileList:
    """All files under ``root/<class>/`` (recursively) whose suffix is in ``extensions``.

    Order and class indices match ``torchvision.datasets.ImageFolder``: classes sorted,
    files sorted by path within each class. ``class_names`` (e.g. the training split's)
    fixes the index of each class; a folder not in it is an error, and so is a class folder
    with no matching file.
    """
    root = Path(root)
    found = find_classes(root)
    names = tuple(class_names) if class_names is not None else found
    unknown = [c for c in found if c not in names]
    if unknown:
        raise ValueError(
            f"{root}: class folder(s) {unknown[:5]} not in the class list {list(names)[:20]}"
        )
    exts = tuple(e.lower() for e in extensions)
    paths = PathArrayBuilder()
    labels = array("q")
    index = {c: i for i, c in enumerate(names)}
    for cls in found:
        files = [  # the walk order of torchvision's make_dataset
            os.path.join(dirpath, f)
            for dirpath, _, filenames in sorted(os.walk(root / cls, followlinks=True))
            for f in sorted(filenames)
            if f.lower().endswith(exts) and not f.startswith(".")
        ]
        if not files:
            raise ValueError(
                f"empty class folder {root / cls}: no file ending in {', '.join(exts)}"
            )
        for f in files:
            paths.append(f)
        labels.extend([index[cls]] * len(files))
    return FileList(paths.build(), torch.frombuffer(labels, dtype=torch.int64).clone(), names)


# ---------------------------------------------------------------------------- manifests


def is_manifest(path: str | os.PathLike) -> bool:
    """A ``.csv`` / ``.tsv`` / ``.jsonl`` manifest (read by :func:`multimodal.files.read_rows`),
    not a folder."""
    return Path(path).suffix.lower() in TABLE_EXTENSIONS


def read_labelled_manifest(
    path: str | os.PathLike,
    class_names: Sequence[str] | None = None,
    path_key: str = "path",
    label_key: str = "label",
    check_files: bool = True,
) -> FileList:
    """A ``path,label`` manifest (``.csv`` / ``.tsv`` with a header, or ``.jsonl``); paths
    relative to the manifest's folder.

    Without ``class_names`` the classes are the sorted distinct labels. Every file must
    exist: the error names the first missing one and how many are missing. A label not in
    ``class_names`` is an error naming it and the line of its first row.
    """
    path = Path(path)
    root = "" if str(path.parent) == "." else str(path.parent) + os.sep
    paths = PathArrayBuilder(root)
    seen: dict[str, int] = {}  # label -> order of first appearance
    first_line: dict[str, int] = {}  # label -> line of its first row
    label_ids = array("q")
    for line, row in read_rows(path, (path_key, label_key), what="manifest"):
        rel = os.path.normpath(str(row[path_key]))
        paths.append(rel)
        label = str(row[label_key])
        if label not in seen:
            seen[label], first_line[label] = len(seen), line
        label_ids.append(seen[label])
    if not len(paths):
        raise ValueError(f"{path}: manifest has no rows")
    names = tuple(class_names) if class_names is not None else tuple(sorted(seen))
    index = {c: i for i, c in enumerate(names)}
    bad = next((lab for lab in seen if lab not in index), None)
    if bad is not None:
        raise ValueError(f"{path}:{first_line[bad]}: label {bad!r} is not in the class list "
                         f"{list(names)[:20]}")
    array_ = paths.build()
    ids = torch.frombuffer(label_ids, dtype=torch.int64).clone()
    del label_ids
    remap = torch.tensor([index[lab] for lab in seen], dtype=torch.int64)
    if check_files:
        check_files_exist(array_, str(path))
    return FileList(array_, remap[ids], names)


def check_files_exist(paths: Iterable[str], where: str) -> None:
    """Raise FileNotFoundError naming the first missing file and how many are missing."""
    first, missing, total = None, 0, 0
    for p in paths:
        total += 1
        if not os.path.isfile(p):
            missing += 1
            first = first or p
    if missing:
        raise FileNotFoundError(
            f"{where}: {missing} of {total} files are missing, the first is {first}"
        )


# ------------------------------------------------------------------------------ images


def undecodable_images(paths: Iterable[str], channels: int,
                       threads: int | None = None) -> list[tuple[int, CorruptFileError]]:
    """``(index, error)`` of every file among ``paths`` that
    :func:`multimodal.files.read_image` cannot read, in order: each file read and decoded
    once, on ``threads`` threads (default: the machine's cores; the decoders release the
    GIL). What ``fit`` runs before its first step, so a broken file is named then, not in
    the test after training."""
    from concurrent.futures import ThreadPoolExecutor

    def check(item: tuple[int, str]) -> tuple[int, CorruptFileError] | None:
        try:
            read_image(item[1], channels)
        except CorruptFileError as err:
            return item[0], err
        return None

    with ThreadPoolExecutor(max_workers=threads or os.cpu_count() or 1) as pool:
        return [bad for bad in pool.map(check, enumerate(paths)) if bad is not None]
