"""Speech synthesis with the Debian programs espeak-ng and flite: which voices this machine
has, and one word spoken by one voice at one speed and pitch into a trimmed 16-bit WAV.

Speeds are espeak-ng words per minute (``-s``), pitches 0..99 (``-p``); flite gets
``duration_stretch = 175 / speed`` and ``F0 = base * 2^((pitch - 50) / 100)``.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import soundfile as sf

from multimodal.data.audio_transforms import trim_silence
from multimodal.progress import progress as progress_bar
from multimodal.tokenizers.phonemes import espeak_voices

__all__ = [
    "ESPEAK_LANGUAGES",
    "ESPEAK_VARIANTS",
    "FLITE_VOICES",
    "SpeechJob",
    "Voice",
    "available_voices",
    "check_voices",
    "speak",
    "speak_all",
]

# espeak-ng English accents (no MBROLA voices: they need extra packages) and voice variants.
ESPEAK_LANGUAGES = (
    "en", "en-us", "en-gb-scotland", "en-gb-x-rp", "en-gb-x-gbclan", "en-gb-x-gbcwmd",
    "en-029", "en-us-nyc",
)  # fmt: skip
ESPEAK_VARIANTS = ("", "m1", "m2", "m3", "m4", "m5", "m6", "m7", "f1", "f2", "f3", "f4")
# flite voices: full-vocabulary ones only (awb_time speaks only the time; kal16 = kal).
FLITE_VOICES = ("kal", "awb", "rms", "slt")
# Median F0 (Hz) of each flite voice's default output, measured with
# torchaudio.functional.detect_pitch_frequency; pitch p maps to F0 = base * 2^((p - 50) / 100).
FLITE_BASE_F0 = {"kal": 95.0, "awb": 105.0, "rms": 100.0, "slt": 160.0}
ESPEAK_DEFAULT_SPEED = 175  # words per minute; flite duration_stretch = 175 / speed


@dataclass(frozen=True, order=True)
class Voice:
    """A synthetic speaker: ``engine`` is ``"espeak"`` or ``"flite"``; ``name`` is an
    espeak-ng voice (``en-us+m3``) or a flite voice (``slt``)."""

    engine: Literal["espeak", "flite"]
    name: str

    @property
    def id(self) -> str:
        return f"{self.engine}:{self.name}"

    @property
    def slug(self) -> str:
        """File-system-safe form of :attr:`id`."""
        return re.sub(r"[^A-Za-z0-9-]+", "_", f"{self.engine}_{self.name}")

    @classmethod
    def parse(cls, voice_id: str) -> Voice:
        engine, _, name = voice_id.partition(":")
        if engine not in ("espeak", "flite") or not name:
            raise ValueError(f"voice must be 'espeak:NAME' or 'flite:NAME', got {voice_id!r}")
        return cls(engine, name)  # type: ignore[arg-type]


def _run(cmd: Sequence[str]) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    return result.stdout + result.stderr


@functools.lru_cache(maxsize=1)
def _flite_voices() -> frozenset[str]:
    if shutil.which("flite") is None:
        return frozenset()
    return frozenset(_run(["flite", "-lv"]).replace("Voices available:", "").split())


def available_voices() -> list[Voice]:
    """Voices this machine can speak with: :data:`ESPEAK_LANGUAGES` x :data:`ESPEAK_VARIANTS`
    for the languages ``espeak-ng --voices`` lists, and the :data:`FLITE_VOICES` that
    ``flite -lv`` lists. Empty when neither program is installed."""
    voices: list[Voice] = []
    for lang in ESPEAK_LANGUAGES:
        if lang in espeak_voices():
            voices += [Voice("espeak", f"{lang}+{v}" if v else lang) for v in ESPEAK_VARIANTS]
    return voices + [Voice("flite", v) for v in FLITE_VOICES if v in _flite_voices()]


def _voice_problem(voice: Voice) -> str | None:
    program = "espeak-ng" if voice.engine == "espeak" else "flite"
    if shutil.which(program) is None:
        return f"{program} is not installed (bash data/get_audio.sh installs it)"
    if voice.engine == "flite":
        known = voice.name in _flite_voices()
        listing = "flite -lv"
    else:
        base, _, variant = voice.name.partition("+")
        known = base in espeak_voices() and (not variant or variant in espeak_voices(True))
        listing = "espeak-ng --voices and --voices=variant"
    return None if known else f"{program} has no such voice (see `{listing}`)"


def check_voices(voices: Sequence[Voice]) -> None:
    """Raise ``ValueError`` naming every voice this machine cannot speak with. Needed because
    both programs fall back to a default voice without an error on some unknown names
    (flite on any, espeak-ng on an unknown ``+variant``): a silent wrong speaker."""
    problems = [f"{v.id}: {p}" for v in sorted(set(voices)) if (p := _voice_problem(v))]
    if problems:
        raise ValueError("cannot speak with these voices:\n  " + "\n  ".join(problems))


@dataclass(frozen=True)
class SpeechJob:
    """One clip to make: ``voice`` speaks ``word`` at ``speed`` and ``pitch`` into ``out``."""

    voice: Voice
    word: str
    speed: int
    pitch: int
    out: Path


def _command(job: SpeechJob, wav: Path) -> list[str]:
    if job.voice.engine == "espeak":
        return ["espeak-ng", "-v", job.voice.name, "-s", str(job.speed), "-p", str(job.pitch),
                "-w", str(wav), job.word]  # fmt: skip
    base = FLITE_BASE_F0.get(job.voice.name, 110.0)
    f0 = base * 2 ** ((job.pitch - 50) / 100)
    stretch = ESPEAK_DEFAULT_SPEED / job.speed
    return ["flite", "-voice", job.voice.name, "-t", job.word, "-o", str(wav),
            "--setf", f"duration_stretch={stretch:.3f}",
            "--setf", f"int_f0_target_mean={f0:.1f}"]  # fmt: skip


def speak(job: SpeechJob) -> str | None:
    """Speak one word into ``job.out`` (trimmed 16-bit WAV); returns an error or None."""
    tmp = job.out.with_name(job.out.stem + ".tmp.wav")
    try:
        output = _run(_command(job, tmp))
        if not tmp.is_file() or tmp.stat().st_size <= 44:
            return f"{job.voice.id} {job.word!r}: no audio written ({output.strip()[:200]})"
        data, rate = sf.read(str(tmp), dtype="float32")
        if data.ndim > 1:
            data = data.mean(axis=1)
        sf.write(str(job.out), trim_silence(data, rate), rate, subtype="PCM_16")
        return None
    except (OSError, subprocess.SubprocessError, sf.LibsndfileError) as err:
        return f"{job.voice.id} {job.word!r}: {err}"
    finally:
        tmp.unlink(missing_ok=True)


def _workers(requested: int | None) -> int:
    if requested is not None:
        return max(1, requested)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def speak_all(jobs: Sequence[SpeechJob], workers: int | None = None, progress: bool = True,
              desc: str = "speech") -> None:
    """Run every :class:`SpeechJob` whose WAV does not exist yet (so a recipe is idempotent
    and resumes after an interruption), in ``workers`` processes (default: the usable
    cores) with a progress bar; output folders are made first. Raises ``ValueError`` before
    any work when a voice is unknown (:func:`check_voices`), ``RuntimeError`` naming how
    many jobs failed and the first five errors."""
    todo = [j for j in jobs if not j.out.is_file()]
    check_voices([j.voice for j in todo])
    for folder in {j.out.parent for j in todo}:
        folder.mkdir(parents=True, exist_ok=True)
    workers = min(_workers(workers), max(1, len(todo)))
    errors: list[str] = []
    with progress_bar(total=len(todo), desc=desc, unit="clip", disable=not progress) as bar, \
            ExitStack() as stack:
        results = map(speak, todo) if workers == 1 else stack.enter_context(
            ProcessPoolExecutor(max_workers=workers)).map(speak, todo, chunksize=16)
        for err in results:
            errors += [err] if err else []
            bar.update()
    if errors:
        shown = "\n  ".join(errors[:5])
        raise RuntimeError(f"{len(errors)} of {len(todo)} {desc} clips failed, e.g.:\n  {shown}")
