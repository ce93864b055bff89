"""Audio classification data: spoken words synthesised offline, Sonic Pi samples, a DataModule.

Sources (offline; see ``data/README.md`` and ``bash data/get_audio.sh``):

* ``spoken_words`` — the ten digits and ten commands (20 classes) spoken by ~100 voices of
  the Debian speech synthesisers ``espeak-ng`` (English accents x voice variants) and
  ``flite`` (kal, awb, rms, slt), each at several speeds and pitches.
  :func:`synthesize_spoken_words` writes them once, as WAV files plus ``manifest.csv``
  (``path, word, voice, speed, pitch``), under ``data/cache/spoken_words/``. Splits are by
  voice: validation and test voices are never heard in training.
* ``sonic_pi`` — the real recorded clips of the Debian package ``sonic-pi-samples``
  (``/usr/share/sonic-pi/samples/*.flac``); the class is the file name prefix before the
  first underscore (``bd``, ``drum``, ``elec``, ...), classes with fewer than
  ``min_class_files`` files are dropped; splits are seeded and by file.

Batches are dicts: ``{"features": (B, F, n_mels), "lengths": (B,), "label": (B,)}`` (log-mel
frames from :class:`~multimodal.tokenizers.audio.AudioFrameTokenizer`, its normalisation
fitted on the training split) or, with ``features=False``, ``{"waveform": (B, T), ...}``
(16 kHz mono, zero padded; ``lengths`` in samples).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import random
import re
import shutil
import subprocess
from collections import defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import soundfile as sf
import torch
import torchaudio
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from multimodal.data.splits import SplitDataModule
from multimodal.tokenizers.audio import AudioFeatureConfig, AudioFrameTokenizer, load_audio

__all__ = [
    "AUDIO_EXTENSIONS",
    "COMMANDS",
    "DIGITS",
    "SONIC_PI_DIR",
    "SPOKEN_WORDS",
    "AudioBatchCollate",
    "AudioClassificationDataModule",
    "AudioFolderDataset",
    "NoiseMixer",
    "SonicPiDataset",
    "SpokenWordsDataset",
    "Voice",
    "available_voices",
    "list_audio_files",
    "read_audio_folder",
    "read_manifest",
    "sonic_pi_files",
    "split_sonic_pi",
    "split_voices",
    "synthesize_spoken_words",
]

DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
COMMANDS = ("yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go")
SPOKEN_WORDS = DIGITS + COMMANDS
SAMPLE_RATE = 16000
SONIC_PI_DIR = Path("/usr/share/sonic-pi/samples")
DEFAULT_ROOT = Path("data/cache")
AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg")
MANIFEST_FIELDS = ("path", "word", "voice", "speed", "pitch")

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

DEFAULT_SPEEDS = (120, 150, 180, 210)
DEFAULT_PITCHES = (30, 45, 60, 75)

_HOW_TO_GET = (
    "Get it with `bash data/get_audio.sh` (installs the Debian packages espeak-ng, flite and "
    "sonic-pi-samples, then synthesises the spoken words with "
    "`python -m multimodal.data.audio`)."
)


# ----------------------------------------------------------------------------- synthesis
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


def available_voices() -> list[Voice]:
    """Voices this machine can speak with: :data:`ESPEAK_LANGUAGES` x :data:`ESPEAK_VARIANTS`
    for the languages ``espeak-ng --voices=en`` lists, and the :data:`FLITE_VOICES` that
    ``flite -lv`` lists. Empty when neither program is installed."""
    voices: list[Voice] = []
    if shutil.which("espeak-ng"):
        listed = {line.split()[1] for line in _run(["espeak-ng", "--voices=en"]).splitlines()[1:]
                  if len(line.split()) > 1}
        for lang in ESPEAK_LANGUAGES:
            if lang in listed:
                voices += [Voice("espeak", f"{lang}+{v}" if v else lang) for v in ESPEAK_VARIANTS]
    if shutil.which("flite"):
        listed = set(_run(["flite", "-lv"]).replace("Voices available:", "").split())
        voices += [Voice("flite", v) for v in FLITE_VOICES if v in listed]
    return voices


@dataclass(frozen=True)
class _Job:
    voice: Voice
    word: str
    speed: int
    pitch: int
    out: Path


def _command(job: _Job, wav: Path) -> list[str]:
    if job.voice.engine == "espeak":
        return ["espeak-ng", "-v", job.voice.name, "-s", str(job.speed), "-p", str(job.pitch),
                "-w", str(wav), job.word]  # fmt: skip
    base = FLITE_BASE_F0.get(job.voice.name, 110.0)
    f0 = base * 2 ** ((job.pitch - 50) / 100)
    stretch = ESPEAK_DEFAULT_SPEED / job.speed
    return ["flite", "-voice", job.voice.name, "-t", job.word, "-o", str(wav),
            "--setf", f"duration_stretch={stretch:.3f}",
            "--setf", f"int_f0_target_mean={f0:.1f}"]  # fmt: skip


def trim_silence(x: np.ndarray, sample_rate: int, threshold: float = 0.02,
                 margin_s: float = 0.03) -> np.ndarray:  # fmt: skip
    """Cut leading/trailing samples quieter than ``threshold * max|x|``, keeping
    ``margin_s`` seconds each side (espeak-ng appends ~0.45 s of silence)."""
    peak = float(np.abs(x).max()) if x.size else 0.0
    if peak == 0.0:
        return x
    loud = np.nonzero(np.abs(x) > threshold * peak)[0]
    margin = int(margin_s * sample_rate)
    return x[max(0, loud[0] - margin) : min(len(x), loud[-1] + 1 + margin)]


def _synthesize_one(job: _Job) -> str | None:
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


def _plan(
    root: Path,
    voices: Sequence[Voice],
    words: Sequence[str],
    speeds: Sequence[int],
    pitches: Sequence[int],
    takes_per_word: int,
    seed: int,
) -> list[_Job]:
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
                jobs.append(_Job(voice, word, speed, pitch, out))
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
        raise FileNotFoundError(f"neither espeak-ng nor flite is installed. {_HOW_TO_GET}")
    for engine, program in (("espeak", "espeak-ng"), ("flite", "flite")):
        if any(v.engine == engine for v in chosen) and not shutil.which(program):
            raise FileNotFoundError(f"{program} is not installed. {_HOW_TO_GET}")
    unknown = sorted(set(words) - set(SPOKEN_WORDS))
    if unknown:
        raise ValueError(f"words must come from SPOKEN_WORDS, got {unknown}")
    jobs = _plan(root, sorted(set(chosen)), words, speeds, pitches, takes_per_word, seed)
    todo = [j for j in jobs if not j.out.is_file()]
    for folder in {j.out.parent for j in todo}:
        folder.mkdir(parents=True, exist_ok=True)
    n_workers = min(_workers(workers), max(1, len(todo)))
    errors = _execute(todo, n_workers, progress)
    if errors:
        shown = "\n  ".join(errors[:5])
        raise RuntimeError(f"{len(errors)} of {len(todo)} clips failed, e.g.:\n  {shown}")
    tmp = manifest.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(MANIFEST_FIELDS)
        for j in jobs:
            rel = j.out.relative_to(root).as_posix()
            writer.writerow([rel, j.word, j.voice.id, j.speed, j.pitch])
    tmp.replace(manifest)
    return manifest


def _execute(jobs: list[_Job], workers: int, progress: bool) -> list[str]:
    from multimodal.progress import progress as progress_bar

    bar = progress_bar(total=len(jobs), desc="spoken words", unit="clip", disable=not progress)
    errors: list[str] = []
    with bar:
        if workers == 1:
            results: Iterable[str | None] = map(_synthesize_one, jobs)
            for err in results:
                errors += [err] if err else []
                bar.update()
        else:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                for err in pool.map(_synthesize_one, jobs, chunksize=16):
                    errors += [err] if err else []
                    bar.update()
    return errors


def read_manifest(root: str | os.PathLike) -> list[dict[str, str]]:
    """Rows of ``root/manifest.csv`` as dicts with :data:`MANIFEST_FIELDS`."""
    path = Path(root) / "manifest.csv"
    if not path.is_file():
        raise FileNotFoundError(f"spoken-words manifest not found: {path}. {_HOW_TO_GET}")
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if rows and set(MANIFEST_FIELDS) - set(rows[0]):
        raise ValueError(f"{path} must have columns {MANIFEST_FIELDS}, got {sorted(rows[0])}")
    return rows


# ----------------------------------------------------------------------------- splits
def _split_counts(n: int, val_fraction: float, test_fraction: float) -> tuple[int, int]:
    if n < 3:
        return 0, (1 if n == 2 else 0)
    n_test = max(1, round(test_fraction * n)) if test_fraction > 0 else 0
    n_val = max(1, round(val_fraction * n)) if val_fraction > 0 else 0
    while n_test + n_val >= n:  # keep at least one for training
        if n_val > 0:
            n_val -= 1
        else:
            n_test -= 1
    return n_val, n_test


def split_voices(
    voices: Iterable[str],
    val_fraction: float = 0.1,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> dict[str, list[str]]:
    """Split voice ids into disjoint ``train`` / ``val`` / ``test`` lists.

    Stratified by engine (``espeak`` / ``flite``, the part before ``:``) so each split hears
    both synthesisers: within an engine the sorted voices are shuffled with ``seed`` and the
    first ``round(test_fraction * n)`` (at least 1) go to test, the next ones to val.
    Deterministic: the same voices and seed give the same split.
    """
    if not (0 <= val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction < 1):
        raise ValueError(
            f"need 0 <= val_fraction, test_fraction and a sum < 1, got {val_fraction}, "
            f"{test_fraction}"
        )
    by_engine: dict[str, list[str]] = defaultdict(list)
    for v in sorted(set(voices)):
        by_engine[v.partition(":")[0]].append(v)
    out: dict[str, list[str]] = {"train": [], "val": [], "test": []}
    for engine in sorted(by_engine):
        group = by_engine[engine]
        random.Random(f"{seed}:{engine}").shuffle(group)
        n_val, n_test = _split_counts(len(group), val_fraction, test_fraction)
        out["test"] += group[:n_test]
        out["val"] += group[n_test : n_test + n_val]
        out["train"] += group[n_test + n_val :]
    return {k: sorted(v) for k, v in out.items()}


def sonic_pi_files(
    samples_dir: str | os.PathLike = SONIC_PI_DIR, min_class_files: int = 8
) -> dict[str, list[Path]]:
    """``{class: sorted files}`` of the ``*.flac`` in ``samples_dir``, class = file name prefix
    before the first underscore; classes with fewer than ``min_class_files`` files dropped."""
    folder = Path(samples_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"Sonic Pi samples not found in {folder}. {_HOW_TO_GET}")
    groups: dict[str, list[Path]] = defaultdict(list)
    for path in sorted(folder.glob("*.flac")):
        if "_" in path.stem:
            groups[path.stem.split("_", 1)[0]].append(path)
    kept = {c: files for c, files in sorted(groups.items()) if len(files) >= min_class_files}
    if not kept:
        raise FileNotFoundError(
            f"no class in {folder} has >= {min_class_files} '<class>_*.flac' files. {_HOW_TO_GET}"
        )
    return kept


def split_sonic_pi(
    files: dict[str, list[Path]], val_fraction: float = 0.1, test_fraction: float = 0.2,
    seed: int = 0,
) -> dict[str, list[tuple[Path, int]]]:  # fmt: skip
    """Seeded split by file, stratified by class: ``{split: [(path, label), ...]}``."""
    out: dict[str, list[tuple[Path, int]]] = {"train": [], "val": [], "test": []}
    for label, name in enumerate(sorted(files)):
        group = sorted(files[name])
        random.Random(f"{seed}:{name}").shuffle(group)
        n_val, n_test = _split_counts(len(group), val_fraction, test_fraction)
        out["test"] += [(p, label) for p in group[:n_test]]
        out["val"] += [(p, label) for p in group[n_test : n_test + n_val]]
        out["train"] += [(p, label) for p in group[n_test + n_val :]]
    return {k: sorted(v) for k, v in out.items()}


# ----------------------------------------------------------------------------- datasets
class _Resampler:
    """Mono 16 kHz from any rate, with torchaudio's kernels cached per input rate."""

    def __init__(self, target: int = SAMPLE_RATE) -> None:
        self.target = target
        self._cache: dict[int, torchaudio.transforms.Resample] = {}

    def __call__(self, waveform: Tensor, rate: int) -> Tensor:
        mono = waveform.mean(dim=0) if waveform.dim() == 2 else waveform
        if rate == self.target:
            return mono
        if rate not in self._cache:
            self._cache[rate] = torchaudio.transforms.Resample(rate, self.target)
        return self._cache[rate](mono)


def _pink_noise(n: int, generator: torch.Generator | None) -> Tensor:
    """Noise with power spectrum ~ 1/f: white noise shaped by 1/sqrt(f) in the rfft domain."""
    spectrum = torch.fft.rfft(torch.randn(n, generator=generator))
    f = torch.arange(spectrum.shape[0], dtype=torch.float32)
    spectrum = spectrum / f.clamp(min=1.0).sqrt()
    return torch.fft.irfft(spectrum, n=n)


class NoiseMixer:
    """Mix background noise at a random SNR: ``y = x + g n`` with
    ``g = sqrt(P_x / (P_n 10^(snr/10)))`` (``P`` = mean power), ``snr ~ U[snr_min, snr_max]``.

    ``kind``: ``"white"``, ``"pink"`` (1/f) or ``"ambient"`` (random crops of the Sonic Pi
    ``ambi_*`` and ``vinyl_*`` recordings, loaded once).
    """

    def __init__(
        self,
        kind: Literal["white", "pink", "ambient"] = "pink",
        snr_db: tuple[float, float] = (5.0, 20.0),
        samples_dir: str | os.PathLike = SONIC_PI_DIR,
    ) -> None:
        if kind not in ("white", "pink", "ambient"):
            raise ValueError(f"noise must be 'none', 'white', 'pink' or 'ambient', got {kind!r}")
        if snr_db[0] > snr_db[1]:
            raise ValueError(f"snr_db must be (low, high), got {snr_db}")
        self.kind, self.snr_db = kind, (float(snr_db[0]), float(snr_db[1]))
        self._beds: list[Tensor] = []
        if kind == "ambient":
            folder = Path(samples_dir)
            paths = sorted([*folder.glob("ambi_*.flac"), *folder.glob("vinyl_*.flac")])
            if not paths:
                raise FileNotFoundError(f"no ambi_*/vinyl_* samples in {folder}. {_HOW_TO_GET}")
            resample = _Resampler()
            self._beds = [resample(*load_audio(p)) for p in paths]

    def noise(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        if self.kind == "white":
            return torch.randn(n, generator=generator)
        if self.kind == "pink":
            return _pink_noise(n, generator)
        bed = self._beds[int(torch.randint(len(self._beds), (1,), generator=generator))]
        if bed.shape[0] < n:
            bed = bed.repeat(math.ceil(n / bed.shape[0]))
        start = int(torch.randint(bed.shape[0] - n + 1, (1,), generator=generator))
        return bed[start : start + n]

    def __call__(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        lo, hi = self.snr_db
        snr = lo + (hi - lo) * torch.rand((), generator=generator)
        n = self.noise(x.shape[-1], generator)
        p_x, p_n = x.pow(2).mean(), n.pow(2).mean().clamp(min=1e-12)
        if p_x == 0:
            return x
        return x + n * torch.sqrt(p_x / (p_n * 10 ** (snr / 10)))


def _centre_crop(x: Tensor, n: int) -> Tensor:
    if x.shape[0] <= n:
        return x
    start = (x.shape[0] - n) // 2
    return x[start : start + n]


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
        noise: NoiseMixer | None = None,
        noise_seed: int | None = None,
    ) -> None:
        self.root, self.rows = Path(root), list(rows)
        self.labels = [SPOKEN_WORDS.index(r["word"]) for r in self.rows]
        self.max_samples, self.noise, self.noise_seed = max_samples, noise, noise_seed
        self._resample = _Resampler()

    def __len__(self) -> int:
        return len(self.rows)

    def waveform(self, i: int) -> Tensor:
        """The clean 16 kHz mono clip of item ``i``."""
        x = self._resample(*load_audio(self.root / self.rows[i]["path"]))
        return x if self.max_samples is None else _centre_crop(x, self.max_samples)

    def __getitem__(self, i: int) -> dict[str, Any]:
        x = self.waveform(i)
        if self.noise is not None:
            gen = None
            if self.noise_seed is not None:
                gen = torch.Generator().manual_seed(self.noise_seed * 1_000_003 + i)
            x = self.noise(x, gen)
        return {"waveform": x, "label": self.labels[i]}


class SonicPiDataset(Dataset):
    """Sonic Pi clips held in memory (16 kHz mono) -> fixed-length crops.

    ``train=True``: a random crop of ``clip_samples`` (global torch RNG); else the centre
    crop. Shorter clips are zero padded at the end to ``clip_samples``.
    """

    def __init__(
        self,
        items: Sequence[tuple[Path, int]],
        clip_samples: int,
        train: bool,
        noise: NoiseMixer | None = None,
        noise_seed: int | None = None,
    ) -> None:
        resample = _Resampler()
        self.paths = [p for p, _ in items]
        self.labels = [label for _, label in items]
        self.clips = [resample(*load_audio(p)) for p in self.paths]
        self.clip_samples, self.train = clip_samples, train
        self.noise, self.noise_seed = noise, noise_seed

    def __len__(self) -> int:
        return len(self.clips)

    def __getitem__(self, i: int) -> dict[str, Any]:
        x, n = self.clips[i], self.clip_samples
        if x.shape[0] > n:
            if self.train:
                start = int(torch.randint(x.shape[0] - n + 1, (1,)))
                x = x[start : start + n]
            else:
                x = _centre_crop(x, n)
        elif x.shape[0] < n:
            x = torch.nn.functional.pad(x, (0, n - x.shape[0]))
        if self.noise is not None:
            gen = None
            if self.noise_seed is not None:
                gen = torch.Generator().manual_seed(self.noise_seed * 1_000_003 + i)
            x = self.noise(x, gen)
        return {"waveform": x, "label": self.labels[i]}


def list_audio_files(folder: str | os.PathLike) -> list[Path]:
    """The WAV / FLAC / OGG files directly in ``folder``, sorted by name."""
    path = Path(folder)
    if not path.is_dir():
        raise FileNotFoundError(f"audio folder not found: {path}")
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in AUDIO_EXTENSIONS)
    if not files:
        raise FileNotFoundError(f"no {'/'.join(AUDIO_EXTENSIONS)} files in {path}")
    return files


class AudioFolderDataset(Dataset):
    """A folder of audio files for ``predict``: ``{"waveform": (T,) 16 kHz, "filename": str}``
    in sorted file-name order; clips longer than ``max_samples`` are centre-cropped."""

    def __init__(self, folder: str | os.PathLike, max_samples: int | None = None) -> None:
        self.files = list_audio_files(folder)
        self.max_samples = max_samples
        self._resample = _Resampler()

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> dict[str, Any]:
        x = self._resample(*load_audio(self.files[i]))
        if self.max_samples is not None:
            x = _centre_crop(x, self.max_samples)
        return {"waveform": x, "filename": self.files[i].name}


def read_audio_folder(
    folder: str | os.PathLike, tokenizer: AudioFrameTokenizer
) -> list[tuple[Tensor, str]]:
    """``[(features (F, n_mels), file name), ...]`` for the audio files of ``folder``, sorted."""
    out = []
    for item in AudioFolderDataset(folder):
        feats, lengths = tokenizer(item["waveform"], SAMPLE_RATE)
        out.append((feats[0, : int(lengths[0])], item["filename"]))
    return out


class AudioBatchCollate:
    """Pad a list of ``{"waveform": (T_i,), ...}`` items into a batch dict.

    With a tokenizer: ``{"features": (B, F, n_mels), "lengths": frames, ...}``; without:
    ``{"waveform": (B, T), "lengths": samples, ...}``. ``label`` becomes a LongTensor,
    ``filename`` a list.
    """

    def __init__(self, tokenizer: AudioFrameTokenizer | None = None) -> None:
        self.tokenizer = tokenizer

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        waves = [it["waveform"] for it in items]
        batch: dict[str, Any] = {}
        if self.tokenizer is not None:
            with torch.no_grad():
                batch["features"], batch["lengths"] = self.tokenizer(waves, SAMPLE_RATE)
        else:
            lengths = torch.tensor([w.shape[0] for w in waves], dtype=torch.long)
            padded = torch.zeros(len(waves), int(lengths.max()))
            for i, w in enumerate(waves):
                padded[i, : w.shape[0]] = w
            batch["waveform"], batch["lengths"] = padded, lengths
        if "label" in items[0]:
            batch["label"] = torch.tensor([it["label"] for it in items], dtype=torch.long)
        if "filename" in items[0]:
            batch["filename"] = [it["filename"] for it in items]
        return batch


# ----------------------------------------------------------------------------- datamodule
class AudioClassificationDataModule(SplitDataModule):
    """Spoken words (20 classes, split by voice) or Sonic Pi samples (split by file).

    Args:
        dataset: ``"spoken_words"`` or ``"sonic_pi"``.
        root: cache folder; spoken words live in ``root/spoken_words``.
        samples_dir: the Sonic Pi samples folder.
        batch_size: clips per batch.
        num_workers: DataLoader worker processes.
        clip_seconds: Sonic Pi crop length (random at train, centre at eval); spoken words
            longer than this are centre-cropped (they are ~0.3-1 s after trimming).
        noise: background noise mixed into training clips: ``"none"``, ``"white"``,
            ``"pink"`` or ``"ambient"`` (Sonic Pi ``ambi_``/``vinyl_`` recordings; spoken
            words only, as those are classes of ``sonic_pi``).
        snr_db_min, snr_db_max: range of the random SNR in dB.
        noise_eval: also mix (seeded, fixed) noise into val/test clips.
        features: batches of log-mel ``features`` (True) or raw ``waveform`` (False).
        n_mels: mel bins of the features.
        val_fraction, test_fraction: share of voices (spoken words) / files (Sonic Pi).
        seed: seed of the splits and of the stats subset.
        min_class_files: Sonic Pi classes with fewer files are dropped.
        stats_clips: number of training clips the normalisation is fitted on.
        synthesize: in ``prepare_data``, synthesise the spoken words if missing.
        limit_train: keep only this many training clips (quick runs).
        predict_dir: folder of audio files for ``predict``.
    """

    def __init__(
        self,
        dataset: Literal["spoken_words", "sonic_pi"] = "spoken_words",
        root: str = str(DEFAULT_ROOT),
        samples_dir: str = str(SONIC_PI_DIR),
        batch_size: int = 64,
        num_workers: int = 0,
        clip_seconds: float = 1.0,
        noise: Literal["none", "white", "pink", "ambient"] = "none",
        snr_db_min: float = 5.0,
        snr_db_max: float = 20.0,
        noise_eval: bool = False,
        features: bool = True,
        n_mels: int = 80,
        val_fraction: float = 0.1,
        test_fraction: float = 0.2,
        seed: int = 0,
        min_class_files: int = 8,
        stats_clips: int = 512,
        synthesize: bool = True,
        limit_train: int | None = None,
        predict_dir: str | None = None,
    ) -> None:
        super().__init__()
        if dataset not in ("spoken_words", "sonic_pi"):
            raise ValueError(f"dataset must be 'spoken_words' or 'sonic_pi', got {dataset!r}")
        if noise not in ("none", "white", "pink", "ambient"):
            raise ValueError(f"noise must be 'none', 'white', 'pink' or 'ambient', got {noise!r}")
        if dataset == "sonic_pi" and noise == "ambient":
            raise ValueError(
                "noise='ambient' mixes Sonic Pi ambi_/vinyl_ recordings, which are classes of "
                "the sonic_pi dataset itself; use noise='white' or 'pink' there"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if clip_seconds * SAMPLE_RATE < 400:
            raise ValueError(f"clip_seconds must be >= 0.025 (one window), got {clip_seconds}")
        if stats_clips < 1:
            raise ValueError(f"stats_clips must be >= 1, got {stats_clips}")
        self.save_hyperparameters()
        self.dataset, self.root, self.samples_dir = dataset, Path(root), Path(samples_dir)
        self.batch_size, self.num_workers = batch_size, num_workers
        self.clip_samples = round(clip_seconds * SAMPLE_RATE)
        self.noise_kind, self.snr_db, self.noise_eval = noise, (snr_db_min, snr_db_max), noise_eval
        self.features, self.seed, self.stats_clips = features, seed, stats_clips
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.min_class_files, self.synthesize = min_class_files, synthesize
        self.limit_train, self.predict_dir = limit_train, predict_dir
        self.tokenizer = AudioFrameTokenizer(AudioFeatureConfig(n_mels=n_mels))
        self._class_names: list[str] | None = None
        self._datasets: dict[str, Dataset] = {}
        self.split_voices: dict[str, list[str]] = {}
        self.split_files: dict[str, list[Path]] = {}

    @property
    def words_root(self) -> Path:
        return self.root / "spoken_words"

    @property
    def class_names(self) -> list[str]:
        if self._class_names is None:
            if self.dataset == "spoken_words":
                self._class_names = list(SPOKEN_WORDS)
            else:
                self._class_names = sorted(sonic_pi_files(self.samples_dir, self.min_class_files))
        return self._class_names

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def sample_rate(self) -> int:
        return SAMPLE_RATE

    def prepare_data(self) -> None:
        if self.dataset == "spoken_words" and self.synthesize:
            if not (self.words_root / "manifest.csv").is_file() and not available_voices():
                raise FileNotFoundError(
                    f"spoken words not found in {self.words_root} and neither espeak-ng nor "
                    f"flite is installed to make them. {_HOW_TO_GET}"
                )
            synthesize_spoken_words(self.words_root, seed=self.seed)

    def _noise(self) -> NoiseMixer | None:
        if self.noise_kind == "none":
            return None
        return NoiseMixer(self.noise_kind, self.snr_db, self.samples_dir)  # type: ignore[arg-type]

    def _build(self) -> None:
        noise = self._noise()
        eval_noise = noise if self.noise_eval else None
        if self.dataset == "spoken_words":
            rows = read_manifest(self.words_root)
            self.split_voices = split_voices(
                (r["voice"] for r in rows), self.val_fraction, self.test_fraction, self.seed
            )
            by_split = {
                s: [r for r in rows if r["voice"] in set(v)] for s, v in self.split_voices.items()
            }
            if self.limit_train is not None:
                by_split["train"] = by_split["train"][: self.limit_train]
            root, n = self.words_root, self.clip_samples
            self._datasets = {
                "train": SpokenWordsDataset(root, by_split["train"], n, noise),
                "val": SpokenWordsDataset(root, by_split["val"], n, eval_noise, self.seed),
                "test": SpokenWordsDataset(root, by_split["test"], n, eval_noise, self.seed),
            }
        else:
            splits = split_sonic_pi(
                sonic_pi_files(self.samples_dir, self.min_class_files),
                self.val_fraction, self.test_fraction, self.seed,
            )  # fmt: skip
            if self.limit_train is not None:
                splits["train"] = splits["train"][: self.limit_train]
            self.split_files = {s: [p for p, _ in items] for s, items in splits.items()}
            n = self.clip_samples
            self._datasets = {
                "train": SonicPiDataset(splits["train"], n, True, noise),
                "val": SonicPiDataset(splits["val"], n, False, eval_noise, self.seed),
                "test": SonicPiDataset(splits["test"], n, False, eval_noise, self.seed),
            }

    def _fit_stats(self) -> None:
        train = self._datasets["train"]
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(self.seed))
        chosen = order[: self.stats_clips].tolist()
        if isinstance(train, SpokenWordsDataset):
            clips: Iterable[Tensor] = (train.waveform(i) for i in chosen)
        elif isinstance(train, SonicPiDataset):
            clips = (_centre_crop(train.clips[i], self.clip_samples) for i in chosen)
        else:
            raise TypeError(f"unexpected training dataset {type(train).__name__}")
        self.tokenizer.fit_stats(c for c in clips if c.shape[0] >= 400)

    def setup(self, stage: str | None = None) -> None:
        if not self._datasets:
            self._build()
            if len(self._datasets["train"]) == 0:  # type: ignore[arg-type]
                raise ValueError(f"the {self.dataset} training split is empty")
            if not self.tokenizer.is_fitted:  # stats restored from a checkpoint are kept
                self._fit_stats()

    def split_dataset(self, split: str) -> Dataset:
        self.setup()
        return self._datasets[split]

    def collate_fn(self) -> AudioBatchCollate:
        return AudioBatchCollate(self.tokenizer if self.features else None)

    def predict_dataloader(self) -> DataLoader:
        if self.predict_dir is None:
            raise ValueError("set predict_dir to a folder of audio files to predict on")
        if self.features and not self.tokenizer.is_fitted:
            self.setup("predict")
        return self.loader(AudioFolderDataset(self.predict_dir), shuffle=False)

    def state_dict(self) -> dict[str, Any]:
        return {"tokenizer": self.tokenizer.to_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "tokenizer" in state_dict:
            self.tokenizer = AudioFrameTokenizer.from_dict(state_dict["tokenizer"])


def _main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m multimodal.data.audio",
        description="Synthesise the spoken-words dataset (cached) and check the Sonic Pi samples.",
    )
    parser.add_argument("--root", default=str(DEFAULT_ROOT / "spoken_words"))
    parser.add_argument("--takes-per-word", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--samples-dir", default=str(SONIC_PI_DIR))
    args = parser.parse_args(argv)
    manifest = synthesize_spoken_words(
        args.root, takes_per_word=args.takes_per_word, seed=args.seed, workers=args.workers
    )
    rows = read_manifest(args.root)
    voices = {r["voice"] for r in rows}
    print(f"spoken words: {len(rows)} clips, {len(voices)} voices, "
          f"{len({r['word'] for r in rows})} words -> {manifest}")  # fmt: skip
    try:
        files = sonic_pi_files(args.samples_dir)
        summary = ", ".join(f"{c} {len(f)}" for c, f in files.items())
        total = sum(map(len, files.values()))
        print(f"sonic pi: {total} files in {len(files)} classes ({summary})")
    except FileNotFoundError as err:
        print(f"sonic pi: {err}")


if __name__ == "__main__":
    _main()

