"""Audio classification from your own files: class folders and manifests of real WAV / FLAC /
OGG / MP3 files written here, resampled and down-mixed, padded batches, splits, bad input."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio

from multimodal.data.audio import AudioClassificationDataModule
from multimodal.data.audio_datasets import AudioBatchCollate
from multimodal.data.readers import CorruptFileError
from multimodal.data.readers.audio import SkippingAudioCollate


def tone(seconds: float, rate: int, freq: float, channels: int = 1) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    x = 0.3 * np.sin(2 * math.pi * freq * t).astype(np.float32)
    return np.stack([x * (c + 1) / channels for c in range(channels)], axis=1)


def write(path, seconds, rate, freq, channels=1, fmt=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), tone(seconds, rate, freq, channels), rate, format=fmt)
    return path


def make_folder(root, per_class=6):
    """Two classes (low / high tone), mixed formats, rates, channel counts and lengths."""
    kinds = [("wav", 44100, 2), ("flac", 22050, 1), ("ogg", 16000, 1), ("wav", 8000, 1)]
    for c, (name, freq) in enumerate([("high", 2000.0), ("low", 300.0)]):
        for i in range(per_class):
            ext, rate, ch = kinds[(i + c) % len(kinds)]
            write(root / name / f"{i}.{ext}", 0.3 + 0.1 * i, rate, freq, ch)
    return root


def dm_of(train, **kw):
    kw.setdefault("batch_size", 4)
    return AudioClassificationDataModule(train=train, n_mels=16, **kw)


def test_folder_classes_splits_and_padded_batches(tmp_path):
    root = make_folder(tmp_path / "clips")
    dm = dm_of(str(root), features=False, val_size=2, test_size=2, seed=3)
    assert dm.class_names == ["high", "low"] and dm.num_classes == 2
    dm.setup("fit")
    splits = {k: set(v.paths.tolist()) for k, v in dm.file_splits.items()}
    assert [len(splits[k]) for k in ("train", "val", "test")] == [8, 2, 2]
    assert not (splits["train"] & splits["val"]) and not (splits["train"] & splits["test"])
    assert not (splits["val"] & splits["test"])
    again = dm_of(str(root), features=False, val_size=2, test_size=2, seed=3)
    again.setup("fit")
    assert {k: set(v.paths.tolist()) for k, v in again.file_splits.items()} == splits

    batch = next(iter(dm.val_dataloader()))
    # each clip: 16 kHz mono, its own length, zero padded to the longest
    for row, n, path, label in zip(batch["waveform"], batch["lengths"],
                                   dm.file_splits["val"].paths, batch["label"], strict=True):
        data, rate = sf.read(path, dtype="float32", always_2d=True)
        mono = torch.from_numpy(data.T.copy()).mean(0)
        want = mono if rate == 16000 else torchaudio.functional.resample(mono, rate, 16000)
        assert int(n) == want.shape[0]
        torch.testing.assert_close(row[: int(n)], want)
        assert torch.all(row[int(n):] == 0)
        assert dm.class_names[int(label)] == path.split("/")[-2]


def test_features_batches_and_fit_step(tmp_path):
    from lightning import Trainer

    from multimodal.models.audio import AudioClassifier, AudioClassifierConfig
    from multimodal.tasks import ClassificationTask

    root = make_folder(tmp_path / "clips")
    dm = dm_of(str(root), val_size=0.2, test_size=0.2)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["features"].shape[-1] == 16 and batch["features"].shape[0] == 4
    assert batch["lengths"].max() == batch["features"].shape[1]
    model = AudioClassifier(AudioClassifierConfig(num_classes=2, n_mels=16, dim=16, depth=1,
                                                  heads=2, mlp_dim=32))
    task = ClassificationTask(model=model)
    trainer = Trainer(fast_dev_run=1, accelerator="cpu", logger=False,
                      enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(task, datamodule=dm)
    assert trainer.state.finished


def test_manifests_csv_and_jsonl_with_given_splits(tmp_path):
    clips = make_folder(tmp_path / "clips", per_class=4)
    files = sorted(p.relative_to(tmp_path) for p in clips.rglob("*.*"))
    (tmp_path / "train.csv").write_text(
        "path,label\n" + "".join(f"{p},{p.parent.name}\n" for p in files[:6]))
    (tmp_path / "val.jsonl").write_text(
        "".join(json.dumps({"path": str(p), "label": p.parent.name}) + "\n" for p in files[6:]))
    dm = dm_of(str(tmp_path / "train.csv"), val=str(tmp_path / "val.jsonl"), test_size=0,
               features=False)
    dm.setup("fit")
    assert len(dm.file_splits["train"]) == 6 and len(dm.file_splits["val"]) == 2
    assert len(dm.file_splits["test"]) == 0
    labels = [dm.class_names[i] for i in dm.file_splits["val"].labels.tolist()]
    assert labels == [str(p.parent.name) for p in files[6:]]


def test_mp3_is_read_and_resampled(tmp_path):
    if "MP3" not in sf.available_formats():
        pytest.skip("this libsndfile reads no MP3")
    root = tmp_path / "clips"
    for name, freq in [("a", 300.0), ("b", 2000.0)]:
        for i in range(3):
            write(root / name / f"{i}.mp3", 0.5, 48000, freq, 2, fmt="MP3")
    dm = dm_of(str(root), features=False, val_size=0, test_size=0)
    dm.setup("fit")
    item = dm.split_dataset("train")[0]
    assert abs(item["waveform"].shape[0] - 8000) < 1200  # MP3 adds encoder padding
    # the 300 Hz tone survives: its spectral peak is at 300 Hz
    spectrum = torch.fft.rfft(item["waveform"]).abs()
    peak_hz = int(spectrum.argmax()) * 16000 / item["waveform"].shape[0]
    assert abs(peak_hz - 300) < 10


def test_empty_class_folder_is_named(tmp_path):
    root = make_folder(tmp_path / "clips", per_class=3)
    (root / "silent").mkdir()
    (root / "silent" / "notes.txt").write_text("no audio here")
    with pytest.raises(ValueError, match=r"empty class folder .*silent"):
        dm_of(str(root)).setup("fit")


def test_missing_manifest_files_name_first_and_count(tmp_path):
    make_folder(tmp_path / "clips", per_class=2)
    (tmp_path / "m.csv").write_text(
        "path,label\nclips/high/0.wav,high\nclips/high/gone.wav,high\n"
        "clips/low/0.flac,low\nclips/low/gone2.ogg,low\n")
    with pytest.raises(FileNotFoundError, match=r"2 of 4 files are missing.*gone\.wav"):
        dm_of(str(tmp_path / "m.csv")).setup("fit")


@pytest.mark.parametrize("kind", ["empty", "garbage"])
def test_bad_file_is_an_error_naming_it_or_skipped_and_counted(tmp_path, kind):
    root = make_folder(tmp_path / "clips", per_class=4)
    bad = root / "low" / "bad.wav"
    if kind == "empty":  # a valid WAV header with no samples
        sf.write(str(bad), np.zeros((0, 1), np.float32), 16000)
        message = "zero-length"
    else:  # not audio at all
        bad.write_bytes(b"RIFF this is not really a wave file" * 4)
        message = "not a readable audio file"
    with pytest.raises(CorruptFileError, match=rf"{re.escape(str(bad))}.*{message}.*1 of 9"):
        dm_of(str(root), val_size=0, test_size=0).setup("fit")
    dm = dm_of(str(root), val_size=0, test_size=0, skip_corrupt=True)
    dm.setup("fit")
    assert dm.skipped_up_front == 1
    assert str(bad) not in dm.file_splits["train"].paths.tolist()
    assert len(dm.split_dataset("train")) == 8


def test_file_broken_after_the_check_is_skipped_per_epoch(tmp_path):
    root = make_folder(tmp_path / "clips", per_class=2)
    dm = dm_of(str(root), val_size=0, test_size=0, skip_corrupt=True, features=False)
    dm.setup("fit")
    strict = dm_of(str(root), val_size=0, test_size=0, features=False)
    strict.setup("fit")  # both checked every header before the file broke
    broken = dm.file_splits["train"].paths[1]
    with open(broken, "wb") as f:
        f.write(b"gone bad since setup")
    data = dm.split_dataset("train")
    assert data[1] is None
    batch = SkippingAudioCollate(AudioBatchCollate())([data[i] for i in range(4)])
    assert int(batch["skipped"]) == 1 and batch["waveform"].shape[0] == 3
    batch = dm.on_before_batch_transfer(batch, 0)
    assert "skipped" not in batch and dm.skipped == {0: 1}
    with pytest.raises(CorruptFileError, match=re.escape(str(broken))):
        strict.split_dataset("train")[1]


def test_val_without_train_is_an_error():
    with pytest.raises(ValueError, match="need train"):
        AudioClassificationDataModule(val="somewhere")
