"""What ``fit`` / ``predict`` print (#52): no product adverts, no torch deprecation raised
inside Lightning, no "new head ... (was N)" when the trained head comes from the
checkpoint, prediction ids as the input path was given, and one message for a fine-tuning
config without a model or with a model of another modality."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest

from multimodal.cli.main import main as cli_main
from tests.test_stored_class_paths import _fit_text_classifier

ROOT = Path(__file__).resolve().parents[2]


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli_main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err.strip()


def test_predict_from_a_checkpoint_prints_no_noise_and_ids_as_given(
        tmp_path, monkeypatch, capsys, caplog):
    ckpt = _fit_text_classifier(tmp_path)  # a preset (bert_tiny) with a new 2-class head
    monkeypatch.chdir(tmp_path)
    Path("new.txt").write_text("We fried the eggs\nThe team scored twice\n")
    capsys.readouterr()
    caplog.clear()  # the fit's lines
    with caplog.at_level(logging.INFO), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli_main(["predict", "--ckpt_path", str(ckpt), "--data.init_args.predict", "new.txt"])
    out = capsys.readouterr()
    text = out.out + out.err + caplog.text + "".join(str(w.message) for w in caught)
    rows = [ln.split("\t") for ln in out.out.splitlines() if ln.count("\t") == 2]
    assert [r[0] for r in rows] == ["new.txt:1", "new.txt:2"]  # as typed, not absolute
    assert all(r[1] in ("food", "sport") for r in rows)
    assert "Tip:" not in text and "litlogger" not in text
    assert "LeafSpec" not in text
    assert "new head" not in text  # the head is the checkpoint's trained one
    assert f"from {ckpt} (checkpoint): loaded" in text and "new: nothing" in text
    assert "callbacks used to create the checkpoint" not in text


def test_a_finetune_config_without_a_model_says_so_first(tmp_path, capsys, monkeypatch):
    from tests.cli.test_first_run import _photos

    monkeypatch.chdir(tmp_path)
    _photos(tmp_path / "shapes")
    config = str(ROOT / "configs" / "finetune_image.yaml")
    assert _error(capsys, ["fit", "--config", config, "--data.init_args.train", "shapes"]) == (
        "error: ClassificationTask needs a model to start from: --model.init_args.pretrained "
        "FOLDER|NAME|CKPT (a model folder, an installed model's name from `multimodal "
        "models`, or one of our checkpoints) (--model.init_args.pretrained)")


def test_a_text_model_for_image_data_names_only_the_image_part_it_needs(tmp_path, capsys,
                                                                      monkeypatch):
    import multimodal as mm
    from tests.cli.test_first_run import _photos

    monkeypatch.chdir(tmp_path)
    _photos(tmp_path / "shapes")
    enc = mm.TextEncoder(mm.TextEncoderConfig(vocab_size=50, max_len=16, dim=16, depth=1,
                                              heads=2, mlp_dim=32))
    folder = enc.save_pretrained(tmp_path / "text_model")
    config = str(ROOT / "configs" / "finetune_image.yaml")
    line = _error(capsys, ["fit", "--config", config, "--data.init_args.train", "shapes",
                           "--model.init_args.pretrained", str(folder)])
    assert line.startswith(f"error: pretrained: {folder} holds a TextEncoder (text model): "
                           "it has no part ClassificationTask can train as an image model "
                           "(needs a ViT)"), line
    assert "image_size" not in line
