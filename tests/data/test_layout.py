"""The data package organised by concern: the image data module takes any registered
source, and the helpers beside it (held-out splits, pixel statistics) compute what their
formulas say."""

from __future__ import annotations

import pytest
import torch

from multimodal.data import vision
from multimodal.data.splits import held_out, split_counts, split_size
from multimodal.data.vision_datasets import ImageSet, ImageSource, pixel_statistics


def _tiny_source(n: int = 40) -> ImageSource:
    """A source of ``n`` 2x3 grey images whose pixel values encode their row index."""
    images = torch.arange(n, dtype=torch.uint8).view(n, 1, 1).expand(n, 2, 3).contiguous()
    labels = torch.arange(n) % 4

    def read(root, split, download):
        assert split == "train"
        return ImageSet(images, labels, ("a", "b", "c", "d"))

    return ImageSource(image_size=3, in_channels=1, class_names=("a", "b", "c", "d"),
                       has_test_split=False, flip=False, read=read)


def test_the_image_data_module_takes_any_registered_source(monkeypatch) -> None:
    monkeypatch.setitem(vision.DATASETS, "tiny", _tiny_source())
    dm = vision.ImageClassificationDataModule("tiny", val_size=0.25, test_size=0.25,
                                              augment=False, image_size=3, batch_size=8)
    dm.setup("fit")
    assert dm.num_classes == 4 and dm.in_channels == 1
    rows = {s: dm.split_indices[s] for s in ("train", "val", "test")}
    # 40 rows: test = round(0.25 * 40) = 10, val = round(0.25 * 30) = 8, train the other 22
    assert [len(rows[s]) for s in ("train", "val", "test")] == [22, 8, 10]
    assert len(set(torch.cat(list(rows.values())).tolist())) == 40  # disjoint, all rows
    train_pixels = rows["train"].double() / 255.0  # every pixel of image i is i / 255
    assert dm.mean[0] == pytest.approx(float(train_pixels.mean()))
    x, y = dm.split_dataset("val")[0]
    i = int(rows["val"][0])
    torch.testing.assert_close(x, torch.full((1, 2, 3), (i / 255.0 - dm.mean[0]) / dm.std[0]))
    assert int(y) == i % 4


def test_unknown_source_names_the_registered_ones() -> None:
    with pytest.raises(ValueError, match=r"digits.*fashion_mnist.*mnist5k"):
        vision.ImageClassificationDataModule("nope")


def test_held_out_by_its_formula() -> None:
    idx = held_out(100, seed=3, val_size=0.1, test_size=20, has_test=False, limit_train=50)
    order = torch.randperm(100, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(idx["test"], order[:20].sort().values)
    torch.testing.assert_close(idx["val"], order[20:28].sort().values)  # round(0.1 * 80)
    torch.testing.assert_close(idx["train"], order[28:78].sort().values)
    given = held_out(10, seed=0, val_size=0.5, test_size=0.5, has_test=True, has_val=True)
    assert given["test"] is None and given["val"] is None and len(given["train"]) == 10
    assert split_size(0.25, 10, "x") == 2 and split_size(3, 10, "x") == 3  # round(2.5) == 2
    with pytest.raises(ValueError, match="x must be a fraction below 1 or a whole count"):
        split_size(2.5, 10, "x")
    assert split_counts(10, 0.1, 0.2) == (1, 2) and split_counts(2, 0.1, 0.2) == (0, 1)


def test_pixel_statistics_by_hand() -> None:
    g = torch.Generator().manual_seed(0)
    images = [torch.rand(2, 3, 4, generator=g, dtype=torch.float64) for _ in range(5)]
    mean, std = pixel_statistics([(x, 0) for x in images] + [None], channels=2)
    allpix = torch.stack(images).transpose(0, 1).reshape(2, -1)  # (C, every pixel)
    torch.testing.assert_close(torch.tensor(mean, dtype=torch.float64), allpix.mean(dim=1))
    torch.testing.assert_close(torch.tensor(std, dtype=torch.float64),
                               allpix.std(dim=1, correction=0))
    with pytest.raises(ValueError, match="no training image"):
        pixel_statistics([None], channels=2)


@pytest.mark.parametrize("argv,says", [
    (["spoken-words", "--help"], ["--takes-per-word", "--samples-dir"]),
    (["tts", "--help"], ["--fit-clips"]),
])
def test_the_synthesis_recipes_run_as_a_module(argv, says, monkeypatch, capsys) -> None:
    """data/get_audio.sh and data/get_tts.sh run the recipes as ``python -m
    multimodal.cli.datasets KIND``."""
    _run_module("multimodal.cli.datasets", argv, monkeypatch, code=0)
    out = capsys.readouterr().out
    assert all(option in out for option in says)


@pytest.mark.parametrize("module,kind", [("multimodal.data.sources.spoken_words", "spoken-words"),
                                         ("multimodal.data.audio", "spoken-words"),
                                         ("multimodal.data.tts", "tts")])
def test_the_old_recipe_paths_name_the_new_one(module, kind, monkeypatch) -> None:
    message = _run_module(module, ["--help"], monkeypatch)
    assert message == f"this recipe moved: python -m multimodal.cli.datasets {kind} [--help]"


def _run_module(module: str, argv: list[str], monkeypatch, code: int | None = None):
    import runpy
    import warnings

    monkeypatch.setattr("sys.argv", [module, *argv])
    with warnings.catch_warnings():  # runpy warns that the module is already imported
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(SystemExit) as exit_info:
            runpy.run_module(module, run_name="__main__")
    if code is not None:
        assert exit_info.value.code == code
    return exit_info.value.code
