"""The text-to-speech data: phrase selection, the utterance plan (voice split, held-out
phrases, per-voice style), and the data module's batch on a tiny recipe synthesised here
(skipped without espeak-ng)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from multimodal.data.documents import Document
from multimodal.data.sources.speech import Voice
from multimodal.data.sources.spoken_words import SPOKEN_WORDS, split_voices
from multimodal.data.sources.tts_voices import (
    EXTRA_WORDS,
    TTSRecipe,
    plan_utterances,
    read_tts_manifest,
    tts_phrases,
)
from multimodal.data.tts import TTSDataModule, collate_tts, prepare_tts
from multimodal.tokenizers.audio import AudioFeatureConfig, load_audio
from multimodal.tokenizers.codec import CodecConfig, MelRVQCodec

DOCS = [
    Document("In the beginning God created the heaven and the earth. And the earth was "
             "without form, and void; and darkness was upon the face of the deep.", "bible",
             "Ge 1"),
    Document("Let there be light: and there was light.\nIt's 3 o'clock -- time for tea! "
             "and the Earth was without form", "fortunes", "x #0"),
]


def test_phrases_are_short_letter_only_clauses_without_duplicates() -> None:
    # clauses at . , ; : ! ? -- and line breaks; 2..6 words of letters (an inner apostrophe
    # allowed); "and the Earth was without form" repeats a clause up to case; the clauses
    # of 9 words ("In the beginning ...", "and darkness ... of the deep") and the one with a
    # digit ("It's 3 o'clock") go
    assert tts_phrases(DOCS) == [
        "And the earth was without form", "and void", "Let there be light",
        "and there was light", "time for tea",
    ]
    assert tts_phrases(DOCS, min_words=1, max_words=2) == ["and void"]
    with pytest.raises(ValueError, match="min_words"):
        tts_phrases(DOCS, min_words=3, max_words=2)


VOICES = [Voice("espeak", n) for n in ("en", "en+m1", "en+f2", "en-us", "en-us+m3",
                                       "en-gb-scotland", "en-029")] + [Voice("flite", "slt"),
                                                                        Voice("flite", "kal")]
PHRASES = [f"phrase number {w}" for w in ("one", "two", "three", "four", "five", "six",
                                          "seven", "eight", "nine", "ten", "eleven", "twelve")]


def test_plan_splits_voices_like_the_spoken_words_and_holds_phrases_out(tmp_path: Path) -> None:
    recipe = TTSRecipe(train_phrases=4, train_words=3, vocab_words=2,
                       held_out_phrases_per_voice=2, held_out_phrases=3)
    plan = plan_utterances(tmp_path, VOICES, PHRASES, recipe)
    split = split_voices(v.id for v in VOICES)
    for u in plan:
        assert u.split == next(s for s, vs in split.items() if u.job.voice.id in vs)
    held = {u.job.word for u in plan if u.split != "train"}
    trained = {u.job.word for u in plan if u.split == "train" and u.kind == "phrase"}
    assert held and trained and not held & trained
    assert len(held | trained) <= len(PHRASES)
    for v in VOICES:
        mine = [u for u in plan if u.job.voice == v]
        if mine[0].split == "train":
            assert sum(u.kind == "phrase" for u in mine) == 4
            words = [u.job.word for u in mine if u.kind == "word"]
            assert len(words) == 3 and sum(w in SPOKEN_WORDS for w in words) == 2
            assert sum(w in EXTRA_WORDS for w in words) == 1
        else:
            assert [u.kind for u in mine] == ["phrase", "phrase"]
        # one speaker: every utterance within the jitter of the voice's base speed / pitch
        speeds, pitches = [u.job.speed for u in mine], [u.job.pitch for u in mine]
        assert max(speeds) - min(speeds) <= 2 * recipe.speed_jitter
        assert max(pitches) - min(pitches) <= 2 * recipe.pitch_jitter
    # deterministic whatever the order of the voices
    again = plan_utterances(tmp_path, list(reversed(VOICES)), PHRASES, recipe)
    assert again == plan


def test_collate_pads_with_zero_and_keeps_lengths() -> None:
    items = [
        {"phonemes": torch.tensor([9, 8, 7]), "prompt": torch.ones(2, 4, dtype=torch.long),
         "codes": torch.full((2, 5), 3), "speaker": 1},
        {"phonemes": torch.tensor([5]), "prompt": torch.full((2, 2), 6),
         "codes": torch.full((2, 2), 4), "speaker": 0},
    ]
    b = collate_tts(items)
    assert b["phonemes"].tolist() == [[9, 8, 7], [5, 0, 0]]
    assert b["phoneme_lengths"].tolist() == [3, 1]
    assert b["prompt"].shape == (2, 2, 4) and b["prompt_lengths"].tolist() == [4, 2]
    assert b["prompt"][1].tolist() == [[6, 6, 0, 0], [6, 6, 0, 0]]
    assert b["codes"].shape == (2, 2, 5) and b["code_lengths"].tolist() == [5, 2]
    assert b["codes"][1, :, 2:].eq(0).all() and b["codes"][1, :, :2].eq(4).all()
    assert b["speaker"].tolist() == [1, 0]


TINY_VOICES = ["espeak:en", "espeak:en+f2", "espeak:en-us+m3"]  # one each to train/val/test
TINY_CODEC = CodecConfig(  # the layout of TTS_CODEC (10 ms frames, two per token), tiny
    features=AudioFeatureConfig(n_mels=40, log_offset=1e-5, win_ms=25.0, hop_ms=10.0),
    num_codebooks=2, codebook_size=8, kmeans_iters=5, stack_frames=2)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (bash data/get_audio.sh)")
    root = tmp_path_factory.mktemp("tts")
    recipe = TTSRecipe(train_phrases=3, train_words=2, vocab_words=1,
                       held_out_phrases_per_voice=2, held_out_phrases=4)
    docs = [*DOCS, Document(". ".join(PHRASES), "bible", "made up")]
    prepare_tts(root, recipe=recipe, codec_config=TINY_CODEC, voices=TINY_VOICES,
                documents=docs, fit_clips=10, workers=1, progress=False)
    return root


def test_prepare_is_idempotent(tiny: Path) -> None:
    tts = tiny / "tts"
    files = sorted(p for p in tts.rglob("*") if p.is_file())
    stamps = {p: p.stat().st_mtime_ns for p in files}
    prepare_tts(tiny, codec_config=TINY_CODEC, voices=TINY_VOICES, progress=False)
    assert {p: p.stat().st_mtime_ns for p in files} == stamps
    rows = read_tts_manifest(tts)
    assert {r["split"] for r in rows} == {"train", "val", "test"}
    assert all(float(r["seconds"]) > 0.1 for r in rows)
    speakers = (tts / "speakers.csv").read_text().splitlines()
    assert speakers[0] == "path,label"
    assert len(speakers) - 1 == sum(r["split"] == "train" for r in rows)


def test_batch_follows_the_contract(tiny: Path) -> None:
    dm = TTSDataModule(root=str(tiny), batch_size=4, prompt_seconds=0.5, prepare=False)
    dm.prepare_data()
    dm.setup("fit")
    codec, tok = dm.codec, dm.phoneme_tokenizer
    assert isinstance(codec, MelRVQCodec) and codec.num_codebooks == 2
    assert dm.speakers == sorted(TINY_VOICES)
    assert dm.frame_rate == 50
    rows = dm.items.rows
    checked = 0
    for split in ("train", "val", "test"):
        ds = dm.split_dataset(split)
        batch = next(iter(dm.loader(ds, shuffle=False)))  # item b is row ds.indices[b]
        n = batch["phonemes"].shape[0]
        assert batch["codes"].shape[:2] == (n, 2) and batch["prompt"].shape[:2] == (n, 2)
        for b in range(n):
            j = ds.indices[b]
            row = rows[j]
            wave, rate = load_audio(tiny / "tts" / row["path"])
            expect = codec.encode(wave, rate)  # the cache holds the codec's tokens
            T = int(batch["code_lengths"][b])
            assert torch.equal(batch["codes"][b, :, :T], expect)
            assert batch["codes"][b, :, T:].eq(0).all()
            ids = tok.encode(row["text"])
            P = int(batch["phoneme_lengths"][b])
            assert batch["phonemes"][b, :P].tolist() == ids
            assert batch["phonemes"][b, P:].eq(tok.pad_token_id).all()
            assert dm.speakers[int(batch["speaker"][b])] == row["voice"]
            # the prompt: a window of another phrase of the same voice, <= 0.5 s
            Tp = int(batch["prompt_lengths"][b])
            assert 1 <= Tp <= 25
            prompt = batch["prompt"][b, :, :Tp]
            found = [k for k, r in enumerate(rows) if r["voice"] == row["voice"]
                     and k != j and r["kind"] == "phrase"
                     and any(torch.equal(dm.items.codes(k)[:, s : s + Tp], prompt)
                             for s in range(dm.items.codes(k).shape[1] - Tp + 1))]
            assert found
            checked += 1
    assert checked == 4 + 2 + 2  # a first batch of 4 training items, 2 val, 2 test
    # evaluation prompts are fixed: the same batch twice
    a = next(iter(dm.test_dataloader()))
    b = next(iter(dm.test_dataloader()))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_missing_cache_names_the_recipe(tmp_path: Path) -> None:
    dm = TTSDataModule(root=str(tmp_path), prepare=False)
    with pytest.raises(FileNotFoundError, match=r"get_tts\.sh"):
        dm.prepare_data()
    assert os.listdir(tmp_path) == []


def _tts_eval():
    import importlib.util

    path = Path(__file__).parents[2] / "benchmarks" / "tts_eval.py"
    spec = importlib.util.spec_from_file_location("tts_eval", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_eval_nearest_voice_and_ceiling_by_hand() -> None:
    ev = _tts_eval()
    def e(x: float, y: float) -> torch.Tensor:
        return torch.nn.functional.normalize(torch.tensor([x, y]), dim=0)

    embs = {"a": [("a1", e(1.0, 0.0)), ("a2", e(1.0, 0.2))],
            "b": [("b1", e(0.0, 1.0)), ("b2", e(0.9, 0.5))]}
    # leaving b2 out, b's mean is (0, 1); b2 = (0.87, 0.48) has cosine 0.48 with it and
    # ~0.96 with a's mean direction (1, 0.1): b2 is the one miss of the four clips
    cents = ev.voice_centroids(embs, leave_out="b2")
    torch.testing.assert_close(cents["b"], embs["b"][0][1])
    assert ev.SpeakerJudge.nearest(embs["b"][1][1], cents) == "a"
    assert ev.SpeakerJudge.nearest(embs["a"][1][1], ev.voice_centroids(embs, "a2")) == "a"
    assert ev.speaker_ceiling(embs) == (0.75, 4)


def test_eval_judge_clip_trims_and_cuts_one_second() -> None:
    ev = _tts_eval()
    t = torch.arange(48000) / 16000
    tone = 0.5 * torch.cos(2 * torch.pi * 220 * t)  # loud at both ends of the cuts below
    wave = torch.cat([torch.zeros(8000), tone[:24000], torch.zeros(8000)])  # 1.5 s of tone
    clip = ev.judge_clip(wave)
    assert clip.numel() == 16000 and clip.abs().max() > 0.4
    short = ev.judge_clip(torch.cat([torch.zeros(4000), tone[:3200], torch.zeros(4000)]))
    # trimmed to the 0.2 s tone + 30 ms margins, shorter than 1 s: kept whole
    assert short.numel() == 3200 + 2 * 480
    assert ev.log_mel_rmse(tone, tone) == 0.0


def test_speak_all_skips_made_clips_and_names_failures(tmp_path, monkeypatch) -> None:
    """The one synthesis runner of both recipes: clips already on disk are not remade, new
    folders are created, and failing jobs are reported by count with their errors."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    from multimodal.data.sources import speech

    good = speech.SpeechJob(speech.Voice("espeak", "en-us"), "yes", 175, 50,
                            tmp_path / "a" / "yes.wav")
    speech.speak_all([good], workers=1, progress=False)
    assert good.out.is_file() and good.out.stat().st_size > 44
    made = good.out.stat().st_mtime_ns
    bad = speech.SpeechJob(speech.Voice("espeak", "en"), "no", 175, 50, tmp_path / "b" / "no.wav")
    ran: list[str] = []

    def failing(job: speech.SpeechJob) -> str:  # a synthesiser that fails, as speak reports it
        ran.append(job.word)
        return f"{job.voice.id} {job.word!r}: engine crashed"

    monkeypatch.setattr(speech, "speak", failing)
    with pytest.raises(RuntimeError, match=r"(?s)1 of 1 test clips failed.*'no': engine crashed"):
        speech.speak_all([good, bad], workers=1, progress=False, desc="test")
    assert ran == ["no"]  # the clip on disk was not remade
    assert good.out.stat().st_mtime_ns == made and bad.out.parent.is_dir()


def test_speak_all_refuses_unknown_voices_before_any_work(tmp_path: Path) -> None:
    """flite speaks an unknown voice name as its default voice, and espeak-ng an unknown
    ``+variant`` as the plain language, both without an error: a wrong speaker in the data.
    speak_all must name them and write nothing."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    from multimodal.data.sources import speech

    def job(voice: str, word: str) -> speech.SpeechJob:
        return speech.SpeechJob(speech.Voice.parse(voice), word, 175, 50,
                                tmp_path / word / f"{word}.wav")

    good = job("espeak:en-us+m3", "yes")
    bad = [job("espeak:en-us+nosuchvariant", "no"), job("flite:nosuchvoice", "maybe"),
           job("espeak:xx-nosuch", "never")]
    with pytest.raises(ValueError) as err:
        speech.speak_all([good, *bad], workers=1, progress=False)
    message = str(err.value)
    for b in bad:
        assert b.voice.id in message
    assert good.voice.id not in message
    assert not any(tmp_path.iterdir())  # refused before any folder or clip was made
    speech.check_voices([good.voice, speech.Voice("espeak", "en")])  # known ones pass
