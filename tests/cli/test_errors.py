"""Every verb answers a mistake with one ``error: <what> (<where>)`` line and exit status 2;
``--debug`` / ``MULTIMODAL_DEBUG=1`` raise it with its traceback instead.

The jsonargparse messages in the unit tests are the ones jsonargparse 4.53 prints (copied
from real runs of ``multimodal fit``); the end-to-end cases run the command in-process."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from multimodal.cli.errors import DEBUG_ENV, UsageError, describe, guard, simplify
from multimodal.cli.verbs import run

UNION_INT = '''Parser key "trainer.max_epochs":
  Does not validate against any of the Union subtypes
  Subtypes: [<class 'int'>, <class 'NoneType'>]
  Errors:
    - Expected a <class 'int'>
    - Expected a <class 'NoneType'>
  Given value type: <class 'str'>
  Given value: abc'''

UNION_CLASS = '''Parser key "model":
  Does not validate against any of the Union subtypes
  Subtypes: [<class 'lightning.pytorch.core.module.LightningModule'>, <class 'NoneType'>]
  Errors:
    - Problem with given class_path 'multimodal.tasks.ClassificationTask':
        Parser key "lr":
          Expected a <class 'float'>. Got value: abc
    - Expected a <class 'NoneType'>
  Given value type: <class 'jsonargparse._util.NestedArg'>
  Given value: NestedArg(key='lr', val='abc')'''

UNKNOWN_INIT_ARG = '''Parser key "model":
  Does not validate against any of the Union subtypes
  Subtypes: [<class 'lightning.pytorch.core.module.LightningModule'>, <class 'NoneType'>]
  Errors:
    - Problem with given class_path 'multimodal.tasks.ClassificationTask':
        Option 'bogus' is not accepted
    - Expected a <class 'NoneType'>
  Given value type: <class 'jsonargparse._util.NestedArg'>
  Given value: NestedArg(key='bogus', val='1')'''

NOT_A_CLASS = '''Parser key "data":

  - Expected a path but CLASSX either not accessible or invalid
  - Does not validate against any of the Union subtypes
  Subtypes: [<class 'lightning.pytorch.core.datamodule.LightningDataModule'>, <class 'NoneType'>]
  Errors:
    - Expected a dot import path string: CLASSX
    - Expected a <class 'NoneType'>
  Given value type: <class 'str'>
  Given value: CLASSX'''


@pytest.mark.parametrize("message,expected", [
    (UNION_INT, ("expected int or null, got 'abc'", "--trainer.max_epochs")),
    (UNION_CLASS, ("expected float, got 'abc'", "--model.init_args.lr")),
    (UNKNOWN_INIT_ARG, ("unknown option 'bogus'", "--model.init_args.bogus")),
    (NOT_A_CLASS, ("expected a class (package.module.Class) or null, got 'CLASSX'",
                   "--data")),
    ('Parser key "config":\n  File does not exist: \'/x/nowhere.yaml\'',
     ("file not found: '/x/nowhere.yaml'", "--config")),
    ("unrecognized arguments: --bogus 3", ("unknown option --bogus", None)),
    ("the following arguments are required: fit.data",
     ("missing --data: give it in the config or on the command line", None)),
])
def test_jsonargparse_dumps_become_the_message_that_matters(message, expected):
    assert simplify(message) == expected


def test_a_moved_option_names_its_new_spelling():
    """The flat optimiser keys of earlier releases (every key of the block, no other)."""
    from multimodal.cli.errors import MOVED_OPTIONS
    from multimodal.tasks.optim import OPTIMIZER_KEYS

    moved = {f"model.init_args.{k}": f"model.init_args.optimizer.{k}" for k in OPTIMIZER_KEYS}
    assert moved == MOVED_OPTIONS
    message = UNKNOWN_INIT_ARG.replace("'bogus'", "'lr'")
    assert simplify(message) == ("removed option, write --model.init_args.optimizer.lr "
                                 "instead", "--model.init_args.lr")


def test_a_wrapped_exception_is_reported_by_its_cause():
    """What jsonargparse raises when a data module's __init__ fails: a Union dump whose
    __cause__ is the real error; and a link's compute_fn failing."""
    try:
        try:
            raise FileNotFoundError("text data not found: nowhere.csv")
        except FileNotFoundError as real:
            raise ValueError("Call to compute_fn of link '_data_class_names(data) --> "
                             "model.init_args.class_names' with args ({Train dataloader: "
                             "None}) failed: text data not found: nowhere.csv") from real
    except ValueError as err:
        assert describe(err, "fit") == \
            "text data not found: nowhere.csv (multimodal fit)"


def test_guard_prints_one_line_and_debug_raises(monkeypatch, capsys):
    def bad(args):
        raise FileNotFoundError(f"image folder not found: {args[0]}")

    monkeypatch.delenv(DEBUG_ENV, raising=False)
    assert guard("predict", bad, ["nowhere"]) == 2
    err = capsys.readouterr().err
    assert err == "error: image folder not found: nowhere (multimodal predict)\n"
    monkeypatch.setenv(DEBUG_ENV, "1")
    with pytest.raises(FileNotFoundError, match="nowhere"):
        guard("predict", bad, ["nowhere"])


def test_a_bug_keeps_its_traceback(monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)

    def buggy(args):
        return [][1]

    with pytest.raises(IndexError):
        guard("fit", buggy, [])


def test_usage_error_says_where():
    assert str(UsageError("label 'a' is given twice", "--labels")) == \
        "label 'a' is given twice (--labels)"
    err = argparse.ArgumentError(None, UNION_INT)
    assert describe(err, "fit") == "expected int or null, got 'abc' (--trainer.max_epochs)"


# ------------------------------------------------------------------------ end to end


def _errors(capsys, argv: list[str]) -> list[str]:
    assert run(argv) == 2
    captured = capsys.readouterr()
    lines = [ln for ln in captured.err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, captured.err
    # (a logging handler left holding an earlier test's closed stream prints "--- Logging
    # error ---" and its traceback: pytest's capture, not the command)
    err = re.sub(r"--- Logging error ---.*?(?=^error:|\Z)", "", captured.err,
                 flags=re.S | re.M)
    assert "Traceback" not in err
    return lines


@pytest.fixture()
def images(tmp_path):
    rng = np.random.default_rng(0)
    for c, name in enumerate(("ant", "bee")):
        (tmp_path / "photos" / name).mkdir(parents=True)
        for i in range(4):
            pixels = rng.integers(0, 80, (12, 12, 3)) + 80 * c
            Image.fromarray(pixels.astype(np.uint8)).save(tmp_path / "photos" / name / f"{i}.png")
    (tmp_path / "photos" / "cat").mkdir()  # an empty class folder
    config = {"model": {"class_path": "multimodal.tasks.ClassificationTask",
                        "init_args": {"preset": "vit_imagefolder",
                                      "optimizer": {"lr": 0.001}}},
              "data": {"class_path": "multimodal.data.vision.ImageClassificationDataModule",
                       "init_args": {"train": str(tmp_path / "photos"), "image_size": 16,
                                     "batch_size": 4}},
              "trainer": {"max_epochs": 1, "accelerator": "cpu", "logger": False,
                          "default_root_dir": str(tmp_path / "run")}}
    (tmp_path / "img.yaml").write_text(yaml.safe_dump(config))
    return tmp_path


def test_fit_mistakes(images, capsys, monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    cfg = str(images / "img.yaml")
    assert _errors(capsys, ["fit"]) == ["error: multimodal fit needs --config CONFIG.yaml "
                                        "(configs/*.yaml) (multimodal fit --help)"]
    assert _errors(capsys, ["predict", "--data.init_args.predict", "x"]) == [
        "error: multimodal predict needs --ckpt_path CKPT (the checkpoint names its task and "
        "data) or --config CONFIG.yaml (multimodal predict --help)"]
    assert _errors(capsys, ["fit", "--config", str(images / "nowhere.yaml")]) == \
        [f"error: file not found: '{images / 'nowhere.yaml'}' (--config)"]
    assert _errors(capsys, ["fit", "--config", cfg, "--bogus", "3"]) == \
        ["error: unknown option --bogus (multimodal fit --help lists the options)"]
    assert _errors(capsys, ["fit", "--config", cfg, "--trainer.max_epochs", "abc"]) == \
        ["error: expected int or null, got 'abc' (--trainer.max_epochs)"]
    assert _errors(capsys, ["fit", "--config", cfg, "--model.init_args.optimizer.lr", "abc"]) \
        == ["error: optimizer: lr must be a number, got 'abc' (--model)"]
    assert _errors(capsys, ["fit", "--config", cfg, "--model.init_args.optimizer.lrr", "1"]) \
        == ["error: optimizer: unknown key(s) ['lrr']; keys: ['lr', 'weight_decay', 'betas', "
            "'warmup_fraction', 'min_lr_ratio'] (--model)"]
    # the flat optimiser keys of earlier releases, in a config or typed: the new spelling
    flat = yaml.safe_load(Path(cfg).read_text())
    flat["model"]["init_args"]["lr"] = 0.01
    (images / "flat.yaml").write_text(yaml.safe_dump(flat))
    moved = ["error: removed option, write --model.init_args.optimizer.lr instead "
             "(--model.init_args.lr)"]
    assert _errors(capsys, ["fit", "--config", str(images / "flat.yaml")]) == moved
    assert _errors(capsys, ["fit", "--config", cfg, "--model.init_args.lr", "0.01"]) == moved
    assert _errors(capsys, ["fit", "--config", cfg, "--model.lr=0.01"]) == moved
    assert _errors(capsys, ["fit", "--config", cfg, "--model.init_args.min_lr_ratio", "0"]) \
        == ["error: removed option, write --model.init_args.optimizer.min_lr_ratio instead "
            "(--model.init_args.min_lr_ratio)"]
    [line] = _errors(capsys, ["fit", "--config", cfg])
    assert line.startswith(f"error: empty class folder {images / 'photos' / 'cat'}")
    assert line.endswith("(--data)")
    [line] = _errors(capsys, ["fit", "--config", cfg, "--data.init_args.train",
                              str(images / "nowhere")])
    assert "nowhere" in line and "not found" in line.lower()


def test_checkpoint_mistakes(images, capsys, monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    (images / "notes.txt").write_text("hello\n")
    (images / "run" / "checkpoints").mkdir(parents=True)
    torch.save({"state_dict": {}, "hyper_parameters": {
        "_class_path": "multimodal.tasks.masked_lm.MaskedLMTask"}},
        images / "run" / "checkpoints" / "last.ckpt")
    folder = images / "run"
    assert _errors(capsys, ["predict", "--ckpt_path", str(folder)]) == [
        f"error: {folder} is a folder, not a checkpoint: give a .ckpt file, e.g. "
        f"{folder / 'checkpoints' / 'last.ckpt'} (--ckpt_path)"]
    assert _errors(capsys, ["test", "--ckpt_path", str(images / "notes.txt")]) == [
        f"error: {images / 'notes.txt'} is not a checkpoint: it is a text file (--ckpt_path)"]
    assert _errors(capsys, ["validate", "--ckpt_path", str(images / "no.ckpt")]) == [
        f"error: checkpoint not found: {images / 'no.ckpt'} (--ckpt_path)"]
    last = folder / "checkpoints" / "last.ckpt"
    [line] = _errors(capsys, ["test", "--config", str(images / "img.yaml"),
                              "--ckpt_path", str(last)])
    assert line.startswith(f"error: {last} is a checkpoint of "
                           "multimodal.tasks.masked_lm.MaskedLMTask, but the config's "
                           "model is multimodal.tasks.ClassificationTask")


def test_skip_corrupt_needs_data_that_reads_files(images, capsys, monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    config = yaml.safe_load((images / "img.yaml").read_text())
    config["data"] = {"class_path": "multimodal.data.numbers.NumberWordsDataModule"}
    (images / "numbers.yaml").write_text(yaml.safe_dump(config))
    [line] = _errors(capsys, ["fit", "--config", str(images / "numbers.yaml"),
                              "--skip_corrupt", "true"])
    assert line.endswith("reads no files that could be skipped (--skip_corrupt)")


def test_debug_flag_shows_the_traceback(images, monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    with pytest.raises(Exception, match="empty class folder"):
        run(["fit", "--config", str(images / "img.yaml"), "--debug"])
    os.environ.pop(DEBUG_ENV, None)


def test_inference_verb_mistakes(tmp_path, capsys, monkeypatch):
    """Checked before any model is read: the model paths here do not even exist."""
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    assert _errors(capsys, ["zero-shot", "--model", "m", "--labels", "circle, circle",
                            "--inputs", "x"]) == \
        ["error: label 'circle' is given twice: each label once (--labels)"]
    assert _errors(capsys, ["embed", "--model", "m", "--inputs", "x",
                            "--out", str(tmp_path / "e.txt")]) == \
        [f"error: {tmp_path / 'e.txt'} must end in .safetensors or .npy (--out)"]
    assert _errors(capsys, ["transcribe", "--model", "m", "--inputs", "x",
                            "--out", str(tmp_path)]) == \
        [f"error: {tmp_path} is a folder: give a file name ending in .csv or .jsonl (--out)"]
    (tmp_path / "file").write_text("")
    assert _errors(capsys, ["caption", "--model", "m", "--inputs", "x",
                            "--out", str(tmp_path / "file" / "c.csv")]) == \
        [f"error: cannot write {tmp_path / 'file' / 'c.csv'}: {tmp_path / 'file'} is not a "
         "folder (--out)"]
    assert _errors(capsys, ["speak", "--text", "hi", "--prompt", "p.wav", "--out", "o.wav"]) \
        == ["error: the following arguments are required: --model (multimodal speak --help "
            "lists the options)"]
    assert _errors(capsys, ["embed", "--model", "m", "--inputs", "x", "--out", "e.npy",
                            "--batch_size", "many"]) == \
        ["error: argument --batch_size: invalid int value: 'many' (multimodal embed --help "
         "lists the options)"]


def test_predict_folders_honour_skip_corrupt(tmp_path, caplog):
    """What ``predict --skip_corrupt true`` reads: the unreadable files (not an image at
    all, a PNG cut short) are left out and named; without it, the first is an error naming
    it."""
    from multimodal.data.vision_datasets import ImageFolderDataset

    Image.fromarray(np.full((8, 8, 3), 200, np.uint8)).save(tmp_path / "a.png")
    whole = (tmp_path / "a.png").read_bytes()
    (tmp_path / "b.png").write_bytes(b"not an image")
    (tmp_path / "c.png").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match=r"b\.png: not a readable image \(it starts with the"):
        ImageFolderDataset(tmp_path, 8, 3)
    with caplog.at_level("WARNING"):
        data = ImageFolderDataset(tmp_path, 8, 3, skip_corrupt=True)
    assert [f.name for f in data.files] == ["a.png"] and data.skipped == ["b.png", "c.png"]
    assert "skipped 2 unreadable file(s)" in caplog.text and "c.png" in caplog.text
    x, name = data[0]
    assert name == "a.png" and x.shape == (3, 8, 8)
    torch.testing.assert_close(x, torch.full((3, 8, 8), 200 / 255))


def test_audio_predict_folders_honour_skip_corrupt(tmp_path):
    import soundfile as sf

    from multimodal.data.audio_datasets import AudioFolderDataset

    sf.write(tmp_path / "a.wav", np.sin(np.arange(1600) / 5).astype(np.float32), 16000)
    (tmp_path / "b.wav").write_bytes(b"RIFF but not really")
    data = AudioFolderDataset(tmp_path, skip_corrupt=True)
    assert [f.name for f in data.files] == ["a.wav"] and data.skipped == ["b.wav"]
    assert data[0]["waveform"].shape == (1600,)
    with pytest.raises(Exception, match=r"b\.wav"):
        plain = AudioFolderDataset(tmp_path)
        [plain[i] for i in range(len(plain))]


def test_a_folder_is_never_a_missing_checkpoint(tmp_path):
    from multimodal.checkpoints import read_checkpoint
    from multimodal.cli.callbacks import checkpoint_problem

    assert checkpoint_problem(tmp_path) == "a folder, not a checkpoint file"
    assert checkpoint_problem(tmp_path / "no.ckpt") == "no such file"
    with pytest.raises(IsADirectoryError, match="is a folder, not a checkpoint file"):
        read_checkpoint(tmp_path)
