"""One-line errors for every verb of the ``multimodal`` command.

A mistake (a missing file, an unknown option, a value of the wrong type, an empty class
folder, a folder or a text file where a checkpoint goes, a checkpoint of another task) is
printed as ``error: <what> (<where>)`` and the command exits with status 2. ``--debug`` on
the command line, or ``MULTIMODAL_DEBUG=1`` in the environment, shows the traceback instead.

jsonargparse (behind LightningCLI) reports a bad value as a nested dump ("Does not validate
against any of the Union subtypes ... Errors: - ... Given value: ..."); :func:`simplify`
walks that dump down to the one message that matters and the option it belongs to. An
exception raised while a class is built or a run goes is followed down its ``__cause__``
chain to the first one that is not a wrapper.

Nothing here imports torch or Lightning: ``multimodal VERB --help`` stays fast.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from multimodal.deps import explain_broken_import

__all__ = ["DEBUG_ENV", "UsageError", "debug_enabled", "describe", "guard", "simplify"]

DEBUG_ENV = "MULTIMODAL_DEBUG"
"""Environment variable: set to 1 to see tracebacks instead of one-line errors."""

MAX_LINES = 4
"""An error message longer than this (a list of files, say) is cut, with ``...``."""

_USER_ERRORS = (ValueError, OSError, KeyError, TypeError, ImportError, RuntimeError,
                argparse.ArgumentError)
"""Exception types that mean "what was given is wrong" (or cannot be done here: a missing
package, too little memory): printed on one line. Any other exception (AttributeError,
AssertionError, IndexError, ...) is a bug, raised with its traceback."""

MOVED_OPTIONS = {f"model.init_args.{key}": f"model.init_args.optimizer.{key}"
                 for key in ("lr", "weight_decay", "betas", "warmup_fraction", "min_lr_ratio")}
"""Options of earlier releases that live elsewhere now (the flat optimiser keys, in the one
``optimizer`` block: ``multimodal.tasks.optim.OPTIMIZER_KEYS``): typed on the command line
or written in a config, their error names the new spelling."""

_UNION = "Does not validate against any of the Union subtypes"
_VERBS_OF_CLI = ("fit", "validate", "test", "predict")  # LightningCLI's subcommands


class UsageError(ValueError):
    """A mistake in what the user gave; printed as ``error: <what> (<where>)``."""

    def __init__(self, what: str, where: str | None = None) -> None:
        super().__init__(what)
        self.what, self.where = what, where

    def __str__(self) -> str:
        return f"{self.what} ({self.where})" if self.where else self.what


def debug_enabled() -> bool:
    """``MULTIMODAL_DEBUG`` is set to something other than empty / 0 / false / no."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


# ------------------------------------------------------------ jsonargparse's messages


def _quote(value: str) -> str:
    return value if value.startswith(("'", '"')) else f"'{value}'"


def _type_name(text: str) -> str:
    """``<class 'int'>`` -> ``int``; ``<class 'pathlib.Path'>`` -> ``Path``."""
    found = re.findall(r"<class '([\w.]+)'>", text)
    return ", ".join(name.rsplit(".", 1)[-1] for name in found) if found else text.strip()


def _blocks(lines: list[str]) -> list[list[str]]:
    """The ``- item`` entries of a bullet list (each with its continuation lines)."""
    items: list[list[str]] = []
    indent = None
    for line in lines:
        stripped = line.lstrip()
        here = len(line) - len(stripped)
        if stripped.startswith("- ") and (indent is None or here == indent):
            indent = here
            items.append([" " * (here + 2) + stripped[2:]])
        elif items and indent is not None and here >= indent:
            items[-1].append(line)
        else:
            break
    return items


def _dedent(lines: list[str]) -> list[str]:
    lines = [ln for ln in lines if ln.strip()]
    if not lines:
        return []
    cut = min(len(ln) - len(ln.lstrip()) for ln in lines)
    return [ln[cut:] for ln in lines]


def _simplify_lines(lines: list[str]) -> tuple[str, list[str]]:
    """(message, option keys from the outside in) of one jsonargparse message."""
    lines = _dedent(lines)
    if not lines:
        return "invalid value", []
    first, rest = lines[0].strip(), lines[1:]
    if first.startswith("- "):  # several attempts (a config file path, a class, ...)
        attempts = _blocks(lines)
        useful = [a for a in attempts if not a[0].strip().startswith("Expected a path but")]
        return _simplify_lines((useful or attempts)[0])
    key = re.match(r'^Parser key "([^"]+)":\s*(.*)$', first)
    if key:
        inner = ([key.group(2)] if key.group(2) else []) + rest
        what, keys = _simplify_lines(inner)
        return what, [key.group(1), *keys]
    klass = re.match(r"^Problem with given class_path '([^']+)':\s*(.*)$", first)
    if klass:
        inner = ([klass.group(2)] if klass.group(2) else []) + rest
        what, keys = _simplify_lines(inner)
        return what, ["init_args", *keys] if keys else []
    if first.startswith(_UNION):
        given = next((ln.split(":", 1)[1].strip() for ln in rest
                      if ln.strip().startswith("Given value:")), None)
        start = next((i for i, ln in enumerate(rest) if ln.strip() == "Errors:"), None)
        errors = _blocks(rest[start + 1:]) if start is not None else []
        real = [e for e in errors if "<class 'NoneType'>" not in e[0]]
        nested = [e for e in real if not e[0].strip().startswith("Expected a ")]
        if nested:
            return _simplify_lines(nested[0])
        wanted = ["a class (package.module.Class)" if "dot import path" in e[0]
                  else _type_name(e[0]) for e in errors
                  if e[0].strip().startswith("Expected a ")]
        allowed = " or ".join(w if w != "NoneType" else "null" for w in wanted if w)
        got = f", got {_quote(given)}" if given is not None else ""
        if not allowed and given is not None and re.fullmatch(r"[\w]+(\.[\w]+)+", given):
            return f"no class {given} (give package.module.Class)", []
        return f"expected {allowed or 'another value'}{got}", []
    expected = re.match(r"^Expected a (<class '[^']+'>)\.?\s*Got value:\s*(.*)$", first)
    if expected:
        return f"expected {_type_name(expected.group(1))}, got {_quote(expected.group(2))}", []
    dotted = re.match(r"^Expected a dot import path string:\s*(.*)$", first)
    if dotted:
        return (f"expected a class (package.module.Class), got {_quote(dotted.group(1))}",
                [])
    option = re.match(r"^Option '([^']+)' is not accepted", first)
    if option:
        return f"unknown option '{option.group(1)}'", [option.group(1)]
    unknown = re.match(r"^unrecognized arguments:\s*(.*)$", first)
    if unknown:
        return f"unknown option {unknown.group(1).split()[0]}", []
    required = re.match(r"^the following arguments are required:\s*(.*)$", first)
    if required:
        keys = [k.strip().split(".", 1)[-1] if k.strip().split(".", 1)[0] in _VERBS_OF_CLI
                else k.strip() for k in required.group(1).split(",")]
        return ("missing " + ", ".join(f"--{k}" for k in keys) +
                ": give it in the config or on the command line"), []
    missing = re.match(r"^File does not exist:\s*(.*)$", first) or \
        re.match(r"^Problem in path '?([^']+)'?.*does not exist", first)
    if missing:
        return f"file not found: {missing.group(1).strip()}", []
    return " ".join([first, *(ln.strip() for ln in rest[:MAX_LINES - 1])]), []


def simplify(message: str) -> tuple[str, str | None]:
    """(what, where) of a jsonargparse error message: the innermost message of a nested
    Union dump, and the option it belongs to as typed on the command line
    (``--model.init_args.lr``), or None when the message names no option."""
    what, keys = _simplify_lines(message.splitlines())
    keys = [k for k in keys if k]
    if keys and keys[-1] == "init_args":
        keys = keys[:-1]
    where = f"--{'.'.join(keys)}" if keys else None
    if where is not None and what.startswith("unknown option"):
        dotted = re.sub(r"^(model|data)\.(?!init_args\.)", r"\1.init_args.", where[2:])
        if dotted in MOVED_OPTIONS:
            what = f"removed option, write --{MOVED_OPTIONS[dotted]} instead"
    return what, where


# ------------------------------------------------------------------ exceptions


def _root(exc: BaseException) -> BaseException:
    """The first exception down the ``__cause__`` chain that is not jsonargparse's wrapper
    of it (a Union dump or "Problem with given class_path")."""
    seen = {id(exc)}
    while True:
        below = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
        text = str(exc)
        frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
        raised_in = frames[-1].filename.replace("\\", "/") if frames else ""
        wrapper = _UNION in text or "Problem with given class_path" in text or \
            text.startswith("Call to compute_fn of link") or "/jsonargparse/" in raised_in \
            or type(exc).__module__.startswith("jsonargparse")
        if below is None or id(below) in seen or not wrapper:
            return exc
        seen.add(id(below))
        exc = below


_WORKER = re.compile(r"^Caught (\w+) in DataLoader worker process \d+\.\s*\n"
                     r"Original Traceback \(most recent call last\):\n(.*)$", re.S)
_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+', re.M)


def worker_error(text: str) -> tuple[str, list[str], str] | None:
    """``(message, files of the frames, exception class name)`` of the original exception
    in torch's text for an exception raised in a DataLoader worker process (``Caught X in
    DataLoader worker process 0. Original Traceback ...``), or None for another text: the
    worker's error is shown as the one line it gives without workers."""
    found = _WORKER.match(text.strip() + "\n")
    if found is None:
        return None
    name, body = found.groups()
    lines = [ln for ln in body.splitlines() if ln.strip()]
    at = next((i for i in range(len(lines) - 1, -1, -1)
               if re.match(rf"^[\w.]*\b{re.escape(name)}\b(:|$)", lines[i])), None)
    if at is None:
        return None
    first = lines[at].split(":", 1)[1].strip() if ":" in lines[at] else ""
    message = " ".join([first, *(ln.strip() for ln in lines[at + 1:])]).strip()
    return message or name, _FRAME.findall("\n".join(lines[:at])), name


def _section(exc: BaseException) -> str | None:
    """Which part of the config raised ``exc``: ``--data (ClassName)`` for a frame of
    multimodal.data, ``--model (ClassName)`` for a task / model / loading frame."""
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    files = [frame.filename for frame in frames]
    worker = worker_error(str(exc))
    if worker is not None:
        files = worker[1]
    package = Path(__file__).resolve().parents[1]
    for filename in reversed(files):
        try:
            rel = Path(filename).resolve().relative_to(package)
        except ValueError:
            continue
        part = rel.parts[0] if rel.parts else ""
        if part == "data":
            return "--data"
        if part in ("tasks", "models", "nn", "tokenizers", "convert") or \
                rel.stem in ("loading", "weights"):
            return "--model"
        if part == "cli":
            return None
    return None


def _clip(text: str) -> str:
    lines = [ln.rstrip() for ln in str(text).strip().splitlines() if ln.strip()]
    if len(lines) > MAX_LINES:
        lines = [*lines[:MAX_LINES], "  ..."]
    return "\n".join(lines) if lines else ""


def describe(exc: BaseException, verb: str | None = None) -> str:
    """The ``error: ...`` text of ``exc`` (without the ``error:`` prefix): what went wrong
    and, in parentheses, where (the option, the config section or the verb)."""
    if isinstance(exc, UsageError):
        return _clip(str(exc))
    if isinstance(exc, argparse.ArgumentError):
        what, where = simplify(exc.message if hasattr(exc, "message") else str(exc))
        if where is None and verb and what.startswith("unknown option"):
            where = f"multimodal {verb} --help lists the options"
        return _clip(f"{what} ({where})" if where else what)
    root = _root(exc)
    if isinstance(root, UsageError):  # raised while a class was built: it names its place
        return _clip(str(root))
    text = str(root) or type(root).__name__
    worker = worker_error(text)
    if worker is not None:
        what, where = worker[0], _section(root)
        if type(root).__name__ != worker[2] or not isinstance(
                root, (ValueError, OSError, ImportError, argparse.ArgumentError)):
            what = f"{worker[2]}: {what}"  # as torch could not rebuild it, or not a mistake
    elif type(root).__name__ == "OutOfMemoryError":  # torch's, outside fit / predict
        what = "out of GPU memory: try a smaller --batch_size (half), or --device cpu"
        where = None
    elif _UNION in text:
        what, where = simplify(text)
    else:
        what, where = text, _section(root)
        if isinstance(root, KeyError) and root.args:
            what = f"missing key {root.args[0]!r}"
        if not isinstance(root, (ValueError, OSError, ImportError, argparse.ArgumentError)) \
                and not getattr(root, "plain", False):
            what = f"{type(root).__name__}: {what}"
    if where and where.startswith("--") and where in what:
        where = None
    if where is None and verb:
        where = f"multimodal {verb}"
    return _clip(f"{what} ({where})" if where else what)


def guard(verb: str, run: Callable[[list[str]], int | None], args: list[str]) -> int:
    """``run(args)`` with mistakes (:data:`_USER_ERRORS`) printed as one ``error: ...`` line
    (exit status 2), a Ctrl-C as ``interrupted`` (130); with debugging on
    (:func:`debug_enabled`) they are raised with their traceback, as other exceptions (bugs)
    always are. ``SystemExit`` (``--help``, a preempted run's status) passes through."""
    try:
        code = run(args)
    except KeyboardInterrupt:
        if debug_enabled():
            raise
        again = {"embed": " (run the same command again to resume)",
                 "fit": " (add --ckpt_path last to resume)"}.get(verb, "")
        print(f"interrupted{again}", file=sys.stderr)
        return 130
    except Exception as exc:
        broken = None if debug_enabled() else explain_broken_import(exc)
        if broken:  # a torchaudio / torchvision built for another torch: the fix, not the loader
            print(f"error: {broken}", file=sys.stderr)
            return 2
        shown = exc if isinstance(exc, (UsageError, argparse.ArgumentError)) else _root(exc)
        if debug_enabled() or not isinstance(shown, _USER_ERRORS):
            raise
        print(f"error: {describe(exc, verb)}", file=sys.stderr)
        return 2
    return int(code or 0)
