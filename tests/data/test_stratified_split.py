"""Held-out splits of labelled data are stratified by class (#38): each class gives its share
of the validation and test rows, so a small split of a two-class folder is not all of one
class; the sizes are those of the unstratified split."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch
from PIL import Image

from multimodal.data.splits import held_out, split_size, stratified_counts
from multimodal.data.text_classification import TextClassificationDataModule
from multimodal.data.vision import ImageClassificationDataModule


@pytest.mark.parametrize(("sizes", "k"), [([12, 12, 12], 4), ([30, 3, 1], 4), ([50, 50], 7),
                                          ([7, 5, 3, 1], 5), ([1000, 10], 101)])
def test_counts_are_the_shares_rounded_by_largest_remainder(sizes, k):
    counts = stratified_counts(sizes, k)
    total = sum(sizes)
    assert sum(counts) == k
    for n, c in zip(sizes, counts, strict=True):
        assert abs(c - k * n / total) < 1  # within one of its exact share
        assert c <= max(n - 1, 0) or sum(max(m - 1, 0) for m in sizes) < k


def test_counts_by_hand():
    # 12/12/12, 4 rows: 4/3 each -> floors 1, 1, 1; one remainder to the first class
    assert stratified_counts([12, 12, 12], 4) == [2, 1, 1]
    # 30/3/1, 4 rows: 3.53, 0.35, 0.12 -> 3, 0, 0 and the largest remainder 0.53 -> 4, 0, 0
    assert stratified_counts([30, 3, 1], 4) == [4, 0, 0]
    # a class of one keeps it for training while others have room
    assert stratified_counts([1, 5], 3) == [0, 3]
    with pytest.raises(ValueError, match="cannot hold out 5 of 4"):
        stratified_counts([2, 2], 5)


def test_stratified_split_keeps_each_class_share_and_the_sizes():
    labels = torch.tensor([0] * 40 + [1] * 40 + [2] * 20)[torch.randperm(100)]
    plain = held_out(100, 3, 0.1, 0.2, has_test=False)
    strat = held_out(100, 3, 0.1, 0.2, has_test=False, labels=labels)
    for split in ("train", "val", "test"):
        assert len(strat[split]) == len(plain[split])
    every = torch.cat([strat["train"], strat["val"], strat["test"]])
    assert sorted(every.tolist()) == list(range(100))  # disjoint, all rows
    assert Counter(labels[strat["test"]].tolist()) == {0: 8, 1: 8, 2: 4}  # 20 of 40/40/20
    assert Counter(labels[strat["val"]].tolist()) == {0: 3, 1: 3, 2: 2}  # 8 of 32/32/16
    # seeded: the same split again; another seed, another split
    again = held_out(100, 3, 0.1, 0.2, has_test=False, labels=labels.tolist())
    assert all(torch.equal(strat[s], again[s]) for s in strat)
    assert not torch.equal(held_out(100, 4, 0.1, 0.2, False, labels=labels)["val"],
                           strat["val"])


def test_without_labels_the_split_is_the_seeded_permutation_as_before():
    order = torch.randperm(50, generator=torch.Generator().manual_seed(7))
    n_test = split_size(0.2, 50, "test_size")
    n_val = split_size(0.1, 50 - n_test, "val_size")
    idx = held_out(50, 7, 0.1, 0.2, has_test=False)
    assert idx["test"].tolist() == sorted(order[:n_test].tolist())
    assert idx["val"].tolist() == sorted(order[n_test:n_test + n_val].tolist())


def test_labels_of_another_length_are_refused():
    with pytest.raises(ValueError, match="3 labels for 4 rows"):
        held_out(4, 0, 0.5, 0, has_test=True, labels=[0, 1, 0])


def test_own_texts_validation_split_has_every_class(tmp_path):
    rows = [{"text": f"good movie number {i}", "label": "pos"} for i in range(18)] + \
        [{"text": f"bad film number {i}", "label": "neg"} for i in range(18)]
    path = tmp_path / "reviews.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dm = TextClassificationDataModule(train=str(path), val_size=0.1, test_size=0.2,
                                      vocab_size=60, batch_size=4)
    splits = dm.read_splits()
    # test: 7 = round(0.2 * 36) rows, 3.5 of each class: the tie to the first label (neg)
    assert Counter(splits["test"].labels) == {"neg": 4, "pos": 3}
    # val: 3 = round(0.1 * 29) of 14 neg / 15 pos: shares 1.45 and 1.55 -> 1 and 2
    assert Counter(splits["val"].labels) == {"neg": 1, "pos": 2}


def test_own_images_validation_split_is_not_one_class(tmp_path):
    rng = np.random.default_rng(0)
    for name in ("circle", "square"):
        (tmp_path / name).mkdir()
        for i in range(10):
            image = rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
            Image.fromarray(image).save(tmp_path / name / f"{i}.png")
    dm = ImageClassificationDataModule(train=str(tmp_path), image_size=8, batch_size=4,
                                       val_size=4, test_size=0)
    splits = dm._load_file_splits()
    assert Counter(splits["val"].labels.tolist()) == {0: 2, 1: 2}
    assert Counter(splits["train"].labels.tolist()) == {0: 8, 1: 8}


@pytest.mark.parametrize(("rows", "minimum", "held"), [
    (32, 5, 0),    # 8 a class: 10 % is 3 rows, 0.8 a class < 5 -> every row trains
    (256, 5, 26),  # 64 a class: 26 rows, 6.5 a class >= 5 -> held out
    (32, 0, 3),    # the check off: held out as before
])
def test_a_validation_split_below_min_held_out_per_class_is_not_held_out(rows, minimum, held,
                                                                   caplog):
    labels = torch.arange(rows) % 4
    with caplog.at_level("INFO"):
        idx = held_out(rows, 0, 0.1, 0.0, has_test=False, labels=labels,
                       min_held_out_per_class=minimum)
    assert len(idx["val"]) == held and len(idx["train"]) == rows - held
    assert ("no validation split, every row trains" in caplog.text) == (held == 0)
    # the test split by the same rule, before the validation split
    both = held_out(rows, 0, 0.1, 0.1, has_test=False, labels=labels,
                    min_held_out_per_class=minimum)
    assert len(both["test"]) == held and len(both["train"]) == rows - held - len(both["val"])
    # a count is the user's own choice: always held out
    assert len(held_out(rows, 0, 3, 0.0, False, labels=labels,
                        min_held_out_per_class=minimum)["val"]) == 3


def test_text_module_trains_on_every_text_when_its_validation_would_be_tiny(tmp_path):
    path = tmp_path / "texts.jsonl"
    path.write_text("".join(json.dumps({"text": f"text number {i}", "label": "ab"[i % 2]})
                            + "\n" for i in range(20)))
    small = TextClassificationDataModule(str(path), test=str(path), min_held_out_per_class=3)
    assert len(small.read_splits()["train"]) == 20 and len(small.read_splits()["val"]) == 0
    plain = TextClassificationDataModule(str(path), test=str(path))
    assert len(plain.read_splits()["val"]) == 2
    with pytest.raises(ValueError, match="min_held_out_per_class must be a whole number"):
        TextClassificationDataModule(str(path), min_held_out_per_class=-1)
