"""Your own images: class folders and manifests, checked against torchvision's ImageFolder
and PIL on real files written in the test."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch
from PIL import Image

from multimodal.data.readers import (
    CorruptFileError,
    read_labelled_manifest,
    scan_class_folders,
)
from multimodal.data.vision import ImageClassificationDataModule
from multimodal.data.vision_transforms import ImageTransformConfig, image_transform
from multimodal.files import read_image as decode_image_file

RNG = np.random.default_rng(0)
EXTS = (".png", ".jpg", ".webp", ".bmp", ".gif")


def reference_folder(root):
    """torchvision's ImageFolder over the same extensions (its default list lacks .gif)."""
    from torchvision.datasets import ImageFolder

    return ImageFolder(str(root), is_valid_file=lambda p: p.lower().endswith(EXTS))


def rgb(h: int = 10, w: int = 12) -> np.ndarray:
    return RNG.integers(0, 256, size=(h, w, 3), dtype=np.uint8)


def save(path, image: Image.Image, **kwargs) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, **kwargs)


def make_folder(root, per_class: int = 3) -> None:
    """Classes named so that case and digits matter for the sort order; mixed formats."""
    kinds = [
        ("png", lambda a: Image.fromarray(a)),
        ("jpg", lambda a: Image.fromarray(a)),
        ("webp", lambda a: Image.fromarray(a)),
        ("bmp", lambda a: Image.fromarray(a)),
        ("gif", lambda a: Image.fromarray(a).convert("P")),
    ]
    for c, cls in enumerate(["b_cls", "B", "a", "10", "9"]):
        for i in range(per_class):
            ext, make = kinds[(c + i) % len(kinds)]
            save(root / cls / f"img{i:02d}.{ext}", make(rgb(8 + i, 9 + c)))
    save(root / "a" / "sub" / "deep.png", Image.fromarray(rgb()))


def test_class_folder_matches_torchvision_imagefolder(tmp_path):
    make_folder(tmp_path)
    files = scan_class_folders(tmp_path, EXTS)
    ref = reference_folder(tmp_path)
    assert list(files.class_names) == ref.classes == ["10", "9", "B", "a", "b_cls"]
    assert [str(p) for p in files.paths] == [s[0] for s in ref.samples]
    assert files.labels.tolist() == ref.targets


def test_decode_matches_pil_for_every_format_and_mode(tmp_path):
    a = rgb()
    cases = {
        "rgb.png": Image.fromarray(a),
        "rgba.png": Image.fromarray(np.dstack([a, a[..., :1]])),
        "grey.png": Image.fromarray(a[..., 0]),
        "la.png": Image.fromarray(np.dstack([a, a[..., :1]])).convert("LA"),
        "palette.png": Image.fromarray(a).convert("P"),
        "rgb.webp": Image.fromarray(a),
        "rgb.bmp": Image.fromarray(a),
        "frame.gif": Image.fromarray(a).convert("P"),
    }
    for name, image in cases.items():
        kwargs = {"lossless": True} if name.endswith(".webp") else {}
        save(tmp_path / name, image, **kwargs)
    for name in cases:
        with Image.open(tmp_path / name) as im:
            for channels, mode in ((3, "RGB"), (4, "RGBA"), (1, "L")):
                ours = decode_image_file(tmp_path / name, channels)
                ref = np.asarray(im.convert(mode)).reshape(im.size[1], im.size[0], -1)
                assert ours.shape == (channels, 10, 12) and ours.dtype == torch.uint8, name
                diff = (ours.permute(1, 2, 0).numpy().astype(int) - ref.astype(int))
                # grey: torchvision's luma rounds differently from PIL's by at most 1
                assert np.abs(diff).max() <= (1 if channels == 1 else 0), (name, mode)


def test_decode_jpeg_cmyk_and_16_bit(tmp_path):
    a = rgb()
    Image.fromarray(a).convert("CMYK").save(tmp_path / "cmyk.jpg", quality=95)
    ours = decode_image_file(tmp_path / "cmyk.jpg", 3).permute(1, 2, 0).numpy().astype(int)
    with Image.open(tmp_path / "cmyk.jpg") as im:
        ref = np.asarray(im.convert("RGB")).astype(int)
    assert np.abs(ours - ref).max() <= 1
    assert decode_image_file(tmp_path / "cmyk.jpg", 4)[3].eq(255).all()  # opaque alpha

    wide = RNG.integers(0, 65536, size=(6, 7), dtype=np.uint16)
    Image.fromarray(wide).save(tmp_path / "g16.png")
    ours = decode_image_file(tmp_path / "g16.png", 1)[0].numpy().astype(np.int64)
    expected = np.floor((wide.astype(np.int64) * 255 + 32767) / 65535)  # round(v * 255/65535)
    np.testing.assert_array_equal(ours, expected)


def test_corrupt_and_truncated_files_are_named(tmp_path):
    Image.fromarray(rgb(32, 32)).save(tmp_path / "ok.png")
    data = (tmp_path / "ok.png").read_bytes()
    (tmp_path / "truncated.png").write_bytes(data[: len(data) // 2])
    (tmp_path / "garbage.jpg").write_bytes(b"\xff\xd8\xff" + b"\x00" * 50)
    for name in ("truncated.png", "garbage.jpg"):
        with pytest.raises(CorruptFileError, match=name):
            decode_image_file(tmp_path / name, 3)


# -------------------------------------------------------------------------- DataModule


def module(**kwargs) -> ImageClassificationDataModule:
    args = {"image_size": 8, "batch_size": 4, "val_size": 0.2, "test_size": 0.2}
    return ImageClassificationDataModule(**{**args, **kwargs})


def test_folder_module_batches_and_labels(tmp_path):
    make_folder(tmp_path, per_class=6)
    dm = module(train=str(tmp_path), augment=False, batch_size=64, val_size=0, test_size=0)
    assert dm.num_classes == 5 and dm.in_channels == 3  # known before setup
    dm.setup("fit")
    x, y = next(iter(dm.loader(dm.split_dataset("train"), shuffle=False)))
    ref = reference_folder(tmp_path)
    assert x.shape == (len(ref), 3, 8, 8) and y.tolist() == ref.targets
    # pixels: the v2 resize of the decoded file, normalised with the training statistics
    from torchvision.transforms.v2 import functional as TF

    first = torch.from_numpy(np.array(ref[0][0])).permute(2, 0, 1)
    resized = TF.resize(first, [8, 8], antialias=True).float() / 255
    mean = torch.tensor(dm.mean).view(3, 1, 1)
    std = torch.tensor(dm.std).view(3, 1, 1)
    torch.testing.assert_close(x[0], (resized - mean) / std)
    # the statistics are those of all training images after resizing (stats_samples > n)
    pixels = torch.stack([
        TF.resize(torch.from_numpy(np.asarray(img)).permute(2, 0, 1), [8, 8], antialias=True)
        for img, _ in ref
    ]).double() / 255
    torch.testing.assert_close(torch.tensor(dm.mean, dtype=torch.float64),
                               pixels.mean(dim=(0, 2, 3)))
    torch.testing.assert_close(torch.tensor(dm.std, dtype=torch.float64),
                               pixels.std(dim=(0, 2, 3), unbiased=False))


def test_held_out_and_given_splits(tmp_path):
    make_folder(tmp_path / "train", per_class=10)
    dm = module(train=str(tmp_path / "train"))
    dm.setup("fit")
    idx = dm.split_indices
    n = 51  # 5 classes x 10 + one nested file
    assert len(idx["test"]) == round(0.2 * n) and len(idx["val"]) == round(0.2 * (n - 10))
    parts = [set(idx[k].tolist()) for k in ("train", "val", "test")]
    assert set.union(*parts) == set(range(n)) and sum(map(len, parts)) == n
    make_folder(tmp_path / "val", per_class=2)
    dm = module(train=str(tmp_path / "train"), val=str(tmp_path / "val"), test_size=0)
    dm.setup("fit")
    assert len(dm.split_dataset("train")) == n and len(dm.split_dataset("val")) == 11
    assert dm.mean == module(train=str(tmp_path / "train"), val_size=0, test_size=0).mean


def test_manifests_csv_and_jsonl_give_the_folder_items(tmp_path):
    make_folder(tmp_path / "imgs")
    files = scan_class_folders(tmp_path / "imgs", EXTS)
    rel = [str(p).removeprefix(str(tmp_path) + "/") for p in files.paths]
    names = [files.class_names[i] for i in files.labels]
    (tmp_path / "m.csv").write_text(
        "path,label\n" + "".join(f"{p},{c}\n" for p, c in zip(rel, names, strict=True))
    )
    (tmp_path / "m.jsonl").write_text(
        "".join(json.dumps({"path": p, "label": c}) + "\n" for p, c in zip(rel, names, strict=True))
    )
    for name in ("m.csv", "m.jsonl"):
        got = read_labelled_manifest(tmp_path / name)
        assert got.class_names == files.class_names
        assert got.labels.tolist() == files.labels.tolist()
        assert [str(p) for p in got.paths] == [str(p) for p in files.paths]
    dm = module(train=str(tmp_path / "m.csv"), val=str(tmp_path / "m.jsonl"), test_size=0)
    dm.setup("fit")
    x, y = next(iter(dm.val_dataloader()))
    assert x.shape == (4, 3, 8, 8) and y.tolist() == files.labels[:4].tolist()


def test_manifest_errors_name_the_problem(tmp_path):
    Image.fromarray(rgb()).save(tmp_path / "a.png")
    (tmp_path / "m.csv").write_text("path,label\na.png,cat\nb.png,dog\nc.png,dog\n")
    with pytest.raises(FileNotFoundError, match=r"2 of 3 files are missing.*b\.png"):
        read_labelled_manifest(tmp_path / "m.csv")
    (tmp_path / "v.csv").write_text("path,label\na.png,cat\na.png,bird\n")
    with pytest.raises(ValueError, match=r"v\.csv:3: label 'bird' is not in the class list"):
        read_labelled_manifest(tmp_path / "v.csv", ["cat", "dog"])
    (tmp_path / "h.csv").write_text("file,label\na.png,cat\n")
    with pytest.raises(ValueError, match=r"h\.csv:1: no 'path' column in the header "
                                         r"\['file', 'label'\]"):
        read_labelled_manifest(tmp_path / "h.csv")
    (tmp_path / "j.jsonl").write_text('{"path": "a.png"}\n')
    with pytest.raises(ValueError, match=r"j\.jsonl:1: no 'label' field"):
        read_labelled_manifest(tmp_path / "j.jsonl")


def test_folder_errors(tmp_path):
    make_folder(tmp_path / "t", per_class=2)
    (tmp_path / "t" / "empty").mkdir()
    with pytest.raises(ValueError, match=r"empty class folder .*empty"):
        module(train=str(tmp_path / "t")).setup("fit")
    (tmp_path / "t" / "empty").rmdir()
    make_folder(tmp_path / "v", per_class=1)
    (tmp_path / "v" / "zebra").mkdir()
    Image.fromarray(rgb()).save(tmp_path / "v" / "zebra" / "z.png")
    with pytest.raises(ValueError, match=r"\['zebra'\] not in the class list"):
        module(train=str(tmp_path / "t"), val=str(tmp_path / "v")).setup("fit")
    with pytest.raises(ValueError, match="image_size is needed"):
        ImageClassificationDataModule(train=str(tmp_path / "t"))


def test_corrupt_file_error_or_skip_with_count(tmp_path, caplog):
    make_folder(tmp_path, per_class=4)
    (tmp_path / "a" / "zz_broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage")
    # verify_files (the default): found when the splits are made, before any batch
    dm = module(train=str(tmp_path), val_size=0, test_size=0, mean=0.5, std=0.25)
    with pytest.raises(CorruptFileError, match=r"zz_broken\.png: not a readable image \("):
        dm.setup("fit")
    # without the check: found when the loader reads it
    dm = module(train=str(tmp_path), val_size=0, test_size=0, mean=0.5, std=0.25,
                verify_files=False)
    dm.setup("fit")
    with pytest.raises(CorruptFileError, match=r"zz_broken\.png"):
        list(dm.train_dataloader())
    dm = module(train=str(tmp_path), val_size=0, test_size=0, skip_corrupt=True,
                verify_files=False)
    dm.setup("fit")
    seen = 0
    for batch in dm.train_dataloader():
        x, y = dm.on_before_batch_transfer(batch, 0)
        assert len(x) == len(y)
        seen += len(y)
    assert seen == 5 * 4 + 1 and dm.skipped == {0: 1}  # every readable file, once
    with caplog.at_level(logging.WARNING):
        dm.teardown("fit")
    assert "epoch 0: skipped 1 corrupt image file(s)" in caplog.text
    # skip_corrupt with the check: left out of its split once, every batch whole
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        dm = module(train=str(tmp_path), val_size=0, test_size=0, skip_corrupt=True)
        dm.setup("fit")
    assert "train: left out 1 corrupt image file(s) of 22" in caplog.text
    assert len(dm._load_file_splits()["train"]) == 21
    seen = sum(len(dm.on_before_batch_transfer(b, 0)[1]) for b in dm.train_dataloader())
    assert seen == 21 and not any(dm.skipped.values())


def test_every_file_is_decoded_once_before_training(tmp_path, monkeypatch):
    from multimodal.data.readers import file_lists

    make_folder(tmp_path, per_class=3)
    decoded: list[str] = []
    real = file_lists.read_image
    monkeypatch.setattr(file_lists, "read_image",
                        lambda path, channels: decoded.append(str(path)) or real(path, channels))
    dm = module(train=str(tmp_path), val_size=0.2, test_size=0.2, mean=0.5, std=0.25)
    dm.setup("fit")
    files = [str(p) for split in dm._load_file_splits().values() for p in split.paths]
    assert sorted(decoded) == sorted(files) and len(set(decoded)) == len(decoded)


def test_given_normalisation_and_augment_options(tmp_path):
    make_folder(tmp_path, per_class=2)
    dm = module(train=str(tmp_path), in_channels=1, mean=0.5, std=0.25,
                random_resized_crop=0.5, auto_augment="trivial", val_size=0, test_size=0)
    dm.setup("fit")
    assert dm.mean == (0.5,) and dm.std == (0.25,)
    x, _ = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 1, 8, 8)
    assert float(x.min()) >= -2.0 - 1e-6 and float(x.max()) <= 2.0 + 1e-6  # (0..1 - .5)/.25
    for aug in ("rand", "trivial", None):
        t = image_transform(ImageTransformConfig(16, (0.0,) * 3, (1.0,) * 3, shift=True,
                                                 flip=True, auto_augment=aug), train=True)
        assert t(torch.zeros(3, 20, 30, dtype=torch.uint8)).shape == (3, 16, 16)
    with pytest.raises(ValueError, match="auto_augment"):
        module(train=str(tmp_path), auto_augment="cutmix")
    with pytest.raises(ValueError, match="mean and std together"):
        module(train=str(tmp_path), mean=0.5)


def test_color_jitter_changes_colour_not_geometry_and_greys_one_image_in_five():
    """SimCLR's colour distortion: a red square on blue keeps its place (the pixel-wise
    changes are colour maps, so the square's mask is the same), its colours change in about
    0.8 of the draws and it turns grey (R = G = B) in about 0.2 of them."""
    torch.manual_seed(0)
    image = torch.zeros(3, 16, 16, dtype=torch.uint8)
    image[2] = 200
    image[:, 4:10, 4:10] = torch.tensor([220, 30, 30], dtype=torch.uint8)[:, None, None]
    config = ImageTransformConfig(16, (0.0,) * 3, (1.0,) * 3, color_jitter=0.5)
    jitter = image_transform(config, train=True)
    same, grey, draws = 0, 0, 2000
    inside = torch.zeros(16, 16, dtype=torch.bool)
    inside[4:10, 4:10] = True
    for _ in range(draws):
        x = jitter(image)
        assert x.shape == (3, 16, 16)
        # every pixel of the square equals every other pixel of it, and the ground likewise
        assert torch.allclose(x[:, inside], x[:, inside][:, :1], atol=1e-6)
        assert torch.allclose(x[:, ~inside], x[:, ~inside][:, :1], atol=1e-6)
        same += bool(torch.allclose(x, image.float() / 255, atol=1e-6))
        grey += bool(torch.allclose(x[0], x[1], atol=2 / 255)
                     and torch.allclose(x[1], x[2], atol=2 / 255))
    # P(untouched) = 0.2 (no jitter) * 0.8 (no grey) = 0.16; P(grey) = 0.2; binomial
    # standard deviations at n = 2000 are ~0.008 and ~0.009: margins of ~5 of them
    assert abs(same / draws - 0.16) < 0.04
    assert abs(grey / draws - 0.2) < 0.045
    assert image_transform(config, train=False)(image).allclose(image.float() / 255)
    with pytest.raises(ValueError, match="color_jitter"):
        ImageTransformConfig(16, (0.0,), (1.0,), color_jitter=2.0)


def test_color_jitter_is_for_your_own_images():
    for option in ({"color_jitter": 0.5}, {"invert": 0.5}):
        with pytest.raises(ValueError, match="color_jitter and invert apply to your own"):
            ImageClassificationDataModule(dataset="digits", **option)


def test_invert_draws_the_negative_image_with_its_probability():
    torch.manual_seed(0)
    image = torch.randint(0, 256, (3, 8, 8), dtype=torch.uint8)
    flip = image_transform(ImageTransformConfig(8, (0.0,) * 3, (1.0,) * 3, invert=0.3),
                           train=True)
    negative, draws = 0, 2000
    for _ in range(draws):
        x = flip(image)
        is_negative = torch.allclose(x, (255 - image).float() / 255, atol=1e-6)
        assert is_negative or torch.allclose(x, image.float() / 255, atol=1e-6)
        negative += is_negative
    assert abs(negative / draws - 0.3) < 0.05  # binomial sd ~0.010 at n = 2000
    with pytest.raises(ValueError, match="invert is a probability"):
        ImageTransformConfig(8, (0.0,), (1.0,), invert=1.5)
