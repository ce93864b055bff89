"""The ``multimodal`` commands of README.md and docs/*.md, checked against the command itself.

Every command in a fenced block is sorted into one of:

* run: it runs offline in well under a second (``multimodal models``, ``--help``) and must
  exit 0 (README's ``multimodal models`` table is compared with what it prints);
* parsed: it would start something long-lived or slow (``serve``), so its arguments go
  through the verb's own parser, which resolves ``--model`` (an installed name must work);
* slow: it runs in a test marked slow (``chat`` on the real SmolLM2: ~40 s on 2 cores),
  its printed reply compared with what the README says it prints;
* skipped, with the reason (:func:`skip_reason`): training (minutes), placeholders
  (``FOLDER``, ``DIR|MANIFEST``), files of an earlier run (``runs/...``) or of the reader
  (``my_photos/``).

Whatever the category, the verb must exist and every ``--option`` of an argparse verb must
be one its ``--help`` lists; a ``--config`` file must exist. docs/serve.md's example answer
(the first number of the first embedding, ``prompt_tokens``) is what MiniLM gives.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from pathlib import Path

import pytest

from multimodal.cli.verbs import VERBS, run

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LIGHTNING_VERBS = ("fit", "validate", "test", "predict")
PLACEHOLDER = re.compile(r"(?<![\w.-])\$?[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b|(?<![\w.-])"
                         r"(?:FOLDER|DIR|PATH|NAME|KEY)\b|\||\[|\.\.\.")
READERS_FILES = ("my_", "reviews.jsonl", "texts.jsonl", "pairs.", "shards/", "clips/",
                 "voice.wav", "new_texts.txt", "clip_folder/", "/scratch/")


def documented_commands() -> list[tuple[str, str]]:
    """(``file:line``, command) for every line of a fenced block that starts with
    ``multimodal``, continuation lines (``\\``) joined, the comment kept."""
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for block in re.finditer(r"```[\w-]*\n(.*?)```", text, re.DOTALL):
            start = text.count("\n", 0, block.start(1)) + 1
            lines = block.group(1).split("\n")
            i = 0
            while i < len(lines):
                line, at = lines[i].strip(), i
                while line.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    line = line[:-1].rstrip() + " " + lines[i].strip()
                if line.startswith("multimodal ") or line == "multimodal":
                    found.append((f"{path.relative_to(ROOT)}:{start + at}", line))
                i += 1
    return found


COMMANDS = documented_commands()


def words(command: str) -> list[str]:
    return shlex.split(command, comments=True)[1:]


def skip_reason(command: str) -> str | None:
    """Why a documented command is not run by this test (None: it is run or parsed)."""
    args = words(command)
    verb = args[0] if args else ""
    if not args[1:] and verb != "models":
        return "the verb alone (the README's list of verbs): covered by its --help"
    if PLACEHOLDER.search(" ".join(args)):
        return "placeholders to fill in"
    if verb in LIGHTNING_VERBS:
        return "trains or evaluates a model: minutes (tests/cli and tests/tasks run the configs)"
    if any("runs/" in a or "checkpoints/" in a for a in args):
        return "needs the checkpoint of an earlier fit"
    if any(a.startswith(READERS_FILES) or "/" + READERS_FILES[0] in a for a in args):
        return "needs the reader's own files"
    return None


def category(command: str) -> str:
    args = words(command)
    if skip_reason(command) is not None:
        return "skipped"
    if args[0] == "models" or "--help" in args:
        return "run"
    if args[0] == "serve":
        return "parsed"
    if args[0] == "chat":
        return "slow"
    return "uncategorised"


def run_captured(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = run(args)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
    return code, out.getvalue(), err.getvalue()


_HELP: dict[str, str] = {}


def verb_help(verb: str) -> str:
    if verb not in _HELP:
        code, out, err = run_captured([verb, "--help"])
        assert code == 0, err
        _HELP[verb] = out
    return _HELP[verb]


def test_the_docs_have_commands_and_each_falls_in_a_category():
    assert len(COMMANDS) > 40
    loose = [(where, c) for where, c in COMMANDS if category(c) == "uncategorised"]
    assert loose == [], "a new documented command: run it here, or give a skip reason"


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_a_documented_command_names_a_verb_and_its_options(where, command):
    args = words(command)
    verb = args[0]
    assert verb in VERBS, f"{where}: no verb {verb!r}"
    for i, arg in enumerate(args):
        if arg == "--config":
            assert (ROOT / args[i + 1]).is_file(), f"{where}: no {args[i + 1]}"
    if verb in LIGHTNING_VERBS:
        return  # their options come from the config's classes
    options = set(re.findall(r"--[\w-]+", verb_help(verb)))
    used = [a.split("=")[0] for a in args if a.startswith("--")]
    unknown = [a for a in used if a not in options]
    assert not unknown, f"{where}: {verb} has no option {unknown}"


RUN = [(w, c) for w, c in COMMANDS if category(c) == "run"]
PARSED = [(w, c) for w, c in COMMANDS if category(c) == "parsed"]
SLOW = [(w, c) for w, c in COMMANDS if category(c) == "slow"]


@pytest.mark.parametrize(("where", "command"), RUN, ids=[w for w, _ in RUN])
def test_a_quick_documented_command_runs(where, command):
    code, out, err = run_captured(words(command))
    assert code == 0, f"{where}: {err}"
    assert out.strip()


def test_the_readmes_models_table_is_what_models_prints():
    from multimodal.installed import list_weights

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = text.split("prints (paths shortened):\n\n```\n", 1)[1].split("```", 1)[0]
    documented = [re.split(r"\s{2,}", line.strip()) for line in table.strip().splitlines()]
    installed = {w.name for w in list_weights()}
    if installed != {row[0] for row in documented}:
        pytest.skip(f"this machine has {sorted(installed)} installed, the README lists four")
    code, out, _ = run_captured(["models"])
    assert code == 0
    printed = [re.split(r"\s{2,}", line.strip()) for line in out.strip().splitlines()[:4]]
    assert [row[:2] for row in printed] == [row[:2] for row in documented]
    for got, doc in zip(printed, documented, strict=True):  # ".../pkg/model" ends the path
        assert got[2].endswith(doc[2].removeprefix("...")), (got, doc)


@pytest.mark.parametrize(("where", "command"), PARSED, ids=[w for w, _ in PARSED])
def test_a_documented_serve_command_parses_and_resolves_its_model(where, command):
    from multimodal.cli.serve import parse
    from multimodal.installed import weights_path

    args = words(command)
    name = args[args.index("--model") + 1]
    try:
        path = weights_path(name)
    except (ValueError, FileNotFoundError) as err:
        pytest.skip(f"{name} is not installed here: {err}")
    config = parse(args[1:])
    assert config.model == str(path)
    assert config.name == args[args.index("--served_model_name") + 1] \
        if "--served_model_name" in args else name


@pytest.mark.slow
@pytest.mark.parametrize(("where", "command"), SLOW, ids=[w for w, _ in SLOW])
def test_a_documented_chat_command_prints_what_the_readme_says(where, command):
    from multimodal.installed import weights_path

    args = words(command)
    try:
        weights_path(args[args.index("--model") + 1])
    except (ValueError, FileNotFoundError) as err:
        pytest.skip(str(err))
    code, out, err = run_captured(args)
    assert code == 0, err
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    said = re.search(r"prints `([^`]+)`", text.split(command, 1)[1])
    assert said and out.strip() == said.group(1)


def test_serve_docs_example_answer_is_what_minilm_gives():
    """docs/serve.md's embeddings example: the request's texts, the answer's first number
    (4 decimals) and ``prompt_tokens``, against MiniLM offline (the server's rows equal
    ``Encoder.encode``'s, tests/serve)."""
    from multimodal.installed import weights_path

    try:
        folder = weights_path("all-MiniLM-L6-v2")
    except (ValueError, FileNotFoundError) as err:
        pytest.skip(str(err))
    import multimodal as mm
    from multimodal.serve.embeddings import TextRules

    text = (ROOT / "docs" / "serve.md").read_text(encoding="utf-8")
    block = text.split("## Embeddings", 1)[1].split("```", 2)[1]
    body = json.loads(re.search(r"-d '(\{.*?\})'", block).group(1))
    first = float(re.search(r'"embedding": \[(-?[\d.]+),', block).group(1))
    tokens = int(re.search(r'"prompt_tokens": (\d+)', block).group(1))
    encoder = mm.load_encoder(folder)
    got = encoder.encode(body["input"])
    assert round(float(got[0, 0]), 4) == first
    assert sum(TextRules.of(encoder).token_counts(body["input"])) == tokens
