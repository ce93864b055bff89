"""Readers of your own files, one module per kind (DESIGN.md: ``data/`` holds the data
modules, the readers of your own files and the shards):

* :mod:`~multimodal.data.readers.file_lists`: class-per-subfolder trees and ``path,label``
  manifests as compact file lists (:class:`PathArray`, :class:`FileList`), the check that
  every image of a split decodes;
* :mod:`~multimodal.data.readers.audio`: labelled recordings (headers checked up front,
  decoding into clips, their shard encoder / decoder);
* :mod:`~multimodal.data.readers.text`: ``.txt`` / JSONL texts as documents;
* :mod:`~multimodal.data.readers.captions`: caption manifests and COCO captions JSON.

Images are decoded by the package's one image reader, :func:`multimodal.files.read_image`
(``CorruptFileError`` and ``image_to_channels`` are that module's, gathered here as
before). The names below are importable from ``multimodal.data.readers`` as they were when
it was one module; ``decode_image_file`` / ``decode_image_bytes`` answer with a
``DeprecationWarning`` naming ``read_image``.
"""

from __future__ import annotations

import warnings
from typing import Any

from multimodal.data.readers.file_lists import (
    FileList,
    PathArray,
    PathArrayBuilder,
    check_files_exist,
    find_classes,
    is_manifest,
    read_labelled_manifest,
    scan_class_folders,
    undecodable_images,
)
from multimodal.files import CorruptFileError, image_to_channels, read_image

__all__ = [
    "CorruptFileError",
    "FileList",
    "PathArray",
    "PathArrayBuilder",
    "check_files_exist",
    "find_classes",
    "image_to_channels",
    "is_manifest",
    "read_image",
    "read_labelled_manifest",
    "scan_class_folders",
    "undecodable_images",
]

_DEPRECATED = {"decode_image_file": "read_image(path, channels)",
               "decode_image_bytes": "read_image(data, channels, name)"}


def __getattr__(name: str) -> Any:
    """The decoders this module had before the one image reader, for one release."""
    if name in _DEPRECATED:
        warnings.warn(f"multimodal.data.readers.{name} is deprecated and goes in 0.2: use "
                      f"multimodal.files.{_DEPRECATED[name]}", DeprecationWarning, stacklevel=2)
        return read_image
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
