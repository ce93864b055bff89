"""``mm.transcribe`` / ``multimodal transcribe`` on a tiny random Whisper in a CTranslate2
directory (written by CTranslate2's converter): results equal the model's own decoding,
long files are cut into windows, and bad input is refused naming the file."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import soundfile as sf
import torch

pytest.importorskip("transformers")
pytest.importorskip("ctranslate2")

import multimodal as mm
from multimodal.cli.main import main as cli_main
from multimodal.convert.ctranslate2 import from_ctranslate2, whisper_tokenizer
from multimodal.pipelines.transcribe import read_speech
from tests.models.test_whisper import hf_whisper, write_ct2


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_ct2(hf_whisper(), tmp_path_factory.mktemp("asr") / "tiny", "float32")


def _tone(seconds: float, rate: int = 16000, channels: int = 1, seed: int = 0) -> np.ndarray:
    g = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    wave = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * g.standard_normal(t.size)
    wave = wave.astype(np.float32)
    return np.stack([wave] * channels, axis=1) if channels > 1 else wave


def test_transcribe_equals_the_models_own_decoding_window_by_window(model_dir, tmp_path):
    # the tiny model reads 1 s windows (100 frames); a 2.5 s file is three windows
    sf.write(tmp_path / "long.wav", _tone(2.5), 16000)
    sf.write(tmp_path / "short.wav", _tone(0.7, seed=1), 16000)
    results = mm.transcribe(str(model_dir), tmp_path, show_progress=False)
    assert [r.file.rsplit("/", 1)[-1] for r in results] == ["long.wav", "short.wav"]
    model, tok = from_ctranslate2(model_dir), whisper_tokenizer(model_dir)
    wave = read_speech(tmp_path / "long.wav")
    parts = [wave[s : s + 16000] for s in range(0, wave.numel(), 16000)]
    assert len(parts) == 3
    want = []
    for part in parts:
        ids = model.generate(waveform=part)
        want.append(tok.decode(model.text_tokens(ids)[0]).strip())
    assert results[0].text == " ".join(t for t in want if t)
    assert results[0].seconds == pytest.approx(2.5)
    # what mm.load returned is a model too: the same transcripts
    assert mm.transcribe(mm.load(model_dir), tmp_path, show_progress=False) == results


def test_cli_writes_one_line_per_file_and_csv_jsonl(model_dir, tmp_path, capsys):
    for i in range(2):
        sf.write(tmp_path / f"c{i}.wav", _tone(0.8, seed=i), 16000)
    files = [str(tmp_path / "c0.wav"), str(tmp_path / "c1.wav")]
    cli_main(["transcribe", "--model", str(model_dir), "--inputs", *files,
              "--out", str(tmp_path / "out.csv")])
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split("\t")[0] for line in lines] == files
    with open(tmp_path / "out.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["file"] for r in rows] == files
    assert [r["text"] for r in rows] == [line.split("\t", 1)[1] for line in lines]
    cli_main(["transcribe", "--model", str(model_dir), "--inputs", files[0],
              "--out", str(tmp_path / "out.jsonl")])
    row = json.loads((tmp_path / "out.jsonl").read_text().splitlines()[0])
    assert row["file"] == files[0] and row["text"] == rows[0]["text"]


@pytest.mark.parametrize("case, pattern", [
    ("silent", r"silent\.wav is silent"),
    ("short", r"short\.wav is too short: 50 ms"),
    ("text", r"text\.wav is not a readable audio file"),
])
def test_bad_clips_are_refused_naming_the_file(model_dir, tmp_path, case, pattern):
    path = tmp_path / f"{case}.wav"
    if case == "silent":
        sf.write(path, np.zeros(16000, dtype=np.float32), 16000)
    elif case == "short":
        sf.write(path, _tone(0.05), 16000)
    elif case == "stereo":
        sf.write(path, _tone(1.0, channels=2), 16000)
    elif case == "8k":
        sf.write(path, _tone(1.0, rate=8000), 8000)
    elif case == "44k":
        sf.write(path, _tone(1.0, rate=44100), 44100)
    else:
        path.write_text("not audio at all")
    with pytest.raises(ValueError, match=pattern):
        mm.transcribe(str(model_dir), path, show_progress=False)
    assert cli_main_code(["transcribe", "--model", str(model_dir), "--inputs", str(path)]) == 2


@pytest.mark.parametrize("case, pattern", [
    ("stereo", r"stereo\.wav has 2 channels.*mix=True"),
    ("8k", r"8k\.wav is sampled at 8000 Hz \(telephone band.*resample=True"),
    ("44k", r"44k\.wav is sampled at 44100 Hz.*resample=True"),
])
def test_other_rates_and_channels_are_refused_only_when_asked(model_dir, tmp_path, case,
                                                              pattern):
    rate = {"8k": 8000, "44k": 44100}.get(case, 16000)
    sf.write(tmp_path / f"{case}.wav", _tone(1.0, rate=rate, channels=2 if case == "stereo"
                                             else 1), rate)
    with pytest.raises(ValueError, match=pattern):
        mm.transcribe(str(model_dir), tmp_path / f"{case}.wav", resample=False, mix=False,
                      show_progress=False)


def test_resample_and_mix_make_those_clips_usable(model_dir, tmp_path):
    sf.write(tmp_path / "s.wav", _tone(1.0, rate=44100, channels=2), 44100)
    wave = read_speech(tmp_path / "s.wav", resample=True, mix=True)
    assert wave.shape == (16000,)
    (r,) = mm.transcribe(str(model_dir), tmp_path / "s.wav", resample=True, mix=True,
                         show_progress=False)
    assert isinstance(r.text, str)


def test_cli_resamples_22050_hz_as_every_verb_does_with_one_note(model_dir, tmp_path, capfd):
    """espeak-ng's 22 050 Hz and a stereo file: transcribed (same text as the file converted
    to 16 kHz mono by hand), one ``note:`` line naming them; ``--resample`` / ``--mix`` still
    accepted, each with a note saying it is no longer needed."""
    import torchaudio

    tone = _tone(1.0, rate=22050)
    sf.write(tmp_path / "say.wav", tone, 22050)
    sf.write(tmp_path / "two.wav", _tone(1.0, channels=2, seed=3), 16000)
    by_hand = torchaudio.functional.resample(torch.from_numpy(tone), 22050, 16000)
    sf.write(tmp_path / "by_hand.wav", by_hand.numpy(), 16000)
    want = {r.file.rsplit("/", 1)[-1]: r.text for r in mm.transcribe(
        str(model_dir), [tmp_path / "by_hand.wav"], show_progress=False)}
    for extra in ([], ["--resample", "--mix"]):
        assert cli_main_code(["transcribe", "--model", str(model_dir), "--inputs",
                              str(tmp_path / "say.wav"), str(tmp_path / "two.wav"),
                              *extra]) == 0
        out, err = capfd.readouterr()
        got = dict(line.split("\t", 1) for line in out.strip().splitlines())
        assert got[str(tmp_path / "say.wav")] == want["by_hand.wav"]
        notes = [ln for ln in err.splitlines() if ln.startswith("note:")]
        assert notes == [*(f"note: {flag} is no longer needed (removed in 0.2): every file is "
                           "read as 16 kHz mono" for flag in extra),
                         "note: converted to 16000 Hz mono, as Whisper reads (say.wav: "
                         "22050 Hz, two.wav: 2 channels averaged)"]


def test_an_encoder_only_folder_is_not_a_transcriber(tmp_path):
    audio = mm.AudioClassifier(mm.AudioClassifierConfig(num_classes=3, dim=32, depth=1,
                                                        heads=2))
    audio.save_pretrained(tmp_path / "enc")
    sf.write(tmp_path / "a.wav", _tone(1.0), 16000)
    with pytest.raises(ValueError, match=r"enc holds a AudioClassifier model, not a speech "
                                         r"recogniser"):
        mm.transcribe(str(tmp_path / "enc"), tmp_path / "a.wav", show_progress=False)


def cli_main_code(args: list[str]) -> int:
    try:
        cli_main(args)
    except SystemExit as stop:
        return int(stop.code)
    return 0


def test_transcribe_batches_give_the_same_text_as_one_by_one(model_dir, tmp_path):
    for i in range(3):
        sf.write(tmp_path / f"b{i}.wav", _tone(0.9, seed=10 + i), 16000)
    one = mm.transcribe(str(model_dir), tmp_path, batch_size=1, show_progress=False)
    many = mm.transcribe(str(model_dir), tmp_path, batch_size=3, show_progress=False)
    assert [r.text for r in one] == [r.text for r in many]
    assert torch.is_tensor(read_speech(tmp_path / "b0.wav"))


def test_cli_compile_decodes_through_the_compiled_step_with_the_same_text(
        model_dir, tmp_path, capsys, monkeypatch):
    """``--compile`` reaches the decoding loop's compiled step (replaced by a counted eager
    static step: the plumbing, not inductor) and prints the eager transcripts."""
    import multimodal.generation as gen
    from multimodal.nn.step import static_step

    calls = [0]

    def fake_compiled(*args):
        calls[0] += 1
        return static_step(*args)

    for i in range(2):
        sf.write(tmp_path / f"k{i}.wav", _tone(0.8, seed=20 + i), 16000)
    cli_main(["transcribe", "--model", str(model_dir), "--inputs", str(tmp_path)])
    eager = capsys.readouterr().out
    monkeypatch.setattr(gen, "compile_unavailable", lambda device: None)
    monkeypatch.setitem(gen._COMPILED, "cpu", fake_compiled)
    cli_main(["transcribe", "--model", str(model_dir), "--inputs", str(tmp_path),
              "--compile"])
    assert capsys.readouterr().out == eager and calls[0] > 0


def test_a_transformers_whisper_folder_transcribes_like_its_ctranslate2_copy(model_dir,
                                                                            tmp_path):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    folder = tmp_path / "hf"
    hf_whisper().save_pretrained(folder)  # the weights model_dir was converted from
    vocab = json.loads((model_dir / "vocabulary.json").read_text())
    Tokenizer(WordLevel({t: i for i, t in enumerate(vocab)}, unk_token=vocab[0])).save(
        str(folder / "tokenizer.json"))
    sf.write(tmp_path / "a.wav", _tone(0.9, seed=5), 16000)
    (ours,) = mm.transcribe(str(folder), tmp_path / "a.wav", show_progress=False)
    model = from_ctranslate2(model_dir)
    ids = model.generate(waveform=read_speech(tmp_path / "a.wav"))
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert ours.text == tok.decode(model.text_tokens(ids)[0]).strip()


def test_transcribe_and_embed_collect_the_same_inputs(model_dir, tmp_path):
    """One collector: a folder gives the same audio files (``.raw`` included, other kinds
    left out) to ``transcribe`` as to ``embed``; a manifest works for both; an empty folder
    is the same error."""
    from multimodal.pipelines.inputs import collect_inputs

    clips = tmp_path / "clips"
    (clips / "sub").mkdir(parents=True)
    sf.write(clips / "a.wav", _tone(0.6), 16000)
    pcm = np.round(_tone(0.6, seed=3) * 32767).astype("<i2")
    pcm.tofile(clips / "sub" / "b.raw")  # headerless 16 kHz 16-bit mono
    (clips / "notes.txt").write_text("not audio")
    (clips / "c.png").write_bytes(b"\x89PNG")
    results = mm.transcribe(str(model_dir), clips, show_progress=False)
    collected = collect_inputs(clips, ("audio",))
    assert [r.file for r in results] == [str(i.path) for i in collected] == [
        str(clips / "a.wav"), str(clips / "sub" / "b.raw")]
    assert results[1].seconds == pytest.approx(0.6)
    torch.testing.assert_close(read_speech(clips / "sub" / "b.raw"),
                               torch.from_numpy(pcm.astype(np.float32) / 32768))
    manifest = tmp_path / "m.csv"
    manifest.write_text("path\nclips/sub/b.raw\nclips/a.wav\n")
    by_manifest = mm.transcribe(str(model_dir), manifest, show_progress=False)
    assert [r.text for r in by_manifest] == [results[1].text, results[0].text]
    (tmp_path / "empty").mkdir()
    for collect in (lambda p: mm.transcribe(str(model_dir), p, show_progress=False),
                    lambda p: collect_inputs(p, ("audio",))):
        with pytest.raises(ValueError, match=r"empty holds no audio \(\.wav .* \.raw\)"):
            collect(tmp_path / "empty")
    texts = tmp_path / "t.csv"
    texts.write_text("text\nhello\n")
    with pytest.raises(ValueError, match=r"t\.csv:2 is a text but transcribe reads audio"):
        mm.transcribe(str(model_dir), texts, show_progress=False)
