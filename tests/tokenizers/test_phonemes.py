"""PhonemeTokenizer: espeak-ng phonemes on real sentences, the character fallback, bad input."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

from multimodal.tokenizers.phonemes import (
    CLAUSE_BREAK,
    WORD_BREAK,
    PhonemeTokenizer,
    phonemize,
)
from multimodal.tokenizers.text import SPECIAL_TOKENS, UNK_ID, TextTokenizer, load_tokenizer

needs_espeak = pytest.mark.skipif(
    shutil.which("espeak-ng") is None,
    reason="espeak-ng is not installed (bash data/get_audio.sh installs it)",
)

SENTENCES = [
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void; and darkness was upon the face of the deep.",
    "Hello world, the cat sat on the mat.",
    "She sells sea shells by the sea shore.",
]


def _espeak_lines(text: str) -> list[str]:
    out = subprocess.run(["espeak-ng", "-q", "--ipa", "-v", "en-us"], input=text,
                         capture_output=True, text=True, check=True).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


@needs_espeak
def test_phonemes_of_real_sentences_match_espeak_ipa() -> None:
    # joining the tokens must give back espeak-ng's own IPA (without our separators)
    for text in SENTENCES:
        tokens = phonemize(text)
        clauses = "".join(tokens).split(CLAUSE_BREAK)
        assert clauses == _espeak_lines(text)
    # spot-check known English phonemes: "cat" = k ˈ a t (espeak en-us uses æ), "the" = ð ə
    tokens = phonemize("the cat")
    assert tokens[:2] == ["ð", "ə"]
    assert tokens[2] == WORD_BREAK
    assert tokens[3] == "k" and tokens[4] == "ˈ" and tokens[-1] == "t"
    # an affricate is one token, a stress mark is its own token
    assert phonemize("church")[0] == "tʃ"
    assert "ˈ" in phonemize("hello")


@needs_espeak
def test_encode_decode_round_trip_and_interface(tmp_path) -> None:
    tok = PhonemeTokenizer.train(SENTENCES, backend="espeak")
    assert tok.vocab[: len(SPECIAL_TOKENS)] == list(SPECIAL_TOKENS)
    assert tok.backend == "espeak" and len(tok) == tok.vocab_size > 30
    for text in SENTENCES:
        ids = tok.encode(text)
        assert tok.last_unknown_count == 0
        assert tok.decode(ids) == tok.normalize(text) == "".join(phonemize(text))
    ids = tok.encode(SENTENCES[2], add_bos=True, add_eos=True)
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
    batch = tok.encode_batch(SENTENCES[:3], add_eos=True)
    lengths = [len(tok.encode(s, add_eos=True)) for s in SENTENCES[:3]]
    assert batch["input_ids"].shape == (3, max(lengths))
    assert batch["attention_mask"].sum(1).tolist() == lengths
    # save / load through the shared loader keeps the kind, backend and vocabulary
    path = tok.save(tmp_path / "phon.json")
    again = load_tokenizer(path)
    assert isinstance(again, PhonemeTokenizer) and again.vocab == tok.vocab
    assert again.backend == "espeak" and again.voice == tok.voice
    assert again.encode(SENTENCES[3]) == tok.encode(SENTENCES[3])
    assert isinstance(PhonemeTokenizer.load(path), PhonemeTokenizer)
    assert isinstance(TextTokenizer.load(path), PhonemeTokenizer)


@needs_espeak
def test_unknown_phonemes_are_visible_as_unk() -> None:
    tok = PhonemeTokenizer.train(["the cat"], backend="espeak")
    text = "the zebra jumps"  # z, j ... never seen in "the cat"
    ids = tok.encode(text)
    expected_unk = [p for p in phonemize(text) if p not in tok.vocab]
    assert expected_unk and tok.unknowns(text) == expected_unk
    assert tok.last_unknown_count == ids.count(UNK_ID) == len(expected_unk)
    assert "[UNK]" in tok.decode(ids)
    tok.encode("the cat")
    assert tok.last_unknown_count == 0


def test_character_fallback_switch(tmp_path) -> None:
    tok = PhonemeTokenizer.train(["Hello  World", "the cat"], backend="chars")
    assert tok.backend == "chars"
    assert tok.normalize("Hello   World") == "hello world"
    assert tok.decode(tok.encode("hello world")) == "hello world"
    ids = tok.encode("hello quiz")  # q, u, i, z unseen
    assert tok.last_unknown_count == 4 == ids.count(UNK_ID)
    again = PhonemeTokenizer.load(tok.save(tmp_path / "c.json"))
    assert again.backend == "chars" and again.vocab == tok.vocab


def test_auto_falls_back_to_chars_without_espeak(monkeypatch) -> None:
    monkeypatch.setattr("multimodal.tokenizers.phonemes.shutil.which", lambda _: None)
    with pytest.warns(UserWarning, match="falls back to characters"):
        tok = PhonemeTokenizer.train(["the cat"], backend="auto")
    assert tok.backend == "chars"
    espeak_tok = PhonemeTokenizer(list(SPECIAL_TOKENS), backend="espeak", voice="en-gb")
    with pytest.raises(RuntimeError, match="espeak-ng is not installed"):
        espeak_tok.encode("a text never phonemised before by this cache 123")


@pytest.mark.parametrize("backend", ["chars", pytest.param("espeak", marks=needs_espeak)])
def test_bad_input_raises_clear_errors(backend: str) -> None:
    tok = PhonemeTokenizer.train(SENTENCES, backend=backend)
    with pytest.raises(ValueError, match="empty"):
        tok.encode("")
    with pytest.raises(ValueError, match="empty"):
        tok.encode("   \n")
    with pytest.raises(ValueError, match="no pronounceable"):
        tok.encode("?! ... --")
    with pytest.raises(ValueError, match=r"texts\[1\].*no pronounceable"):
        tok.encode_batch(["fine", "!!!"])
    with pytest.raises(TypeError):
        tok.encode(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode(torch.tensor([tok.vocab_size]))
    with pytest.raises(ValueError, match="no pronounceable training text"):
        PhonemeTokenizer.train(["", "..."], backend=backend)
    with pytest.raises(ValueError, match="backend"):
        PhonemeTokenizer(list(SPECIAL_TOKENS), backend="festival")  # type: ignore[arg-type]


@needs_espeak
def test_unknown_voice_is_a_clear_error() -> None:
    tok = PhonemeTokenizer(list(SPECIAL_TOKENS), backend="espeak", voice="no-such-voice")
    with pytest.raises(RuntimeError, match="no-such-voice"):
        tok.encode("hello")


@needs_espeak
def test_clauses_and_digits() -> None:
    tokens = phonemize("One, two. Three 4")
    assert tokens.count(CLAUSE_BREAK) == 2
    assert len(phonemize("42")) > 3  # digits are read out as words
