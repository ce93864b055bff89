"""The loader recipe every data module shares (multimodal.data.splits)."""

from __future__ import annotations

import pytest
import torch

from multimodal.data.captions import CaptionDataModule
from multimodal.data.numbers import NumberWordsDataModule
from multimodal.data.sampling import EpochShuffleSampler
from multimodal.data.splits import SplitDataModule


def _first_sources(loader, epoch: int, batches: int = 3) -> list[list[int]]:
    loader.sampler.set_epoch(epoch)
    return [b["source_ids"][:, 1].tolist() for b, _ in zip(loader, range(batches), strict=False)]


def test_training_order_depends_only_on_seed_and_epoch() -> None:
    """A resumed run builds a fresh loader and calls set_epoch(k): it must see the batches
    of epoch k of the uninterrupted run, whatever global RNG was used in between."""
    dm = NumberWordsDataModule(train_size=2000, held_out=500, val_size=100, test_size=100)
    dm.setup()
    loader = dm.train_dataloader()
    assert isinstance(loader.sampler, EpochShuffleSampler)
    uninterrupted = [_first_sources(loader, e) for e in range(3)]
    torch.rand(1000)  # consume global RNG, as a training run would
    resumed = NumberWordsDataModule(train_size=2000, held_out=500, val_size=100, test_size=100)
    resumed.setup()
    assert _first_sources(resumed.train_dataloader(), 2) == uninterrupted[2]
    assert uninterrupted[0] != uninterrupted[1]  # and epochs differ from one another


@pytest.mark.parametrize("split", ["val", "test"])
def test_evaluation_splits_keep_their_order(split: str) -> None:
    dm = CaptionDataModule(num_train=16, num_val=16, num_test=16, batch_size=8)
    loader = getattr(dm, f"{split}_dataloader")()
    # in order on one process; each rank its own share, unpadded, on several
    assert loader.sampler.__class__.__name__ == "EvalShardSampler"
    assert list(loader.sampler) == list(range(16))
    first = next(iter(loader))
    assert first["captions"] == [c for _, c in (dm.split_dataset(split)[i] for i in range(8))]


def test_a_module_without_split_dataset_says_so() -> None:
    class NoSplits(SplitDataModule):
        batch_size = 4

    with pytest.raises(NotImplementedError, match="NoSplits must implement split_dataset"):
        NoSplits().train_dataloader()


def _own_files(tmp_path):
    """A ``text,label`` CSV and a ``source<TAB>target`` TSV of 20 rows each."""
    texts = tmp_path / "texts.csv"
    texts.write_text("text,label\n" + "".join(f"text number {i},{'ab'[i % 2]}\n"
                                              for i in range(20)))
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"source {i}\ttarget {i}\n" for i in range(20)))
    return {"TextClassificationDataModule": {"train": str(texts)},
            "TextPairsDataModule": {"train": str(pairs)}}


@pytest.mark.parametrize("name", ["AudioClassificationDataModule", "CaptionDataModule",
                                  "TextCorpusDataModule", "SourceClassificationDataModule",
                                  "TextClassificationDataModule", "TextPairsDataModule"])
def test_the_old_held_out_names_are_read_with_a_warning_naming_the_new(name, tmp_path) -> None:
    """``val_fraction`` / ``test_fraction`` (the names before ``val_size`` / ``test_size``)
    still set the sizes, with a DeprecationWarning naming the new name; the hyper-parameters
    a checkpoint stores hold only the new names."""
    from multimodal.data.audio import AudioClassificationDataModule
    from multimodal.data.text import SourceClassificationDataModule, TextCorpusDataModule
    from multimodal.data.text_classification import TextClassificationDataModule
    from multimodal.data.text_pairs import TextPairsDataModule

    cls = {c.__name__: c for c in (AudioClassificationDataModule, CaptionDataModule,
                                   TextCorpusDataModule, SourceClassificationDataModule,
                                   TextClassificationDataModule, TextPairsDataModule)}[name]
    args = _own_files(tmp_path).get(name, {})
    with pytest.warns(DeprecationWarning, match="val_fraction is deprecated: use val_size"):
        old = cls(**args, val_fraction=3, test_size=0.25)
    assert (old.val_size, old.test_size) == (3, 0.25)
    with pytest.warns(DeprecationWarning, match="test_fraction is deprecated: use test_size"):
        assert cls(**args, test_fraction=0.3).test_size == 0.3
    if old.hparams:  # the modules that save their arguments
        assert old.hparams["val_size"] == 3 and old.hparams["test_size"] == 0.25
        assert "val_fraction" not in old.hparams and "test_fraction" not in old.hparams


def test_an_old_name_splits_as_the_new_one(tmp_path) -> None:
    """Same seed, same size under either name: the same rows in every split."""
    import warnings

    from multimodal.data.text_classification import TextClassificationDataModule

    train = _own_files(tmp_path)["TextClassificationDataModule"]["train"]
    new = TextClassificationDataModule(train=train, val_size=0.2, test_size=4, seed=5,
                                       vocab_size=40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = TextClassificationDataModule(train=train, val_fraction=0.2, test_fraction=4,
                                           seed=5, vocab_size=40)
    want, got = new.read_splits(), old.read_splits()
    for split in ("train", "val", "test"):
        assert list(want[split].texts) == list(got[split].texts), split
    assert len(want["test"].texts) == 4 and len(want["val"].texts) == 3  # round(0.2 * 16)
