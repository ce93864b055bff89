"""Sonic Pi samples: the real recorded clips of the Debian package ``sonic-pi-samples``
(``/usr/share/sonic-pi/samples/*.flac``), as a sound-classification source.

The class is the file name prefix before the first underscore (``bd``, ``drum``, ``elec``,
...); classes with fewer than ``min_class_files`` files are dropped; splits are seeded and by
file, stratified by class.
"""

from __future__ import annotations

import os
import random
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from multimodal.data.audio_transforms import (
    Augment,
    Resampler,
    augment_item,
    centre_crop,
)
from multimodal.data.sources import GET_AUDIO
from multimodal.data.splits import split_counts
from multimodal.tokenizers.audio import load_audio

__all__ = ["SONIC_PI_DIR", "SonicPiDataset", "sonic_pi_files", "split_sonic_pi"]

SONIC_PI_DIR = Path("/usr/share/sonic-pi/samples")


def sonic_pi_files(
    samples_dir: str | os.PathLike = SONIC_PI_DIR, min_class_files: int = 8
) -> dict[str, list[Path]]:
    """``{class: sorted files}`` of the ``*.flac`` in ``samples_dir``, class = file name prefix
    before the first underscore; classes with fewer than ``min_class_files`` files dropped."""
    folder = Path(samples_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"Sonic Pi samples not found in {folder}. {GET_AUDIO}")
    groups: dict[str, list[Path]] = defaultdict(list)
    for path in sorted(folder.glob("*.flac")):
        if "_" in path.stem:
            groups[path.stem.split("_", 1)[0]].append(path)
    kept = {c: files for c, files in sorted(groups.items()) if len(files) >= min_class_files}
    if not kept:
        raise FileNotFoundError(
            f"no class in {folder} has >= {min_class_files} '<class>_*.flac' files. {GET_AUDIO}"
        )
    return kept


def split_sonic_pi(
    files: dict[str, list[Path]], val_size: float = 0.1, test_size: float = 0.2,
    seed: int = 0,
) -> dict[str, list[tuple[Path, int]]]:  # fmt: skip
    """Seeded split by file, stratified by class: ``{split: [(path, label), ...]}``."""
    out: dict[str, list[tuple[Path, int]]] = {"train": [], "val": [], "test": []}
    for label, name in enumerate(sorted(files)):
        group = sorted(files[name])
        random.Random(f"{seed}:{name}").shuffle(group)
        n_val, n_test = split_counts(len(group), val_size, test_size)
        out["test"] += [(p, label) for p in group[:n_test]]
        out["val"] += [(p, label) for p in group[n_test : n_test + n_val]]
        out["train"] += [(p, label) for p in group[n_test + n_val :]]
    return {k: sorted(v) for k, v in out.items()}



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
        noise: Augment | None = None,
        noise_seed: int | None = None,
    ) -> None:
        resample = Resampler()
        self.paths = [p for p, _ in items]
        self.labels = [label for _, label in items]
        self.clips = [resample(*load_audio(p)) for p in self.paths]
        self.clip_samples, self.train = clip_samples, train
        self.noise, self.noise_seed = noise, noise_seed

    def __len__(self) -> int:
        return len(self.clips)

    def waveform(self, i: int) -> Tensor:
        """The clean (noise-free) centre crop of item ``i``: what feature statistics see."""
        return centre_crop(self.clips[i], self.clip_samples)

    def __getitem__(self, i: int) -> dict[str, Any]:
        x, n = self.clips[i], self.clip_samples
        if x.shape[0] > n:
            if self.train:
                start = int(torch.randint(x.shape[0] - n + 1, (1,)))
                x = x[start : start + n]
            else:
                x = centre_crop(x, n)
        elif x.shape[0] < n:
            x = torch.nn.functional.pad(x, (0, n - x.shape[0]))
        x = augment_item(x, self.noise, self.noise_seed, i)
        return {"waveform": x, "label": self.labels[i]}
