"""The ``multimodal`` command: one table of verbs, each a ``module:function`` imported only
when the verb runs (so ``multimodal --help`` and ``multimodal VERB --help`` never pay for
torch or Lightning).

    multimodal --help              every verb, one line each
    multimodal VERB --help         that verb's options
    multimodal VERB ... --debug    a traceback instead of the one-line error

A verb's function takes the arguments after the verb (``list[str]``) and returns the exit
status (``None``: 0). Every verb runs through :func:`multimodal.cli.errors.guard`: a
mistake prints ``error: <what> (<where>)`` and exits with 2.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from collections.abc import Callable

from multimodal.cli.errors import DEBUG_ENV, guard
from multimodal.deps import BrokenCompanionError, explain_broken_import

__all__ = ["VERBS", "load_verb", "main", "usage"]

VERBS: dict[str, tuple[str, str]] = {
    "fit": ("multimodal.cli.train:fit",
            "train the model of a config on its data, then test the best checkpoint"),
    "validate": ("multimodal.cli.train:validate",
                 "one pass over the validation data with a checkpoint"),
    "test": ("multimodal.cli.train:test", "metrics of a checkpoint on the test data"),
    "predict": ("multimodal.cli.train:predict",
                "a checkpoint's predictions for your files (--data.init_args.predict)"),
    "embed": ("multimodal.cli.inference:embed_main",
              "one embedding per image, clip or text, written to .safetensors / .npy"),
    "zero-shot": ("multimodal.cli.inference:zero_shot_main",
                  "classify images by label names with a CLIP / SigLIP model"),
    "caption": ("multimodal.cli.inference:caption_main",
                "describe images in words with a captioning model"),
    "transcribe": ("multimodal.cli.inference:transcribe_main",
                   "speech to text with a Whisper model"),
    "speak": ("multimodal.cli.inference:speak_main",
              "text to speech in the voice of a short recording"),
    "plot": ("multimodal.cli.plots:main",
             "figures of a checkpoint: captions and attention, generated pixels"),
    "models": ("multimodal.cli.models:main",
               "the pretrained weights installed on this machine, with their paths"),
    "serve": ("multimodal.cli.serve:main",
              "serve a model over HTTP (OpenAI-compatible endpoints)"),
    "chat": ("multimodal.cli.chat:main",
             "reply to a prompt with a chat model (or --interactive: a conversation)"),
}
"""verb -> (``module:function``, one line of help)."""

def usage() -> str:
    """The text of ``multimodal --help``."""
    width = max(len(v) for v in VERBS) + 2
    lines = ["usage: multimodal VERB [options]", "",
             "One transformer backbone for text, images and audio.", "", "verbs:"]
    lines += [f"  {verb:<{width}}{text}" for verb, (_, text) in VERBS.items()]
    lines += ["", "options:",
              f"  {'-h, --help':<{width + 4}}this list; multimodal VERB --help: a verb's options",
              f"  {'--version':<{width + 4}}the package version",
              f"  {'--debug':<{width + 4}}a traceback instead of one error line "
              f"(or {DEBUG_ENV}=1)",
              "", "Examples:",
              "  multimodal fit --config configs/finetune_text.yaml "
              "--data.init_args.train my_texts.csv",
              "  multimodal predict --ckpt_path runs/finetune_text/version_0/checkpoints/last.ckpt "
              "--data.init_args.predict new.txt",
              "  multimodal embed --model FOLDER --inputs photos/ --out emb.safetensors"]
    return "\n".join(lines)


class VerbUnavailable(Exception):
    """The module of a verb is not part of this installation."""


def load_verb(verb: str) -> Callable[[list[str]], int | None]:
    """The function of ``verb`` (imported now). A verb whose module is missing raises
    :class:`VerbUnavailable`; a dependency it needs that is missing, ImportError naming it."""
    target, _ = VERBS[verb]
    module_name, function = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except (OSError, RuntimeError, ImportError) as err:
        broken = explain_broken_import(err)
        if broken:  # a torch companion built for another torch release
            raise BrokenCompanionError(broken) from err
        if not isinstance(err, ModuleNotFoundError):
            raise
        if err.name and (module_name == err.name or module_name.startswith(err.name + ".")):
            raise VerbUnavailable(verb) from err
        raise ImportError(f"multimodal {verb} needs the package {err.name!r}, which is not "
                          "installed") from err
    return getattr(module, function)


def _pop_global(argv: list[str]) -> list[str]:
    """``argv`` without ``--debug`` (which turns debugging on for this process)."""
    if "--" in argv:
        cut = argv.index("--")
        head, tail = argv[:cut], argv[cut:]
    else:
        head, tail = argv, []
    if "--debug" in head:
        os.environ[DEBUG_ENV] = "1"
        head = [a for a in head if a != "--debug"]
    return head + tail


def run(argv: list[str]) -> int:
    """Run ``multimodal ARGV``; returns the exit status."""
    argv = _pop_global(list(argv))
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"multimodal {version('multimodal')}")
        except PackageNotFoundError:
            print("multimodal (not installed: run from a source tree)")
        return 0
    verb, args = argv[0], argv[1:]
    if verb.startswith("-"):  # LightningCLI's order: global options, then the verb
        at = next((i for i, a in enumerate(argv) if a in VERBS), None)
        if at is not None:
            verb, args = argv[at], argv[:at] + argv[at + 1:]
    if verb not in VERBS:
        close = difflib.get_close_matches(verb, VERBS, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        print(f"error: unknown verb {verb!r} ({hint}multimodal --help lists the verbs)",
              file=sys.stderr)
        return 2
    try:
        function = load_verb(verb)
    except VerbUnavailable:
        print(f"error: multimodal {verb} is not available in this version", file=sys.stderr)
        return 2
    except ImportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return guard(verb, function, args)


def main(args: list[str] | None = None) -> None:
    """The ``multimodal`` console script."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    code = run(sys.argv[1:] if args is None else list(args))
    if code:
        raise SystemExit(code)
