"""The README's Python example runs as written, and its two commands are the first lines."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_opens_with_the_two_commands():
    first_block = README.read_text().split("```")[1]
    commands = [ln.split("#")[0].strip() for ln in first_block.splitlines()[1:] if ln.strip()]
    assert commands == ["make train", "make test"]


def test_ci_runs_the_readme_test_command():
    ci = (README.parent / ".ci" / "run").read_text()
    assert re.search(r"^make test\b", ci, re.MULTILINE)


def test_readme_python_example_runs(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    assert blocks, "README has no python example"
    monkeypatch.chdir(tmp_path)
    for code in blocks:
        exec(compile(code, str(README), "exec"), {})
