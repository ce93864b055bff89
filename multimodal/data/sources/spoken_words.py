"""Spoken words: the ten digits and ten commands (20 classes) spoken by ~100 voices of the
Debian speech synthesisers ``espeak-ng`` (English accents x voice variants) and ``flite``
(kal, awb, rms, slt), each at several speeds and pitches.

:func:`synthesize_spoken_words` writes them once, as WAV files plus ``manifest.csv``
(``path, word, voice, speed, pitch``), under ``data/cache/spoken_words/``
(``bash data/get_audio.sh`` runs it). Splits are by voice (:func:`split_voices`):
validation and test voices are never heard in training.
"""

from __future__ import annotations

import csv
import os
import random
import shutil
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from torch import Tensor
from torch.utils.data import Dataset

from multimodal.data.audio_transforms import (
    Augment,
    Resampler,
    augment_item,
    centre_crop,
)
from multimodal.data.sources import GET_AUDIO
from multimodal.data.sources.sonic_pi import SONIC_PI_DIR, sonic_pi_files
from multimodal.data.sources.speech import SpeechJob, Voice, available_voices, speak_all
from multimodal.data.splits import check_sizes, split_counts
from multimodal.tokenizers.audio import load_audio

__all__ = ["COMMANDS", "DIGITS", "SPOKEN_WORDS", "SpokenWordsDataset", "read_manifest",
           "split_voices", "synthesize_spoken_words"]

DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
COMMANDS = ("yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go")
SPOKEN_WORDS = DIGITS + COMMANDS
DEFAULT_ROOT = Path("data/cache")
MANIFEST_FIELDS = ("path", "word", "voice", "speed", "pitch")

DEFAULT_SPEEDS = (120, 150, 180, 210)
DEFAULT_PITCHES = (30, 45, 60, 75)


def _plan(
    root: Path,
    voices: Sequence[Voice],
    words: Sequence[str],
    speeds: Sequence[int],
    pitches: Sequence[int],
    takes_per_word: int,
    seed: int,
) -> list[SpeechJob]:
    """Each (voice, word) gets ``takes_per_word`` distinct (speed, pitch) pairs drawn from the
    grid by a RNG seeded with ``(seed, voice, word)``: deterministic, whatever the order."""
    grid = [(s, p) for s in speeds for p in pitches]
    if not 1 <= takes_per_word <= len(grid):
        raise ValueError(f"takes_per_word must be in [1, {len(grid)}], got {takes_per_word}")
    jobs = []
    for voice in voices:
        for word in words:
            rng = random.Random(f"{seed}:{voice.id}:{word}")
            for speed, pitch in sorted(rng.sample(grid, takes_per_word)):
                out = root / "wav" / voice.slug / f"{word}_s{speed}_p{pitch}.wav"
                jobs.append(SpeechJob(voice, word, speed, pitch, out))
    return jobs


def synthesize_spoken_words(
    root: str | os.PathLike = DEFAULT_ROOT / "spoken_words",
    voices: Sequence[Voice | str] | None = None,
    words: Sequence[str] = SPOKEN_WORDS,
    speeds: Sequence[int] = DEFAULT_SPEEDS,
    pitches: Sequence[int] = DEFAULT_PITCHES,
    takes_per_word: int = 3,
    seed: int = 0,
    workers: int | None = None,
    progress: bool = True,
) -> Path:
    """Synthesise every (voice, word, take) as a WAV under ``root/wav/`` and write
    ``root/manifest.csv``; returns the manifest path.

    Cached: when the manifest exists and all its files are there, nothing is done (delete
    ``root`` to make it again); existing WAVs of an interrupted run are kept. Runs on a
    process pool of ``workers`` processes (default: the usable cores), showing progress
    (:func:`multimodal.progress.progress`: a bar on a terminal, a line every 10 % in a log).
    Speeds are espeak-ng words per minute (``-s``), pitches 0..99 (``-p``); flite gets
    ``duration_stretch = 175 / speed`` and ``F0 = base * 2^((pitch - 50) / 100)``.
    """
    root = Path(root)
    manifest = root / "manifest.csv"
    if manifest.is_file() and all((root / r["path"]).is_file() for r in read_manifest(root)):
        return manifest
    chosen = [Voice.parse(v) if isinstance(v, str) else v for v in voices or available_voices()]
    if not chosen:
        raise FileNotFoundError(f"neither espeak-ng nor flite is installed. {GET_AUDIO}")
    for engine, program in (("espeak", "espeak-ng"), ("flite", "flite")):
        if any(v.engine == engine for v in chosen) and not shutil.which(program):
            raise FileNotFoundError(f"{program} is not installed. {GET_AUDIO}")
    unknown = sorted(set(words) - set(SPOKEN_WORDS))
    if unknown:
        raise ValueError(f"words must come from SPOKEN_WORDS, got {unknown}")
    jobs = _plan(root, sorted(set(chosen)), words, speeds, pitches, takes_per_word, seed)
    speak_all(jobs, workers, progress, desc="spoken words")
    tmp = manifest.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(MANIFEST_FIELDS)
        for j in jobs:
            rel = j.out.relative_to(root).as_posix()
            writer.writerow([rel, j.word, j.voice.id, j.speed, j.pitch])
    tmp.replace(manifest)
    return manifest


def read_manifest(root: str | os.PathLike) -> list[dict[str, str]]:
    """Rows of ``root/manifest.csv`` as dicts with :data:`MANIFEST_FIELDS`."""
    path = Path(root) / "manifest.csv"
    if not path.is_file():
        raise FileNotFoundError(f"spoken-words manifest not found: {path}. {GET_AUDIO}")
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if rows and set(MANIFEST_FIELDS) - set(rows[0]):
        raise ValueError(f"{path} must have columns {MANIFEST_FIELDS}, got {sorted(rows[0])}")
    return rows



def split_voices(
    voices: Iterable[str],
    val_size: float = 0.1,
    test_size: float = 0.2,
    seed: int = 0,
) -> dict[str, list[str]]:
    """Split voice ids into disjoint ``train`` / ``val`` / ``test`` lists.

    Stratified by engine (``espeak`` / ``flite``, the part before ``:``) so each split hears
    both synthesisers: within an engine the sorted voices are shuffled with ``seed`` and the
    first ``round(test_size * n)`` (at least 1; a whole count: that many per engine) go to
    test, the next ones to val (:func:`~multimodal.data.splits.split_counts`).
    Deterministic: the same voices and seed give the same split.
    """
    check_sizes(val_size, test_size)
    by_engine: dict[str, list[str]] = defaultdict(list)
    for v in sorted(set(voices)):
        by_engine[v.partition(":")[0]].append(v)
    out: dict[str, list[str]] = {"train": [], "val": [], "test": []}
    for engine in sorted(by_engine):
        group = by_engine[engine]
        random.Random(f"{seed}:{engine}").shuffle(group)
        n_val, n_test = split_counts(len(group), val_size, test_size)
        out["test"] += group[:n_test]
        out["val"] += group[n_test : n_test + n_val]
        out["train"] += group[n_test + n_val :]
    return {k: sorted(v) for k, v in out.items()}


class SpokenWordsDataset(Dataset):
    """Rows of the spoken-words manifest -> ``{"waveform": (T,) 16 kHz, "label": int}``.

    Clips longer than ``max_samples`` are centre-cropped; shorter ones keep their length.
    ``noise`` (training) mixes background noise per item with the global torch RNG; with
    ``noise_seed`` (evaluation) item ``i`` always gets the same noise.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        rows: Sequence[dict[str, str]],
        max_samples: int | None = None,
        noise: Augment | None = None,
        noise_seed: int | None = None,
    ) -> None:
        self.root, self.rows = Path(root), list(rows)
        self.labels = [SPOKEN_WORDS.index(r["word"]) for r in self.rows]
        self.max_samples, self.noise, self.noise_seed = max_samples, noise, noise_seed
        self._resample = Resampler()

    def __len__(self) -> int:
        return len(self.rows)

    def waveform(self, i: int) -> Tensor:
        """The clean 16 kHz mono clip of item ``i``."""
        x = self._resample(*load_audio(self.root / self.rows[i]["path"]))
        return x if self.max_samples is None else centre_crop(x, self.max_samples)

    def __getitem__(self, i: int) -> dict[str, Any]:
        x = self.waveform(i)
        x = augment_item(x, self.noise, self.noise_seed, i)
        return {"waveform": x, "label": self.labels[i]}


def make_spoken_words(root: str | Path = DEFAULT_ROOT / "spoken_words", *,
                      takes_per_word: int = 3, seed: int = 0, workers: int | None = None,
                      samples_dir: str | Path = SONIC_PI_DIR) -> Path:
    """Synthesise the spoken-words set under ``root`` (cached: :func:`synthesize_spoken_words`),
    print what it holds and what the Sonic Pi samples in ``samples_dir`` hold, and return
    its manifest. Run by ``python -m multimodal.cli.datasets spoken-words``
    (``bash data/get_audio.sh``)."""
    manifest = synthesize_spoken_words(root, takes_per_word=takes_per_word, seed=seed,
                                       workers=workers)
    rows = read_manifest(root)
    voices = {r["voice"] for r in rows}
    print(f"spoken words: {len(rows)} clips, {len(voices)} voices, "
          f"{len({r['word'] for r in rows})} words -> {manifest}")  # fmt: skip
    try:
        files = sonic_pi_files(samples_dir)
        summary = ", ".join(f"{c} {len(f)}" for c, f in files.items())
        total = sum(map(len, files.values()))
        print(f"sonic pi: {total} files in {len(files)} classes ({summary})")
    except FileNotFoundError as err:
        print(f"sonic pi: {err}")
    return manifest


if __name__ == "__main__":  # the recipe's options are parsed in cli/ now
    raise SystemExit("this recipe moved: python -m multimodal.cli.datasets spoken-words [--help]")
