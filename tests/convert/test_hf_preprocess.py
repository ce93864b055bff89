"""Imported models come with their input pipelines: our Kaldi fbank / Whisper log-mel /
image preprocessing against transformers' feature extractors and image processors on real
inputs (a spoken-word WAV, an emoji PNG), and ``mm.load_encoder(folder)`` reading
``preprocessor_config.json`` so that raw inputs give the transformers processor + model's
outputs (random-weight models of small configs; atol 1e-4)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import torchaudio

import multimodal as mm
from multimodal.convert.hf_audio import ast_token_order
from multimodal.convert.hf_preprocess import ImagePreprocessor
from multimodal.tokenizers.audio import AudioFeatureConfig, AudioFrameTokenizer, load_audio
from multimodal.tokenizers.audio_frontends import AST_MEAN, AST_STD

transformers = pytest.importorskip("transformers")
PIL = pytest.importorskip("PIL")

ROOT = Path(__file__).resolve().parents[2]
ATOL = 1e-4
SPOKEN = ROOT / "data" / "cache" / "spoken_words" / "wav"
EMOJI = ROOT / "data" / "cache" / "emoji" / "package" / "img" / "twitter" / "64"


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> torch.Tensor:
    """A real spoken word, mono at 16 kHz: from the spoken-words cache, else synthesised
    with espeak-ng; skipped when neither is available."""
    wavs = sorted(SPOKEN.glob("*/*.wav"))[:1] if SPOKEN.is_dir() else []
    if not wavs and shutil.which("espeak-ng"):
        out = tmp_path_factory.mktemp("speech") / "word.wav"
        subprocess.run(["espeak-ng", "-w", str(out), "seven"], check=True, timeout=60)
        wavs = [out]
    if not wavs:
        pytest.skip("no spoken-word WAV: data/cache/spoken_words missing (bash data/get.sh "
                    "spoken_words) and espeak-ng not installed")
    wave, rate = load_audio(wavs[0])
    clip = wave.mean(dim=0)
    return torchaudio.functional.resample(clip, rate, 16000) if rate != 16000 else clip


def _frontend(frontend: str, n_mels: int, frames: int, mean: float, std: float):
    tok = AudioFrameTokenizer(AudioFeatureConfig(n_mels=n_mels, frontend=frontend,
                                                 max_frames=frames))
    tok.mean.fill_(mean)
    tok.std.fill_(std)
    return tok


def test_kaldi_fbank_matches_ast_feature_extractor(speech):
    fe = transformers.ASTFeatureExtractor(num_mel_bins=128, max_length=1024)
    want = fe(speech.numpy(), sampling_rate=16000, return_tensors="pt")["input_values"]
    got, lengths = _frontend("kaldi_fbank", 128, 1024, AST_MEAN, 2 * AST_STD)(speech, 16000)
    assert got.shape == want.shape == (1, 1024, 128) and lengths.tolist() == [1024]
    torch.testing.assert_close(got, want, atol=ATOL, rtol=1e-5)
    # the padding frames are AST's normalised zeros, -mean / (2 std), not 0
    assert torch.allclose(got[0, -1], torch.full((128,), -AST_MEAN / (2 * AST_STD)))


@pytest.mark.parametrize("n_mels", [80, 128])
def test_whisper_log_mel_matches_whisper_feature_extractor(speech, n_mels):
    # transformers computes this with torch.stft when torch is installed (its numpy STFT
    # only without torch), so the same float32 operations agree to rounding
    fe = transformers.WhisperFeatureExtractor(feature_size=n_mels)
    want = fe(speech.numpy(), sampling_rate=16000, return_tensors="pt")["input_features"]
    got, _ = _frontend("whisper", n_mels, 3000, -4.0, 4.0)(speech, 16000)
    assert got.shape == (1, 3000, n_mels)
    torch.testing.assert_close(got.transpose(1, 2), want, atol=ATOL, rtol=1e-5)
    # the dynamic range is 8 in log10 units: (max - min) / 4 <= 2 after (L + 4) / 4
    assert (got.max() - got.min()).item() <= 2.0 + 1e-6


def _perturb(model):
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def test_ast_folder_waveform_to_logits(tmp_path, speech):
    torch.manual_seed(0)
    cfg = transformers.ASTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=48, max_length=128, num_mel_bins=128,
                                 num_labels=4)
    source = _perturb(transformers.ASTForAudioClassification(cfg))
    fe = transformers.ASTFeatureExtractor(num_mel_bins=128, max_length=128, mean=-3.0, std=2.5)
    source.save_pretrained(tmp_path)
    fe.save_pretrained(tmp_path)
    encoder = mm.load_encoder(tmp_path)
    assert encoder.modality == "audio"
    inputs = fe(speech.numpy(), sampling_rate=16000, return_tensors="pt")["input_values"]
    with torch.no_grad():
        want = source(inputs)
        hidden = source.audio_spectrogram_transformer(inputs).last_hidden_state
        logits = encoder.backbone(waveform=speech)
        tokens = encoder.encode(speech, output="tokens").features
    # the folder's own statistics (mean -3, std 2.5), not AudioSet's, were applied
    torch.testing.assert_close(encoder.preprocess(speech), inputs, atol=ATOL, rtol=1e-5)
    torch.testing.assert_close(logits, want.logits, atol=ATOL, rtol=1e-4)
    order = ast_token_order(encoder.backbone.embed.freq_patches,
                            encoder.backbone.embed.time_patches(128))
    torch.testing.assert_close(tokens[:, order], hidden, atol=ATOL, rtol=1e-4)


def test_whisper_folder_waveform_to_encoder_states(tmp_path, speech):
    torch.manual_seed(0)
    cfg = transformers.WhisperConfig(
        d_model=32, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=48,
        decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=48, num_mel_bins=80,
        max_source_positions=50, vocab_size=100, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, decoder_start_token_id=1)
    source = _perturb(transformers.WhisperModel(cfg))
    fe = transformers.WhisperFeatureExtractor(feature_size=80, chunk_length=1)  # 100 frames
    source.save_pretrained(tmp_path)
    fe.save_pretrained(tmp_path)
    encoder = mm.load_encoder(tmp_path)
    feats = fe(speech.numpy(), sampling_rate=16000, return_tensors="pt")["input_features"]
    with torch.no_grad():
        want = source.encoder(feats).last_hidden_state
    torch.testing.assert_close(encoder.encode(speech, output="tokens").features, want,
                               atol=ATOL, rtol=1e-4)
    # one embedding per clip: the mean of the encoder states
    torch.testing.assert_close(encoder.encode(speech), want.mean(1), atol=ATOL, rtol=1e-4)


def test_audio_preprocessor_that_does_not_fit_the_model_is_named(tmp_path):
    cfg = transformers.ASTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=32, max_length=64, num_mel_bins=64)
    transformers.ASTModel(cfg).save_pretrained(tmp_path)
    transformers.ASTFeatureExtractor(num_mel_bins=128, max_length=64).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"preprocessor_config\.json does not fit the model: "
                                         r"num_mel_bins=128 but the model has 64"):
        mm.load_encoder(tmp_path)
    pre = json.loads((tmp_path / "preprocessor_config.json").read_text())
    pre["feature_extractor_type"] = "Wav2Vec2FeatureExtractor"
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(pre))
    with pytest.raises(ValueError, match=r"unsupported feature_extractor_type "
                                         r"'Wav2Vec2FeatureExtractor'.*ASTFeatureExtractor"):
        mm.load_encoder(tmp_path)


def _emoji() -> Path:
    pngs = sorted(EMOJI.glob("*.png"))[:1] if EMOJI.is_dir() else []
    if not pngs:
        pytest.skip("no emoji PNG: data/cache/emoji missing (bash data/get.sh emoji)")
    return pngs[0]


@pytest.mark.parametrize("processor", [
    dict(kind="ViTImageProcessor", size={"height": 48, "width": 40}),
    dict(kind="CLIPImageProcessor", size={"shortest_edge": 40},
         crop_size={"height": 36, "width": 36}),
    dict(kind="BitImageProcessor", size={"shortest_edge": 80}, crop_size={"height": 70,
                                                                         "width": 70}),
    dict(kind="ViTImageProcessor", size={"height": 72, "width": 72}, resample=3),
], ids=["vit-bilinear", "clip-crop", "dinov2-bit", "vit-bicubic"])
def test_image_preprocessor_matches_transformers(processor):
    png = _emoji()
    kw = dict(processor)
    proc = getattr(transformers, kw.pop("kind"))(**kw)
    with PIL.Image.open(png) as img:
        want = proc(img.convert("RGB"), return_tensors="pt")["pixel_values"]
    got = ImagePreprocessor.from_dict(proc.to_dict())(png)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=ATOL, rtol=1e-5)


def test_vit_folder_png_to_features(tmp_path):
    png = _emoji()
    torch.manual_seed(0)
    cfg = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32,
                                 num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=48)
    source = _perturb(transformers.ViTModel(cfg))
    proc = transformers.ViTImageProcessor(size={"height": 32, "width": 32},
                                          image_mean=[0.4, 0.5, 0.6], image_std=[0.2, 0.3, 0.25])
    source.save_pretrained(tmp_path)
    proc.save_pretrained(tmp_path)
    encoder = mm.load_encoder(tmp_path)
    with PIL.Image.open(png) as img:
        pixels = proc(img.convert("RGB"), return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        want = source(pixels).last_hidden_state
    torch.testing.assert_close(encoder.encode([png], output="tokens").features, want,
                               atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(encoder.encode([png]), want[:, 0], atol=ATOL, rtol=1e-4)


# Photo sizes whose resized side minus the crop is odd (333x251 -> 339x256 for a 256 / 224
# BiT processor: offset 57.5) and even, portrait and landscape, up- and down-sampled.
PHOTO_SIZES = [(333, 251), (251, 333), (339, 256), (320, 240), (97, 61), (64, 64)]
PROCESSORS = {
    "ViTImageProcessor": dict(size={"height": 224, "width": 224}),
    "BitImageProcessor": dict(size={"shortest_edge": 256}, crop_size={"height": 224,
                                                                      "width": 224}),
    "CLIPImageProcessor": dict(size={"shortest_edge": 224}, crop_size={"height": 224,
                                                                       "width": 224}),
    "SiglipImageProcessor": dict(size={"height": 224, "width": 224}),
    "DeiTImageProcessor": dict(size={"height": 256, "width": 256},
                               crop_size={"height": 224, "width": 224}),
}


def _photo(width: int, height: int, seed: int = 0):
    """A photo-like RGB image: noise blurred into smooth regions and edges."""
    import numpy as np
    from PIL import ImageFilter

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return PIL.Image.fromarray(pixels).filter(ImageFilter.GaussianBlur(2))


@pytest.mark.parametrize("size", PHOTO_SIZES, ids=[f"{w}x{h}" for w, h in PHOTO_SIZES])
@pytest.mark.parametrize("kind", list(PROCESSORS))
def test_image_preprocessor_is_transformers_to_the_bit(kind, size):
    """transformers' default (torchvision) image processors, every supported class, odd and
    even crop offsets: the same float32 pixel tensor, bit for bit (max difference 0)."""
    proc = getattr(transformers, kind)(**PROCESSORS[kind])
    image = _photo(*size)
    want = proc(image, return_tensors="pt")["pixel_values"]
    got = ImagePreprocessor.from_dict(proc.to_dict())(image)
    assert got.shape == want.shape
    assert torch.equal(got, want), (got - want).abs().max().item()


@pytest.mark.parametrize("kind", list(PROCESSORS))
def test_image_preprocessor_against_the_pil_backends(kind):
    """transformers' PIL backends (``...ImageProcessorPil``) resample with Pillow, not
    torchvision: the crop window is the same, the pixels within 2 uint8 steps."""
    cls = getattr(transformers, f"{kind}Pil", None)
    if cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {kind}Pil")
    proc = cls(**PROCESSORS[kind])
    for size in PHOTO_SIZES[:3]:
        image = _photo(*size, seed=1)
        want = proc(image, return_tensors="pt")["pixel_values"]
        got = ImagePreprocessor.from_dict(proc.to_dict())(image)
        step = 1.0 / (255.0 * torch.tensor(proc.image_std))[:, None, None]
        assert ((got - want).abs() / step).max() <= 2.0 + 1e-3


@pytest.mark.parametrize("image_hw,crop", [((7, 9), (4, 4)), ((8, 8), (3, 5)),
                                           ((5, 6), (8, 8)), ((5, 9), (8, 4))])
def test_center_crop_offsets_and_padding_are_transformers(image_hw, crop):
    """Floored offsets, and zero padding split as transformers' torchvision backend splits
    it when the crop is larger than the image (odd differences included)."""
    from transformers.image_processing_backends import TorchvisionBackend
    from transformers.image_utils import SizeDict

    from multimodal.tokenizers.image_geometry import center_crop

    image = torch.arange(3 * image_hw[0] * image_hw[1], dtype=torch.uint8).reshape(3, *image_hw)
    want = TorchvisionBackend.center_crop(None, image, SizeDict(height=crop[0], width=crop[1]))
    assert torch.equal(center_crop(image, crop), want)
