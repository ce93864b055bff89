"""``python -m multimodal.cli.datasets KIND``: each kind reaches its data function with the
options given, and the data scripts call modules that exist."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

import multimodal.data.sources.spoken_words as spoken_words
import multimodal.data.tts as tts
from multimodal.cli.datasets import main

REPO = Path(__file__).resolve().parents[2]


def test_each_kind_reaches_its_data_function(monkeypatch):
    calls = []
    monkeypatch.setattr(spoken_words, "make_spoken_words",
                        lambda root, **kw: calls.append(("spoken-words", root, kw)))
    monkeypatch.setattr(tts, "make_tts_data", lambda root, **kw: calls.append(("tts", root, kw)))
    main(["spoken-words", "--root", "w", "--takes-per-word", "2", "--seed", "5",
          "--workers", "3", "--samples-dir", "s"])
    main(["tts", "--fit-clips", "40"])
    assert calls == [
        ("spoken-words", "w", {"takes_per_word": 2, "seed": 5, "workers": 3,
                               "samples_dir": "s"}),
        ("tts", "data/cache", {"fit_clips": 40, "workers": None}),
    ]
    with pytest.raises(SystemExit) as stop:
        main(["images"])
    assert stop.value.code == 2


def test_the_data_scripts_run_modules_that_exist():
    found = {}
    for script in sorted((REPO / "data").glob("*.sh")):
        for module in re.findall(r"-m (multimodal[\w.]*)", script.read_text()):
            found[module] = importlib.util.find_spec(module) is not None
    assert found and all(found.values()), found
