"""Audio tokenizer: log-mel frames against their definition, resampling, errors, embeddings."""

from __future__ import annotations

import math

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio

from multimodal.nn.embed import FrameEmbed, SpecAugment, SpectrogramPatchEmbed
from multimodal.tokenizers.audio import AudioFeatureConfig, AudioFrameTokenizer, load_audio

torch.set_num_threads(1)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _reference_log_mel(x: torch.Tensor, n_mels: int = 80, sr: int = 16000) -> torch.Tensor:
    """Log-mel by its definition: 400-sample periodic Hann frames every 160 samples,
    |rfft|^2, HTK triangular filters, log(. + 1e-6). Returns (frames, n_mels)."""
    frames = x.double().unfold(0, 400, 160)  # (F, 400)
    window = torch.hann_window(400, periodic=True, dtype=torch.float64)
    power = torch.fft.rfft(frames * window, dim=-1).abs() ** 2  # (F, 201)
    fb = torchaudio.functional.melscale_fbanks(201, 0.0, sr / 2, n_mels, sr, mel_scale="htk")
    return torch.log(power @ fb.double() + 1e-6)


@pytest.mark.parametrize("num_samples", [400, 559, 560, 16000, 12345])
def test_frame_count_and_values_match_definition(num_samples: int) -> None:
    tok = AudioFrameTokenizer()
    x = torch.randn(num_samples, generator=_gen(num_samples)) * 0.1
    feats, lengths = tok(x)
    expected_frames = 1 + (num_samples - 400) // 160
    assert feats.shape == (1, expected_frames, 80)
    assert lengths.tolist() == [expected_frames]
    torch.testing.assert_close(feats[0].double(), _reference_log_mel(x), atol=2e-3, rtol=1e-4)
    # and against torchaudio's own MelSpectrogram transform built independently
    ms = torchaudio.transforms.MelSpectrogram(
        16000, n_fft=400, win_length=400, hop_length=160, n_mels=80, center=False
    )
    torch.testing.assert_close(feats[0], torch.log(ms(x) + 1e-6).T)


def test_config_derived_sizes() -> None:
    c = AudioFeatureConfig(n_mels=128)
    assert (c.win_length, c.hop_length, c.n_fft) == (400, 160, 400)
    assert c.num_frames(16000) == 98
    assert c.num_frames(399) == 0
    assert AudioFeatureConfig(max_frames=50).num_frames(16000) == 50
    with pytest.raises(ValueError, match="mode"):
        AudioFeatureConfig(mode="pixels")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="f_max"):
        AudioFeatureConfig(f_max=9000.0)


@pytest.mark.parametrize("rate", [8000, 22050, 44100])
def test_resampled_input_gives_16k_frame_count(rate: int) -> None:
    tok = AudioFrameTokenizer()
    seconds = 0.75
    x = torch.randn(int(rate * seconds), generator=_gen(rate)) * 0.1
    feats, lengths = tok(x, sample_rate=rate)
    n16 = math.ceil(int(rate * seconds) * 16000 / rate)
    assert n16 == 12000
    assert lengths.item() == feats.shape[1] == 1 + (n16 - 400) // 160


def test_resampling_keeps_a_tone_in_its_mel_bin() -> None:
    tok = AudioFrameTokenizer()
    t8 = torch.arange(8000) / 8000
    t16 = torch.arange(16000) / 16000
    tone8 = torch.sin(2 * math.pi * 1000 * t8)
    tone16 = torch.sin(2 * math.pi * 1000 * t16)
    f8, _ = tok(tone8, sample_rate=8000)
    f16, _ = tok(tone16, sample_rate=16000)
    assert f8.shape == f16.shape
    peak8 = f8[0, 5:-5].mean(0).argmax()
    peak16 = f16[0, 5:-5].mean(0).argmax()
    assert peak8 == peak16
    hz = torchaudio.functional.melscale_fbanks(201, 0.0, 8000, 80, 16000).argmax(0)[peak16] * 40
    assert abs(int(hz) - 1000) <= 80


def test_stereo_is_downmixed_by_mean() -> None:
    tok = AudioFrameTokenizer()
    stereo = torch.randn(2, 8000, generator=_gen(1)) * torch.tensor([[0.5], [0.05]])
    f_list, _ = tok([stereo])
    f_batch, _ = tok(stereo.unsqueeze(0))
    f_mean, _ = tok(stereo.mean(0))
    torch.testing.assert_close(f_list, f_mean)
    torch.testing.assert_close(f_batch, f_mean)
    f_left, _ = tok(stereo[0])
    assert not torch.allclose(f_left, f_mean)


def test_bad_inputs_raise_clear_errors(tmp_path) -> None:
    tok = AudioFrameTokenizer()
    x = torch.randn(1000)
    x[10] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        tok(x)
    y = torch.randn(1000)
    y[3] = float("inf")
    with pytest.raises(ValueError, match="NaN or inf"):
        tok([y])
    with pytest.raises(ValueError, match="at least 400 samples"):
        tok(torch.randn(399))
    tok(torch.randn(400))  # exactly one window is fine
    with pytest.raises(ValueError, match="at least 400 samples"):
        tok(torch.randn(199), sample_rate=8000)  # 199 -> 398 samples at 16 kHz
    with pytest.raises(ValueError, match=r"\(T,\), \(B, T\) or \(B, C, T\)"):
        tok(torch.randn(1, 1, 2, 1000))
    with pytest.raises(ValueError, match="got a tensor of shape"):
        tok(torch.tensor(0.5))
    with pytest.raises(ValueError, match="clip 1 must be"):
        tok([torch.randn(800), torch.randn(1, 2, 800)])
    with pytest.raises(ValueError, match="sample_rate"):
        tok(torch.randn(800), sample_rate=0)
    bad = tmp_path / "notes.wav"
    bad.write_text("this is not audio\n")
    with pytest.raises(ValueError, match=r"notes\.wav"):
        load_audio(bad)
    with pytest.raises(FileNotFoundError, match=r"missing\.flac"):
        load_audio(tmp_path / "missing.flac")


def test_load_audio_reads_wav_and_flac(tmp_path) -> None:
    rng = np.random.default_rng(0)
    data = (rng.standard_normal((3000, 2)) * 0.1).astype(np.float32)
    for name in ("a.wav", "a.flac"):
        sf.write(tmp_path / name, data, 22050)
        wave, rate = load_audio(tmp_path / name)
        assert rate == 22050
        assert wave.dtype == torch.float32
        assert wave.shape == (2, 3000)
        # 16-bit quantisation: within one step of 2^-15
        np.testing.assert_allclose(wave.T.numpy(), data, atol=2.0 / 2**15)


def test_variable_length_batch_lengths_and_padding() -> None:
    tok = AudioFrameTokenizer()
    clips = [torch.randn(n, generator=_gen(n)) * 0.1 for n in (16000, 4000, 400, 9999)]
    feats, lengths = tok(clips)
    expected = [1 + (n - 400) // 160 for n in (16000, 4000, 400, 9999)]
    assert lengths.tolist() == expected
    assert feats.shape == (4, max(expected), 80)
    for i, clip in enumerate(clips):
        alone, _ = tok(clip)
        torch.testing.assert_close(feats[i, : expected[i]], alone[0])
        assert feats[i, expected[i] :].abs().sum() == 0
    # a padded (B, T) tensor with explicit lengths gives the same thing
    padded = torch.zeros(4, 16000)
    for i, clip in enumerate(clips):
        padded[i, : clip.shape[0]] = clip
    feats2, lengths2 = tok(padded, lengths=[16000, 4000, 400, 9999])
    assert lengths2.tolist() == expected
    torch.testing.assert_close(feats2, feats)
    # lengths after resampling 8 kHz -> 16 kHz: ceil(n * 2)
    _, l8 = tok([torch.randn(n) for n in (8000, 1234)], sample_rate=8000)
    assert l8.tolist() == [1 + (16000 - 400) // 160, 1 + (2468 - 400) // 160]


def test_max_frames_truncates() -> None:
    tok = AudioFrameTokenizer(AudioFeatureConfig(max_frames=40))
    feats, lengths = tok([torch.randn(16000), torch.randn(3000)])
    assert feats.shape[1] == 40
    assert lengths.tolist() == [40, 1 + (3000 - 400) // 160]


def test_fit_stats_normalises_training_set_and_round_trips() -> None:
    g = _gen(3)
    # clips of different loudness, lengths and colour
    clips = []
    for i in range(6):
        noise = torch.randn(4000 + 1000 * i, generator=g) * (0.02 + 0.1 * i)
        clips.append(torchaudio.functional.lowpass_biquad(noise, 16000, 500.0 + 800 * i))
    tok = AudioFrameTokenizer().fit_stats(clips)
    assert tok.is_fitted
    feats, lengths = tok(clips)
    valid = torch.cat([feats[i, : lengths[i]] for i in range(len(clips))])
    torch.testing.assert_close(valid.mean(0), torch.zeros(80), atol=1e-4, rtol=0)
    torch.testing.assert_close(valid.std(0, unbiased=False), torch.ones(80), atol=1e-3, rtol=0)

    restored = AudioFrameTokenizer.from_dict(tok.to_dict())
    torch.testing.assert_close(restored(clips)[0], feats)
    other = AudioFrameTokenizer()
    other.load_state_dict(tok.state_dict())
    torch.testing.assert_close(other(clips)[0], feats)
    assert other.is_fitted
    with pytest.raises(ValueError, match="80 values"):
        AudioFrameTokenizer.from_dict({**tok.to_dict(), "mean": [0.0] * 3})


def test_frame_embed_stacks_k_frames() -> None:
    embed = FrameEmbed(n_mels=4, dim=5, stack_frames=3)
    feats = torch.randn(2, 10, 4, generator=_gen(4))
    tokens = embed(feats)
    assert tokens.shape == (2, 3, 5)
    w, b = embed.proj.weight, embed.proj.bias
    for j in range(3):
        stacked = torch.cat([feats[:, 3 * j], feats[:, 3 * j + 1], feats[:, 3 * j + 2]], dim=-1)
        torch.testing.assert_close(tokens[:, j], stacked @ w.T + b)
    assert embed.output_lengths(torch.tensor([10, 7, 3, 2, 0])).tolist() == [3, 2, 1, 1, 0]
    assert embed.num_tokens(98) == 32
    with pytest.raises(ValueError, match="n_mels=4"):
        embed(torch.randn(2, 10, 5))


@pytest.mark.parametrize(("n_mels", "frames", "p", "s"), [(80, 98, 16, 10), (128, 100, 16, 16)])
def test_patch_embed_grid_matches_formula(n_mels: int, frames: int, p: int, s: int) -> None:
    embed = SpectrogramPatchEmbed(n_mels, dim=8, patch_size=p, stride=s)
    feats = torch.randn(2, frames, n_mels, generator=_gen(5))
    tokens = embed(feats)
    fp, tp = (n_mels - p) // s + 1, (frames - p) // s + 1
    assert embed.grid(frames) == (fp, tp)
    assert tokens.shape == (2, fp * tp, 8)
    assert embed.num_tokens(frames) == fp * tp
    # token (t, f) in time-major order is the dot product with the patch at mel f*s, frame t*s
    w, b = embed.proj.weight[:, 0], embed.proj.bias  # (dim, p, p)
    for t, f in [(0, 0), (1, 2), (tp - 1, fp - 1)]:
        patch = feats[:, t * s : t * s + p, f * s : f * s + p].transpose(1, 2)  # (B, mel, time)
        expected = torch.einsum("bij,dij->bd", patch, w) + b
        torch.testing.assert_close(tokens[:, t * fp + f], expected, atol=1e-5, rtol=1e-4)


def test_patch_embed_output_lengths_are_a_prefix() -> None:
    embed = SpectrogramPatchEmbed(80, dim=8, patch_size=16, stride=10)
    assert embed.freq_patches == 7
    lengths = torch.tensor([98, 26, 25, 16, 5])
    # (L - 16) // 10 + 1 time columns of 7 tokens, at least one column
    assert embed.output_lengths(lengths).tolist() == [9 * 7, 2 * 7, 1 * 7, 1 * 7, 1 * 7]
    with pytest.raises(ValueError, match="patch_size=16"):
        embed(torch.randn(1, 10, 80))


def test_build_embed_follows_mode() -> None:
    frames = AudioFrameTokenizer(AudioFeatureConfig(stack_frames=2)).build_embed(32)
    assert isinstance(frames, FrameEmbed)
    assert frames.stack_frames == 2
    patches = AudioFrameTokenizer(AudioFeatureConfig(mode="patches", patch_stride=16))
    embed = patches.build_embed(32)
    assert isinstance(embed, SpectrogramPatchEmbed)
    assert embed.stride == 16


def test_spec_augment_masks_only_in_training() -> None:
    aug = SpecAugment(freq_mask_param=10, time_mask_param=10, num_masks=2)
    feats = torch.randn(4, 50, 80, generator=_gen(6)) + 5.0  # no natural zeros
    aug.eval()
    assert torch.equal(aug(feats), feats)
    aug.train()
    torch.manual_seed(0)
    out = aug(feats)
    assert out.shape == feats.shape
    masked = out == 0
    assert masked.any()
    # unmasked entries are untouched; masked ones form whole mel bands / whole frames
    assert torch.equal(out[~masked], feats[~masked])
    for b in range(4):
        full_bins = masked[b].all(dim=0)
        full_frames = masked[b].all(dim=1)
        cover = full_bins[None, :] | full_frames[:, None]
        assert torch.equal(cover, masked[b])
    # independent masks per example
    assert not all(torch.equal(masked[0], masked[b]) for b in range(1, 4))
