"""Audio and checkpoint inputs from outside: integer PCM of every width
rescaled the same way on every audio path (checked against soundfile's and scipy's own
float conversion), stereo in either layout, 25-45 ms clips through the codec, files that are
not checkpoints, text the phonemiser cannot read, bad sampling settings."""

from __future__ import annotations

import io
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

import multimodal as mm
from multimodal.checkpoints import read_checkpoint
from multimodal.data.audio_transforms import Resampler
from multimodal.encoder import Encoder
from multimodal.models.audio import AudioClassifier, AudioClassifierConfig
from multimodal.tokenizers.audio import AudioFeatureConfig, AudioFrameTokenizer
from multimodal.tokenizers.codec import CodecConfig, MelRVQCodec
from multimodal.tokenizers.phonemes import PhonemeTokenizer, unreadable_letters
from multimodal.tokenizers.waveform import as_mono, pcm_to_float

SR = 16000


def _speechlike(seconds: float = 0.6, seed: int = 0) -> np.ndarray:
    g = np.random.default_rng(seed)
    t = np.arange(int(seconds * SR)) / SR
    wave = sum(np.sin(2 * math.pi * h * 170 * t) / h for h in range(1, 6))
    return (0.25 * wave * np.hanning(t.size) + 0.003 * g.standard_normal(t.size)
            ).astype(np.float32)


def _pcm(wave: np.ndarray, subtype: str, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """``wave`` written as a ``subtype`` WAV and read back by soundfile twice: as the
    integers ``dtype`` and as soundfile's own float32 (the reference scaling)."""
    buf = io.BytesIO()
    sf.write(buf, wave, SR, subtype=subtype, format="WAV")
    buf.seek(0)
    ints, _ = sf.read(buf, dtype=dtype)
    buf.seek(0)
    floats, _ = sf.read(buf, dtype="float32")
    return ints, floats


# --- integer PCM ---------------------------------------------------------------------------


@pytest.mark.parametrize(("subtype", "dtype"), [("PCM_16", "int16"), ("PCM_24", "int32"),
                                                ("PCM_32", "int32")])
def test_integer_pcm_is_scaled_as_soundfile_scales_it(subtype, dtype):
    ints, floats = _pcm(_speechlike(), subtype, dtype)
    assert ints.dtype == np.dtype(dtype) and np.abs(ints).max() > 1000
    torch.testing.assert_close(pcm_to_float(ints), torch.from_numpy(floats), atol=1e-7,
                               rtol=0)
    torch.testing.assert_close(pcm_to_float(torch.from_numpy(ints)), torch.from_numpy(floats),
                               atol=1e-7, rtol=0)


def test_unsigned_8_bit_wav_is_scaled_as_scipy_reads_it():
    from scipy.io import wavfile

    buf = io.BytesIO()
    sf.write(buf, _speechlike(), SR, subtype="PCM_U8", format="WAV")
    buf.seek(0)
    _, u8 = wavfile.read(buf)
    buf.seek(0)
    floats, _ = sf.read(buf, dtype="float32")
    assert u8.dtype == np.uint8
    torch.testing.assert_close(pcm_to_float(u8), torch.from_numpy(floats), atol=1e-7, rtol=0)


def test_every_integer_width_maps_its_full_range_to_minus_one_one():
    for dtype in (torch.int8, torch.int16, torch.int32, torch.int64):
        info = torch.iinfo(dtype)
        x = pcm_to_float(torch.tensor([info.min, 0, info.max], dtype=dtype))
        assert x[0] == -1.0 and x[1] == 0.0 and 0.99 < x[2] <= 1.0
    for dtype in (torch.uint8, torch.uint16, torch.uint32):
        top = 2 ** torch.iinfo(dtype).bits - 1
        x = pcm_to_float(torch.tensor([0, top // 2 + 1, top], dtype=dtype))
        assert x[0] == -1.0 and x[1] == 0.0 and 0.99 < x[2] <= 1.0
    with pytest.raises(ValueError, match=r"torch\.bool"):
        pcm_to_float(torch.ones(10, dtype=torch.bool))


def test_int16_gives_the_same_features_on_every_audio_path():
    """What scipy.io.wavfile returns (int16) and what soundfile returns (float32) give the
    same result through the front end (Encoder / AudioClassifier), the data's resampler,
    the codec."""
    ints, floats = _pcm(_speechlike(), "PCM_16", "int16")
    i16, f32 = torch.from_numpy(ints), torch.from_numpy(floats)
    tok = AudioFrameTokenizer(AudioFeatureConfig(n_mels=20))
    ref = tok(f32, SR)[0]
    for given in (i16, ints, [i16], [ints], i16[None]):
        torch.testing.assert_close(tok(given, SR)[0], ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(tok(i16, 8000)[0], tok(f32, 8000)[0], atol=1e-5, rtol=0)

    model = AudioClassifier(AudioClassifierConfig(num_classes=3, dim=32, depth=1, heads=4,
                                                  mlp_dim=64, n_mels=20)).eval()
    enc = Encoder(model)
    torch.testing.assert_close(enc.preprocess(ints), enc.preprocess(floats), atol=1e-5, rtol=0)
    torch.testing.assert_close(model.features_from_waveform(i16)[0],
                               model.features_from_waveform(f32)[0], atol=1e-5, rtol=0)

    resample = Resampler()
    for rate in (SR, 22050):
        torch.testing.assert_close(resample(i16[None], rate), resample(f32[None], rate),
                                   atol=1e-6, rtol=0)

    codec = _codec()
    assert torch.equal(codec.encode(i16, SR), codec.encode(f32, SR))
    assert torch.equal(codec.encode(ints, SR), codec.encode(f32, SR))


# --- layouts and short clips -------------------------------------------------------------


def test_stereo_in_soundfile_layout_is_averaged_like_channels_first():
    left, right = torch.from_numpy(_speechlike(seed=1)), torch.from_numpy(_speechlike(seed=2))
    first, last = torch.stack([left, right]), torch.stack([left, right], dim=1)
    assert last.shape == (left.numel(), 2)
    torch.testing.assert_close(as_mono(last), (left + right) / 2)
    torch.testing.assert_close(as_mono(first), (left + right) / 2)
    codec = _codec()
    assert torch.equal(codec.encode(last, SR), codec.encode(first, SR))
    tok = AudioFrameTokenizer(AudioFeatureConfig(n_mels=20))
    torch.testing.assert_close(tok([last.numpy()], SR)[0], tok([first], SR)[0])
    with pytest.raises(ValueError, match=r"\(samples, channels\).*\(2, 3, 4\)"):
        as_mono(torch.zeros(2, 3, 4))
    # a 2-D tensor is a batch (B, T) for the front end: soundfile's layout is named
    with pytest.raises(ValueError, match=r"\[0, 1, .*, 19, \.\.\. and 15980 more\] too short"
                                         r".*\(samples, channels\) layout, \(16000, 2\), "
                                         r"pass waveform\.T"):
        tok(torch.randn(16000, 2) * 0.1, SR)
    torch.testing.assert_close(tok(last.T, SR)[0], tok(first, SR)[0])


_CODEC: list[MelRVQCodec] = []


def _codec() -> MelRVQCodec:
    if not _CODEC:
        codec = MelRVQCodec(CodecConfig(num_codebooks=2, codebook_size=8, kmeans_iters=2,
                                        griffin_lim_iters=2))
        codec.fit([torch.from_numpy(_speechlike(seed=i)) for i in range(3)])
        _CODEC.append(codec)
    return _CODEC[0]


@pytest.mark.parametrize("ms", [25, 30, 35, 40, 45])
def test_codec_decodes_every_clip_it_encodes(ms):
    codec = _codec()
    f = codec.config.features
    clip = torch.from_numpy(_speechlike(seconds=ms / 1000, seed=ms))[: int(SR * ms / 1000)]
    clip = clip + 0.05 * torch.randn(clip.numel(), generator=torch.Generator().manual_seed(0))
    tokens = codec.encode(clip, SR)
    frames = tokens.shape[1]
    assert frames == 1 + (clip.numel() - f.win_length) // f.hop_length
    wave = codec.decode(tokens)
    assert wave.shape == ((frames - 1) * f.hop_length + f.win_length,)
    assert torch.isfinite(wave).all() and wave.abs().max() > 0


# --- checkpoints that are not checkpoints --------------------------------------------------


_NOT_CHECKPOINTS = {
    "notes.ckpt": (b"remember to train the model\n", "a text file"),
    "lfs.ckpt": (b"version https://git-lfs.github.com/spec/v1\noid sha256:4d7a2146\n"
                 b"size 132\n", "Git LFS pointer"),
    "page.ckpt": (b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head></html>",
                  "HTML page"),
    "empty.ckpt": (b"", "empty"),
    "noise.ckpt": (bytes(range(200, 256)) * 4, "starts with the bytes"),
}


@pytest.mark.parametrize("name", sorted(_NOT_CHECKPOINTS))
def test_a_file_that_is_not_a_checkpoint_is_named(tmp_path, name):
    data, what = _NOT_CHECKPOINTS[name]
    path = tmp_path / name
    path.write_bytes(data)
    pattern = rf"{name} is not a checkpoint file: .*{what}"
    with pytest.raises(ValueError, match=pattern):
        read_checkpoint(path)
    with pytest.raises(ValueError, match=pattern):
        mm.synthesize(path, "the cat", torch.zeros(SR))
    with pytest.raises(ValueError, match=pattern):
        mm.from_pretrained(path)


def test_speak_cli_says_not_a_checkpoint_without_a_traceback(tmp_path, capsys):
    from multimodal.cli.main import main

    (tmp_path / "notes.ckpt").write_text("hello\n")
    sf.write(tmp_path / "voice.wav", _speechlike(), SR)
    with pytest.raises(SystemExit) as info:
        main(["speak", "--ckpt", str(tmp_path / "notes.ckpt"), "--text", "the cat",
              "--prompt", str(tmp_path / "voice.wav"), "--out", str(tmp_path / "o.wav")])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert "notes.ckpt is not a checkpoint file: it is a text file" in err
    assert "Traceback" not in err


def test_a_truncated_checkpoint_names_the_file(tmp_path):
    path = tmp_path / "cut.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(1000)}}, path)
    path.write_bytes(path.read_bytes()[:600])
    with pytest.raises(ValueError, match=r"cut\.ckpt is not a readable checkpoint"):
        read_checkpoint(path)


# --- text and sampling -----------------------------------------------------------------


def test_scripts_a_voice_does_not_read_are_found():
    assert unreadable_letters("你好世界", "en-us") == {"CJK": "你好世界"}
    assert unreadable_letters("hello 世界, привет", "en-gb+f3") == {"CJK": "世界",
                                                                   "CYRILLIC": "привет"}
    assert unreadable_letters("привет, hello", "ru") == {}
    assert unreadable_letters("こんにちは世界", "ja") == {}
    assert unreadable_letters("any text 你好", "xx-unknown") == {}


def test_unreadable_text_is_refused_or_warned():
    from multimodal.pipelines.speak import check_readable

    tok = PhonemeTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[BOS]", "[EOS]"],
                           backend="chars")
    tok.backend, tok.voice = "espeak", "en-us"  # the check reads only these two
    with pytest.raises(ValueError, match=r"CJK \('你好世界'\) letters .* 'en-us'.*nothing"):
        check_readable(tok, "你好世界")
    with pytest.warns(UserWarning, match=r"CJK \('世界'\) letters"):
        check_readable(tok, "hello 世界")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_readable(tok, "hello world")


@pytest.fixture(scope="module")
def tts_task(tmp_path_factory):
    from tests.models.test_codec_lm import _trained_task

    return _trained_task(tmp_path_factory.mktemp("tts"))


def test_synthesize_warns_on_unknown_phonemes_and_refuses_negative_temperature(tts_task):
    from multimodal.pipelines.speak import synthesize

    task, _ = tts_task
    prompt = torch.from_numpy(_speechlike(seconds=1.0))
    with pytest.warns(UserWarning, match=r"3 of the \d+ phoneme tokens .* \[UNK\]"):
        synthesize(task, "the cat zqx", prompt, SR, temperature=0)
    for bad in (-1, -0.5, float("nan")):
        with pytest.raises(ValueError, match="temperature must be >= 0"):
            synthesize(task, "the cat", prompt, SR, temperature=bad)


def test_prompt_in_int16_and_soundfile_stereo_layout_speaks_like_float(tts_task, tmp_path):
    from multimodal.pipelines.speak import synthesize

    task, _ = tts_task
    ints, floats = _pcm(_speechlike(seconds=1.0), "PCM_16", "int16")
    ref, _ = synthesize(task, "the cat", torch.from_numpy(floats), SR, temperature=0)
    for prompt in (torch.from_numpy(ints), ints, np.stack([ints, ints], axis=1),
                   torch.from_numpy(np.stack([floats, floats], axis=1))):
        got, _ = synthesize(task, "the cat", prompt, SR, temperature=0)
        torch.testing.assert_close(got, ref)


def test_docs_list_the_hostile_folder_behaviour():
    text = (Path(__file__).parents[1] / "docs" / "encoders.md").read_text()
    for phrase in ("safetensors header", "num_hidden_layers", "... and", "not a safetensors"):
        assert phrase in text, phrase
