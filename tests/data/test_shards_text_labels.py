"""LitData shards of labelled texts and text pairs: ``multimodal-prepare labelled-text`` /
``text-pairs`` write them, the data modules read them (``shards=``) and give the items they
give from the files, with the same classes, tokenizer and special ids (a Hugging Face
tokenizer's own included)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("litdata")
# litdata.optimize starts a worker process per split: each fixture takes ~10-30 s here.
pytestmark = pytest.mark.slow

from multimodal.cli.prepare import main as prepare  # noqa: E402
from multimodal.data.text_classification import TextClassificationDataModule  # noqa: E402
from multimodal.data.text_pairs import TextPairsDataModule  # noqa: E402
from tests.real_weights import real_weights  # noqa: E402

WORDS = ["river", "stone", "light", "quiet", "storm", "green", "paper", "glass", "night",
         "bread", "music", "winter"]


def sentence(i: int, n: int = 6) -> str:
    return " ".join(WORDS[(i * 5 + 3 * k) % len(WORDS)] for k in range(n)) + f" {i}"


def items(dm, split: str) -> list[tuple]:
    """Sorted unpadded items of a split, through the module's own loader: ``(ids, label)``
    (classification) or ``(source ids, target ids)`` (pairs, target up to its eos)."""
    rows = []
    for batch in dm.loader(dm.split_dataset(split), shuffle=False):
        if "label" in batch:
            for ids, mask, label in zip(batch["input_ids"], batch["attention_mask"],
                                        batch["label"], strict=True):
                rows.append((tuple(ids[: int(mask.sum())].tolist()), int(label)))
        else:
            eos = dm.eos_token_id
            for ids, mask, target in zip(batch["source_ids"], batch["source_mask"],
                                         batch["target_ids"], strict=True):
                t = target.tolist()
                rows.append((tuple(ids[: int(mask.sum())].tolist()),
                             tuple(t[: t.index(eos) + 1])))
    return sorted(rows)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("labelled")
    for c, cls in enumerate(("alpha", "beta", "gamma")):
        (root / "in" / cls).mkdir(parents=True)
        for i in range(10):
            (root / "in" / cls / f"{i}.txt").write_text(sentence(10 * c + i))
    prepare(["labelled-text", str(root / "in"), str(root / "out"), "--vocab-size", "80",
             "--max-length", "40", "--val-size", "4", "--test-size", "5"])
    return root / "in", root / "out"


def test_labelled_shards_give_the_folder_items(folder):
    src, out = folder
    files = TextClassificationDataModule(train=str(src), vocab_size=80, max_length=40,
                                         val_size=4, test_size=5, batch_size=7)
    shards = TextClassificationDataModule(shards=str(out), max_length=40, batch_size=7)
    assert shards.class_names == files.class_names == ["alpha", "beta", "gamma"]
    assert json.loads((out / "multimodal.json").read_text())["kind"] == "labelled-text"
    files.setup("fit")
    shards.setup("fit")
    # the shards carry the tokenizer their ids were made with; the files' module trained
    # its own (tied pieces may be numbered otherwise): compare texts through each one
    for split in ("train", "val", "test"):
        got = items(shards, split)
        assert len(got) == len(files.datasets[split])
        decoded = sorted((shards.tokenizer.decode(list(ids)), label) for ids, label in got)
        want = sorted((files.tokenizer.decode(ids), label)
                      for ids, label in zip(files.datasets[split].ids,
                                            files.datasets[split].labels, strict=True))
        assert decoded == want
    with pytest.raises(ValueError, match="up to 40 ids: set max_length: 40"):
        TextClassificationDataModule(shards=str(out), max_length=8)
    with pytest.raises(ValueError, match="holds 'labelled-text' shards, not 'text-pairs'"):
        TextPairsDataModule(shards=str(out))


def test_labelled_shards_keep_a_hugging_face_tokenizers_ids(folder, tmp_path):
    src, _ = folder
    tok = str(real_weights("all-MiniLM-L6-v2"))
    prepare(["labelled-text", str(src), str(tmp_path / "out"), "--tokenizer", tok,
             "--max-length", "10", "--val-size", "3", "--test-size", "3"])
    files = TextClassificationDataModule(train=str(src), tokenizer=tok, max_length=10,
                                         val_size=3, test_size=3, batch_size=5)
    shards = TextClassificationDataModule(shards=str(tmp_path / "out"), max_length=10,
                                          batch_size=5)
    files.setup("fit")
    shards.setup("fit")
    assert shards.specials == files.specials and shards.pad_token_id == 0
    for split in ("train", "val", "test"):
        assert items(shards, split) == items(files, split)


def test_pair_shards_give_the_file_items(tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"{sentence(i)}\t{sentence(i + 1, 3)}\n" for i in range(40)))
    prepare(["text-pairs", str(pairs), str(tmp_path / "out"), "--vocab-size", "80",
             "--max-source-len", "40", "--max-target-len", "30", "--val-size", "5",
             "--test-size", "5", "--separate-vocabularies"])
    kw = dict(max_source_len=40, max_target_len=30, batch_size=8)
    files = TextPairsDataModule(train=str(pairs), vocab_size=80, shared_vocabulary=False,
                                val_size=5, test_size=5, **kw)
    shards = TextPairsDataModule(shards=str(tmp_path / "out"), **kw)
    files.setup("fit")
    shards.setup("fit")
    assert (shards.bos_token_id, shards.eos_token_id, shards.pad_token_id) == (5, 6, 0)
    for split in ("train", "val", "test"):
        got = items(shards, split)
        assert len(got) == len(files.datasets[split])
        for side, tok_name in ((0, "source_tokenizer"), (1, "target_tokenizer")):
            mine = sorted(getattr(shards, tok_name).decode(list(r[side])) for r in got)
            ref = sorted(getattr(files, tok_name).decode(ids)
                         for ids in getattr(files.datasets[split], f"{tok_name[:6]}s"))
            assert mine == ref
    batch = next(iter(shards.loader(shards.split_dataset("val"), shuffle=False)))
    assert torch.all(batch["target_ids"][:, 0] == 5)
