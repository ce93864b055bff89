"""Every verb that takes ``--model`` reads it through one resolver
(:func:`multimodal.cli.flags.model_path`, over :func:`multimodal.installed.resolve_weights`,
which ``fit``'s ``pretrained`` uses too): an installed model's name is its installed path, an
empty value or an unknown name is one ``error:`` line naming ``--model``, exit 2."""

from __future__ import annotations

import wave
from pathlib import Path

import pytest

from multimodal import installed
from multimodal.cli.verbs import VERBS, run

# verb -> the other arguments it needs to reach the model
VERB_ARGS = {
    "embed": ["--inputs", "in.txt", "--out", "e.npy"],
    "zero-shot": ["--labels", "a,b", "--inputs", "in.txt"],
    "caption": ["--inputs", "in.txt"],
    "transcribe": ["--inputs", "a.wav"],
    "speak": ["--text", "hi", "--prompt", "a.wav", "--out", "o.wav"],
    "chat": ["hi"],
    "serve": [],
}
NAME = "tiny-installed-test-model"


def test_the_table_covers_every_verb_that_takes_model():
    import importlib
    import inspect

    takes = set()
    for verb, (target, _) in VERBS.items():
        module = importlib.import_module(target.split(":")[0])
        if verb not in ("fit", "validate", "test", "predict", "plot") \
                and '"--model"' in inspect.getsource(module):
            takes.add(verb)
    assert takes == set(VERB_ARGS)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """Inputs each verb accepts, and a known model name whose 'installed' folder is an empty
    folder of ``tmp_path`` (so the verb stops, after resolving, at loading it)."""
    (tmp_path / "in.txt").write_text("hello\n")
    with wave.open(str(tmp_path / "a.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\x00\x01" * 16000)
    folder = tmp_path / "installed-folder"
    folder.mkdir()
    source = installed.WeightsSource(NAME, "a test", ("no_such_pkg",), "model", ("embed",),
                                     "nothing")
    monkeypatch.setattr(installed, "KNOWN_WEIGHTS", (*installed.KNOWN_WEIGHTS, source))
    real = installed._locate
    monkeypatch.setattr(installed, "_locate",
                        lambda s: folder if s.name == NAME else real(s))
    monkeypatch.chdir(tmp_path)
    return folder


def _error(capsys) -> str:
    captured = capsys.readouterr()
    lines = [ln for ln in (captured.err + captured.out).splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, captured
    return lines[0]


@pytest.mark.parametrize("verb", sorted(VERB_ARGS))
def test_an_installed_name_reaches_the_loader_as_its_path(verb, workdir: Path, capsys):
    code = run([verb, "--model", NAME, *VERB_ARGS[verb]])
    assert code == 2
    line = _error(capsys)
    assert str(workdir) in line and "has no config.json" in line  # loading, not resolving


@pytest.mark.parametrize("verb", sorted(VERB_ARGS))
@pytest.mark.parametrize(("value", "says"), [
    ("", "the model is empty"),
    ("no-such-model-name", "no-such-model-name does not exist and is no installed model's"),
])
def test_an_empty_or_unknown_model_is_one_error_line(verb, value, says, workdir, capsys):
    try:
        code = run([verb, "--model", value, *VERB_ARGS[verb]])
    except SystemExit as exit_:  # serve's own parser exits
        code = exit_.code
    assert code == 2
    line = _error(capsys)
    assert says in line and "(--model)" in line and "multimodal models" in line


def test_serve_reports_an_installed_model_by_its_name(workdir):
    from multimodal.cli.serve import parse

    config = parse(["--model", NAME])
    assert config.model == str(workdir) and config.name == NAME
    assert parse(["--model", str(workdir)]).name == "installed-folder"  # a path: its last part
