"""Audio items and batches for any source: a folder of clips for ``predict`` and the collate
that pads waveforms (or turns them into log-mel features) into one batch dict."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from multimodal.data.audio_transforms import SAMPLE_RATE, Resampler, centre_crop
from multimodal.files import AUDIO_EXTENSIONS  # WAV, FLAC, OGG, MP3
from multimodal.tokenizers.audio import AudioFrameTokenizer, load_audio

log = logging.getLogger(__name__)

__all__ = ["AudioBatchCollate", "AudioFolderDataset", "list_audio_files"]



def list_audio_files(folder: str | os.PathLike) -> list[Path]:
    """The WAV / FLAC / OGG / MP3 files directly in ``folder``, sorted by name."""
    path = Path(folder)
    if not path.is_dir():
        raise FileNotFoundError(f"audio folder not found: {path}")
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in AUDIO_EXTENSIONS)
    if not files:
        raise FileNotFoundError(f"no {'/'.join(AUDIO_EXTENSIONS)} files in {path}")
    return files


class AudioFolderDataset(Dataset):
    """A folder of audio files for ``predict``: ``{"waveform": (T,) 16 kHz, "filename": str}``
    in sorted file-name order; clips longer than ``max_samples`` are centre-cropped. A file
    that cannot be read raises an error naming it, or with ``skip_corrupt`` is left out
    (each file is read once here to find out) and listed in ``skipped`` and a warning."""

    def __init__(self, folder: str | os.PathLike, max_samples: int | None = None,
                 skip_corrupt: bool = False) -> None:
        self.files = list_audio_files(folder)
        self.max_samples = max_samples
        self._resample = Resampler()
        self.skipped: list[str] = []
        if skip_corrupt:
            kept = []
            for file in self.files:
                try:
                    load_audio(file)
                    kept.append(file)
                except (ValueError, OSError, RuntimeError):
                    self.skipped.append(file.name)
            if self.skipped:
                log.warning("skipped %d unreadable file(s) of %s: %s", len(self.skipped),
                            folder, ", ".join(self.skipped))
            if not kept:
                raise ValueError(f"no readable audio files in {folder}")
            self.files = kept

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> dict[str, Any]:
        x = self._resample(*load_audio(self.files[i]))
        if self.max_samples is not None:
            x = centre_crop(x, self.max_samples)
        return {"waveform": x, "filename": self.files[i].name}


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

