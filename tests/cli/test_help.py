"""``multimodal --help`` lists every verb of the one table, and every verb's ``--help``
answers without importing torch or Lightning (behaviour, not a wall-clock time: the time
follows from it); old flag spellings still work; ``import multimodal`` stays lazy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from multimodal.cli.flags import VerbParser, add_alias, parse
from multimodal.cli.verbs import VERBS, run, usage

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = ("fit", "validate", "test", "predict", "embed", "zero-shot", "caption",
            "transcribe", "speak", "plot", "models", "serve", "chat")


def _in_fresh_python(code: str) -> dict:
    """Run ``code`` in a new interpreter; it prints a JSON object as its last line."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_table_has_every_verb_with_a_line_of_help():
    assert tuple(VERBS) == EXPECTED
    for verb, (target, text) in VERBS.items():
        module, function = target.split(":")
        assert module.startswith("multimodal.") and function.isidentifier(), verb
        assert text and "\n" not in text and len(text) < 90, verb
    text = usage()
    for verb, (_, line) in VERBS.items():
        assert f"  {verb} " in text and line in text


def test_every_verb_help_imports_neither_torch_nor_lightning():
    """``multimodal VERB --help`` in a fresh interpreter: prints the verb's usage, exits 0,
    and leaves torch / lightning / jsonargparse unimported (they are what makes a start
    take seconds)."""
    verbs = [v for v in VERBS if v not in ("models", "serve")]  # other modules' own verbs
    code = (
        "import io, json, sys, contextlib\n"
        "from multimodal.cli.verbs import run\n"
        "res = {}\n"
        f"for verb in {verbs!r}:\n"
        "    buf = io.StringIO()\n"
        "    with contextlib.redirect_stdout(buf):\n"
        "        try:\n"
        "            code = run([verb, '--help'])\n"
        "        except SystemExit as e:\n"
        "            code = e.code\n"
        "    res[verb] = [code, buf.getvalue()[:200]]\n"
        "heavy = [m for m in ('torch', 'lightning', 'jsonargparse', 'numpy') if m in sys.modules]\n"
        "print(json.dumps({'verbs': res, 'heavy': heavy}))\n")
    result = _in_fresh_python(code)
    assert result["heavy"] == []
    for verb in verbs:
        code, text = result["verbs"][verb]
        assert code == 0 and text.startswith("usage: multimodal " + verb), (verb, text)


def test_import_multimodal_is_lazy_and_every_public_name_resolves():
    result = _in_fresh_python(
        "import json, sys\nimport multimodal as mm\n"
        "before = 'torch' in sys.modules\n"
        "names = [n for n in mm.__all__ if getattr(mm, n, None) is None]\n"
        "print(json.dumps({'torch_on_import': before, 'missing': names}))\n")
    assert result == {"torch_on_import": False, "missing": []}


def test_top_level_help_and_unknown_verbs(capsys):
    assert run(["--help"]) == 0
    assert "transcribe" in capsys.readouterr().out
    assert run([]) == 2
    assert run(["transcibe"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown verb 'transcibe'") and "did you mean transcribe" in err


def test_a_verb_whose_module_is_missing_says_so(monkeypatch, capsys):
    monkeypatch.setitem(VERBS, "serve", ("multimodal.no_such_module.cli:main", "x"))
    assert run(["serve", "--port", "1"]) == 2
    assert capsys.readouterr().err.strip() == \
        "error: multimodal serve is not available in this version"


def test_a_missing_dependency_is_named(tmp_path, monkeypatch, capsys):
    (tmp_path / "mm_fake_verb.py").write_text("import no_such_dependency_xyz\n"
                                              "def main(args):\n    return 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(VERBS, "serve", ("mm_fake_verb:main", "x"))
    assert run(["serve"]) == 2
    assert capsys.readouterr().err.strip() == ("error: multimodal serve needs the package "
                                               "'no_such_dependency_xyz', which is not installed")


def test_old_spellings_are_hidden_aliases():
    parser = VerbParser(prog="multimodal x")
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch_size", type=int, default=4)
    add_alias(parser, "--ckpt", "--model")
    add_alias(parser, "--batch-size", "--batch_size")
    assert vars(parse(parser, ["--ckpt", "a.ckpt", "--batch-size", "7"])) == \
        {"model": "a.ckpt", "batch_size": 7}
    assert vars(parse(parser, ["--model", "b"])) == {"model": "b", "batch_size": 4}
    help_text = parser.format_help()
    assert "--batch_size" in help_text and "--batch-size" not in help_text \
        and "--ckpt" not in help_text
    from multimodal.cli.errors import UsageError

    with pytest.raises(UsageError, match="required: --model"):
        parse(parser, [])


@pytest.mark.parametrize("verb,flags", [
    ("transcribe", ["--batch_size", "--num_beams"]),
    ("caption", ["--batch_size", "--num_beams", "--max_new_tokens"]),
    ("embed", ["--batch_size", "--skip_corrupt", "--model"]),
    ("speak", ["--model", "--top_k", "--top_p"]),
])
def test_one_spelling_across_verbs(verb, flags, capsys):
    with pytest.raises(SystemExit) as exit_:
        run([verb, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for flag in flags:
        assert flag in text, (verb, flag)
    assert "--batch-size" not in text and "--num-beams" not in text and "--ckpt" not in text


def test_lightning_verbs_help_lists_the_shared_options(capsys):
    for verb in ("fit", "validate", "test", "predict"):
        assert run([verb, "--help"]) == 0
        text = capsys.readouterr().out
        assert text.startswith(f"usage: multimodal {verb}")
        for flag in ("--config", "--ckpt_path", "--skip_corrupt", "--help_all", "--debug"):
            assert flag in text, (verb, flag)
    assert run(["predict", "-h"]) == 0
    assert "--data.init_args.predict PATH" in capsys.readouterr().out


def test_the_readme_first_screen_shows_every_verb():
    text = (ROOT / "README.md").read_text()
    first_screen = text[: text.index("## The main job")]
    for verb, (_, line) in VERBS.items():
        assert f"multimodal {verb} " in first_screen and line in first_screen, verb


def test_help_all_is_lightning_clis_full_list(capsys):
    with pytest.raises(SystemExit) as exit_:
        run(["fit", "--help_all"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: multimodal [options] fit")
    assert "--trainer.max_epochs" in text and "--skip_corrupt" in text
