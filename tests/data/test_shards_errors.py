"""Shards given wrongly fail when the DataModule is built, naming the problem (no LitData
needed: only ``multimodal.json`` is read)."""

from __future__ import annotations

import json

import pytest

from multimodal.data.audio import AudioClassificationDataModule
from multimodal.data.captions import CaptionDataModule
from multimodal.data.text import TextCorpusDataModule
from multimodal.data.vision import ImageClassificationDataModule


def meta(folder, **kwargs) -> str:
    folder.mkdir(exist_ok=True)
    (folder / "multimodal.json").write_text(json.dumps(kwargs))
    return str(folder)


@pytest.mark.parametrize("make,kind", [
    (lambda s: AudioClassificationDataModule(shards=s), "audio"),
    (lambda s: CaptionDataModule(shards=s), "captions"),
    (lambda s: TextCorpusDataModule(shards=s), "text"),
])
def test_shards_of_another_kind_are_refused(tmp_path, make, kind):
    images = meta(tmp_path / "img", kind="images", classes=["a", "b"], sizes={"train": 2})
    with pytest.raises(ValueError, match=f"holds 'images' shards, not '{kind}'.*"
                                         f"multimodal-prepare {kind}"):
        make(images)
    with pytest.raises(FileNotFoundError, match=r"multimodal\.json not found.*multimodal-prepare"):
        make(str(tmp_path / "nothing"))


def test_shards_and_files_together_are_refused(tmp_path):
    audio = meta(tmp_path / "a", kind="audio", classes=["x"], sizes={"train": 1})
    with pytest.raises(ValueError, match="or shards, not both"):
        AudioClassificationDataModule(shards=audio, train=str(tmp_path))
    with pytest.raises(ValueError, match="or shards, not both"):
        CaptionDataModule(shards=audio, train=str(tmp_path / "c.csv"))
    with pytest.raises(ValueError, match="or shards, not both"):
        TextCorpusDataModule(shards=audio, train=str(tmp_path))
    with pytest.raises(ValueError, match=r"train \(files\) or shards, not both"):
        ImageClassificationDataModule(shards=audio, train=str(tmp_path), image_size=8)


def test_text_shards_need_their_block_size(tmp_path):
    text = meta(tmp_path / "t", kind="text", block_size=64, vocab_size=100,
                sizes={"train": 3})
    with pytest.raises(ValueError, match="block_size 64, not 128: set block_size: 64"):
        TextCorpusDataModule(shards=text)
    assert TextCorpusDataModule(shards=text, block_size=64).block_size == 64
