"""Text-speech pairs for text-to-speech: short phrases of the offline English corpora (King
James Bible, fortunes) and isolated words, read by the espeak-ng / flite voices of
:mod:`~.speech`, one WAV per utterance plus ``manifest.csv``.

Texts (:func:`tts_phrases`): every document is cut into clauses at ``. , ; : ! ?`` (and
line breaks); a clause is kept when it has ``min_words..max_words`` words made only of
letters (an apostrophe inside a word is allowed), so every utterance is short (about
0.5-3 s) and espeak-ng and flite read it the same way (no digits, abbreviations or
symbols). Duplicates (case-insensitive) are dropped; the seeded shuffle of the rest puts
the first ``held_out_phrases`` in the held-out pool, never read by a training voice.

Voices are split as the spoken words split them (:func:`~.spoken_words.split_voices`,
same fractions and seed), so a voice held out there is held out here too: validation and
test voices are never heard in text-to-speech training, nor in the spoken-word
classifier's training.

Per voice (:func:`plan_utterances`): every voice has its own base speed and pitch (drawn
with a RNG seeded by the voice id, ``speed_range`` words per minute, ``pitch_range`` on
espeak-ng's 0..99 scale) and each utterance jitters them by up to ``speed_jitter`` /
``pitch_jitter``, so a voice is one consistent speaker (what an acoustic prompt can
carry) while the set still spans many speeds and pitches.

* a training voice reads ``train_phrases`` phrases of the training pool and
  ``train_words`` isolated words: ``vocab_words`` of the 20 spoken-words vocabulary (the
  words the intelligibility test synthesises; the classifier that judges them is trained
  on the same voices) and the rest from :data:`EXTRA_WORDS`;
* a validation / test voice reads ``held_out_phrases_per_voice`` phrases of the held-out
  pool (the acoustic prompts and the speaker candidates of the evaluation).

The manifest (``path, text, voice, speed, pitch, kind, split, seconds``): ``kind`` is
``phrase`` or ``word``, ``split`` the voice's split, ``seconds`` the trimmed length.
"""

from __future__ import annotations

import csv
import os
import random
import re
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import soundfile as sf

from multimodal.data.documents import Document
from multimodal.data.sources import GET_AUDIO
from multimodal.data.sources.speech import SpeechJob, Voice, available_voices, speak_all
from multimodal.data.sources.spoken_words import SPOKEN_WORDS, split_voices

__all__ = ["EXTRA_WORDS", "FORTUNE_FILES", "MANIFEST_FIELDS", "TTSRecipe", "Utterance",
           "plan_utterances", "read_tts_manifest", "synthesize_tts", "tts_phrases"]

DEFAULT_ROOT = Path("data/cache/tts")
MANIFEST_FIELDS = ("path", "text", "voice", "speed", "pitch", "kind", "split", "seconds")

# fortune files of plain prose (the others hold ASCII art, code, or offensive material)
FORTUNE_FILES = ("cookie", "fortunes", "literature", "love", "people", "pets", "platitudes",
                 "wisdom", "work", "food", "kids", "education", "science", "men-women")
# isolated words besides the spoken-words vocabulary: short, common, unlike each other
EXTRA_WORDS = (
    "house", "water", "light", "green", "small", "happy", "music", "friend", "morning",
    "river", "garden", "silver", "window", "paper", "summer", "winter", "yellow", "orange",
    "table", "number", "people", "mother", "father", "little", "bright", "quiet", "heavy",
    "simple", "golden", "night", "voice", "money", "story", "forest", "city", "horse",
)  # fmt: skip

_CLAUSE_RE = re.compile(r"[.,;:!?()\[\]\"\n]+|--")
_WORD_RE = re.compile(r"^[A-Za-z]+(?:'[A-Za-z]+)?$")


def tts_phrases(
    documents: Iterable[Document], min_words: int = 2, max_words: int = 6
) -> list[str]:
    """Distinct short clauses of ``documents`` (see the module doc), in reading order."""
    if not 1 <= min_words <= max_words:
        raise ValueError(f"need 1 <= min_words <= max_words, got {min_words}, {max_words}")
    seen: set[str] = set()
    out: list[str] = []
    for doc in documents:
        for clause in _CLAUSE_RE.split(doc.text):
            words = clause.split()
            if not min_words <= len(words) <= max_words:
                continue
            if not all(_WORD_RE.match(w) for w in words):
                continue
            phrase = " ".join(words)
            key = phrase.lower()
            if key not in seen:
                seen.add(key)
                out.append(phrase)
    return out


@dataclass(frozen=True)
class TTSRecipe:
    """How many utterances of what: see the module doc. ``val_fraction`` / ``test_fraction``
    / ``seed`` are the voice split's (the spoken words' defaults)."""

    train_phrases: int = 24
    train_words: int = 12
    vocab_words: int = 8
    held_out_phrases_per_voice: int = 16
    held_out_phrases: int = 300
    min_words: int = 2
    max_words: int = 6
    speed_range: tuple[int, int] = (140, 200)
    pitch_range: tuple[int, int] = (25, 75)
    speed_jitter: int = 10
    pitch_jitter: int = 5
    val_fraction: float = 0.1
    test_fraction: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.vocab_words <= min(self.train_words, len(SPOKEN_WORDS)):
            raise ValueError(f"vocab_words must be in [0, min(train_words, 20)], got "
                             f"{self.vocab_words}")
        if self.train_words - self.vocab_words > len(EXTRA_WORDS):
            raise ValueError(f"train_words - vocab_words must be <= {len(EXTRA_WORDS)}")
        for name in ("train_phrases", "held_out_phrases_per_voice", "held_out_phrases"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        lo, hi = self.speed_range
        if not 80 <= lo <= hi:
            raise ValueError(f"speed_range must be (lo, hi) with 80 <= lo <= hi, got "
                             f"{self.speed_range}")
        lo, hi = self.pitch_range
        if not (lo - self.pitch_jitter >= 0 and hi + self.pitch_jitter <= 99 and lo <= hi):
            raise ValueError(f"pitch_range +- pitch_jitter must stay in [0, 99], got "
                             f"{self.pitch_range} +- {self.pitch_jitter}")


@dataclass(frozen=True)
class Utterance:
    """One clip to make: ``job`` (voice, text, speed, pitch, output file), its ``kind``
    (``"phrase"`` / ``"word"``) and its voice's ``split``."""

    job: SpeechJob
    kind: str
    split: str


def _voice_style(voice: Voice, recipe: TTSRecipe) -> tuple[int, int]:
    rng = random.Random(f"{recipe.seed}:style:{voice.id}")
    return rng.randint(*recipe.speed_range), rng.randint(*recipe.pitch_range)


def plan_utterances(
    root: Path,
    voices: Sequence[Voice],
    phrases: Sequence[str],
    recipe: TTSRecipe,
) -> list[Utterance]:
    """Every utterance of the recipe, deterministic whatever the order of ``voices``:
    each voice's texts, speeds and pitches come from a RNG seeded with ``(seed, voice)``."""
    order = list(phrases)
    random.Random(f"{recipe.seed}:phrases").shuffle(order)
    held_out, train_pool = order[: recipe.held_out_phrases], order[recipe.held_out_phrases:]
    split = split_voices((v.id for v in voices), recipe.val_fraction, recipe.test_fraction,
                         recipe.seed)
    split_of = {v: s for s, vs in split.items() for v in vs}
    out: list[Utterance] = []
    for voice in sorted(set(voices)):
        rng = random.Random(f"{recipe.seed}:texts:{voice.id}")
        where = split_of[voice.id]
        if where == "train":
            pool, n = train_pool, recipe.train_phrases
            words = rng.sample(SPOKEN_WORDS, recipe.vocab_words) + rng.sample(
                EXTRA_WORDS, recipe.train_words - recipe.vocab_words)
        else:
            pool, n, words = held_out, recipe.held_out_phrases_per_voice, []
        if n > len(pool):
            raise ValueError(f"{voice.id} needs {n} phrases, the {where} pool has {len(pool)}")
        texts = [(t, "phrase") for t in rng.sample(pool, n)] + [(w, "word") for w in words]
        speed, pitch = _voice_style(voice, recipe)
        for i, (text, kind) in enumerate(texts):
            s = speed + rng.randint(-recipe.speed_jitter, recipe.speed_jitter)
            p = pitch + rng.randint(-recipe.pitch_jitter, recipe.pitch_jitter)
            out_path = root / "wav" / voice.slug / f"{i:03d}_{kind}.wav"
            out.append(Utterance(SpeechJob(voice, text, s, p, out_path), kind, where))
    return out


def read_tts_manifest(root: str | os.PathLike = DEFAULT_ROOT) -> list[dict[str, str]]:
    """Rows of ``root/manifest.csv`` as dicts with :data:`MANIFEST_FIELDS`."""
    path = Path(root) / "manifest.csv"
    if not path.is_file():
        raise FileNotFoundError(f"TTS manifest not found: {path}; make it with "
                                "`bash data/get_tts.sh`")
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or set(MANIFEST_FIELDS) - set(rows[0]):
        raise ValueError(f"{path} must have columns {MANIFEST_FIELDS} and rows")
    return rows


def synthesize_tts(
    root: str | os.PathLike = DEFAULT_ROOT,
    documents: Iterable[Document] | None = None,
    voices: Sequence[Voice | str] | None = None,
    recipe: TTSRecipe | None = None,
    workers: int | None = None,
    progress: bool = True,
) -> Path:
    """Synthesise every utterance of ``recipe`` under ``root/wav/`` and write
    ``root/manifest.csv``; returns the manifest path.

    ``documents``: the texts (default: the Bible and the :data:`FORTUNE_FILES` fortunes);
    ``voices``: default every voice of :func:`~.speech.available_voices`. Cached: with a
    manifest whose files all exist nothing is done (delete ``root`` to make it again); an
    interrupted run keeps its WAVs. Runs on ``workers`` processes with a progress bar.
    """
    root, recipe = Path(root), recipe or TTSRecipe()
    manifest = root / "manifest.csv"
    if manifest.is_file():
        rows = read_tts_manifest(root)
        if all((root / r["path"]).is_file() for r in rows):
            return manifest
    chosen = [Voice.parse(v) if isinstance(v, str) else v for v in voices or available_voices()]
    if not chosen:
        raise FileNotFoundError(f"neither espeak-ng nor flite is installed. {GET_AUDIO}")
    for engine, program in (("espeak", "espeak-ng"), ("flite", "flite")):
        if any(v.engine == engine for v in chosen) and not shutil.which(program):
            raise FileNotFoundError(f"{program} is not installed. {GET_AUDIO}")
    if documents is None:
        documents = _default_documents()
    phrases = tts_phrases(documents, recipe.min_words, recipe.max_words)
    plan = plan_utterances(root, chosen, phrases, recipe)
    speak_all([u.job for u in plan], workers, progress, desc="tts voices")
    tmp = manifest.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(MANIFEST_FIELDS)
        for u in plan:
            j = u.job
            seconds = sf.info(str(j.out)).duration
            writer.writerow([j.out.relative_to(root).as_posix(), j.word, j.voice.id, j.speed,
                             j.pitch, u.kind, u.split, f"{seconds:.3f}"])
    tmp.replace(manifest)
    return manifest


def _default_documents() -> list[Document]:
    from multimodal.data.sources.bible import read_bible
    from multimodal.data.sources.fortunes import read_fortunes

    fortunes = [d for d in read_fortunes() if d.title.split(" #")[0] in FORTUNE_FILES]
    return read_bible() + fortunes
