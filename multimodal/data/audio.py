"""Audio classification data: one LightningDataModule over the built-in sound sources.

Sources (offline; see ``data/README.md`` and ``bash data/get_audio.sh``): spoken words
synthesised with espeak-ng and flite (:mod:`multimodal.data.sources.spoken_words`, split by
voice) and the Sonic Pi samples (:mod:`multimodal.data.sources.sonic_pi`, split by file).
Clips are transformed by :mod:`multimodal.data.audio_transforms` and
:mod:`multimodal.data.noise`, batched by :mod:`multimodal.data.audio_datasets`.

Batches are dicts: ``{"features": (B, F, n_mels), "lengths": (B,), "label": (B,)}`` (log-mel
frames from :class:`~multimodal.tokenizers.audio.AudioFrameTokenizer`, its normalisation
fitted on the training split) or, with ``features=False``, ``{"waveform": (B, T), ...}``
(16 kHz mono, zero padded; ``lengths`` in samples).

``python -m multimodal.cli.datasets spoken-words`` synthesises the spoken words (cached) and
checks the Sonic Pi samples (:func:`multimodal.data.sources.spoken_words.make_spoken_words`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from multimodal.data.audio_datasets import (
    AudioBatchCollate,
    AudioFolderDataset,
)
from multimodal.data.audio_transforms import SAMPLE_RATE, centre_crop
from multimodal.data.device_batches import ResidentSplit, resident_setting
from multimodal.data.noise import NoiseMixer
from multimodal.data.readers import FileList
from multimodal.data.readers.audio import (
    AudioFileDataset,
    AudioShardDecoder,
    SkippingAudioCollate,
    audio_class_names,
    check_audio_files,
    read_audio_files,
)
from multimodal.data.shards import ShardLoaderMixin, read_shard_meta, shard_dataset
from multimodal.data.sources import GET_AUDIO
from multimodal.data.sources.sonic_pi import (
    SONIC_PI_DIR,
    SonicPiDataset,
    sonic_pi_files,
    split_sonic_pi,
)
from multimodal.data.sources.speech import (
    available_voices,
)
from multimodal.data.sources.spoken_words import (
    DEFAULT_ROOT,
    SPOKEN_WORDS,
    SpokenWordsDataset,
    read_manifest,
    split_voices,
    synthesize_spoken_words,
)
from multimodal.data.splits import (
    SplitDataModule,
    check_min_per_class,
    held_out,
    held_out_sizes,
    predict_source,
)
from multimodal.tokenizers.audio import AudioFeatureConfig, AudioFrameTokenizer

__all__ = ["AudioClassificationDataModule"]

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- datamodule
class AudioClassificationDataModule(ShardLoaderMixin, SplitDataModule):
    """Spoken words (20 classes, split by voice), Sonic Pi samples (split by file), your
    own recordings (``train``: a class-per-subfolder folder or a ``path,label`` manifest of
    WAV / FLAC / OGG / MP3 files at any sample rate and channel count; see
    :mod:`multimodal.data.readers.audio`), or LitData shards of them (``shards``).

    Args:
        dataset: ``"spoken_words"`` or ``"sonic_pi"``.
        root: cache folder; spoken words live in ``root/spoken_words``.
        samples_dir: the Sonic Pi samples folder.
        batch_size: clips per batch.
        num_workers: DataLoader worker processes.
        clip_seconds: Sonic Pi and your files' crop length (random at train, centre at
            eval; your shorter clips keep their length, padded in the batch); spoken words
            longer than this are centre-cropped (they are ~0.3-1 s after trimming).
        noise: background noise mixed into training clips: ``"none"``, ``"white"``,
            ``"pink"`` or ``"ambient"`` (Sonic Pi ``ambi_``/``vinyl_`` recordings; not with
            ``sonic_pi``, whose classes they are).
        snr_db_min, snr_db_max: range of the random SNR in dB.
        noise_eval: also mix (seeded, fixed) noise into val/test clips.
        features: batches of log-mel ``features`` (True) or raw ``waveform`` (False).
        n_mels: mel bins of the features.
        val_size, test_size: a fraction (< 1) or a count held out (seeded; test first, then
            val of the rest): of the voices of each engine (spoken words), of the files of
            each class (Sonic Pi), of ``train``'s files when no ``val`` / ``test`` is given.
        val_fraction, test_fraction: their old names (deprecated; still read).
        min_held_out_per_class: hold no validation (test) split out of ``train`` where a
            fractional ``val_size`` (``test_size``) gives fewer recordings than this per
            class: they train (:func:`~multimodal.data.splits.held_out`); 0: always.
        seed: seed of the splits and of the stats subset.
        min_class_files: Sonic Pi classes with fewer files are dropped.
        stats_clips: number of training clips the normalisation is fitted on.
        synthesize: in ``prepare_data``, synthesise the spoken words if missing.
        limit_train: keep only this many training clips (quick runs).
        predict: folder of audio files for ``predict`` (the same key in every data module).
        predict_dir: the old name of ``predict`` (deprecated; still read).
        train: your training recordings: a folder ``train/<class>/<file>`` (classes sorted by
            name, as torchvision's ``ImageFolder``) or a ``path,label`` manifest (``.csv``
            with a header or ``.jsonl``; paths relative to it). ``dataset`` is then unused.
        val, test: your validation / test recordings (same kinds); default: held out of
            ``train`` by ``val_size`` / ``test_size``.
        classes: the class list in index order (default: ``train``'s sorted classes).
        skip_corrupt: skip unreadable or too-short files (counted, logged) instead of an
            error naming the first.
        shards: a folder or object-store URL written by ``multimodal-prepare audio`` (the
            files' encoded bytes, split as when they were written), streamed with
            ``litdata.StreamingDataset`` (:mod:`multimodal.data.shards`); ``train`` / ``val``
            / ``test`` are then unused.
        device_resident: your own recordings (``train``) decoded once (16 kHz mono) and held
            whole on the accelerator: ``auto`` (default) on an accelerator when they take
            at most ``device_resident_max_mb`` (one log line says so), ``true`` also on the
            CPU (an error where they cannot be held: the built-in sources, shards, or
            ``noise``, mixed clip by clip), ``false`` the DataLoader path. Batches are
            taken by index from the seeded epoch permutation, training clips cropped at
            random and log-mel features computed on the device
            (:mod:`multimodal.data.audio_batches`); no loader workers; the same order, crop
            distribution and exact mid-epoch resume as the DataLoader path. Batches are
            padded to the split's width (at most ``clip_seconds``), not the batch's longest
            clip.
        device_resident_max_mb: the most the held splits may take for ``auto`` (MiB):
            training holds whole clips (the crop is drawn per epoch), evaluation the
            centre-cropped ones.
    """

    modality = "audio"

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
        val_size: int | float = 0.1,
        test_size: int | float = 0.2,
        seed: int = 0,
        min_class_files: int = 8,
        stats_clips: int = 512,
        synthesize: bool = True,
        limit_train: int | None = None,
        predict_dir: str | None = None,
        predict: str | None = None,
        train: str | None = None,
        val: str | None = None,
        test: str | None = None,
        classes: list[str] | None = None,
        skip_corrupt: bool = False,
        shards: str | None = None,
        val_fraction: int | float | None = None,
        test_fraction: int | float | None = None,
        min_held_out_per_class: int = 0,
        device_resident: bool | str = "auto",
        device_resident_max_mb: float = 2048.0,
    ) -> None:
        super().__init__()
        self.device_resident = resident_setting(device_resident)
        if device_resident_max_mb < 0:
            raise ValueError(f"device_resident_max_mb must be >= 0, got {device_resident_max_mb}")
        self.device_resident_max_mb = float(device_resident_max_mb)
        val_size, test_size = held_out_sizes(val_size, test_size, val_fraction, test_fraction)
        self.min_held_out_per_class = check_min_per_class(min_held_out_per_class)
        if shards is not None and (train is not None or val is not None or test is not None):
            raise ValueError("give train / val / test (files) or shards, not both")
        if train is None and (val is not None or test is not None):
            raise ValueError("val / test recordings need train (your own recordings) too")
        if shards is not None:
            dataset = "shards"  # type: ignore[assignment]
        elif train is not None:
            dataset = "files"  # type: ignore[assignment]
        elif dataset not in ("spoken_words", "sonic_pi"):
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
        self.record_sizes(val_size, test_size)
        self.min_class_files, self.synthesize = min_class_files, synthesize
        self.limit_train = limit_train
        self.predict = predict_source(predict, predict_dir)
        self.tokenizer = AudioFrameTokenizer(AudioFeatureConfig(n_mels=n_mels))
        self.files = {"train": train, "val": val, "test": test}
        self.skip_corrupt, self.shards = skip_corrupt, shards
        self._class_names: list[str] | None = None
        if shards is not None:
            meta = read_shard_meta(shards, "audio")
            self._class_names = list(classes) if classes is not None else list(meta["classes"])
        elif train is not None:
            self._class_names = list(classes) if classes is not None else list(
                audio_class_names(train))
        elif classes is not None:
            raise ValueError("classes applies to your own recordings (train / shards)")
        self.file_splits: dict[str, FileList] = {}
        self.skipped_up_front = 0  # files dropped by the header check (skip_corrupt)
        self.skipped: dict[int, int] = {}  # epoch -> files skipped when read
        self._logged: set[int] = set()
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
    def model_sizes(self) -> dict[str, int]:
        """The sizes a model of these data must have, by config field name (the
        ``multimodal`` CLI links them into the task's ``data_sizes``: a preset takes them)."""
        return {"n_mels": int(self.hparams.n_mels)}

    @property
    def sample_rate(self) -> int:
        return SAMPLE_RATE

    def prepare_data(self) -> None:
        if self.dataset == "spoken_words" and self.synthesize:
            if not (self.words_root / "manifest.csv").is_file() and not available_voices():
                raise FileNotFoundError(
                    f"spoken words not found in {self.words_root} and neither espeak-ng nor "
                    f"flite is installed to make them. {GET_AUDIO}"
                )
            synthesize_spoken_words(self.words_root, seed=self.seed)

    def _noise(self) -> NoiseMixer | None:
        if self.noise_kind == "none":
            return None
        return NoiseMixer(self.noise_kind, self.snr_db, self.samples_dir)  # type: ignore[arg-type]

    def _file_lists(self) -> dict[str, FileList]:
        """Train / val / test lists of your files (given, or held out seeded), each checked
        header by header (:func:`~multimodal.data.readers.audio.check_audio_files`)."""
        classes = self.class_names
        full = read_audio_files(self.files["train"], classes)  # type: ignore[arg-type]
        given = {k: self.files[k] for k in ("val", "test") if self.files[k] is not None}
        idx = held_out(len(full), self.seed, self.val_size, self.test_size,
                       "test" in given, "val" in given, self.limit_train,
                       labels=full.labels,  # stratified by class
                       min_held_out_per_class=self.min_held_out_per_class)
        splits = {k: full.subset(v) for k, v in idx.items() if v is not None}
        for k, path in given.items():
            splits[k] = read_audio_files(path, classes)  # type: ignore[arg-type]
        for k in ("train", "val", "test"):
            splits[k], n = check_audio_files(splits[k], self.skip_corrupt)
            if n:
                log.warning("%s split: skipped %d unreadable or too short audio file(s)", k, n)
                self.skipped_up_front += n
        return splits

    def _build(self) -> None:
        noise = self._noise()
        eval_noise = noise if self.noise_eval else None
        if self.dataset == "shards":
            n, skip, shards = self.clip_samples, self.skip_corrupt, self.shards
            self._datasets = {
                split: shard_dataset(  # type: ignore[arg-type]
                    shards, split,
                    AudioShardDecoder(n, split == "train", noise if split == "train"
                                      else eval_noise, None if split == "train" else self.seed,
                                      skip),
                    shuffle=split == "train", seed=self.seed)
                for split in ("train", "val", "test")
            }
        elif self.dataset == "files":
            self.file_splits = splits = self._file_lists()
            n, skip = self.clip_samples, self.skip_corrupt
            self._datasets = {
                "train": AudioFileDataset(splits["train"], n, True, noise, None, skip),
                "val": AudioFileDataset(splits["val"], n, False, eval_noise, self.seed, skip),
                "test": AudioFileDataset(splits["test"], n, False, eval_noise, self.seed, skip),
            }
        elif self.dataset == "spoken_words":
            rows = read_manifest(self.words_root)
            self.split_voices = split_voices(
                (r["voice"] for r in rows), self.val_size, self.test_size, self.seed
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
                self.val_size, self.test_size, self.seed,
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
        if self.dataset == "shards":  # the raw items: whole clips, centre-cropped
            raw = shard_dataset(self.shards, "train", None, False, self.seed)  # type: ignore[arg-type]
            decode = AudioShardDecoder()
            clips: Iterable[Tensor] = (
                centre_crop(c, self.clip_samples)
                for c in self._clean_clips(lambda i: decode.waveform(raw[i]), chosen))
        elif isinstance(train, AudioFileDataset):  # your files: unreadable ones skipped if asked
            clips = (centre_crop(c, self.clip_samples)
                     for c in self._clean_clips(train.waveform, chosen))
        else:
            clips = (train.waveform(i) for i in chosen)  # a built-in source's clean clip of item i
        self.tokenizer.fit_stats(c for c in clips if c.shape[0] >= 400)

    def _clean_clips(self, waveform: Callable[[int], Tensor], chosen: list[int]
                     ) -> Iterable[Tensor]:  # fmt: skip
        for i in chosen:
            try:
                yield waveform(i)
            except ValueError:  # CorruptFileError: raised when read unless skipped
                if not self.skip_corrupt:
                    raise

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

    # -- held on the device (multimodal.data.device_batches, .audio_batches) ----------------
    def resident_refusal(self) -> str | None:
        if self.dataset == "shards":
            return "shards are streamed, not held in memory"
        if self.dataset != "files":
            return f"the built-in {self.dataset} clips are read one by one"
        if self.noise_kind != "none":
            return "noise is mixed clip by clip"
        return None

    def resident_bytes(self) -> int:
        """Bytes the held splits take (float32 samples, int64 lengths and labels), from the
        files' headers: training's whole clips, the others' centre crops."""
        import soundfile as sf

        from multimodal.tokenizers.audio import resampled_length

        self.setup()
        total = 0
        for split, files in self.file_splits.items():
            longest = 0
            for path in files.paths.tolist():
                info = sf.info(path)
                longest = max(longest, resampled_length(info.frames, info.samplerate,
                                                        SAMPLE_RATE))
            if split != "train":
                longest = min(longest, self.clip_samples)
            total += len(files) * (4 * longest + 16)
        return total

    def _decoded_clips(self, split: str) -> tuple[Tensor, Tensor, Tensor]:
        """``split``'s recordings decoded once: (waves (N, W), lengths, labels); training's
        whole, the others centre-cropped to ``clip_seconds``. A file that cannot be decoded
        raises, or with ``skip_corrupt`` is left out and counted in one log line."""
        from multimodal.data.audio_batches import pad_clips
        from multimodal.data.readers import CorruptFileError

        decoded = self.__dict__.setdefault("_decoded", {})
        if split not in decoded:
            dataset = self._datasets[split]
            clips, labels, skipped = [], [], 0
            for i in range(len(dataset)):  # type: ignore[arg-type]
                try:
                    clip = dataset.waveform(i)  # type: ignore[attr-defined]
                except CorruptFileError:
                    if not self.skip_corrupt:
                        raise
                    skipped += 1
                    continue
                clips.append(clip if split == "train" else centre_crop(clip, self.clip_samples))
                labels.append(int(dataset.files.labels[i]))  # type: ignore[attr-defined]
            if skipped:
                log.warning("%s split: skipped %d unreadable audio file(s) of %d", split,
                            skipped, len(dataset))  # type: ignore[arg-type]
            waves, lengths = pad_clips(clips)
            decoded[split] = (waves, lengths, torch.tensor(labels, dtype=torch.int64))
        return decoded[split]

    def resident_split(self, split: str) -> ResidentSplit | None:
        """Your recordings of ``split`` decoded once, for
        :class:`~multimodal.data.device_batches.DeviceBatches`: training clips cropped at
        random per batch, then waveforms or log-mel features, all on the device
        (:mod:`multimodal.data.audio_batches`)."""
        from multimodal.data.audio_batches import AudioBatchAssembler, BatchAudioCrop

        if self.resident_refusal() is not None:
            return None
        self.setup()
        if split not in self._datasets:
            return None
        arrays = list(self._decoded_clips(split))
        crop = BatchAudioCrop(self.clip_samples) if split == "train" else None
        assemble = AudioBatchAssembler((lambda: self.tokenizer) if self.features else None)
        return ResidentSplit(arrays, crop, assemble=assemble)

    def collate_fn(self) -> Callable[[list[Any]], dict[str, Any]]:
        collate = AudioBatchCollate(self.tokenizer if self.features else None)
        return SkippingAudioCollate(collate) if self.skip_corrupt else collate

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Removes the ``skipped`` count that ``skip_corrupt`` batches carry, summing it per
        epoch; an epoch's count is logged when the next starts and at teardown."""
        if isinstance(batch, dict) and "skipped" in batch:
            skipped = int(batch.pop("skipped"))
            epoch = self.trainer.current_epoch if self.trainer is not None else 0
            if epoch not in self.skipped:
                self._log_skipped()
                self.skipped[epoch] = 0
            self.skipped[epoch] += skipped
        return batch

    def _log_skipped(self) -> None:
        for epoch, n in sorted(self.skipped.items()):
            if epoch not in self._logged:
                log.warning("epoch %d: skipped %d unreadable audio file(s)", epoch, n)
                self._logged.add(epoch)

    def teardown(self, stage: str) -> None:
        self._log_skipped()

    def predict_dataloader(self) -> DataLoader:
        if self.predict is None:
            raise ValueError("set predict to a folder of audio files to predict on "
                             "(--data.init_args.predict)")
        if self.features and not self.tokenizer.is_fitted:
            self.setup("predict")
        dataset = AudioFolderDataset(self.predict, skip_corrupt=self.skip_corrupt)
        return self.loader(dataset, shuffle=False)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "tokenizer": self.tokenizer.to_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)  # the shards' loader position, if any
        if "tokenizer" in state_dict:
            self.tokenizer = AudioFrameTokenizer.from_dict(state_dict["tokenizer"])


if __name__ == "__main__":  # the recipe's options are parsed in cli/ now
    raise SystemExit("this recipe moved: python -m multimodal.cli.datasets spoken-words [--help]")
