"""MelRVQCodec / RVQ: the quantiser against its formula, monotone error in Q, I/O and bad input."""

from __future__ import annotations

import math

import pytest
import torch
import torchaudio

from multimodal.tokenizers.codec import RVQ, CodecConfig, MelRVQCodec
from multimodal.tokenizers.kmeans import kmeans

SR = 16000


def _voice(f0: float, seconds: float = 0.5, sr: int = SR, seed: int = 0) -> torch.Tensor:
    """A vowel-like test signal: harmonics of f0 with a falling spectrum, vibrato and a fade."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(int(seconds * sr)) / sr
    phase = 2 * math.pi * f0 * (t + 0.002 * torch.sin(2 * math.pi * 5 * t))
    wave = sum(torch.sin(h * phase) / h for h in range(1, 8))
    wave = wave * torch.hann_window(t.numel(), periodic=False) * 0.3
    return wave + 0.003 * torch.randn(t.numel(), generator=g)


def _fitted(q: int = 4, k: int = 16) -> tuple[MelRVQCodec, list[torch.Tensor]]:
    clips = [_voice(f0, seed=i) for i, f0 in enumerate((110, 150, 190, 230, 270, 320))]
    codec = MelRVQCodec(CodecConfig(num_codebooks=q, codebook_size=k, kmeans_iters=8,
                                    griffin_lim_iters=8))
    return codec.fit(clips), clips


def test_rvq_encode_decode_match_the_formula_by_hand() -> None:
    rvq = RVQ(num_codebooks=2, codebook_size=3, dim=2)
    books = [[[0.0, 0.0], [4.0, 0.0], [0.0, 4.0]], [[1.0, 1.0], [-1.0, 0.0], [0.0, -0.5]]]
    rvq.codebooks.copy_(torch.tensor(books))
    xs = [[3.0, 1.2], [0.2, 3.1], [-0.8, 0.1], [5.0, -1.0]]
    got = rvq.encode(torch.tensor(xs))
    for n, x in enumerate(xs):
        r = list(x)
        recon = [0.0, 0.0]
        for q in range(2):
            d2 = [(r[0] - e[0]) ** 2 + (r[1] - e[1]) ** 2 for e in books[q]]
            c = d2.index(min(d2))  # c_q = argmin_k ||r_{q-1} - e_{q,k}||
            assert got[n, q].item() == c
            e = books[q][c]
            r = [r[0] - e[0], r[1] - e[1]]  # r_q = r_{q-1} - e_{q,c_q}
            recon = [recon[0] + e[0], recon[1] + e[1]]
        torch.testing.assert_close(rvq.decode(got[n]), torch.tensor(recon))
        torch.testing.assert_close(torch.tensor(x) - rvq.decode(got[n]), torch.tensor(r))
    # first codes worked out on paper: [3, 1.2] is nearest [4, 0]; residual [-1, 1.2] -> [1, 1]?
    # |(-1,1.2)-(1,1)|^2 = 4.04, |(-1,1.2)-(-1,0)|^2 = 1.44, |(-1,1.2)-(0,-.5)|^2 = 3.89 -> 1
    assert got[0].tolist() == [1, 1]
    assert rvq.encode(torch.tensor(xs), num_codebooks=1).shape == (4, 1)
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        rvq.decode(torch.tensor([[0, 3]]))


def test_kmeans_centroids_are_the_means_of_their_points() -> None:
    g = torch.Generator().manual_seed(0)
    centers = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    x = torch.cat([c + 0.5 * torch.randn(200, 2, generator=g) for c in centers])
    got = kmeans(x, 3, iters=10, generator=g)
    assign = torch.cdist(x, got).argmin(1)
    for j in range(3):
        torch.testing.assert_close(got[j], x[assign == j].mean(0))
    # every true centre is found (to within the sampling error of 200 points)
    err = torch.cdist(centers, got).min(1).values
    assert (err < 0.2).all(), err
    with pytest.raises(ValueError, match="at least k=5"):
        kmeans(x[:3], 5)


def test_more_codebooks_never_increase_error_on_training_frames() -> None:
    codec, clips = _fitted(q=5, k=8)
    frames = torch.cat([codec.log_mel(c) for c in clips])  # all fitted (< max_fit_frames)
    assert frames.shape[0] < codec.config.max_fit_frames
    mse = []
    for q in range(1, 6):
        recon = codec.rvq.decode(codec.rvq.encode(frames, num_codebooks=q))
        mse.append((frames - recon).pow(2).mean().item())
    base = frames.pow(2).mean().item()  # q = 0: reconstruction is zero
    assert all(b <= a * (1 + 1e-5) for a, b in zip([base, *mse[:-1]], mse, strict=True)), mse
    assert mse[-1] < 0.5 * mse[0]


def test_encode_decode_shapes_and_round_trip() -> None:
    codec, clips = _fitted()
    wave = clips[2]
    tokens = codec.encode(wave)
    frames = 1 + (wave.numel() - 400) // 160
    assert tokens.shape == (4, frames) and tokens.dtype == torch.long
    assert tokens.min() >= 0 and tokens.max() < 16
    out = codec.decode(tokens)
    assert out.shape == ((frames - 1) * 160 + 400,)
    assert codec.encode(out).shape == tokens.shape  # T frames -> samples -> T frames
    assert codec.encode(wave, num_codebooks=2).shape == (2, frames)
    assert codec.decode(tokens[:2]).shape == out.shape
    # the round trip keeps the clip's spectrum: closer to its own log-mel than to another's
    own = codec.log_mel(wave)
    d_own = (codec.log_mel(out) - own).pow(2).mean()
    d_other = (codec.log_mel(clips[5][: wave.numel()]) - own).pow(2).mean()
    assert d_own < 0.5 * d_other


def test_stacked_frames_quantise_the_concatenation_of_consecutive_frames() -> None:
    clips = [_voice(f0, seed=i) for i, f0 in enumerate((110, 150, 190, 230, 270, 320))]
    codec = MelRVQCodec(CodecConfig(num_codebooks=3, codebook_size=8, kmeans_iters=5,
                                    griffin_lim_iters=4, stack_frames=3)).fit(clips)
    assert codec.rvq.codebooks.shape == (3, 8, 3 * 80)
    assert codec.frame_rate == 16000 / (3 * 160)
    wave = clips[1][:4000]
    frames = codec.log_mel(wave)  # 23 frames: 7 full tokens + 2 frames + 1 repeated
    n = frames.shape[0]
    assert n == 1 + (4000 - 400) // 160 == 23
    padded = torch.cat([frames, frames[-1:]])
    vectors = torch.stack([padded[3 * t : 3 * t + 3].flatten() for t in range(8)])
    tokens = codec.encode(wave)
    assert tokens.shape == (3, 8)
    assert torch.equal(tokens.T, codec.rvq.encode(vectors))
    # decode_mel: the quantised vectors, cut back into frames in time order
    recon = codec.rvq.decode(tokens.T)
    torch.testing.assert_close(codec.decode_mel(tokens),
                               torch.cat([v.reshape(3, 80) for v in recon]))
    assert codec.decode(tokens).shape == ((24 - 1) * 160 + 400,)
    assert CodecConfig.from_dict(codec.config.to_dict()) == codec.config


def test_sample_rates_and_channels() -> None:
    codec, _ = _fitted()
    at_22k = _voice(200, sr=22050)
    expected = codec.encode(torchaudio.functional.resample(at_22k, 22050, SR))
    assert torch.equal(codec.encode(at_22k, sample_rate=22050), expected)
    mono = _voice(180)
    stereo = torch.stack([mono, mono])
    assert torch.equal(codec.encode(stereo), codec.encode(mono))
    left, right = mono, _voice(260)
    torch.testing.assert_close(codec.log_mel(torch.stack([left, right])),
                               codec.log_mel((left + right) / 2))


def test_save_load_round_trip(tmp_path) -> None:
    codec, clips = _fitted()
    path = codec.save(tmp_path / "codec" / "c.safetensors")
    again = MelRVQCodec.load(path)
    assert again.config == codec.config
    torch.testing.assert_close(again.rvq.codebooks, codec.rvq.codebooks, rtol=0, atol=0)
    assert torch.equal(again.encode(clips[0]), codec.encode(clips[0]))
    (tmp_path / "bad.safetensors").write_bytes(b"not a file")
    with pytest.raises(ValueError, match=r"bad\.safetensors"):
        MelRVQCodec.load(tmp_path / "bad.safetensors")
    with pytest.raises(FileNotFoundError):
        MelRVQCodec.load(tmp_path / "missing.safetensors")


def test_bad_input_raises_clear_errors() -> None:
    with pytest.raises(RuntimeError, match="fit"):
        MelRVQCodec(CodecConfig(num_codebooks=1, codebook_size=2)).encode(_voice(100))
    codec, _ = _fitted()
    with pytest.raises(ValueError, match="too short"):
        codec.encode(_voice(150)[:399])
    with pytest.raises(ValueError, match="too short"):  # 400 samples at 44.1 kHz < 400 at 16k
        codec.encode(_voice(150, sr=44100)[:400], sample_rate=44100)
    with pytest.raises(ValueError, match="silent"):
        codec.encode(torch.zeros(8000))
    bad = _voice(150)
    bad[10] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        codec.encode(bad)
    with pytest.raises(ValueError, match="one clip"):
        codec.encode(torch.zeros(2, 2, 800))
    with pytest.raises(ValueError, match=r"\(Q, T\)"):
        codec.decode(torch.zeros(10, dtype=torch.long))
    with pytest.raises(ValueError, match="1 <= q <= 4"):
        codec.decode(torch.zeros(5, 10, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[0, 16\)"):
        codec.decode(torch.full((4, 10), 16))
    with pytest.raises(ValueError, match="max_frames"):
        CodecConfig(features={"max_frames": 10})  # type: ignore[arg-type]
