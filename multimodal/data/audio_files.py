"""Your own audio files for classification: a class-per-subfolder folder or a ``path,label``
manifest, read into a :class:`~multimodal.data.readers.FileList` (paths + int64 labels).

Formats: whatever the installed ``soundfile`` (libsndfile) reads among WAV, FLAC, OGG and
MP3 (MP3 needs libsndfile >= 1.1). Any sample rate and channel count: clips are down-mixed
to mono and resampled to 16 kHz (:class:`~multimodal.data.audio_transforms.Resampler`), as
the built-in sources are; clips of mixed length are padded in the batch and their lengths
kept (:class:`~multimodal.data.audio_datasets.AudioBatchCollate`).

Bad files are found up front by reading each header (:func:`check_audio_files`): an
unreadable file or one shorter than one 25 ms analysis window (zero-length included) is an
error naming it, or, with ``skip_corrupt``, dropped and counted. A file whose header reads
but whose samples do not is found when read: the same error, or ``None`` (skipped, counted
per epoch by the data module).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from multimodal.data.audio_transforms import SAMPLE_RATE, Augment, Resampler, augment_item
from multimodal.data.readers import (
    AUDIO_EXTENSIONS,
    CorruptFileError,
    FileList,
    find_classes,
    is_manifest,
    read_labelled_manifest,
    scan_class_folders,
)
from multimodal.tokenizers.audio import load_audio

__all__ = [
    "MIN_SAMPLES",
    "AudioFileDataset",
    "SkippingAudioCollate",
    "audio_class_names",
    "check_audio_files",
    "read_audio_files",
]

# One 25 ms analysis window at 16 kHz: the shortest clip the log-mel tokenizer accepts.
MIN_SAMPLES = 400


def audio_class_names(source: str | os.PathLike) -> tuple[str, ...]:
    """Classes of an audio folder (sorted subfolder names, as ``ImageFolder``) or manifest
    (sorted distinct labels)."""
    if is_manifest(source):
        return read_labelled_manifest(source, check_files=False).class_names
    return find_classes(source)


def read_audio_files(source: str | os.PathLike, classes: Sequence[str] | None = None) -> FileList:
    """The labelled audio files of a class-per-subfolder folder or a ``path,label``
    manifest (CSV with a header, or JSONL; paths relative to the manifest).

    Errors: an empty class folder names it; missing manifest files name the first and how
    many; a label or folder not in ``classes`` names it.
    """
    if is_manifest(source):
        return read_labelled_manifest(source, classes)
    return scan_class_folders(source, AUDIO_EXTENSIONS, classes)


def _header_problem(path: str) -> str | None:
    """Why ``path`` cannot be a clip (from its header alone), or None."""
    import soundfile as sf

    try:
        info = sf.info(path)
    except (sf.LibsndfileError, RuntimeError, TypeError) as err:
        return f"is not a readable audio file (WAV, FLAC, OGG or MP3): {err}"
    if info.frames <= 0:
        return "is zero-length audio (no samples)"
    if info.frames * SAMPLE_RATE < MIN_SAMPLES * info.samplerate:
        return (f"is too short: {info.frames} samples at {info.samplerate} Hz, less than one "
                f"25 ms window")
    return None


def check_audio_files(files: FileList, skip_corrupt: bool = False) -> tuple[FileList, int]:
    """Read every file's header; returns ``(usable files, number skipped)``.

    Without ``skip_corrupt`` the first bad file raises :class:`CorruptFileError` naming it
    and saying how many of the files are bad.
    """
    bad = [(i, why) for i, p in enumerate(files.paths.tolist())
           if (why := _header_problem(p)) is not None]  # fmt: skip
    if not bad:
        return files, 0
    if not skip_corrupt:
        i, why = bad[0]
        raise CorruptFileError(
            f"{files.paths[i]} {why} ({len(bad)} of {len(files)} files are unusable; "
            f"set skip_corrupt: true to skip them)"
        )
    keep = torch.ones(len(files), dtype=torch.bool)
    keep[[i for i, _ in bad]] = False
    return files.subset(keep.nonzero().squeeze(1)), len(bad)


class AudioFileDataset(Dataset):
    """Labelled audio files -> ``{"waveform": (T,) 16 kHz mono, "label": int}``.

    Clips longer than ``max_samples`` are cropped to it: at random (global torch RNG) when
    ``random_crop`` (training), else the centre; shorter ones keep their length (the batch
    pads them). ``noise`` mixes background noise as in the built-in sources; with
    ``noise_seed`` item ``i`` always gets the same noise. A file that cannot be decoded
    raises :class:`CorruptFileError` naming it, or yields ``None`` with ``skip_corrupt``.
    """

    def __init__(
        self,
        files: FileList,
        max_samples: int | None = None,
        random_crop: bool = False,
        noise: Augment | None = None,
        noise_seed: int | None = None,
        skip_corrupt: bool = False,
    ) -> None:
        if files.labels is None:
            raise ValueError("AudioFileDataset needs labelled files")
        self.files, self.max_samples, self.random_crop = files, max_samples, random_crop
        self.noise, self.noise_seed, self.skip_corrupt = noise, noise_seed, skip_corrupt
        self._resample = Resampler()

    def __len__(self) -> int:
        return len(self.files)

    def waveform(self, i: int) -> Tensor:
        """The whole clip ``i``, 16 kHz mono; raises :class:`CorruptFileError` naming it."""
        path = str(self.files.paths[i])
        try:
            x = self._resample(*load_audio(path))
        except ValueError as err:
            raise CorruptFileError(str(err)) from err
        if x.shape[0] < MIN_SAMPLES:
            raise CorruptFileError(
                f"{path} has {x.shape[0]} samples at 16 kHz, less than one 25 ms window"
            )
        return x

    def __getitem__(self, i: int) -> dict[str, Any] | None:
        try:
            x = self.waveform(i)
        except CorruptFileError:
            if self.skip_corrupt:
                return None
            raise
        n = self.max_samples
        if n is not None and x.shape[0] > n:
            start = (int(torch.randint(x.shape[0] - n + 1, (1,))) if self.random_crop
                     else (x.shape[0] - n) // 2)  # fmt: skip
            x = x[start : start + n]
        x = augment_item(x, self.noise, self.noise_seed, i)
        return {"waveform": x, "label": int(self.files.labels[i])}  # type: ignore[index]


class SkippingAudioCollate:
    """Wrap an audio collate: ``None`` items (skipped files) are dropped and their count put
    in the batch as ``"skipped"`` (the data module removes it before the model sees it)."""

    def __init__(self, collate: Callable[[list[dict[str, Any]]], dict[str, Any]]) -> None:
        self.collate = collate

    def __call__(self, items: list[dict[str, Any] | None]) -> dict[str, Any]:
        kept = [it for it in items if it is not None]
        if not kept:
            raise CorruptFileError(f"every file of a batch of {len(items)} was unreadable")
        batch = self.collate(kept)
        batch["skipped"] = torch.tensor(len(items) - len(kept))
        return batch
