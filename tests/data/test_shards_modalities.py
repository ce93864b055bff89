"""LitData shards of audio, captions and text: ``multimodal-prepare`` writes them, the task's
DataModule reads them (``shards=``) and gives the same items as from the files they were
written from; audio shards are split between DDP ranks (2 CPU processes, gloo) and resume
mid-epoch through a Lightning checkpoint.

Audio clips are made so that their length says which file they are: 16 kHz mono clips of
``400 + 10 * id`` samples (a few others at 22.05 kHz stereo / FLAC for the round trip).
"""

from __future__ import annotations

import csv
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("litdata")
sf = pytest.importorskip("soundfile")
# litdata.optimize starts a worker process per split: each fixture takes ~10-60 s here.
pytestmark = pytest.mark.slow

from multimodal.cli.prepare import main as prepare  # noqa: E402
from multimodal.data.audio import AudioClassificationDataModule  # noqa: E402
from multimodal.data.captions import CaptionDataModule  # noqa: E402
from multimodal.data.text import TextCorpusDataModule  # noqa: E402
from tests.shard_runs import Killed, Record, trainer  # noqa: E402

CLASSES = ("no", "stop", "yes")
N_PER_CLASS = 8


# ------------------------------------------------------------------------------ audio
@pytest.fixture(scope="module")
def audio(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("audio")
    rng = np.random.default_rng(0)
    for c, cls in enumerate(CLASSES):
        (root / "in" / cls).mkdir(parents=True)
        for i in range(N_PER_CLASS):
            item = c * N_PER_CLASS + i
            x = rng.uniform(-0.5, 0.5, 400 + 10 * item).astype(np.float32)
            sf.write(root / "in" / cls / f"{i:02d}.wav", x, 16000, subtype="FLOAT")
    # other formats / rates / channel counts: only in the round-trip module
    (root / "mixed" / "yes").mkdir(parents=True)
    (root / "mixed" / "no").mkdir(parents=True)
    for i in range(6):
        x = rng.uniform(-0.5, 0.5, (900 + 37 * i, 2)).astype(np.float32)
        sf.write(root / "mixed" / "yes" / f"s{i}.flac", x, 22050)
        sf.write(root / "mixed" / "no" / f"m{i}.wav", x[:, 0], 8000, subtype="PCM_16")
    sizes = prepare(["audio", str(root / "in"), str(root / "out"), "--val-size", "4",
                     "--test-size", "4"])
    assert sizes == {"train": 16, "val": 4, "test": 4}
    prepare(["audio", str(root / "mixed"), str(root / "mixed_out"), "--val-size", "3",
             "--test-size", "3"])
    return root, root / "out"


def audio_module(**kwargs) -> AudioClassificationDataModule:
    args = dict(features=False, batch_size=4, clip_seconds=1.0, seed=0)
    return AudioClassificationDataModule(**{**args, **kwargs})


def clips(dm: AudioClassificationDataModule, split: str) -> list[tuple[int, tuple[float, ...]]]:
    """(label, samples) of every clip of a split, sorted (shards stream in their order)."""
    out = []
    for batch in dm.loader(dm.split_dataset(split), shuffle=split == "train"):
        for x, n, y in zip(batch["waveform"], batch["lengths"], batch["label"], strict=True):
            out.append((int(y), tuple(x[: int(n)].tolist())))
    return sorted(out)


@pytest.mark.parametrize("source", ["in", "mixed"])
def test_audio_shards_give_the_folder_items(audio, source):
    root, _ = audio
    out = root / ("out" if source == "in" else "mixed_out")
    size = dict(val_size=4, test_size=4) if source == "in" else dict(
        val_size=3, test_size=3)
    files = audio_module(train=str(root / source), **size)
    shards = audio_module(shards=str(out))
    files.setup("fit")
    shards.setup("fit")
    assert shards.class_names == files.class_names
    for split in ("val", "test", "train"):
        expected, got = clips(files, split), clips(shards, split)
        assert len(got) == len(expected) > 0
        for (ya, xa), (yb, xb) in zip(got, expected, strict=True):
            assert ya == yb
            torch.testing.assert_close(torch.tensor(xa), torch.tensor(xb), rtol=0, atol=0)
    # the log-mel normalisation is fitted on the same clips
    feats_files = audio_module(train=str(root / source), features=True, **size)
    feats_shards = audio_module(shards=str(out), features=True)
    feats_files.setup("fit")
    feats_shards.setup("fit")
    assert feats_files.tokenizer.to_dict() == feats_shards.tokenizer.to_dict()


def test_audio_shards_of_another_kind_are_refused(audio, tmp_path):
    _, out = audio
    with pytest.raises(ValueError, match="holds 'audio' shards, not 'text'"):
        TextCorpusDataModule(shards=str(out))
    with pytest.raises(FileNotFoundError, match="multimodal-prepare"):
        audio_module(shards=str(tmp_path))


def ids_of(batch: dict) -> list[int]:
    return ((batch["lengths"] - 400) // 10).tolist()


class Probe(L.LightningModule):
    """The smallest trainable module: one weight, a loss that touches every batch."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch, batch_idx):
        return (self.w * batch["waveform"].mean() + self.w.square()).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def every_train_id(out: Path) -> list[int]:
    dm = audio_module(shards=str(out))
    return sorted(i for b in dm.loader(dm.split_dataset("train"), False) for i in ids_of(b))


def test_audio_ddp_ranks_stream_disjoint_shares_covering_the_epoch(audio, tmp_path):
    _, out = audio
    L.seed_everything(0)
    trainer(tmp_path, Record(ids_of, tmp_path), devices=2, strategy="ddp_spawn").fit(
        Probe(), audio_module(shards=str(out)))
    r0 = [i for batch in torch.load(tmp_path / "seen0.pt") for i in batch]
    r1 = [i for batch in torch.load(tmp_path / "seen1.pt") for i in batch]
    assert len(r0) == len(r1) == 8
    assert not set(r0) & set(r1)
    assert sorted(r0 + r1) == every_train_id(out)


def test_audio_resume_mid_epoch_continues_with_unseen_items(audio, tmp_path):
    _, out = audio
    first = Record(ids_of, tmp_path, stop_after=2)
    L.seed_everything(0)
    with pytest.raises(Killed):
        trainer(tmp_path, first).fit(Probe(), audio_module(shards=str(out)))
    before = [i for batch in first.seen for i in batch]
    assert len(before) == 8
    second = Record(ids_of)
    trainer(tmp_path, second).fit(Probe(), audio_module(shards=str(out)),
                                  ckpt_path=tmp_path / "mid.ckpt")
    after = [i for batch in second.seen for i in batch]
    assert len(after) == 8 and not set(before) & set(after)
    assert sorted(before + after) == every_train_id(out)


# --------------------------------------------------------------------------- captions
@pytest.fixture(scope="module")
def captions(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("captions")
    rng = np.random.default_rng(1)
    rows = []
    for i in range(12):
        pixels = rng.integers(0, 256, (10 + i, 14, 3), dtype=np.uint8)  # varied sizes
        Image.fromarray(pixels).save(root / f"im{i}.png")
        rows += [(f"im{i}.png", f"picture {i} caption {k}") for k in range(1 + i % 3)]
    with open(root / "pairs.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["image", "caption"])
        writer.writerows(rows)
    prepare(["captions", str(root / "pairs.csv"), str(root / "out"), "--val-size", "2",
             "--test-size", "2"])
    return root / "pairs.csv", root / "out"


def test_caption_shards_give_the_manifest_items(captions):
    manifest, out = captions
    args = dict(image_size=8, batch_size=5, val_size=2, test_size=2)
    files = CaptionDataModule(train=str(manifest), **args)
    shards = CaptionDataModule(shards=str(out), **args)
    files.setup("fit")
    shards.setup("fit")
    torch.testing.assert_close(shards.mean, files.mean)
    torch.testing.assert_close(shards.std, files.std)
    assert shards.train_captions() == files.train_captions()
    for split in ("train", "val", "test"):
        def items(dm, split=split):
            out = []
            for batch in dm.loader(dm.split_dataset(split), shuffle=split == "train"):
                out += [(c, tuple(x.flatten().tolist()))
                        for x, c in zip(batch["images"], batch["captions"], strict=True)]
            return sorted(out)

        expected, got = items(files), items(shards)
        assert len(got) == len(expected) == len(files.captions(split)) > 0
        for (ca, xa), (cb, xb) in zip(got, expected, strict=True):
            assert ca == cb
            torch.testing.assert_close(torch.tensor(xa), torch.tensor(xb))
        torch.testing.assert_close(shards.raw_images(split).float().mean(),
                                   files.raw_images(split).float().mean())


# ------------------------------------------------------------------------------- text
@pytest.fixture(scope="module")
def text(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("text")
    (root / "books").mkdir()
    words = ["the", "cat", "sat", "on", "a", "mat", "while", "dogs", "ran", "far", "away",
             "under", "blue", "skies"]
    rng = np.random.default_rng(2)
    for b in range(4):
        paragraphs = [" ".join(rng.choice(words, 40)) + "." for _ in range(30)]
        (root / "books" / f"b{b}.txt").write_text("\n\n".join(paragraphs))
    prepare(["text", str(root / "books"), str(root / "out"), "--block-size", "16",
             "--vocab-size", "120", "--chunk-chars", "400", "--val-size", "0.1",
             "--test-size", "0.1"])
    return root / "books", root / "out"


def test_text_shards_give_the_files_blocks(text):
    books, out = text
    files = TextCorpusDataModule(train=str(books), block_size=16, vocab_size=120,
                                 chunk_chars=400, val_size=0.1, test_size=0.1,
                                 batch_size=8)
    shards = TextCorpusDataModule(shards=str(out), block_size=16, batch_size=8)
    files.setup("fit")
    shards.setup("fit")
    assert shards.vocab_size == files.vocab_size
    sentence = "the dogs sat under a blue mat, far away"
    assert shards.tokenizer.encode(sentence) == files.tokenizer.encode(sentence)
    for split in ("train", "val", "test"):
        def blocks(dm, split=split):
            rows = []
            for batch in dm.loader(dm.split_dataset(split), shuffle=split == "train"):
                assert torch.equal(batch["input_ids"][:, 1:], batch["targets"][:, :-1])
                rows += [(*r.tolist(), int(t[-1]))
                         for r, t in zip(batch["input_ids"], batch["targets"], strict=True)]
            return sorted(rows)

        expected = blocks(files)
        assert len(expected) > 0 and blocks(shards) == expected
    with pytest.raises(ValueError, match="block_size 16, not 32"):
        TextCorpusDataModule(shards=str(out), block_size=32)
