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

import io
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from multimodal.data.audio_transforms import SAMPLE_RATE, Augment, Resampler, augment_item
from multimodal.data.readers import (
    CorruptFileError,
    FileList,
    find_classes,
    is_manifest,
    read_labelled_manifest,
    scan_class_folders,
)
from multimodal.files import AUDIO_EXTENSIONS
from multimodal.tokenizers.audio import load_audio

__all__ = [
    "MIN_SAMPLES",
    "AudioFileDataset",
    "AudioShardDecoder",
    "AudioShardEncoder",
    "SkippingAudioCollate",
    "audio_class_names",
    "check_audio_files",
    "decode_audio_bytes",
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
        return _long_enough(x, path)

    def __getitem__(self, i: int) -> dict[str, Any] | None:
        try:
            x = self.waveform(i)
        except CorruptFileError:
            if self.skip_corrupt:
                return None
            raise
        x = crop_and_augment(x, i, self.max_samples, self.random_crop, self.noise,
                             self.noise_seed)
        return {"waveform": x, "label": int(self.files.labels[i])}  # type: ignore[index]


def _long_enough(x: Tensor, name: str) -> Tensor:
    if x.shape[0] < MIN_SAMPLES:
        raise CorruptFileError(
            f"{name} has {x.shape[0]} samples at 16 kHz, less than one 25 ms window"
        )
    return x


def crop_and_augment(
    x: Tensor, index: int, max_samples: int | None, random_crop: bool,
    noise: Augment | None, noise_seed: int | None,
) -> Tensor:
    """A clip longer than ``max_samples`` cropped to it (at random with the global torch RNG
    when ``random_crop``, else the centre), then ``noise`` mixed in (seeded per ``index``
    when ``noise_seed`` is given)."""
    n = max_samples
    if n is not None and x.shape[0] > n:
        start = (int(torch.randint(x.shape[0] - n + 1, (1,))) if random_crop
                 else (x.shape[0] - n) // 2)  # fmt: skip
        x = x[start : start + n]
    return augment_item(x, noise, noise_seed, index)


def decode_audio_bytes(data: bytes, name: str, resample: Resampler | None = None) -> Tensor:
    """An encoded audio file's bytes (WAV, FLAC, OGG, MP3 as ``soundfile`` reads them) ->
    16 kHz mono float32; :class:`CorruptFileError` naming ``name`` when unreadable or
    shorter than one 25 ms window."""
    import soundfile as sf

    try:
        samples, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, TypeError) as err:
        raise CorruptFileError(f"{name} is not readable audio: {err}") from err
    x = (resample or Resampler())(torch.from_numpy(samples.T.copy()), int(rate))
    return _long_enough(x, name)


class AudioShardEncoder:
    """``multimodal-prepare audio``: item ``i`` of a split is the file's own bytes (still
    encoded: WAV / FLAC / OGG / MP3), its label and its row ``index`` in the split."""

    def __init__(self, files: FileList) -> None:
        self.paths, self.labels = files.paths, files.labels

    def __len__(self) -> int:
        return len(self.paths)

    def __call__(self, i: int) -> dict[str, Any]:
        with open(str(self.paths[i]), "rb") as f:
            data = f.read()
        return {"audio": data, "label": int(self.labels[i]), "index": i}  # type: ignore[index]


class AudioShardDecoder:
    """``StreamingDataset`` transform: a shard item -> ``{"waveform", "label"}`` exactly as
    :class:`AudioFileDataset` makes it from the file (None for an unreadable clip with
    ``skip_corrupt``)."""

    def __init__(
        self, max_samples: int | None = None, random_crop: bool = False,
        noise: Augment | None = None, noise_seed: int | None = None,
        skip_corrupt: bool = False,
    ) -> None:
        self.max_samples, self.random_crop = max_samples, random_crop
        self.noise, self.noise_seed, self.skip_corrupt = noise, noise_seed, skip_corrupt
        self._resample = Resampler()

    def waveform(self, item: dict[str, Any]) -> Tensor:
        """The whole clip of ``item``, 16 kHz mono."""
        return decode_audio_bytes(item["audio"], f"shard item {item['index']}", self._resample)

    def __call__(self, item: dict[str, Any]) -> dict[str, Any] | None:
        try:
            x = self.waveform(item)
        except CorruptFileError:
            if self.skip_corrupt:
                return None
            raise
        x = crop_and_augment(x, int(item["index"]), self.max_samples, self.random_crop,
                             self.noise, self.noise_seed)
        return {"waveform": x, "label": int(item["label"])}


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
