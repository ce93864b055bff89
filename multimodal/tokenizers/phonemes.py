"""Phoneme tokenizer: text -> IPA phonemes with espeak-ng, characters as the fallback.

The input side of text-to-speech. :class:`PhonemeTokenizer` shares the interface of the
text tokenizers in :mod:`multimodal.tokenizers.text` (``train``, ``encode``,
``encode_many``, ``encode_batch``, ``pad``, ``decode``, ``decode_batch``, ``normalize``,
``tokenize``, ``unknowns``, ``save`` / ``load``, ``vocab_size``, the special tokens
``[PAD] [UNK] [CLS] [SEP] [MASK] [BOS] [EOS]`` = ids 0..6, ``last_unknown_count``).

Backends (``backend=``):

* ``"espeak"`` -- ``espeak-ng -q --ipa --sep=_ -v VOICE`` (text on stdin) writes one line per
  clause, words separated by spaces and phonemes by ``_``. Each phoneme is a token (length
  marks stay on their phoneme: ``ɜː``; affricates and diphthongs are one token: ``tʃ``,
  ``əʊ``); a stress mark ``ˈ`` / ``ˌ`` is a token of its own before the vowel it stresses;
  ``" "`` separates words and ``"|"`` clauses. ``"Hello world, the cat"`` ->
  ``h ə l ˈ əʊ " " w ˈ ɜː l d | ð ə " " k ˈ a t``.
* ``"chars"`` -- lower-cased characters, runs of whitespace collapsed to one ``" "``: the
  switch for machines without espeak-ng, or to compare against phonemes.
* ``"auto"`` (the default of :meth:`PhonemeTokenizer.train`) -- ``"espeak"`` when
  ``espeak-ng`` is on the PATH, else ``"chars"`` with a warning. The resolved backend is
  what is saved.

Documented behaviour on bad input (differs from the text tokenizers on purpose: a speech
synthesiser has nothing to say for these):

* empty or whitespace-only text -> ``ValueError``;
* text with no letter or digit (``"?!..."``; espeak-ng would read out punctuation names)
  -> ``ValueError`` naming the text;
* a phoneme (or character) never seen in training -> ``[UNK]``, counted in
  ``last_unknown_count`` and written as ``[UNK]`` by ``decode``;
* ``backend="espeak"`` without espeak-ng installed, or an unknown espeak-ng voice ->
  ``RuntimeError`` saying what to do.

``decode`` joins the tokens without spaces (the word separator is itself a token), so for
in-vocabulary text ``decode(encode(text)) == normalize(text)``, e.g. ``"həlˈəʊ wˈɜːld"``.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import unicodedata
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from multimodal.tokenizers.text import SPECIAL_TOKENS, VocabTokenizer, iter_training_texts

__all__ = [
    "CLAUSE_BREAK",
    "LATIN_VOICES",
    "VOICE_SCRIPTS",
    "WORD_BREAK",
    "PhonemeTokenizer",
    "espeak_available",
    "espeak_voices",
    "letter_script",
    "phonemize",
    "unreadable_letters",
]

WORD_BREAK = " "
"""Token between two words."""
CLAUSE_BREAK = "|"
"""Token between two clauses (espeak-ng's line breaks: commas, full stops, ...)."""
STRESS_MARKS = ("ˈ", "ˌ")

Backend = Literal["espeak", "chars", "auto"]
_PRONOUNCEABLE = re.compile(r"[^\W_]")  # a letter or a digit, in any script
_SPACES = re.compile(r"\s+")


#: the scripts (first word of a letter's Unicode name) an espeak-ng voice reads besides
#: Latin, by language code (``"ru"`` of ``"ru+f3"``); ``LATIN_VOICES`` read Latin only
VOICE_SCRIPTS: dict[str, frozenset[str]] = {
    **dict.fromkeys(("ru", "uk", "bg", "sr", "mk", "be", "kk", "ky", "tt", "ba"),
                    frozenset({"CYRILLIC"})),
    "el": frozenset({"GREEK"}), "grc": frozenset({"GREEK"}),
    **dict.fromkeys(("ar", "fa", "ur", "ps", "sd", "ug"), frozenset({"ARABIC"})),
    "he": frozenset({"HEBREW"}),
    **dict.fromkeys(("hi", "mr", "ne", "sa", "kok", "bpy"), frozenset({"DEVANAGARI"})),
    **dict.fromkeys(("cmn", "yue", "hak", "zh"), frozenset({"CJK"})),
    "ja": frozenset({"CJK", "HIRAGANA", "KATAKANA"}), "ko": frozenset({"HANGUL"}),
    "th": frozenset({"THAI"}), "ka": frozenset({"GEORGIAN"}), "hy": frozenset({"ARMENIAN"}),
    "bn": frozenset({"BENGALI"}), "as": frozenset({"BENGALI"}), "ta": frozenset({"TAMIL"}),
    "te": frozenset({"TELUGU"}), "kn": frozenset({"KANNADA"}), "ml": frozenset({"MALAYALAM"}),
    "gu": frozenset({"GUJARATI"}), "pa": frozenset({"GURMUKHI"}), "si": frozenset({"SINHALA"}),
    "my": frozenset({"MYANMAR"}), "am": frozenset({"ETHIOPIC"}), "or": frozenset({"ORIYA"}),
}
LATIN_VOICES = frozenset([
    "en", "fr", "de", "es", "it", "pt", "nl", "sv", "da", "nb", "no", "fi", "pl", "cs",
    "sk", "hu", "ro", "tr", "vi", "id", "ms", "ca", "hr", "sl", "et", "lv", "lt", "sq",
    "eu", "gl", "cy", "ga", "gd", "is", "af", "sw", "eo", "la", "lfn", "jbo", "io", "ia",
    "mt", "az", "uz", "tn", "om", "so", "ht", "haw", "qu", "kl", "nci", "fo", "lb", "sjn",
    "qya", "py", "pap",
])


def letter_script(ch: str) -> str:
    """The script of a letter: the first word of its Unicode name (``"LATIN"``, ``"CJK"``,
    ``"CYRILLIC"``, ``"HIRAGANA"`` ...)."""
    return unicodedata.name(ch, "UNKNOWN").split(" ", 1)[0]


def unreadable_letters(text: str, voice: str) -> dict[str, str]:
    """``{script: its letters in text}`` for the letters of ``text`` in a script that the
    espeak-ng ``voice`` does not read (espeak-ng names such characters instead of reading
    them: "Chinese letter"); empty for a voice whose scripts are not known here."""
    lang = voice.split("+", 1)[0].split("-", 1)[0].lower()
    if lang in VOICE_SCRIPTS:
        readable = VOICE_SCRIPTS[lang] | {"LATIN"}
    elif lang in LATIN_VOICES:
        readable = frozenset({"LATIN"})
    else:
        return {}
    out: dict[str, str] = {}
    for ch in text:
        if ch.isalpha():
            script = letter_script(ch)
            if script not in readable:
                out[script] = out.get(script, "") + ch
    return out


def espeak_available() -> bool:
    """Whether the ``espeak-ng`` program is on the PATH."""
    return shutil.which("espeak-ng") is not None


def _check_speakable(text: str, where: str = "text") -> None:
    if not text.strip():
        raise ValueError(f"{where} is empty: there is nothing to pronounce")
    if not _PRONOUNCEABLE.search(text):
        raise ValueError(
            f"{where} {text!r:.60} has no pronounceable characters (no letter or digit)"
        )


def _espeak_exe() -> str:
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise RuntimeError(
            "espeak-ng is not installed (needed by backend='espeak'); install it "
            "(bash data/get_audio.sh does) or use PhonemeTokenizer(..., backend='chars')"
        )
    return exe


@functools.lru_cache(maxsize=16)
def espeak_voices(variants: bool = False, exe: str = "espeak-ng") -> frozenset[str]:
    """Names ``espeak-ng -v`` accepts, from its own listing: language codes, voice names and
    voice files of ``espeak-ng --voices`` or, with ``variants``, the variant files of
    ``--voices=variant`` (the ``m3`` of ``en-us+m3``). Empty when ``exe`` is not installed."""
    if shutil.which(exe) is None:
        return frozenset()
    flag = "--voices=variant" if variants else "--voices"
    out = subprocess.run([exe, flag], capture_output=True, text=True, check=False).stdout
    names: set[str] = set()
    for line in out.splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 5:
            file_name = cols[4].rsplit("/", 1)[-1]
            names.update((file_name,) if variants else (cols[1], cols[3], cols[4], file_name))
    return frozenset(names)


def _check_voice(exe: str, voice: str) -> None:
    # espeak-ng --ipa silently falls back to its default voice on an unknown name
    base = voice.split("+", 1)[0]  # "en-us+f3": a voice plus a variant
    if base not in espeak_voices(exe=exe):
        raise RuntimeError(
            f"espeak-ng has no voice {voice!r} (see `espeak-ng --voices`); "
            "pass e.g. voice='en-us'"
        )


@functools.lru_cache(maxsize=65536)
def _espeak_ipa(text: str, voice: str) -> str:
    exe = _espeak_exe()
    _check_voice(exe, voice)
    proc = subprocess.run(
        [exe, "-q", "--ipa", "--sep=_", "-v", voice],
        input=text, capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"espeak-ng failed on {text!r:.60} with voice {voice!r} (exit {proc.returncode}): "
            f"{proc.stderr.strip() or proc.stdout.strip()}"
        )
    return proc.stdout


def phonemize(text: str, voice: str = "en-us") -> list[str]:
    """Phoneme tokens of ``text`` by espeak-ng (see the module doc for the layout).

    Raises ``ValueError`` on empty / unpronounceable text, ``RuntimeError`` when espeak-ng is
    missing or fails (unknown voice).
    """
    _check_speakable(text)
    # one line per clause; inside, words by spaces, phonemes by "_"
    clauses = [line.split() for line in _espeak_ipa(text, voice).splitlines()]
    tokens: list[str] = []
    for words in clauses:
        if not words:
            continue
        if tokens:
            tokens.append(CLAUSE_BREAK)
        for w, word in enumerate(words):
            if w:
                tokens.append(WORD_BREAK)
            for phone in word.split("_"):
                while phone and phone[0] in STRESS_MARKS:
                    tokens.append(phone[0])
                    phone = phone[1:]
                if phone:
                    tokens.append(phone)
    return tokens


def _characters(text: str) -> list[str]:
    _check_speakable(text)
    return list(_SPACES.sub(" ", text.strip().lower()))


class PhonemeTokenizer(VocabTokenizer):
    """Phonemes (espeak-ng) or characters as integer tokens; see the module doc.

    ``vocab`` starts with the seven special tokens; ``backend`` is ``"espeak"`` or
    ``"chars"``; ``voice`` is the espeak-ng voice that phonemises (``"en-us"``).
    """

    kind: ClassVar[str] = "phonemes"

    def __init__(
        self, vocab: Sequence[str], backend: Backend = "espeak", voice: str = "en-us"
    ) -> None:
        super().__init__(vocab, lowercase=backend == "chars")
        self.backend = self._resolve(backend)
        self.voice = voice

    @staticmethod
    def _resolve(backend: str) -> str:
        if backend == "auto":
            if espeak_available():
                return "espeak"
            warnings.warn(
                "espeak-ng not found: PhonemeTokenizer falls back to characters "
                "(backend='chars')", stacklevel=3,
            )
            return "chars"
        if backend not in ("espeak", "chars"):
            raise ValueError(f"backend must be 'espeak', 'chars' or 'auto', got {backend!r}")
        return backend

    # --- splitting ------------------------------------------------------------------------
    def _split(self, text: str) -> list[str]:
        if self.backend == "chars":
            return _characters(text)
        return phonemize(text, self.voice)

    def _prepare(self, text: str) -> str:
        return text  # the backends normalise themselves

    def _join(self, tokens: list[str]) -> str:
        return "".join(tokens)

    def _encode_texts(self, texts: list[str]) -> list[list[int]]:
        for i, text in enumerate(texts):
            _check_speakable(text, f"texts[{i}]" if len(texts) > 1 else "text")
        return super()._encode_texts(texts)

    def normalize(self, text: str) -> str:
        """The phonemes (or characters) of ``text`` as one string: ``"həlˈəʊ wˈɜːld"``."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self._join(self._split(text))

    # --- training -------------------------------------------------------------------------
    @classmethod
    def train(
        cls,
        texts_or_files: Iterable[str] | Iterable[Path],
        *,
        backend: Backend = "auto",
        voice: str = "en-us",
        vocab_size: int | None = None,
        min_frequency: int = 1,
    ) -> PhonemeTokenizer:
        """Keep every phoneme (or character) of the training texts, most frequent first (at
        most ``vocab_size - 7`` of them, seen at least ``min_frequency`` times).

        Texts that cannot be pronounced (empty, only punctuation) are skipped here; a corpus
        with none left raises ``ValueError``.
        """
        probe = cls(list(SPECIAL_TOKENS), backend=backend, voice=voice)
        counts: Counter = Counter()
        n_used = 0
        for text in iter_training_texts(texts_or_files):
            if not text.strip() or not _PRONOUNCEABLE.search(text):
                continue
            counts.update(probe._split(text))
            n_used += 1
        if n_used == 0:
            raise ValueError("train() got no pronounceable training text")
        base = VocabTokenizer._from_counts(counts, vocab_size, min_frequency, False)
        return cls(base.vocab, backend=probe.backend, voice=voice)

    # --- persistence ----------------------------------------------------------------------
    def _to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "voice": self.voice, "vocab": self.vocab}

    @classmethod
    def _from_dict(cls, payload: dict[str, Any]) -> PhonemeTokenizer:
        backend = payload.get("backend")
        if backend not in ("espeak", "chars"):
            raise ValueError(f"phoneme tokenizer file has backend {backend!r}, "
                             "expected 'espeak' or 'chars'")
        return cls(payload["vocab"], backend=backend, voice=str(payload.get("voice", "en-us")))

    def __repr__(self) -> str:
        return (f"PhonemeTokenizer(vocab_size={self.vocab_size}, backend={self.backend!r}, "
                f"voice={self.voice!r})")
