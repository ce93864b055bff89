"""A GGUF file's bytes: the header and metadata read by hand (no memory map of the
tensor data), ``gguf.GGUFReader`` opened with errors that name the file and the problem,
:func:`read_gguf_metadata`."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from multimodal.files import GGUF_MAGIC


def _gguf_extent(path: Path) -> int:
    """The byte count the header says the file has (its tensor data included), read by
    :class:`_HeaderReader`; raises ``EOFError`` where the header itself ends early. Used
    only to explain why ``gguf.GGUFReader`` could not read a file."""
    reader = _HeaderReader(path, check_size=False)
    return max((t.data_offset + t.n_bytes for t in reader.tensors), default=0)


def open_gguf(path: str | os.PathLike) -> Any:
    """A ``gguf.GGUFReader`` of ``path`` (memory-mapped), with errors that name the file
    and the problem: absent, not GGUF, truncated (bytes expected vs present), corrupt."""
    try:
        import gguf
    except ImportError as err:
        raise ImportError("reading a GGUF file needs the gguf package "
                          "(pip install gguf)") from err
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a folder, not a GGUF file")
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} does not exist")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ValueError(f"{path} is not a GGUF file: it starts with {magic!r}, not {GGUF_MAGIC!r}")
    try:
        return gguf.GGUFReader(path)
    except Exception as err:  # the reader's own errors are numpy reshape / index errors
        size = path.stat().st_size
        try:
            expected = _gguf_extent(path)
        except EOFError as why:
            raise ValueError(f"{path} is truncated: {why}; the file has {size} bytes") from None
        except Exception:
            expected = None
        if expected is not None and expected > size:
            raise ValueError(f"{path} is truncated: its header describes {expected} bytes of "
                             f"header and tensor data, the file has {size}") from None
        raise ValueError(f"{path} is not a readable GGUF file "
                         f"({type(err).__name__}: {err})") from None


class _LightField:
    """A metadata value as :class:`_HeaderReader` holds it (``contents()`` as gguf's)."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.data = value if isinstance(value, list) else [value]

    def contents(self) -> Any:
        return self.value


class _LightTensor:
    """A tensor's header entry; ``data`` read from the file on demand, in the shapes
    ``gguf.GGUFReader`` gives (float types: numpy dims; others: uint8 rows of bytes)."""

    def __init__(self, path: Path, name: str, kind: int, dims: list[int], offset: int) -> None:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        self.path, self.name = path, name
        self.tensor_type = GGMLQuantizationType(kind)
        self.shape = np.array(dims, dtype=np.uint64)
        self.n_elements = int(np.prod(dims))
        block, size = GGML_QUANT_SIZES[self.tensor_type]
        self.n_bytes = self.n_elements * size // block
        self.data_offset = offset

    @property
    def data(self) -> np.ndarray:
        dims = tuple(int(d) for d in reversed(self.shape.tolist()))
        if self.tensor_type.name in ("F32", "F16"):
            dtype = np.float32 if self.tensor_type.name == "F32" else np.float16
            return np.fromfile(self.path, dtype=dtype, count=self.n_elements,
                               offset=self.data_offset).reshape(dims)
        raw = np.fromfile(self.path, dtype=np.uint8, count=self.n_bytes, offset=self.data_offset)
        return raw.reshape(*dims[:-1], -1)


# GGUF metadata value types -> struct formats (8: string, 9: array)
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                 10: "<Q", 11: "<q", 12: "<d"}


class _HeaderReader:
    """The header of a GGUF file as plain Python values (``fields`` / ``tensors`` as
    ``gguf.GGUFReader`` names them), read in one pass without a memory map. gguf's reader
    keeps a numpy view per array element (~145 MB for SmolLM2's 49k-token vocabulary, more
    than the 94 MB file): the packed path reads the header with this instead, so loading
    stays within 1.5x the file size (tests/convert/test_gguf_quant.py checks both readers
    agree). ``check_size``: tensor data past the end of the file is an ``EOFError``.
    """

    def __init__(self, path: Path, check_size: bool = True) -> None:
        import io

        with path.open("rb") as raw:
            f = io.BufferedReader(raw, buffer_size=1 << 20)

            def take(fmt: str) -> Any:
                size = struct.calcsize(fmt)
                chunk = f.read(size)
                if len(chunk) != size:
                    raise EOFError("the header ends early")
                return struct.unpack(fmt, chunk)[0]

            def string() -> str:
                n = take("<Q")
                chunk = f.read(n)
                if len(chunk) != n:
                    raise EOFError("the header ends early")
                return chunk.decode("utf-8")

            def value(kind: int) -> Any:
                if kind == 8:
                    return string()
                if kind == 9:
                    inner, count = take("<I"), take("<Q")
                    if inner in _GGUF_SCALARS:
                        fmt = _GGUF_SCALARS[inner]
                        size = struct.calcsize(fmt)
                        chunk = f.read(size * count)
                        if len(chunk) != size * count:
                            raise EOFError("the header ends early")
                        return list(struct.unpack(f"<{count}{fmt[1]}", chunk))
                    return [value(inner) for _ in range(count)]
                return take(_GGUF_SCALARS[kind])

            if f.read(4) != GGUF_MAGIC:
                raise ValueError("not a GGUF file")
            take("<I")
            n_tensors, n_kv = take("<Q"), take("<Q")
            self.fields: dict[str, _LightField] = {}
            for _ in range(n_kv):
                key = string()
                self.fields[key] = _LightField(value(take("<I")))
            infos = []
            for _ in range(n_tensors):
                name = string()
                dims = [take("<Q") for _ in range(take("<I"))]
                infos.append((name, dims, take("<I"), take("<Q")))
            alignment = int(self.fields.get("general.alignment", _LightField(32)).value)
            start = -(-f.tell() // alignment) * alignment
        self.tensors = [_LightTensor(path, name, kind, dims, start + offset)
                        for name, dims, kind, offset in infos]
        size = path.stat().st_size
        if check_size and any(t.data_offset + t.n_bytes > size for t in self.tensors):
            raise EOFError("tensor data past the end of the file")


def open_header(path: str | os.PathLike) -> Any:
    """:class:`_HeaderReader` of ``path``; any problem is reported by :func:`open_gguf`'s
    checks (the same one-line errors as the float path)."""
    path = Path(path)
    try:
        return _HeaderReader(path)
    except Exception:
        return open_gguf(path)


def field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def read_gguf_metadata(path: str | os.PathLike, arrays: bool = False) -> dict[str, Any]:
    """The key/value metadata of a GGUF file as Python values (arrays such as
    ``tokenizer.ggml.tokens`` shortened to their length unless ``arrays=True``)."""
    reader = open_gguf(path)
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        if not arrays and len(field.data) > 1:
            out[key] = f"<array of {len(field.data)}>"
        else:
            out[key] = field.contents()
    return out
