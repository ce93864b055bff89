"""AudioClassifier: shapes, padding invariance, positions, waveform == features, save/load,
bad input, the data-module stats contract, predict on files, and a real learning test."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import soundfile as sf
import torch
import yaml

import multimodal as mm
from multimodal.data.audio_datasets import AudioBatchCollate, AudioFolderDataset
from multimodal.models.audio import AudioClassifier, AudioClassifierConfig
from multimodal.tasks import ClassificationTask
from multimodal.tokenizers.audio import AudioFeatureConfig, AudioFrameTokenizer, load_audio

SR = 16000
FRAMES = dict(num_classes=3, dim=32, depth=2, heads=4, mlp_dim=64, n_mels=20, mode="frames",
              stack_frames=2, pool="mean")
PATCHES = dict(num_classes=3, dim=32, depth=2, heads=4, mlp_dim=64, n_mels=20, mode="patches",
               patch_size=8, patch_stride=6, pool="cls")


def _model(**kw) -> AudioClassifier:
    return AudioClassifier(AudioClassifierConfig(**kw)).eval()


def _tone(freq: float, seconds: float, gen: torch.Generator, noise: float = 0.05) -> torch.Tensor:
    t = torch.arange(round(seconds * SR)) / SR
    phase = 2 * math.pi * torch.rand((), generator=gen)
    amp = 0.2 + 0.6 * torch.rand((), generator=gen)
    return amp * torch.sin(2 * math.pi * freq * t + phase) + noise * torch.randn(
        t.shape[0], generator=gen)


def _fitted_tokenizer(n_mels: int = 20, seed: int = 0) -> AudioFrameTokenizer:
    """A tokenizer fitted like the data module does, on a few noisy tones."""
    gen = torch.Generator().manual_seed(seed)
    clips = [_tone(f, 0.3, gen) for f in (300.0, 800.0, 2000.0)]
    return AudioFrameTokenizer(AudioFeatureConfig(n_mels=n_mels)).fit_stats(clips)


# ----------------------------------------------------------------------------- shapes
@pytest.mark.parametrize("kw", [FRAMES, PATCHES], ids=["frames", "patches"])
def test_output_and_attention_shapes(kw) -> None:
    model = _model(**kw)
    features = torch.randn(2, 50, 20)
    logits, maps = model(features=features, lengths=torch.tensor([50, 31]),
                         return_attention=True)
    assert logits.shape == (2, 3)
    patches = 1 + ((50 - 8) // 6 + 1) * ((20 - 8) // 6 + 1)  # class token + time x freq
    tokens = 50 // 2 if kw["mode"] == "frames" else patches
    assert len(maps.self_attn) == 2 and maps.self_attn[0].shape == (2, 4, tokens, tokens)
    assert maps.cross_attn == []
    assert model(features=features).shape == (2, 3)


def test_attention_gives_padded_keys_zero_weight() -> None:
    model = _model(**FRAMES)
    _, maps = model(features=torch.randn(2, 40, 20), lengths=torch.tensor([40, 14]),
                    return_attention=True)
    valid = 14 // 2
    for w in maps.self_attn:
        assert torch.all(w[1, :, :, valid:] == 0)
        torch.testing.assert_close(w[1].sum(-1), torch.ones(4, 20))


def test_masked_mean_pool_is_the_mean_of_valid_tokens() -> None:
    model = _model(**FRAMES)
    tokens = torch.randn(2, 5, 32)
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    pooled = model.pool(tokens, attention_mask=mask)
    torch.testing.assert_close(pooled[0], tokens[0].mean(0))
    torch.testing.assert_close(pooled[1], (tokens[1, 0] + tokens[1, 1]) / 2)


# ----------------------------------------------------------------------------- padding
@pytest.mark.parametrize(
    ("kw", "short"),
    [(FRAMES, 23), ({**FRAMES, "pool": "cls"}, 7), (PATCHES, 27), (PATCHES, 5),
     ({**PATCHES, "pos_embed": "learned", "pos_frames": 40}, 30),
     ({**FRAMES, "pos_embed": "learned", "pos_frames": 20}, 50)],
    ids=["frames-mean", "frames-cls", "patches-cls", "patches-shorter-than-a-patch", "learned",
         "learned-stretched"],
)
def test_logits_do_not_depend_on_the_batch(kw, short: int) -> None:
    """A clip's logits are the same alone and padded next to a longer clip."""
    model = _model(**kw)
    gen = torch.Generator().manual_seed(1)
    clip = torch.randn(1, short, 20, generator=gen)
    alone = model(features=clip, lengths=torch.tensor([short]))
    batch = torch.randn(2, 64, 20, generator=gen)  # padding full of junk
    batch[0, :short] = clip[0]
    together = model(features=batch, lengths=torch.tensor([short, 64]))
    torch.testing.assert_close(together[0], alone[0])
    other_alone = model(features=batch[1:], lengths=torch.tensor([64]))
    torch.testing.assert_close(together[1], other_alone[0])


# ----------------------------------------------------------------------------- positions
def test_sinusoidal_positions_follow_the_formula_at_unseen_lengths() -> None:
    model = _model(**FRAMES)
    pos = model._positions(700, torch.zeros(()))[0]
    t, i = 613, 5
    assert pos[t, 2 * i].item() == pytest.approx(math.sin(t / 10000 ** (2 * i / 32)), abs=1e-5)
    assert pos[t, 2 * i + 1].item() == pytest.approx(math.cos(t / 10000 ** (2 * i / 32)),
                                                     abs=1e-5)
    # a 14 s clip (1400 frames): far longer than anything a 1 s training set holds
    out = model(features=torch.randn(1, 1400, 20))
    assert out.shape == (1, 3) and torch.isfinite(out).all()


def test_patch_positions_encode_time_then_frequency() -> None:
    model = _model(**PATCHES)  # freq patches: (20 - 8) // 6 + 1 = 3
    pos = model._positions(4, torch.zeros(()))[0]
    assert pos.shape == (12, 32)
    # token t * 3 + f: first half of the channels = time t, second half = frequency f
    torch.testing.assert_close(pos[2 * 3 + 1, :16], pos[2 * 3 + 0, :16])
    assert pos[2 * 3 + 1, 0].item() == pytest.approx(math.sin(2.0), abs=1e-6)
    assert pos[2 * 3 + 1, 16].item() == pytest.approx(math.sin(1.0), abs=1e-6)


def test_learned_positions_resample_for_longer_clips() -> None:
    model = _model(**{**FRAMES, "pos_embed": "learned", "pos_frames": 20})  # 10 time tokens
    table = model.pos_table.detach()
    torch.testing.assert_close(model._positions(6, table)[0], table[:6])  # a prefix
    # clips of 19 and 4 time tokens in one batch: the long one gets the table stretched to
    # 19 rows (linear, ends aligned: row 9 = old row 4.5), the short one keeps the prefix
    pos = model._positions(19, table, torch.tensor([19, 4]))
    torch.testing.assert_close(pos[0, 0], table[0])
    torch.testing.assert_close(pos[0, -1], table[-1])
    torch.testing.assert_close(pos[0, 9], (table[4] + table[5]) / 2)
    torch.testing.assert_close(pos[1, :4], table[:4])
    assert model(features=torch.randn(2, 100, 20)).shape == (2, 3)


# ----------------------------------------------------------------------------- waveforms
def test_waveform_in_equals_features_in() -> None:
    """The training path (data-module features) and raw waveforms give the same logits."""
    data_tokenizer = _fitted_tokenizer()
    model = _model(**FRAMES)
    model.adopt_stats(data_tokenizer)  # what ClassificationTask.setup does
    gen = torch.Generator().manual_seed(3)
    clips = [_tone(440.0, 0.5, gen), _tone(1000.0, 0.27, gen)]
    features, frame_lengths = data_tokenizer(clips)  # as AudioBatchCollate makes them
    from_features = model(features=features, lengths=frame_lengths)
    padded = torch.zeros(2, clips[0].shape[0])
    padded[0], padded[1, : clips[1].shape[0]] = clips[0], clips[1]
    lengths = torch.tensor([c.shape[0] for c in clips])
    from_waves = model(waveform=padded, lengths=lengths)
    torch.testing.assert_close(from_waves, from_features)
    from_list = model(waveform=clips)
    torch.testing.assert_close(from_list, from_features)
    # a 48 kHz stereo file of the same clip is resampled and mixed down
    single = model(waveform=clips[0][None], sample_rate=SR)
    torch.testing.assert_close(single[0], from_features[0])


def test_stats_flow_between_model_and_data() -> None:
    data_tokenizer = _fitted_tokenizer()
    fresh = _model(**FRAMES)
    assert not fresh.tokenizer.is_fitted
    fresh.adopt_stats(data_tokenizer)  # unfitted model <- data
    torch.testing.assert_close(fresh.tokenizer.mean, data_tokenizer.mean)
    torch.testing.assert_close(fresh.tokenizer.std, data_tokenizer.std)
    assert fresh.tokenizer.is_fitted
    other_data = _fitted_tokenizer(seed=7)
    assert not torch.allclose(other_data.mean, data_tokenizer.mean)
    fresh.adopt_stats(other_data)  # fitted model -> data (its weights were trained so)
    torch.testing.assert_close(other_data.mean, data_tokenizer.mean)
    with pytest.raises(ValueError, match="n_mels: model 20 vs data 40"):
        fresh.adopt_stats(AudioFrameTokenizer(AudioFeatureConfig(n_mels=40)))


def test_predict_on_raw_files_matches_the_training_path(tmp_path: Path, capsys) -> None:
    """Files -> predict batches (waveforms) -> ClassificationTask.predict_step gives the same
    probabilities as training-path features of the same clips."""
    gen = torch.Generator().manual_seed(5)
    clips = {"a_low.wav": _tone(300.0, 0.4, gen), "b_high.flac": _tone(2500.0, 0.7, gen)}
    for name, clip in clips.items():
        sf.write(tmp_path / name, clip.numpy(), SR)
    data_tokenizer = _fitted_tokenizer()
    model = _model(**FRAMES)
    model.adopt_stats(data_tokenizer)
    task = ClassificationTask(model).eval()
    task.class_names = ["low", "mid", "high"]
    items = [AudioFolderDataset(tmp_path)[i] for i in range(2)]
    raw_batch = AudioBatchCollate(None)(items)  # {"waveform", "lengths", "filename"}
    rows = task.predict_step(raw_batch, 0)
    printed = capsys.readouterr().out.splitlines()
    assert [r[0] for r in rows] == ["a_low.wav", "b_high.flac"]
    assert printed[0].startswith("a_low.wav\t")
    feature_batch = AudioBatchCollate(data_tokenizer)(items)  # the training path
    with torch.no_grad():
        probs = task({k: v for k, v in feature_batch.items() if k != "filename"}).softmax(-1)
    conf, idx = probs.max(-1)
    assert [r[1] for r in rows] == [task.class_names[i] for i in idx.tolist()]
    assert [r[2] for r in rows] == pytest.approx(conf.tolist(), abs=1e-5)


# ----------------------------------------------------------------------------- save / load
def test_save_load_round_trip(tmp_path: Path) -> None:
    model = _model(**{**PATCHES, "pos_embed": "learned", "pos_frames": 50})
    model.adopt_stats(_fitted_tokenizer())
    features = torch.randn(2, 60, 20)
    expected = model(features=features, lengths=torch.tensor([60, 33]))
    model.save_pretrained(tmp_path / "audio")
    loaded = mm.from_pretrained(tmp_path / "audio")
    assert isinstance(loaded, AudioClassifier) and loaded.config == model.config
    assert loaded.tokenizer.is_fitted
    torch.testing.assert_close(loaded.tokenizer.std, model.tokenizer.std)
    torch.testing.assert_close(loaded(features=features, lengths=torch.tensor([60, 33])),
                               expected, atol=0, rtol=0)


def test_presets_build() -> None:
    model = mm.create_model("audio_frames_small", num_classes=5, depth=1)
    assert model(features=torch.randn(1, 30, 40)).shape == (1, 5)
    assert "ast_tiny_patch16" in mm.list_presets()


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(features=torch.full((1, 30, 20), float("nan"))), "NaN"),
        (dict(waveform=torch.full((1, 4000), float("nan"))), "NaN"),
        (dict(waveform=torch.randn(1, 100)), "too short"),
        (dict(features=torch.randn(30, 20)), r"\(B, frames, n_mels=20\)"),
        (dict(features=torch.randn(1, 30, 40)), r"\(B, frames, n_mels=20\)"),
        (dict(waveform=torch.randn(1, 1, 1, 4000)), "waveform must be"),
        (dict(features=torch.randn(2, 30, 20), lengths=torch.tensor([30, 31])), "lengths"),
        (dict(features=torch.randn(2, 30, 20), lengths=torch.tensor([30])), "lengths"),
        (dict(features=torch.randint(0, 3, (1, 30, 20))), "float"),
        ({}, "exactly one"),
        (dict(features=torch.randn(1, 30, 20), waveform=torch.randn(1, 4000)), "exactly one"),
    ],
    ids=["nan-features", "nan-waveform", "too-short", "rank-2", "wrong-mels", "rank-4-wave",
         "long-length", "lengths-shape", "int-features", "no-input", "both-inputs"],
)
def test_bad_input_raises_value_error(kwargs, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _model(**FRAMES)(**kwargs)


def test_bad_config_raises_value_error() -> None:
    with pytest.raises(ValueError, match="pool"):
        AudioClassifierConfig(pool="max")
    with pytest.raises(ValueError, match="mode"):
        AudioClassifierConfig(mode="wave")
    with pytest.raises(ValueError, match="patch_size"):
        AudioClassifierConfig(mode="patches", n_mels=8, patch_size=16)


# ----------------------------------------------------------------------------- learning
def test_tiny_model_learns_two_tones() -> None:
    """Two classes, 400 Hz vs 1200 Hz tones of random length, phase, level and noise:
    a few seconds of training, > 90% on fresh clips."""
    gen = torch.Generator().manual_seed(0)

    def data(n: int) -> tuple[list[torch.Tensor], torch.Tensor]:
        labels = torch.randint(0, 2, (n,), generator=gen)
        lengths = 0.1 + 0.2 * torch.rand(n, generator=gen)
        clips = [_tone((400.0, 1200.0)[int(y)], float(s), gen, noise=0.2)
                 for y, s in zip(labels, lengths, strict=True)]
        return clips, labels

    train_clips, train_y = data(128)
    test_clips, test_y = data(64)
    tokenizer = AudioFrameTokenizer(AudioFeatureConfig(n_mels=20)).fit_stats(train_clips)
    train_x, train_len = tokenizer(train_clips)
    test_x, test_len = tokenizer(test_clips)
    model = AudioClassifier(AudioClassifierConfig(
        num_classes=2, dim=16, depth=1, heads=2, mlp_dim=32, n_mels=20, stack_frames=4))
    model.adopt_stats(tokenizer)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(3):
        for i in range(0, 128, 32):
            loss = torch.nn.functional.cross_entropy(
                model(features=train_x[i : i + 32], lengths=train_len[i : i + 32]),
                train_y[i : i + 32])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        acc = (model(features=test_x, lengths=test_len).argmax(-1) == test_y).float().mean()
        untrained = AudioClassifier(model.config).eval()
        untrained.adopt_stats(tokenizer)
        chance = (untrained(features=test_x, lengths=test_len).argmax(-1) == test_y).float()
    assert acc > 0.9, (acc, chance.mean())


# ----------------------------------------------------------------------------- CLI (slow)
@pytest.mark.slow
def test_cli_fit_then_predict_spoken_words(tmp_path: Path, capsys) -> None:
    """The spoken-words config end to end on a slice of the data: fit, test, then predict a
    folder of raw files from the held-out test voices with the checkpoint."""
    from multimodal.cli.main import main as cli_main
    from multimodal.data.sources.spoken_words import DEFAULT_ROOT, read_manifest, split_voices
    from multimodal.data.sources.spoken_words import SPOKEN_WORDS as rows_words

    words = DEFAULT_ROOT / "spoken_words"
    if not (words / "manifest.csv").is_file():
        pytest.skip("spoken words not synthesised (bash data/get_audio.sh)")
    run = tmp_path / "run"
    cfg = yaml.safe_load(Path("configs/audio_spoken_words.yaml").read_text())
    cfg["data"]["init_args"].update(limit_train=256, stats_clips=64)
    cfg["trainer"] = dict(
        accelerator="cpu", max_epochs=1, limit_val_batches=2, limit_test_batches=2,
        enable_progress_bar=False, logger=False, default_root_dir=str(run),
        callbacks=[{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                    "init_args": {"dirpath": str(run / "ckpt"), "save_last": True}}])
    config = tmp_path / "audio.yaml"
    config.write_text(yaml.safe_dump(cfg))
    cli_main(["fit", "--config", str(config)])
    ckpt = run / "ckpt" / "last.ckpt"
    assert ckpt.is_file()
    rows = read_manifest(words)
    test_voices = set(split_voices(r["voice"] for r in rows)["test"])
    folder = tmp_path / "clips"
    folder.mkdir()
    chosen = [r for r in rows if r["voice"] in test_voices][:3]
    for i, r in enumerate(chosen):
        (folder / f"{i}_{r['word']}.wav").write_bytes((words / r["path"]).read_bytes())
    capsys.readouterr()
    cli_main(["predict", "--config", str(config), "--ckpt_path", str(ckpt),
              "--data.init_args.predict", str(folder)])
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.count("\t") == 2]
    assert [ln.split("\t")[0] for ln in lines] == sorted(p.name for p in folder.iterdir())
    assert all(ln.split("\t")[1] in {r["word"] for r in rows} for ln in lines)
    # the checkpoint's model on the raw files (its own tokenizer and stats) agrees with the
    # CLI's predict (data-module features)
    model = mm.from_pretrained(ckpt)
    files = sorted(folder.iterdir())
    probs = torch.cat([model.predict_waveform(*load_audio(f)) for f in files])
    conf, idx = probs.max(-1)
    assert [ln.split("\t")[1] for ln in lines] == [rows_words[i] for i in idx.tolist()]
    assert [float(ln.split("\t")[2]) for ln in lines] == pytest.approx(conf.tolist(), abs=1e-3)
