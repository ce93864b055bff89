"""Captions from your own files: CSV / JSONL manifests and COCO-captions JSON of real PNG /
JPEG files written here; splits by image; bad input; a CLIP fit step on a manifest."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from torchvision.io import write_jpeg, write_png
from torchvision.transforms.v2 import functional as TF

from multimodal.data.captions import CaptionDataModule


def make_images(folder, n=10, size=20):
    """n images of distinct solid colours, PNG and JPEG alternately; returns names."""
    (folder / "img").mkdir(parents=True, exist_ok=True)
    names = []
    for i in range(n):
        image = torch.zeros(3, size, size + 4, dtype=torch.uint8)
        image[0], image[1], image[2] = 20 * i, 255 - 20 * i, 100
        name = f"img/{i}.png" if i % 2 == 0 else f"img/{i}.jpg"
        (write_png if i % 2 == 0 else write_jpeg)(image, str(folder / name))
        names.append(name)
    return names


def colour_words(i):
    return f"image number {i} in colour {20 * i}"


def write_csv(path, rows):
    path.write_text("image,caption\n" + "".join(f"{im},{cap}\n" for im, cap in rows))


def test_csv_manifest_several_captions_per_image_split_by_image(tmp_path):
    names = make_images(tmp_path)
    rows = [(n, colour_words(i)) for i, n in enumerate(names)]
    rows += [(n, f"another caption of {i}") for i, n in enumerate(names)]
    write_csv(tmp_path / "caps.csv", rows)
    dm = CaptionDataModule(train=str(tmp_path / "caps.csv"), image_size=16, batch_size=4,
                           val_size=0.25, test_size=0.2, seed=1)
    dm.setup("fit")
    images = {k: set(v.images.tolist()) for k, v in dm.file_splits.items()}
    assert [len(images[k]) for k in ("train", "val", "test")] == [6, 2, 2]
    assert not (images["train"] & images["val"]) and not (images["train"] & images["test"])
    assert not (images["val"] & images["test"])
    for split in ("train", "val", "test"):  # every caption of an image goes with it
        assert len(dm.captions(split)) == 2 * len(images[split])
    # item = (the image resized and normalised with the training statistics, its caption)
    data = dm.split_dataset("val")
    image, caption = data[0]
    path = dm.file_splits["val"].images[int(dm.file_splits["val"].image_index[0])]
    i = int(re.search(r"(\d+)\.\w+$", path).group(1))
    assert caption in (colour_words(i), f"another caption of {i}")
    from torchvision.io import decode_image

    raw = TF.resize(decode_image(path), [16, 16], antialias=True).float() / 255
    want = (raw - dm.mean.view(3, 1, 1)) / dm.std.view(3, 1, 1)
    torch.testing.assert_close(image, want)
    # training statistics: mean over the training images' pixels, by hand
    train_px = torch.stack([TF.resize(decode_image(p), [16, 16], antialias=True).float() / 255
                            for p in sorted(images["train"])])
    torch.testing.assert_close(dm.mean, train_px.mean(dim=(0, 2, 3)), rtol=1e-5, atol=1e-6)
    batch = next(iter(dm.train_dataloader()))
    assert batch["images"].shape == (4, 3, 16, 16) and len(batch["captions"]) == 4


def test_jsonl_caption_lists_and_coco_json_read_the_same_pairs(tmp_path):
    names = make_images(tmp_path, n=4)
    with open(tmp_path / "caps.jsonl", "w") as f:
        for i, n in enumerate(names):
            f.write(json.dumps({"image": n, "caption": [colour_words(i), f"picture {i}"]}) + "\n")
    coco = {"images": [{"id": 100 + i, "file_name": n} for i, n in enumerate(names)],
            "annotations": [{"image_id": 100 + i, "id": k, "caption": c}
                            for k, (i, c) in enumerate(
                                [(i, colour_words(i)) for i in range(4)]
                                + [(i, f"picture {i}") for i in range(4)])]}
    (tmp_path / "coco.json").write_text(json.dumps(coco))
    pairs = []
    for manifest in ("caps.jsonl", "coco.json"):
        dm = CaptionDataModule(train=str(tmp_path / manifest), val=str(tmp_path / manifest),
                               test=str(tmp_path / manifest), image_size=8)
        dm.setup("fit")
        files = dm.file_splits["test"]
        pairs.append(sorted((files.images[int(j)].rsplit("/", 1)[1], c)
                            for j, c in zip(files.image_index, files.captions, strict=True)))
    assert pairs[0] == pairs[1] and len(pairs[0]) == 8
    assert ("0.png", colour_words(0)) in pairs[0] and ("3.jpg", "picture 3") in pairs[0]


def test_missing_images_name_the_first_and_count(tmp_path):
    names = make_images(tmp_path, n=3)
    write_csv(tmp_path / "caps.csv", [(names[0], "a"), ("img/gone.png", "b"),
                                      ("img/gone2.png", "c"), ("img/gone.png", "d")])
    with pytest.raises(FileNotFoundError, match=r"2 of 3 files are missing.*gone\.png"):
        CaptionDataModule(train=str(tmp_path / "caps.csv")).setup("fit")


def test_a_caption_that_tokenises_to_nothing_is_named(tmp_path):
    names = make_images(tmp_path, n=3)
    write_csv(tmp_path / "caps.csv", [(names[0], "a cat"), (names[1], "   ")])
    with pytest.raises(ValueError, match=r"caps\.csv:3: empty 'caption'"):
        CaptionDataModule(train=str(tmp_path / "caps.csv")).setup("fit")
    with open(tmp_path / "caps.jsonl", "w") as f:
        f.write(json.dumps({"image": names[0], "caption": ["fine", ""]}) + "\n")
    with pytest.raises(ValueError, match=r"caps\.jsonl:1: empty caption"):
        CaptionDataModule(train=str(tmp_path / "caps.jsonl")).setup("fit")


def test_coco_image_without_captions_is_an_error(tmp_path):
    names = make_images(tmp_path, n=2)
    coco = {"images": [{"id": 1, "file_name": names[0]}, {"id": 2, "file_name": names[1]}],
            "annotations": [{"image_id": 1, "caption": "only the first"}]}
    (tmp_path / "coco.json").write_text(json.dumps(coco))
    with pytest.raises(ValueError, match=r"1 image\(s\) have no caption.*1\.jpg"):
        CaptionDataModule(train=str(tmp_path / "coco.json")).setup("fit")


def test_clip_fit_step_on_a_tiny_manifest(tmp_path):
    import lightning as L

    import multimodal as mm
    from multimodal.tasks.contrastive import ContrastiveTask

    names = make_images(tmp_path, n=12)
    write_csv(tmp_path / "caps.csv", [(n, colour_words(i)) for i, n in enumerate(names)])
    L.seed_everything(0)
    model = mm.CLIP(mm.CLIPConfig(
        vision=mm.ViTConfig(image_size=16, patch_size=4, dim=16, depth=1, heads=2, mlp_dim=32,
                            pool="mean", class_token=False),
        text=mm.TextEncoderConfig(vocab_size=64, max_len=24, dim=16, depth=1, heads=2,
                                  mlp_dim=32), embed_dim=8))
    dm = CaptionDataModule(train=str(tmp_path / "caps.csv"), image_size=16, batch_size=4,
                           val_size=0.25, test_size=0.0)
    task = ContrastiveTask(model, optimizer={"lr": 1e-2, "warmup_fraction": 0.0},
                           recall_ks=(1, 2))
    before = [p.detach().clone() for p in model.parameters()]
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path,
                        enable_checkpointing=False)
    trainer.fit(task, dm)
    m = trainer.callback_metrics
    assert math.isfinite(float(m["train/loss"])) and "val/i2t_R@1" in m
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
