"""Text-to-speech data: phonemes of a text, the codec tokens of its speech, and an acoustic
prompt (codec tokens of another utterance of the same voice), VALL-E style.

:func:`prepare_tts` makes everything once under ``root/tts/`` (``bash data/get_tts.sh``):

1. the utterances (:func:`~multimodal.data.sources.tts_voices.synthesize_tts`: WAVs +
   ``manifest.csv``; voices split as the spoken words split them);
2. ``phonemes.json``: a :class:`~multimodal.tokenizers.phonemes.PhonemeTokenizer`
   (espeak-ng IPA, ``en-us``; characters where espeak-ng is missing) trained on every
   text of the manifest (the phoneme inventory, not the texts, is what it keeps);
3. ``speakers.csv``: the training voices' utterances as a ``path,label`` manifest labelled
   by voice (the speaker judge of ``configs/speaker_id.yaml`` trains on it);
4. ``codec.safetensors`` (+ ``codec.json``: its config and what it was fitted on): a
   :class:`~multimodal.tokenizers.codec.MelRVQCodec` with :data:`TTS_CODEC` settings,
   fitted on ``fit_clips`` utterances of the training voices only;
5. ``tokens.safetensors``: every utterance's codec tokens ``(Q, T)`` and phoneme ids, one
   flat tensor each with offsets; its metadata names the codec file's digest and the
   manifest's, so a new codec or manifest re-encodes.

:class:`TTSDataModule` yields the batch of the TTS contract (``docs/tts.md``): ``phonemes``
(B, P) padded with ``phoneme_tokenizer.pad_token_id`` (0), ``phoneme_lengths`` (B,),
``prompt`` (B, Q, Tp) and ``prompt_lengths``, ``codes`` (B, Q, T) and ``code_lengths``
(tokens padded with 0; lengths in frames), ``speaker`` (B,) (index into
:attr:`TTSDataModule.speakers`). The prompt is another *phrase* of the target's voice
(never the target itself) cut to at most ``prompt_seconds``: a random window of a random
other phrase in training, a fixed one (seeded by the item) in validation and test.
"""

from __future__ import annotations

import csv
import hashlib
import json
import random
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import Tensor
from torch.utils.data import Dataset

from multimodal.data.documents import Document
from multimodal.data.sources.speech import Voice
from multimodal.data.sources.spoken_words import SPOKEN_WORDS
from multimodal.data.sources.tts_voices import (
    DEFAULT_ROOT as TTS_ROOT,
)
from multimodal.data.sources.tts_voices import (
    EXTRA_WORDS,
    TTSRecipe,
    read_tts_manifest,
    synthesize_tts,
)
from multimodal.data.splits import SplitDataModule
from multimodal.progress import progress as progress_bar
from multimodal.tokenizers.audio import AudioFeatureConfig, load_audio
from multimodal.tokenizers.codec import CodecConfig, MelRVQCodec
from multimodal.tokenizers.phonemes import PhonemeTokenizer
from multimodal.tokenizers.text import PAD_ID
from multimodal.weights import save_safetensors

__all__ = [
    "TTS_CODEC",
    "TTSDataModule",
    "TTSDataset",
    "TTSItems",
    "collate_tts",
    "prepare_tts",
]

TTS_CODEC = CodecConfig(
    features=AudioFeatureConfig(n_mels=80, log_offset=1e-5, win_ms=25.0, hop_ms=10.0),
    num_codebooks=8,
    codebook_size=256,
    stack_frames=2,
)
"""The codec of the TTS data: 80-mel frames every 10 ms, two frames per token (50 tokens/s),
Q = 8 codebooks of K = 256. Chosen by the round trip of BENCHMARKS.md's "Speech codec"
section (``benchmarks/tts_eval.py --codec-sweep``): a 20 ms analysis hop (50 ms window)
dropped the spoken-word classifier to 90 % on round-tripped held-out voices (88.5 % even
unquantised: Griffin-Lim and the time resolution were the loss), while two stacked 10 ms
frames per token keep 98 % (as the originals) at Q = 4, 8 and 12; Q = 8 for a lower log-mel
error (voice detail) at the same AR length."""

CODEC_FILE, PHONEMES_FILE, TOKENS_FILE = "codec.safetensors", "phonemes.json", "tokens.safetensors"
SPEAKERS_FILE = "speakers.csv"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _fit_codec(tts: Path, rows: list[dict[str, str]], config: CodecConfig, fit_clips: int,
               seed: int, progress: bool) -> MelRVQCodec:
    train = [r for r in rows if r["split"] == "train"]
    if not train:
        raise ValueError(f"{tts}/manifest.csv has no training utterances to fit the codec on")
    chosen = random.Random(f"{seed}:codec").sample(train, min(fit_clips, len(train)))
    clips = (load_audio(tts / r["path"])
             for r in progress_bar(chosen, desc="codec fit clips", unit="clip",
                                   disable=not progress))
    codec = MelRVQCodec(config).fit(clips, seed=seed)
    codec.save(tts / CODEC_FILE)
    meta = {"config": config.to_dict(), "fitted_on": f"{len(chosen)} training utterances",
            "frames_per_second": config.frame_rate, "seed": seed}
    (tts / CODEC_FILE).with_suffix(".json").write_text(json.dumps(meta, indent=1))
    return codec


def prepare_tts(
    root: str | Path = TTS_ROOT.parent,
    recipe: TTSRecipe | None = None,
    codec_config: CodecConfig | None = None,
    voices: Sequence[Voice | str] | None = None,
    documents: Sequence[Document] | None = None,
    fit_clips: int = 800,
    seed: int = 0,
    workers: int | None = None,
    progress: bool = True,
) -> Path:
    """Make (or find) the utterances, phoneme tokenizer, codec and token cache under
    ``root/tts`` (see the module doc); returns that folder. Idempotent: each step runs only
    when its output is missing (or, for the token cache, stale). ``recipe``, ``voices`` and
    ``documents`` (the texts) go to :func:`~multimodal.data.sources.tts_voices.synthesize_tts`."""
    tts = Path(root) / "tts"
    synthesize_tts(tts, documents, voices=voices, recipe=recipe, workers=workers, progress=progress)
    rows = read_tts_manifest(tts)
    if not (tts / PHONEMES_FILE).is_file():
        texts = sorted({r["text"] for r in rows} | set(SPOKEN_WORDS) | set(EXTRA_WORDS))
        PhonemeTokenizer.train(texts, backend="auto").save(tts / PHONEMES_FILE)
    if not (tts / SPEAKERS_FILE).is_file():
        _write_speakers(tts, rows)
    if not (tts / CODEC_FILE).is_file():
        _fit_codec(tts, rows, codec_config or TTS_CODEC, fit_clips, seed, progress)
    key = {"codec": _digest(tts / CODEC_FILE), "manifest": _digest(tts / "manifest.csv"),
           "phonemes": _digest(tts / PHONEMES_FILE)}
    if _token_key(tts / TOKENS_FILE) != key:
        _encode_all(tts, rows, key, progress)
    return tts


def _write_speakers(tts: Path, rows: list[dict[str, str]]) -> None:
    """``speakers.csv``: a ``path,label`` manifest of the training voices' utterances labelled
    by voice, what ``configs/speaker_id.yaml`` trains the speaker judge on."""
    tmp = tts / (SPEAKERS_FILE + ".tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(("path", "label"))
        writer.writerows((r["path"], r["voice"]) for r in rows if r["split"] == "train")
    tmp.replace(tts / SPEAKERS_FILE)


def _token_key(path: Path) -> dict[str, str] | None:
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata() or {}
    return json.loads(meta.get("key", "null"))


def _encode_all(tts: Path, rows: list[dict[str, str]], key: dict[str, str],
                progress: bool) -> None:
    codec = MelRVQCodec.load(tts / CODEC_FILE)
    tokenizer = PhonemeTokenizer.load(tts / PHONEMES_FILE)
    codes, phonemes = [], []
    for r in progress_bar(rows, desc="tts tokens", unit="clip", disable=not progress):
        codes.append(codec.encode(*load_audio(tts / r["path"])).to(torch.int16))
        phonemes.append(torch.tensor(tokenizer.encode(r["text"]), dtype=torch.int16))
    tensors = {
        "codes": torch.cat(codes, dim=1).contiguous(),
        "code_offsets": torch.tensor([0] + [c.shape[1] for c in codes]).cumsum(0),
        "phonemes": torch.cat(phonemes).contiguous(),
        "phoneme_offsets": torch.tensor([0] + [len(p) for p in phonemes]).cumsum(0),
    }
    tmp = tts / (TOKENS_FILE + ".tmp")
    save_safetensors(tensors, tmp, metadata={"key": json.dumps(key), "rows": str(len(rows))})
    tmp.replace(tts / TOKENS_FILE)


class TTSItems:
    """The manifest rows of ``root/tts`` with their cached codec tokens and phoneme ids:
    ``rows[i]``, ``codes(i)`` (long ``(Q, T)``), ``phonemes(i)`` (long ``(P,)``)."""

    def __init__(self, tts: Path) -> None:
        self.rows = read_tts_manifest(tts)
        path = tts / TOKENS_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found; make it with `bash data/get_tts.sh`")
        with safe_open(str(path), framework="pt") as fh:
            n = int((fh.metadata() or {}).get("rows", -1))
            self._codes, self._code_off = fh.get_tensor("codes"), fh.get_tensor("code_offsets")
            self._ph, self._ph_off = fh.get_tensor("phonemes"), fh.get_tensor("phoneme_offsets")
        if n != len(self.rows):
            raise ValueError(f"{path} holds {n} utterances, the manifest {len(self.rows)}: "
                             "run `bash data/get_tts.sh` again to re-encode")

    def __len__(self) -> int:
        return len(self.rows)

    def codes(self, i: int) -> Tensor:
        return self._codes[:, self._code_off[i] : self._code_off[i + 1]].long()

    def phonemes(self, i: int) -> Tensor:
        return self._ph[self._ph_off[i] : self._ph_off[i + 1]].long()


class TTSDataset(Dataset):
    """Items ``indices`` of ``items`` as ``{"phonemes", "prompt", "codes", "speaker"}``.

    The prompt of item ``i`` is a window of at most ``prompt_frames`` frames of another
    phrase of the same voice among ``indices`` (phrases only: isolated words are short).
    ``train``: the other phrase and the window are drawn with the global torch RNG (seeded
    by Lightning); otherwise with ``random.Random(seed, i)`` (the same prompt every epoch).
    """

    def __init__(self, items: TTSItems, indices: Sequence[int], speakers: Sequence[str],
                 prompt_frames: int, train: bool, seed: int = 0) -> None:
        if prompt_frames < 1:
            raise ValueError(f"prompt_frames must be >= 1, got {prompt_frames}")
        self.items, self.indices = items, list(indices)
        self.prompt_frames, self.train, self.seed = prompt_frames, train, seed
        self.speaker_index = {v: k for k, v in enumerate(speakers)}
        by_voice: dict[str, list[int]] = defaultdict(list)
        for j in self.indices:
            if items.rows[j]["kind"] == "phrase":
                by_voice[items.rows[j]["voice"]].append(j)
        self.prompts: list[list[int]] = []
        for j in self.indices:
            voice = items.rows[j]["voice"]
            others = [k for k in by_voice[voice] if k != j]
            if not others:
                raise ValueError(f"voice {voice} has no other phrase to prompt "
                                 f"{items.rows[j]['path']} with")
            self.prompts.append(others)

    def __len__(self) -> int:
        return len(self.indices)

    def _draw(self, n: int, i: int, salt: str) -> int:
        if self.train:
            return int(torch.randint(n, ()))
        return random.Random(f"{self.seed}:{salt}:{i}").randrange(n)

    def __getitem__(self, i: int) -> dict[str, Any]:
        j = self.indices[i]
        others = self.prompts[i]
        prompt = self.items.codes(others[self._draw(len(others), i, "prompt")])
        extra = prompt.shape[1] - self.prompt_frames
        if extra > 0:
            start = self._draw(extra + 1, i, "window")
            prompt = prompt[:, start : start + self.prompt_frames]
        return {"phonemes": self.items.phonemes(j), "prompt": prompt,
                "codes": self.items.codes(j),
                "speaker": self.speaker_index[self.items.rows[j]["voice"]]}


def _pad_codes(seqs: list[Tensor]) -> tuple[Tensor, Tensor]:
    lengths = torch.tensor([s.shape[1] for s in seqs])
    out = torch.zeros(len(seqs), seqs[0].shape[0], int(lengths.max()), dtype=torch.long)
    for b, s in enumerate(seqs):
        out[b, :, : s.shape[1]] = s
    return out, lengths


def collate_tts(items: list[dict[str, Any]]) -> dict[str, Tensor]:
    """Pad a list of :class:`TTSDataset` items into the contract's batch."""
    ph_len = torch.tensor([len(x["phonemes"]) for x in items])
    phonemes = torch.full((len(items), int(ph_len.max())), PAD_ID, dtype=torch.long)
    for b, x in enumerate(items):
        phonemes[b, : len(x["phonemes"])] = x["phonemes"]
    prompt, prompt_len = _pad_codes([x["prompt"] for x in items])
    codes, code_len = _pad_codes([x["codes"] for x in items])
    return {"phonemes": phonemes, "phoneme_lengths": ph_len, "prompt": prompt,
            "prompt_lengths": prompt_len, "codes": codes, "code_lengths": code_len,
            "speaker": torch.tensor([x["speaker"] for x in items])}


class TTSDataModule(SplitDataModule):
    """Phonemes + acoustic prompt -> codec tokens, from the offline TTS voices set.

    Args:
        root: cache folder; the data live in ``root/tts`` (made by ``prepare_data`` when
            missing, :func:`prepare_tts`).
        batch_size: utterances per batch.
        num_workers: DataLoader worker processes.
        prompt_seconds: the prompt is cut to at most this many seconds.
        max_seconds: training utterances longer than this are left out (None: keep all).
        seed: seed of the evaluation prompts and of the training order.
        prepare: in ``prepare_data``, make the data when missing (else only read them).
        limit_train: keep only this many training utterances (quick runs).

    After ``setup()`` (or ``prepare_data()``): :attr:`phoneme_tokenizer`, :attr:`codec`,
    :attr:`speakers` (every voice id of the set, sorted; ``speaker`` indexes it) and
    :attr:`split_voices` (which voices are in which split).
    """

    modality = "text-audio"

    def __init__(
        self,
        root: str = str(TTS_ROOT.parent),
        batch_size: int = 16,
        num_workers: int = 0,
        prompt_seconds: float = 3.0,
        max_seconds: float | None = None,
        seed: int = 0,
        prepare: bool = True,
        limit_train: int | None = None,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if prompt_seconds <= 0:
            raise ValueError(f"prompt_seconds must be > 0, got {prompt_seconds}")
        self.save_hyperparameters()
        self.root, self.batch_size, self.num_workers = Path(root), batch_size, num_workers
        self.prompt_seconds, self.max_seconds, self.seed = prompt_seconds, max_seconds, seed
        self.prepare, self.limit_train = prepare, limit_train
        self._tokenizer: PhonemeTokenizer | None = None
        self._codec: MelRVQCodec | None = None
        self._items: TTSItems | None = None
        self._datasets: dict[str, TTSDataset] = {}
        self.speakers: list[str] = []
        self.split_voices: dict[str, list[str]] = {}

    @property
    def tts_root(self) -> Path:
        return self.root / "tts"

    @property
    def model_sizes(self) -> dict[str, int]:
        """The sizes a model of these data must have, by config field name (the
        ``multimodal`` CLI links them into the task's ``data_sizes``: a preset takes them):
        the codec's codebooks, Q and K (the codec file's when it exists, else
        :data:`TTS_CODEC`'s, which ``prepare_data`` fits)."""
        file = self.tts_root / CODEC_FILE
        codec = self._codec or (MelRVQCodec.load(file) if file.is_file() else None)
        if codec is not None:
            return {"num_codebooks": codec.num_codebooks, "codebook_size": codec.codebook_size}
        return {"num_codebooks": TTS_CODEC.num_codebooks,
                "codebook_size": TTS_CODEC.codebook_size}

    def prepare_data(self) -> None:
        if self.prepare:
            prepare_tts(self.root, seed=self.seed)
        self._load()

    def _load(self) -> None:
        if self._items is not None:
            return
        tts = self.tts_root
        for name in (PHONEMES_FILE, CODEC_FILE):
            if not (tts / name).is_file():
                raise FileNotFoundError(f"{tts / name} not found; make it with "
                                        "`bash data/get_tts.sh` (or prepare=True)")
        self._tokenizer = PhonemeTokenizer.load(tts / PHONEMES_FILE)
        self._codec = MelRVQCodec.load(tts / CODEC_FILE)
        self._items = TTSItems(tts)
        self.speakers = sorted({r["voice"] for r in self._items.rows})
        voices: dict[str, set[str]] = defaultdict(set)
        for r in self._items.rows:
            voices[r["split"]].add(r["voice"])
        self.split_voices = {s: sorted(voices[s]) for s in ("train", "val", "test")}

    @property
    def phoneme_tokenizer(self) -> PhonemeTokenizer:
        self._load()
        assert self._tokenizer is not None
        return self._tokenizer

    @property
    def codec(self) -> MelRVQCodec:
        self._load()
        assert self._codec is not None
        return self._codec

    @property
    def frame_rate(self) -> float:
        """Codec frames (tokens) per second."""
        return self.codec.frame_rate

    @property
    def items(self) -> TTSItems:
        self._load()
        assert self._items is not None
        return self._items

    def setup(self, stage: str | None = None) -> None:
        if self._datasets:
            return
        items = self.items
        prompt_frames = max(1, round(self.prompt_seconds * self.frame_rate))
        for split in ("train", "val", "test"):
            idx = [i for i, r in enumerate(items.rows) if r["split"] == split]
            if split == "train":
                if self.max_seconds is not None:
                    idx = [i for i in idx if float(items.rows[i]["seconds"]) <= self.max_seconds]
                if self.limit_train is not None:
                    idx = idx[: self.limit_train]
            self._datasets[split] = TTSDataset(items, idx, self.speakers, prompt_frames,
                                               train=split == "train", seed=self.seed)
        if len(self._datasets["train"]) == 0:
            raise ValueError(f"{self.tts_root}: the TTS training split is empty")

    def split_dataset(self, split: str) -> Dataset:
        self.setup()
        return self._datasets[split]

    def collate_fn(self) -> Callable[[list[Any]], dict[str, Tensor]]:
        return collate_tts


def make_tts_data(root: str | Path = TTS_ROOT.parent, *, fit_clips: int = 800,
                  workers: int | None = None) -> Path:
    """Make the TTS voices set under ``root`` (:func:`prepare_tts`: the utterances, the
    phoneme tokenizer, the codec fitted on ``fit_clips`` training clips, the token cache),
    print what it holds per split and the recipe, and return its folder. Run by
    ``python -m multimodal.cli.datasets tts`` (``bash data/get_tts.sh``)."""
    tts = prepare_tts(root, fit_clips=fit_clips, workers=workers)
    items = TTSItems(tts)
    by_split: dict[str, list[float]] = defaultdict(list)
    for r in items.rows:
        by_split[r["split"]].append(float(r["seconds"]))
    codec = MelRVQCodec.load(tts / CODEC_FILE)
    print(f"tts voices: {len(items)} utterances in {tts}; codec Q={codec.num_codebooks} "
          f"K={codec.codebook_size} at {codec.frame_rate:g} frames/s")
    for split, secs in sorted(by_split.items()):
        voices = {r['voice'] for r in items.rows if r['split'] == split}
        print(f"  {split}: {len(secs)} utterances, {len(voices)} voices, {sum(secs) / 60:.1f} "
              f"min, {min(secs):.2f}-{max(secs):.2f} s each")
    print("recipe:", json.dumps(asdict(TTSRecipe())))
    return tts


if __name__ == "__main__":  # the recipe's options are parsed in cli/ now
    raise SystemExit("this recipe moved: python -m multimodal.cli.datasets tts [--help]")
