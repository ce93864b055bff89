"""Codec language models (VALL-E AR + NAR), the TTS task and synthesis: layouts by hand,
masking, causality, KV-cache decoding, NAR stages, a tiny overfit, bad input, and a
checkpoint -> synthesize round trip."""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import pytest
import soundfile as sf
import torch

import multimodal as mm
from multimodal.checkpoints import TTSBundle
from multimodal.models.codec_lm import (
    IGNORE_INDEX,
    CodecAR,
    CodecARConfig,
    CodecLM,
    CodecLMConfig,
    CodecNAR,
    CodecNARConfig,
    pack_segments,
)
from multimodal.pipelines.speak import split_sentences, synthesize
from multimodal.tasks.tts import TTSTask, crop_prompt
from multimodal.tokenizers.codec import CodecConfig, MelRVQCodec
from multimodal.tokenizers.phonemes import PhonemeTokenizer

K, Q, NPH = 16, 3, 24
SR = 16000


def _tiny(dim: int = 32, max_len: int = 96) -> CodecLM:
    common = {"dim": dim, "depth": 2, "heads": 2, "codebook_size": K, "num_phonemes": NPH,
              "max_len": max_len}
    return CodecLM(CodecLMConfig(ar=CodecARConfig(**common),
                                 nar=CodecNARConfig(num_codebooks=Q, **common)))


def _batch(seed: int = 0, b: int = 3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "phonemes": torch.randint(7, NPH, (b, 6), generator=g),
        "phoneme_lengths": torch.tensor([6, 4, 2][:b]),
        "prompt": torch.randint(0, K, (b, Q, 5), generator=g),
        "prompt_lengths": torch.tensor([5, 3, 4][:b]),
        "codes": torch.randint(0, K, (b, Q, 7), generator=g),
        "code_lengths": torch.tensor([7, 2, 5][:b]),
        "speaker": torch.zeros(b, dtype=torch.long),
    }


# --- layout --------------------------------------------------------------------------------


def test_pack_segments_by_hand() -> None:
    a = torch.tensor([[1, 2, 3], [4, 5, 0]])
    b = torch.tensor([[7, 0], [8, 9]])
    packed, starts, total = pack_segments([a, b], [torch.tensor([3, 2]), torch.tensor([1, 2])],
                                          pad=-1)
    assert packed.tolist() == [[1, 2, 3, 7], [4, 5, 8, 9]]
    assert [s.tolist() for s in starts] == [[0, 0], [3, 2]] and total.tolist() == [4, 4]
    packed, _, total = pack_segments([a, b], [torch.tensor([1, 0]), torch.tensor([0, 2])], pad=-1)
    assert packed.tolist() == [[1, -1], [8, 9]] and total.tolist() == [1, 2]


def test_ar_stream_and_labels_by_hand() -> None:
    ar = _tiny().ar
    ph = torch.tensor([[3, 4, 0]])  # 2 real phonemes, then padding
    prompt = torch.tensor([[9, 8, 7]])  # 2 real prompt frames
    codes = torch.tensor([[1, 2, 3, 0]])  # 3 real frames
    inputs, labels = ar.teacher_forcing(ph, torch.tensor([2]), prompt, torch.tensor([2]),
                                        codes, torch.tensor([3]))
    off, eos, sep, bos = K + 3, K, K + 1, K + 2
    stream = [3 + off, 4 + off, sep, 9, 8, bos, 1, 2, 3, eos]
    assert inputs.tolist() == [stream[:-1]]
    ign = IGNORE_INDEX
    # only c_1..c_3 and EOS are targets: the predictions made at BOS, c_1, c_2, c_3
    assert labels.tolist() == [[ign, ign, ign, ign, ign, 1, 2, 3, eos]]


def test_ar_positions_restart_at_the_separator() -> None:
    ar = _tiny().ar
    ids = torch.tensor([[K + 3 + 5, K + 3 + 6, K + 3 + 7, K + 1, 2, 3]])
    pos = ar._positions(ids, None, 0, None)
    assert pos.tolist() == [[0, 1, 2, 0, 1, 2]]
    # left padding (mask 0) is skipped; a cached step counts from the phoneme count
    mask = torch.tensor([[0, 1, 1, 1, 1, 1]])
    assert ar._positions(ids.new_tensor([[0, *ids[0, 1:].tolist()]]), mask, 0,
                         torch.tensor([2])).tolist() == [[0, 0, 1, 0, 1, 2]]
    assert ar._positions(ids[:, :1], None, 7, torch.tensor([3])).tolist() == [[4]]
    with pytest.raises(ValueError, match="phoneme_lengths"):
        ar._positions(ids[:, :1], None, 7, None)


def test_ar_loss_ignores_padding_and_prompt_values_beyond_lengths() -> None:
    torch.manual_seed(0)
    task = TTSTask(_tiny(), max_prompt_seconds=10.0)
    task.attach(PhonemeTokenizer.train(["ab cd"], backend="chars"), _codec())
    batch = _batch()
    out = task.losses(batch, stage=torch.tensor([1, 2, 1]), random_crop=False)
    garbled = {k: v.clone() for k, v in batch.items()}
    for key, lens in (("codes", "code_lengths"), ("prompt", "prompt_lengths")):
        t = torch.arange(garbled[key].shape[-1])[None, None]
        pad = t >= garbled[lens][:, None, None]
        garbled[key] = garbled[key].masked_fill(pad, K - 1)
    t = torch.arange(6)[None]
    garbled["phonemes"] = garbled["phonemes"].masked_fill(t >= garbled["phoneme_lengths"][:, None],
                                                          NPH - 1)
    again = task.losses(garbled, stage=torch.tensor([1, 2, 1]), random_crop=False)
    torch.testing.assert_close(again["ar_loss"], out["ar_loss"])
    torch.testing.assert_close(again["nar_loss"], out["nar_loss"])
    # the AR loss is the mean cross-entropy over exactly sum(T_b + 1) targets
    ar = task.model.ar
    inputs, labels = ar.teacher_forcing(batch["phonemes"], batch["phoneme_lengths"],
                                        batch["prompt"][:, 0], batch["prompt_lengths"],
                                        batch["codes"][:, 0], batch["code_lengths"])
    assert int((labels != IGNORE_INDEX).sum()) == int((batch["code_lengths"] + 1).sum())
    logp = ar(inputs).log_softmax(-1)
    by_hand = [-logp[b, t, labels[b, t]] for b in range(3) for t in range(labels.shape[1])
               if labels[b, t] != IGNORE_INDEX]
    torch.testing.assert_close(out["ar_loss"], torch.stack(by_hand).mean())


# --- causal vs bidirectional -----------------------------------------------------------------


def test_ar_is_causal_nar_is_not() -> None:
    model = _tiny().eval()
    batch = _batch()
    inputs, _ = model.ar.teacher_forcing(batch["phonemes"], batch["phoneme_lengths"],
                                         batch["prompt"][:, 0], batch["prompt_lengths"],
                                         batch["codes"][:, 0], batch["code_lengths"])
    cut = 9
    changed = inputs.clone()
    changed[:, cut:] = (changed[:, cut:] + 1) % K  # other codes after position cut
    a, b = model.ar(inputs), model.ar(changed)
    torch.testing.assert_close(a[:, :cut], b[:, :cut])
    assert not torch.allclose(a[:, cut:], b[:, cut:])
    # NAR: a later target frame's codebook 1 changes the logits of the first frame
    codes = batch["codes"].clone()
    base = model.nar(batch["phonemes"], batch["phoneme_lengths"], batch["prompt"],
                     batch["prompt_lengths"], codes, batch["code_lengths"], 1)
    codes[0, 0, 6] = (codes[0, 0, 6] + 1) % K
    moved = model.nar(batch["phonemes"], batch["phoneme_lengths"], batch["prompt"],
                      batch["prompt_lengths"], codes, batch["code_lengths"], 1)
    assert not torch.allclose(base[0, 0], moved[0, 0])
    torch.testing.assert_close(base[1:], moved[1:])  # other rows untouched


# --- generation ------------------------------------------------------------------------------


@pytest.mark.parametrize("sampling", [{}, {"do_sample": True, "temperature": 1.3, "top_k": 8}])
def test_kv_cache_generation_equals_uncached_token_for_token(sampling: dict) -> None:
    model = _tiny().eval()
    batch = _batch(seed=3)
    args = (batch["phonemes"], batch["phoneme_lengths"], batch["prompt"][:, 0],
            batch["prompt_lengths"])
    runs = []
    for use_cache in (True, False):
        kw = dict(sampling)
        if sampling:
            kw["generator"] = torch.Generator().manual_seed(11)
        runs.append(model.ar.generate(*args, max_new_tokens=12, use_cache=use_cache, **kw))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    # a batched, left-padded run gives each row what it gives alone
    codes, lengths = runs[1] if not sampling else (None, None)
    if codes is not None:
        for b in range(3):
            one = model.ar.generate(*(a[b : b + 1] for a in args), max_new_tokens=12)
            assert torch.equal(one[0][0, : int(one[1][0])], codes[b, : int(lengths[b])])


def test_generation_stops_at_eos_and_respects_the_context() -> None:
    model = _tiny(max_len=20).eval()
    ar = model.ar
    batch = _batch()
    with torch.no_grad():  # features all 1 after the final norm; only EOS's row scores
        ar.transformer.norm.weight.zero_()
        ar.transformer.norm.bias.fill_(1.0)
        ar.head.weight.zero_()
        ar.head.weight[K] = 1.0
    _, lengths = ar.generate(batch["phonemes"], batch["phoneme_lengths"],
                                 batch["prompt"][:, 0], batch["prompt_lengths"])
    assert lengths.tolist() == [0, 0, 0]
    # a minimum length masks EOS until then, with and without the KV cache
    for use_cache in (True, False):
        _, lengths = ar.generate(batch["phonemes"], batch["phoneme_lengths"],
                                 batch["prompt"][:, 0], batch["prompt_lengths"],
                                 min_new_tokens=4, use_cache=use_cache)
        assert lengths.tolist() == [4, 4, 4]
    long_ph = torch.randint(7, NPH, (1, 19))
    with pytest.raises(ValueError, match="fill the AR context"):
        ar.generate(long_ph, torch.tensor([19]), batch["prompt"][:1, 0], torch.tensor([5]))


# --- NAR stages ------------------------------------------------------------------------------


def test_nar_stage_reads_only_lower_codebooks_and_rows_are_independent() -> None:
    model = _tiny().eval().nar
    batch = _batch()
    args = (batch["phonemes"], batch["phoneme_lengths"], batch["prompt"],
            batch["prompt_lengths"])
    codes, lens = batch["codes"], batch["code_lengths"]
    at1 = model(*args, codes, lens, 1)
    other = codes.clone()
    other[:, 1:] = (other[:, 1:] + 5) % K  # codebooks >= stage 1 are not read
    torch.testing.assert_close(model(*args, other, lens, 1), at1)
    other = codes.clone()
    other[:, 0] = (other[:, 0] + 5) % K  # codebook 0 is
    assert not torch.allclose(model(*args, other, lens, 1), at1)
    at2 = model(*args, codes, lens, 2)
    mixed = model(*args, codes, lens, torch.tensor([1, 2, 1]))
    torch.testing.assert_close(mixed[0], at1[0])
    torch.testing.assert_close(mixed[1], at2[1])
    torch.testing.assert_close(mixed[2], at1[2])
    for bad in (0, Q):
        with pytest.raises(ValueError, match="stage must be in"):
            model(*args, codes, lens, bad)
    filled = model.fill(*args, codes[:, 0], lens)
    assert filled.shape == (3, Q, 7) and torch.equal(filled[:, 0, :2], codes[:, 0, :2])
    assert int(filled[1, :, 2:].abs().sum()) == 0  # padding frames stay 0


def test_crop_prompt_windows() -> None:
    prompt = torch.arange(2 * 1 * 6).view(2, 1, 6)
    out, lens = crop_prompt(prompt, torch.tensor([6, 2]), 3, random=False)
    assert out.tolist() == [[[0, 1, 2]], [[6, 7, 0]]] and lens.tolist() == [3, 2]
    out, lens = crop_prompt(prompt, torch.tensor([6, 2]), 3,
                            generator=torch.Generator().manual_seed(0))
    start = int(out[0, 0, 0])
    assert 0 <= start <= 3 and out[0, 0].tolist() == [start, start + 1, start + 2]


# --- learning --------------------------------------------------------------------------------


def test_tiny_model_overfits_and_generates_the_training_codes() -> None:
    torch.manual_seed(0)
    model = _tiny(dim=48)
    batch = _batch(seed=1, b=2)
    task = TTSTask(model, max_prompt_seconds=10.0)
    task.attach(PhonemeTokenizer.train(["ab cd"], backend="chars"), _codec())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(150):
        out = task.losses(batch, random_crop=False)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        first = first if first is not None else {k: v.detach() for k, v in out.items()}
    out = {k: v.detach() for k, v in out.items()}
    assert float(out["ar_loss"]) < 0.1 * float(first["ar_loss"])
    assert float(out["nar_loss"]) < 0.1 * float(first["nar_loss"])
    model.eval()
    codes, lengths = model.ar.generate(batch["phonemes"], batch["phoneme_lengths"],
                                       batch["prompt"][:, 0], batch["prompt_lengths"])
    assert lengths.tolist() == batch["code_lengths"].tolist()
    for b in range(2):
        n = int(lengths[b])
        assert codes[b, :n].tolist() == batch["codes"][b, 0, :n].tolist()
    full = model.nar.fill(batch["phonemes"], batch["phoneme_lengths"], batch["prompt"],
                          batch["prompt_lengths"], batch["codes"][:, 0], batch["code_lengths"])
    for b in range(2):
        n = int(lengths[b])
        assert torch.equal(full[b, :, :n], batch["codes"][b, :, :n])


# --- synthesis, checkpoints, bad input ------------------------------------------------------


def _voice(f0: float, seconds: float = 0.8, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(int(seconds * SR)) / SR
    wave = sum(torch.sin(2 * math.pi * h * f0 * t) / h for h in range(1, 6))
    return 0.2 * wave * torch.hann_window(t.numel(), periodic=False) \
        + 0.002 * torch.randn(t.numel(), generator=g)


_CODEC: list[MelRVQCodec] = []


def _codec() -> MelRVQCodec:
    if not _CODEC:
        codec = MelRVQCodec(CodecConfig(num_codebooks=Q, codebook_size=K, kmeans_iters=3,
                                        griffin_lim_iters=2))
        _CODEC.append(codec.fit([_voice(f, seed=i) for i, f in enumerate((120, 180, 260))]))
    return _CODEC[0]


class _Data(L.LightningDataModule):
    """Random batches with the TTSDataModule's keys, tokenizer and codec."""

    def __init__(self) -> None:
        super().__init__()
        self.phoneme_tokenizer = PhonemeTokenizer.train(["hello world. the cat sat"],
                                                        backend="chars")
        self.codec = _codec()

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader([_batch(seed=i) for i in range(2)], batch_size=None)


def _trained_task(tmp_path: Path) -> tuple[TTSTask, Path]:
    task = TTSTask(_tiny(max_len=400), max_prompt_seconds=0.3)
    trainer = L.Trainer(max_steps=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path)
    trainer.fit(task, _Data())
    path = tmp_path / "tts.ckpt"
    trainer.save_checkpoint(path)
    return task, path


def test_checkpoint_alone_synthesizes_the_same_audio(tmp_path: Path) -> None:
    task, path = _trained_task(tmp_path)
    prompt = _voice(150, seconds=1.0)
    stats: dict = {}
    a, rate = synthesize(task, "the cat", prompt, SR, seed=3, stats=stats)
    b, rate_b = mm.synthesize(path, "the cat", prompt, SR, seed=3)
    assert rate == rate_b == SR and a.dim() == 1 and a.numel() > 0
    torch.testing.assert_close(a, b)
    c, _ = mm.synthesize(mm.load(path), "the cat", prompt, SR, seed=3)  # mm.load + the verb
    torch.testing.assert_close(a, c)
    assert set(stats) >= {"ar_seconds", "nar_seconds", "decode_seconds", "audio_seconds",
                          "ar_tokens"}
    assert stats["audio_seconds"] == pytest.approx(a.numel() / SR)
    hop = task.codec.config.features.hop_length
    win = task.codec.config.features.win_length
    assert a.numel() == (stats["ar_tokens"] - 1) * hop + win  # one frame per AR token
    from multimodal.pipelines._loaders import tts

    bundle = tts(mm.load(path))  # what mm.synthesize(mm.load(path), ...) picks
    assert isinstance(bundle, TTSBundle)
    assert bundle.max_prompt_frames == round(0.3 * SR / hop)
    assert bundle.tokenizer.vocab == task.phoneme_tokenizer.vocab


def test_synthesize_bad_input(tmp_path: Path) -> None:
    task, _ = _trained_task(tmp_path)
    prompt = _voice(150, seconds=1.0)
    with pytest.raises(ValueError, match="empty"):
        synthesize(task, "   ", prompt, SR)
    with pytest.raises(ValueError, match="no pronounceable"):
        synthesize(task, "?!...", prompt, SR)
    with pytest.raises(ValueError, match="no phoneme the model knows"):
        synthesize(task, "zzz qqq", prompt, SR)  # chars never seen in training
    with pytest.raises(ValueError, match="silent"):
        synthesize(task, "the cat", torch.zeros(SR), SR)
    with pytest.raises(ValueError, match="too short"):
        synthesize(task, "the cat", prompt[:1000], SR)
    with pytest.raises(ValueError, match=r"\(samples,\)"):
        synthesize(task, "the cat", prompt[None, None], SR)
    with pytest.raises(FileNotFoundError):
        synthesize(task, "the cat", tmp_path / "missing.wav")
    # stereo is averaged, other rates resampled, files read: all the same voice
    mono, _ = synthesize(task, "the cat", prompt, SR, temperature=0)
    stereo, _ = synthesize(task, "the cat", torch.stack([prompt, prompt]), SR, temperature=0)
    torch.testing.assert_close(stereo, mono)
    sf.write(tmp_path / "p.wav", torch.stack([prompt, prompt], 1).numpy(), SR)
    from_file, _ = synthesize(task, "the cat", tmp_path / "p.wav", temperature=0)
    torch.testing.assert_close(from_file, mono, atol=1e-3, rtol=1e-3)
    import torchaudio

    at_8k = torchaudio.functional.resample(prompt, SR, 8000)
    low, rate = synthesize(task, "the cat", at_8k, 8000, temperature=0)
    assert rate == SR and low.numel() > 0


def test_long_text_is_split_into_sentences(tmp_path: Path) -> None:
    task, _ = _trained_task(tmp_path)
    bundle = task.bundle()
    assert split_sentences("Hello world. The cat sat!  Why?\nno") == [
        "Hello world.", "The cat sat!", "Why?", "no"]
    prompt = _voice(150, seconds=1.0)
    from multimodal.pipelines.speak import _budget, _chunks

    limit = _budget(bundle, bundle.max_prompt_frames)
    sentence = "the cat sat. "
    text = sentence * (limit // 10 + 2)
    groups = _chunks(bundle, text, limit)
    assert len(groups) >= 2 and all(len(g) <= limit for g in groups)
    stats: dict = {}
    wave, _ = synthesize(bundle, text, prompt, SR, stats=stats)
    assert wave.numel() > 0 and stats["ar_tokens"] >= len(groups)
    with pytest.raises(ValueError, match="phonemes; with this prompt"):
        synthesize(bundle, "the cat sat " * limit, prompt, SR)


def test_task_rejects_a_codec_of_other_sizes() -> None:
    task = TTSTask(_tiny())
    other = MelRVQCodec(CodecConfig(num_codebooks=Q, codebook_size=K * 2))
    with pytest.raises(ValueError, match="codebook_size=16 but the codec has K=32"):
        task.attach(PhonemeTokenizer.train(["ab"], backend="chars"), other)
    with pytest.raises(ValueError, match="must be a CodecLM"):
        TTSTask(CodecAR(CodecARConfig()))  # type: ignore[arg-type]


def test_config_round_trip_and_sizes() -> None:
    model = _tiny()
    from multimodal.weights import build_model

    again = build_model(CodecLM, __import__("dataclasses").asdict(model.config))
    assert again.config == model.config
    assert isinstance(model.ar, CodecAR) and isinstance(model.nar, CodecNAR)
    with pytest.raises(ValueError, match="differs"):
        CodecLMConfig(ar=CodecARConfig(codebook_size=8), nar=CodecNARConfig(codebook_size=16))
    with pytest.raises(ValueError, match="num_codebooks must be >= 2"):
        CodecNARConfig(num_codebooks=1)


def test_speak_cli_writes_the_synthesized_wav(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from multimodal.cli.main import main

    task, ckpt = _trained_task(tmp_path)
    prompt = _voice(150, seconds=1.0)
    sf.write(tmp_path / "voice.wav", prompt.numpy(), SR)
    out = tmp_path / "out" / "said.wav"
    main(["speak", "--ckpt", str(ckpt), "--text", "the cat", "--prompt",
          str(tmp_path / "voice.wav"), "--out", str(out), "--seed", "5"])
    assert "wrote" in capsys.readouterr().out
    written, rate = sf.read(out, dtype="float32")
    expected, _ = synthesize(task, "the cat", tmp_path / "voice.wav", seed=5)
    assert rate == SR
    torch.testing.assert_close(torch.from_numpy(written), expected, atol=1e-4, rtol=0)
    sf.write(tmp_path / "quiet.wav", torch.zeros(SR).numpy(), SR)
    with pytest.raises(SystemExit) as info:
        main(["speak", "--ckpt", str(ckpt), "--text", "the cat", "--prompt",
              str(tmp_path / "quiet.wav"), "--out", str(out)])
    assert info.value.code == 2 and "error: prompt: clip is silent" in capsys.readouterr().err
