"""Audio data: synthesis cache, voice / file splits, crops, noise, the DataModule."""

from __future__ import annotations

import csv
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from multimodal.data.audio import AudioClassificationDataModule
from multimodal.data.audio_datasets import AudioBatchCollate, AudioFolderDataset, list_audio_files
from multimodal.data.audio_transforms import trim_silence
from multimodal.data.noise import NoiseMixer
from multimodal.data.sources.sonic_pi import (
    SONIC_PI_DIR,
    SonicPiDataset,
    sonic_pi_files,
    split_sonic_pi,
)
from multimodal.data.sources.spoken_words import (
    SPOKEN_WORDS,
    read_manifest,
    split_voices,
    synthesize_spoken_words,
)
from multimodal.tokenizers.audio import AudioFrameTokenizer

HAS_ESPEAK = shutil.which("espeak-ng") is not None


def _tone(freq: float, seconds: float, rate: int, amp: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def _fake_spoken_words(root: Path, n_espeak: int = 8, n_flite: int = 3) -> list[str]:
    """A manifest in the synthesiser's format whose clips are tones (one pitch per word)."""
    words = ["zero", "seven", "go"]
    voices = [f"espeak:en+m{i}" for i in range(n_espeak)] + [f"flite:v{i}" for i in range(n_flite)]
    rows = []
    for vi, voice in enumerate(voices):
        for wi, word in enumerate(words):
            rel = f"wav/{voice.replace(':', '_')}/{word}.wav"
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            seconds = 0.3 + 0.05 * ((vi + wi) % 5)
            sf.write(root / rel, _tone(300.0 * (wi + 1), seconds, 22050), 22050)
            rows.append([rel, word, voice, 175, 50])
    with (root / "manifest.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "word", "voice", "speed", "pitch"])
        w.writerows(rows)
    return voices


def test_split_voices_is_disjoint_deterministic_and_stratified() -> None:
    voices = [f"espeak:en+m{i}" for i in range(40)] + [f"flite:{v}" for v in "abcd"]
    split = split_voices(voices, val_size=0.1, test_size=0.2, seed=3)
    sets = {k: set(v) for k, v in split.items()}
    assert not (sets["train"] & sets["test"] or sets["train"] & sets["val"])
    assert not sets["val"] & sets["test"]
    assert sets["train"] | sets["val"] | sets["test"] == set(voices)
    # espeak: round(0.2*40)=8 test, 4 val; flite: 4 voices -> 1 test, 1 val
    assert len(split["test"]) == 8 + 1 and len(split["val"]) == 4 + 1
    assert sum(v.startswith("flite") for v in split["train"]) == 2
    assert split == split_voices(reversed(voices), 0.1, 0.2, seed=3)  # order does not matter
    assert split != split_voices(voices, 0.1, 0.2, seed=4)
    with pytest.raises(ValueError, match="val_size"):
        split_voices(voices, 0.5, 0.5)


def test_trim_silence_keeps_the_word_and_a_margin() -> None:
    x = np.zeros(22050, dtype=np.float32)
    x[5000:9000] = _tone(440.0, 4000 / 22050, 22050)
    y = trim_silence(x, 22050, margin_s=0.01)
    margin = int(0.01 * 22050)
    assert len(y) == pytest.approx(4000 + 2 * margin, abs=20)
    assert np.abs(y).max() == np.abs(x).max()


@pytest.mark.skipif(not HAS_ESPEAK, reason="espeak-ng not installed (bash data/get_audio.sh)")
def test_synthesize_two_words_two_voices(tmp_path: Path, capsys) -> None:
    root = tmp_path / "sw"
    voices = ["espeak:en-us", "espeak:en+f2"]
    manifest = synthesize_spoken_words(
        root, voices=voices, words=["yes", "seven"], takes_per_word=1, workers=1
    )
    # stderr is not a terminal here (as under CI): plain progress lines, no redrawn bar
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("spoken words: ")]
    assert [ln.split()[2] for ln in lines] == ["1/4", "2/4", "3/4", "4/4"]  # a 10 % step each
    rows = read_manifest(root)
    assert len(rows) == 4
    assert {r["word"] for r in rows} == {"yes", "seven"}
    assert {r["voice"] for r in rows} == set(voices)
    for r in rows:
        data, rate = sf.read(root / r["path"])
        assert rate == 22050
        assert 0.15 < len(data) / rate < 1.5  # a word, trailing silence trimmed
        assert np.abs(data).max() > 0.05
        assert int(r["speed"]) in (120, 150, 180, 210) and int(r["pitch"]) in (30, 45, 60, 75)
    # cached: a second call does not touch the files
    stamps = {p: p.stat().st_mtime_ns for p in root.rglob("*.wav")}
    assert synthesize_spoken_words(root, voices=voices, words=["yes"], workers=1) == manifest
    assert stamps == {p: p.stat().st_mtime_ns for p in root.rglob("*.wav")}
    split = split_voices({r["voice"] for r in rows}, 0.1, 0.2, seed=0)
    assert len(split["test"]) == 1 and len(split["train"]) == 1
    assert not set(split["train"]) & set(split["test"])


def test_missing_data_says_how_to_get_it(tmp_path: Path) -> None:
    dm = AudioClassificationDataModule(root=str(tmp_path), synthesize=False)
    with pytest.raises(FileNotFoundError, match=r"bash data/get_audio\.sh"):
        dm.setup("fit")
    dm = AudioClassificationDataModule(dataset="sonic_pi", samples_dir=str(tmp_path / "none"))
    with pytest.raises(FileNotFoundError, match=r"bash data/get_audio\.sh"):
        dm.setup("fit")
    with pytest.raises(ValueError, match="dataset must be"):
        AudioClassificationDataModule(dataset="speech")  # type: ignore[arg-type]


def test_spoken_words_datamodule_batches(tmp_path: Path) -> None:
    voices = _fake_spoken_words(tmp_path / "spoken_words")
    dm = AudioClassificationDataModule(
        root=str(tmp_path), batch_size=4, synthesize=False, seed=1, n_mels=40
    )
    assert dm.num_classes == 20
    assert dm.class_names == list(SPOKEN_WORDS)
    dm.setup("fit")
    train, val, test = (set(dm.split_voices[s]) for s in ("train", "val", "test"))
    assert train | val | test == set(voices)
    assert not (train & test or train & val or val & test)
    assert dm.tokenizer.is_fitted

    batch = next(iter(dm.val_dataloader()))
    assert set(batch) == {"features", "lengths", "label"}
    b, frames, mels = batch["features"].shape
    assert mels == 40 and b == min(4, 3 * len(dm.split_voices["val"]))
    assert batch["lengths"].dtype == torch.long and int(batch["lengths"].max()) == frames
    for i, row in enumerate(dm._datasets["val"].rows[:b]):  # type: ignore[attr-defined]
        n22 = sf.info(tmp_path / "spoken_words" / row["path"]).frames
        n16 = math.ceil(n22 * 16000 / 22050)
        assert batch["lengths"][i] == 1 + (n16 - 400) // 160
        assert batch["label"][i] == SPOKEN_WORDS.index(row["word"])
    # normalised with training statistics: training frames have ~0 mean, ~1 std overall
    allf = torch.cat(
        [
            f[:n]
            for bt in dm.train_dataloader()
            for f, n in zip(bt["features"], bt["lengths"], strict=True)
        ]
    )
    assert abs(float(allf.mean())) < 0.1
    assert 0.8 < float(allf.std()) < 1.2

    raw = AudioClassificationDataModule(
        root=str(tmp_path), batch_size=2, synthesize=False, features=False
    )
    raw.setup("fit")
    wb = next(iter(raw.test_dataloader()))
    assert set(wb) == {"waveform", "lengths", "label"}
    assert wb["waveform"].shape == (2, int(wb["lengths"].max()))


def _fake_sonic_pi(folder: Path) -> None:
    folder.mkdir()
    counts = {"bd": 10, "elec": 9, "glitch": 3}
    for cls, n in counts.items():
        for i in range(n):
            seconds = 0.5 + 0.25 * i
            stereo = np.stack([_tone(100.0 * (i + 1), seconds, 44100)] * 2, axis=1)
            sf.write(folder / f"{cls}_{i:02d}_x.flac", stereo, 44100)
    (folder / "README.md").write_text("not audio")


def test_sonic_pi_classes_split_and_crops(tmp_path: Path) -> None:
    folder = tmp_path / "samples"
    _fake_sonic_pi(folder)
    files = sonic_pi_files(folder, min_class_files=8)
    assert list(files) == ["bd", "elec"]  # glitch has 3 < 8 files
    split = split_sonic_pi(files, 0.1, 0.2, seed=0)
    paths = {s: {p for p, _ in items} for s, items in split.items()}
    assert not (paths["train"] & paths["test"] or paths["train"] & paths["val"])
    assert sum(len(p) for p in paths.values()) == 19
    # per class: bd 10 -> 2 test, 1 val; elec 9 -> 2 test, 1 val
    assert len(paths["test"]) == 4 and len(paths["val"]) == 2
    assert split == split_sonic_pi(files, 0.1, 0.2, seed=0)

    items = split["train"]
    train = SonicPiDataset(items, clip_samples=8000, train=True)
    evals = SonicPiDataset(items, clip_samples=8000, train=False)
    for i in range(len(items)):
        full = evals.clips[i]
        crop = train[i]["waveform"]
        assert crop.shape == (8000,)
        centre = evals[i]["waveform"]
        assert torch.equal(centre, evals[i]["waveform"])
        if full.shape[0] > 8000:
            start = (full.shape[0] - 8000) // 2
            assert torch.equal(centre, full[start : start + 8000])
        else:
            assert torch.equal(centre[: full.shape[0]], full)


def test_sonic_pi_datamodule_fixed_length_batches(tmp_path: Path) -> None:
    folder = tmp_path / "samples"
    _fake_sonic_pi(folder)
    dm = AudioClassificationDataModule(
        dataset="sonic_pi", samples_dir=str(folder), batch_size=3, clip_seconds=0.5
    )
    assert dm.class_names == ["bd", "elec"]
    batch = next(iter(dm.train_dataloader()))
    assert batch["features"].shape == (3, 1 + (8000 - 400) // 160, 80)
    assert batch["lengths"].tolist() == [48, 48, 48]
    assert set(batch["label"].tolist()) <= {0, 1}


@pytest.mark.skipif(not SONIC_PI_DIR.is_dir(), reason="sonic-pi-samples not installed")
def test_real_sonic_pi_classes() -> None:
    files = sonic_pi_files(SONIC_PI_DIR, min_class_files=8)
    assert {"bd", "drum", "elec", "tabla"} <= set(files)
    assert all(len(v) >= 8 for v in files.values())
    assert all(p.name.startswith(c + "_") for c, v in files.items() for p in v)


@pytest.mark.parametrize("kind", ["white", "pink"])
def test_noise_is_mixed_at_the_requested_snr(kind: str) -> None:
    mixer = NoiseMixer(kind, snr_db=(10.0, 10.0))  # type: ignore[arg-type]
    clean = torch.from_numpy(_tone(440.0, 1.0, 16000))
    noisy = mixer(clean, torch.Generator().manual_seed(0))
    noise = noisy - clean
    snr = 10 * torch.log10(clean.pow(2).mean() / noise.pow(2).mean())
    assert float(snr) == pytest.approx(10.0, abs=1e-3)
    with pytest.raises(ValueError, match="noise must be"):
        NoiseMixer("brown")  # type: ignore[arg-type]


def test_pink_noise_power_falls_as_one_over_f() -> None:
    mixer = NoiseMixer("pink")
    n = mixer.noise(2**16, torch.Generator().manual_seed(0))
    power = torch.fft.rfft(n).abs().pow(2)
    low, high = power[100:200].mean(), power[1000:2000].mean()
    assert float(low / high) == pytest.approx(10.0, rel=0.3)  # frequencies 10x apart


def test_predict_folder_is_sorted_and_featurised(tmp_path: Path) -> None:
    for name, seconds in [("b.wav", 0.5), ("a.flac", 0.25), ("c.ogg", 0.3)]:
        sf.write(tmp_path / name, _tone(440.0, seconds, 8000), 8000)
    (tmp_path / "notes.txt").write_text("skip me")
    assert [p.name for p in list_audio_files(tmp_path)] == ["a.flac", "b.wav", "c.ogg"]
    items, tokenizer = list(AudioFolderDataset(tmp_path)), AudioFrameTokenizer()
    assert [item["filename"] for item in items] == ["a.flac", "b.wav", "c.ogg"]
    frames = [int(tokenizer(item["waveform"], 16000)[1][0]) for item in items]
    assert frames == [1 + (n - 400) // 160 for n in (4000, 8000, 4800)]
    with pytest.raises(FileNotFoundError, match="audio folder not found"):
        list_audio_files(tmp_path / "nope")

    dm = AudioClassificationDataModule(predict_dir=str(tmp_path), features=False, batch_size=8)
    batch = next(iter(dm.predict_dataloader()))
    assert batch["filename"] == ["a.flac", "b.wav", "c.ogg"]
    assert batch["lengths"].tolist() == [4000, 8000, 4800]


def test_collate_pads_waveforms() -> None:
    items = [{"waveform": torch.ones(5), "label": 3}, {"waveform": torch.ones(2), "label": 1}]
    batch = AudioBatchCollate()(items)
    assert batch["waveform"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert batch["lengths"].tolist() == [5, 2]
    assert batch["label"].tolist() == [3, 1]


def test_datamodule_state_keeps_fitted_stats(tmp_path: Path) -> None:
    _fake_spoken_words(tmp_path / "spoken_words")
    dm = AudioClassificationDataModule(root=str(tmp_path), synthesize=False, n_mels=40)
    dm.setup("fit")
    state = dm.state_dict()
    restored = AudioClassificationDataModule(root=str(tmp_path), synthesize=False, n_mels=40)
    restored.load_state_dict(state)
    restored.tokenizer.mean.add_(1.0)  # a restored (here: altered) fit must not be refitted
    restored.setup("fit")
    torch.testing.assert_close(restored.tokenizer.mean, dm.tokenizer.mean + 1.0)
    with pytest.raises(ValueError, match="ambient"):
        AudioClassificationDataModule(dataset="sonic_pi", noise="ambient")
