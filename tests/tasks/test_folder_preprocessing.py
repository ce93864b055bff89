"""A ``save_pretrained`` folder carries its image size (``config.json``) and, when written
by a task or an Encoder that knows it, its normalisation (``preprocessor_config.json``), so
fine-tuning or embedding from it needs no ``image_size`` / ``mean`` / ``std``; and the
files written are readable by others (0644 under the usual umask, not safetensors' 0600)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from PIL import Image

import multimodal as mm
from multimodal.convert.hf_preprocess import ImagePreprocessor, data_image_preprocessor
from multimodal.data.vision import ImageClassificationDataModule
from multimodal.tasks import ClassificationTask
from multimodal.tasks.pretrained import data_settings


def _vit(image_size: int = 28, channels: int = 1, classes: int = 2) -> mm.ViT:
    return mm.ViT(mm.ViTConfig(image_size=image_size, patch_size=7, in_channels=channels,
                               num_classes=classes, dim=16, depth=1, heads=2))


def _photos(root: Path, size: int = 30, mode: str = "L") -> Path:
    rng = np.random.default_rng(0)
    for c, name in enumerate(("a", "b")):
        (root / name).mkdir(parents=True)
        for i in range(4):
            shape = (size, size + 6) if mode == "L" else (size, size + 6, 3)
            pixels = rng.integers(0, 120, shape) + 100 * c
            Image.fromarray(pixels.astype(np.uint8), mode).save(root / name / f"{i}.png")
    return root


def _usual_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def test_a_save_pretrained_vit_folder_gives_the_data_its_size_and_channels(tmp_path):
    folder = _vit(image_size=28, channels=1).save_pretrained(tmp_path / "vit")
    assert data_settings(folder) == {"image_size": 28, "in_channels": 1}
    clip = mm.CLIP(mm.CLIPConfig(
        vision=mm.ViTConfig(image_size=32, patch_size=8, dim=16, depth=1, heads=2),
        text=mm.TextEncoderConfig(vocab_size=40, max_len=8, dim=16, depth=1, heads=2),
        embed_dim=8))
    assert data_settings(clip.save_pretrained(tmp_path / "clip")) == {"image_size": 32,
                                                                        "in_channels": 3}
    text = mm.TextEncoder(mm.TextEncoderConfig(vocab_size=40, max_len=8, dim=16, depth=1,
                                               heads=2))
    assert data_settings(text.save_pretrained(tmp_path / "text")) == {}
    # the image data module now builds from the folder alone (it said "image_size is
    # needed with your own images" before)
    dm = ImageClassificationDataModule(train=str(_photos(tmp_path / "photos")),
                                       **data_settings(folder))
    assert dm.image_size == 28 and dm.in_channels == 1


@pytest.mark.parametrize("mode,resize", [("L", None), ("RGB", 32)])
def test_the_data_module_preprocessing_as_a_folder_file_gives_the_same_pixels(
        tmp_path, mode, resize):
    photos = _photos(tmp_path / "photos", mode=mode)
    channels = 1 if mode == "L" else 3
    mean, std = [0.3] * channels, [0.2] * channels
    dm = ImageClassificationDataModule(train=str(photos), image_size=28, in_channels=channels,
                                       mean=mean, std=std, resize=resize,
                                       predict_dir=str(photos / "b"), batch_size=8)
    pre = data_image_preprocessor(dm)
    assert pre is not None
    pre.save(tmp_path)
    read = ImagePreprocessor.from_dict(
        json.loads((tmp_path / "preprocessor_config.json").read_text()))
    assert read.channels == channels
    dm.setup("predict")
    batch = next(iter(dm.predict_dataloader()))
    want = batch[0] if isinstance(batch, (list, tuple)) else batch
    files = sorted((photos / "b").glob("*.png"))
    got = read(files)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_a_task_and_an_encoder_save_pretrained_carry_the_normalisation(tmp_path):
    photos = _photos(tmp_path / "photos", mode="L")
    dm = ImageClassificationDataModule(train=str(photos), image_size=28, in_channels=1,
                                       batch_size=4, val_size=2, test_size=2)
    task = ClassificationTask(_vit(), optimizer={"lr": 1e-3})
    L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False, accelerator="cpu").fit(task, dm)
    folder = task.save_pretrained(tmp_path / "trained")
    settings = data_settings(folder)
    assert settings["image_size"] == 28 and settings["in_channels"] == 1
    assert settings["mean"] == pytest.approx(list(dm.mean), abs=1e-6)
    assert settings["std"] == pytest.approx(list(dm.std), abs=1e-6)
    # load_encoder reads it back; Encoder.save_pretrained writes it again
    enc = mm.load_encoder(folder)
    assert isinstance(enc.preprocessor, ImagePreprocessor) and enc.preprocessor.channels == 1
    again = enc.save_pretrained(tmp_path / "again")
    assert (again / "preprocessor_config.json").read_text() == \
        (folder / "preprocessor_config.json").read_text()
    files = sorted((photos / "a").glob("*.png"))[:2]
    torch.testing.assert_close(mm.load_encoder(again).encode(files), enc.encode(files))
    for file in (folder / "model.safetensors", again / "model.safetensors",
                 folder / "preprocessor_config.json"):
        assert stat.S_IMODE(file.stat().st_mode) == _usual_mode(), file


def test_safetensors_outputs_have_the_usual_mode(tmp_path):
    vit = _vit()
    lora = mm.apply_lora(vit, rank=2, alpha=4)
    path = mm.save_lora(lora, tmp_path / "adapters.safetensors")
    assert stat.S_IMODE(path.stat().st_mode) == _usual_mode()
    out = tmp_path / "emb.safetensors"
    photos = _photos(tmp_path / "photos", mode="L")
    encoder = mm.load_encoder(_vit())
    encoder.preprocessor = ImagePreprocessor(size=28, image_mean=[0.5], image_std=[0.5],
                                             channels=1)
    mm.embed(encoder, str(photos), out)
    assert stat.S_IMODE(out.stat().st_mode) == _usual_mode()
