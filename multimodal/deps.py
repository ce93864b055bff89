"""The compiled companions of torch, imported where they are used and named when they break.

torchaudio and torchvision ship C libraries built against one torch release each. A pair
that does not match fails deep inside the import (``undefined symbol:
torch_exception_get_what_without_backtrace``, ``operator torchvision::nms does not exist``),
which says nothing about the fix. :func:`require` imports such a package and turns that
failure into one line naming the versions and the fix::

    torchaudio 2.11.1 does not match torch 2.11.0 (its C library fails to load);
    install torchaudio==2.11.0 or run make install

:func:`explain_broken_import` does the same for an exception raised anywhere below an
import of one of them (the CLI's error guard asks it). Audio modules call
``require("torchaudio")`` inside the functions that need it, so an image or text job never
imports torchaudio (DESIGN.md, Dependencies).

Nothing here imports torch at module level: the CLI's ``--help`` stays fast.
"""

from __future__ import annotations

import importlib
import re
import sys
import traceback
from importlib import metadata
from types import ModuleType

__all__ = ["BrokenCompanionError", "expected_version", "explain_broken_import", "require"]

COMPANIONS = ("torchaudio", "torchvision")
"""Packages whose compiled library must match the installed torch release."""


class BrokenCompanionError(ImportError):
    """A torch companion (torchaudio, torchvision) whose compiled library does not load
    against the installed torch; the message names both versions and the fix."""


def _installed(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, int, int]:
    """``"2.11.0+cu130"`` -> ``(2, 11, 0)``."""
    parts = [int(p) for p in re.findall(r"\d+", version.split("+")[0])[:3]]
    return tuple(parts + [0] * (3 - len(parts)))  # type: ignore[return-value]


def expected_version(package: str, torch_version: str) -> str:
    """The companion release built for ``torch_version``: torchaudio shares torch's
    number (2.11.0 -> 2.11.0), torchvision is ``0.(minor + 15).patch`` (2.11.0 -> 0.26.0)."""
    major, minor, patch = _release(torch_version)
    if package == "torchaudio":
        return f"{major}.{minor}.{patch}"
    if package == "torchvision":
        return f"0.{minor + 15}.{patch}"
    raise ValueError(f"{package!r} is not a torch companion ({', '.join(COMPANIONS)})")


def broken_pair_message(package: str) -> str:
    """The one line for a companion that failed to load against the installed torch."""
    torch_version = _installed("torch") or "?"
    have = _installed(package) or "?"
    want = expected_version(package, torch_version) if torch_version != "?" else "?"
    return (f"{package} {have} does not match torch {torch_version.split('+')[0]} (its C "
            f"library fails to load); install {package}=={want} or run make install")


def require(package: str) -> ModuleType:
    """Import a torch companion, or raise :class:`BrokenCompanionError` with one line saying
    which versions clash and what to install (a missing package: ImportError naming it)."""
    try:
        return _import_on_cpu(package)
    except ModuleNotFoundError as err:
        if err.name != package:
            raise
        raise ImportError(f"{package} is not installed; run make install (or pip install "
                          f"{package}=={expected_version(package, _installed('torch') or '0')})"
                          ) from err
    except (OSError, ImportError, RuntimeError, AttributeError) as err:
        raise BrokenCompanionError(broken_pair_message(package)) from err


def _import_on_cpu(package: str) -> ModuleType:
    """Import ``package`` with every torch function mode off, so that tensors it makes at
    import time are ordinary CPU tensors: a first import inside a model built on the meta
    device (``multimodal.weights.meta_build``, ``torch.device("meta")``) would otherwise
    leave a companion's module constants there (torchaudio's Kaldi ``EPSILON``: "Cannot
    copy out of meta tensor" at the first filter bank)."""
    if package in sys.modules:
        return sys.modules[package]
    import torch

    with torch._C.DisableTorchFunction():
        return importlib.import_module(package)


def explain_broken_import(err: BaseException) -> str | None:
    """The one-line message when ``err`` (or an exception in its cause chain) was raised
    while a torch companion was being imported or loading its library; else None."""
    seen = 0
    while err is not None and seen < 10:
        if isinstance(err, BrokenCompanionError):
            return str(err)
        if isinstance(err, (OSError, ImportError, RuntimeError, AttributeError)):
            files = [frame.filename.replace("\\", "/")
                     for frame in traceback.extract_tb(err.__traceback__)]
            for package in COMPANIONS:
                if _importing(files, package) or _load_failure_text(str(err), package):
                    return broken_pair_message(package)
        elif _load_failure_text(str(err), None):  # a parser's message that kept only the text
            package = next(p for p in COMPANIONS if _load_failure_text(str(err), p))
            return broken_pair_message(package)
        err, seen = err.__cause__ or err.__context__, seen + 1
    return None


def _importing(files: list[str], package: str) -> bool:
    """The traceback passes through the package's ``__init__`` or its extension loader: the
    failure happened while it was imported, not in a later call into it."""
    return any(f.endswith(f"/{package}/__init__.py") or f"/{package}/_extension/" in f
               for f in files)


_LOAD_FAILURE = re.compile(r"could not load this library|undefined symbol|cannot open shared object"
                           r"|operator \w+::\w+ does not exist", re.IGNORECASE)


def _load_failure_text(text: str, package: str | None) -> bool:
    """``text`` reports a compiled library of ``package`` (any companion if None) failing to
    load: a jsonargparse message keeps only this text of the original exception."""
    if not _LOAD_FAILURE.search(text):
        return False
    names = COMPANIONS if package is None else (package,)
    return any(re.search(rf"lib{name}|/{name}/|\b{name}::", text) for name in names)
