"""A checkpoint reads images as the run that wrote it did: the same file gives the same
tensor through ``fit``'s data module (its evaluation transform) and through ``mm.embed`` /
``multimodal predict`` of the checkpoint, with a resize + centre crop and a bicubic
interpolation (which the checkpoint path used to drop), with normalisation given in the
config and measured on the training images."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from PIL import Image

import multimodal as mm
from multimodal.cli.main import main as cli_main
from multimodal.data.vision import ImageClassificationDataModule
from multimodal.files import read_image
from multimodal.pipelines._loaders import model_encoder
from multimodal.tasks import ClassificationTask

DATA = {"image_size": 16, "resize": 20, "interpolation": "bicubic", "in_channels": 3,
        "val_size": 2, "test_size": 0, "batch_size": 4, "augment": False}


def _photos(root: Path) -> Path:
    """Two classes of 5 RGB pictures of uneven sizes (so the resize keeps an aspect ratio
    and the crop cuts), in two formats."""
    rng = np.random.default_rng(0)
    for c, name in enumerate(("a", "b")):
        (root / name).mkdir(parents=True)
        for i in range(5):
            pixels = rng.integers(0, 140, (23 + i, 31 - i, 3)) + 100 * c
            ext = ".png" if i % 2 else ".bmp"
            Image.fromarray(pixels.astype(np.uint8)).save(root / name / f"{i}{ext}")
    return root


def _vit() -> mm.ViT:
    return mm.ViT(mm.ViTConfig(image_size=16, patch_size=8, in_channels=3, num_classes=2,
                               dim=16, depth=1, heads=2))


def _fit_tensors(dm: ImageClassificationDataModule) -> tuple[list[str], torch.Tensor]:
    """The validation files and the tensors fit's data module makes of them."""
    dm.setup("fit")
    files = [str(p) for p in dm._load_file_splits()["val"].paths]
    data = dm.split_dataset("val")
    return files, torch.stack([data[i][0] for i in range(len(files))])


def _same_through_embed(ckpt: Path, files: list[str], want: torch.Tensor) -> None:
    encoder = model_encoder(ckpt)  # what mm.embed / zero-shot / serve load
    got = encoder.preprocessor(files)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    ids, emb = mm.embed(ckpt, files)
    assert ids == files
    with torch.no_grad():
        torch.testing.assert_close(emb, encoder.pool(encoder(want)), atol=1e-5, rtol=1e-5)


def test_embed_of_a_checkpoint_reads_as_fit_did_with_given_normalisation(tmp_path):
    photos = _photos(tmp_path / "photos")
    dm = ImageClassificationDataModule(train=str(photos), mean=[0.4, 0.5, 0.6],
                                       std=[0.2, 0.25, 0.3], **DATA)
    task = ClassificationTask(_vit(), optimizer={"lr": 1e-3})
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        accelerator="cpu", limit_val_batches=0)
    trainer.fit(task, dm)
    ckpt = tmp_path / "run.ckpt"
    trainer.save_checkpoint(ckpt)
    files, want = _fit_tensors(
        ImageClassificationDataModule(train=str(photos), mean=[0.4, 0.5, 0.6],
                                      std=[0.2, 0.25, 0.3], **DATA))
    # the resize and crop are there: a plain resize to 16 x 16 gives other pixels
    plain = mm.load(ckpt).preprocessor
    assert plain.do_center_crop and plain.size == {"shortest_edge": 20} and plain.resample == 3
    _same_through_embed(ckpt, files, want)


@pytest.mark.slow
def test_embed_and_predict_of_a_cli_checkpoint_read_as_fit_did(tmp_path, capsys):
    """Through the ``multimodal`` command, the normalisation measured on the training
    images (in no argument of the checkpoint: measured again by its data module)."""
    photos = _photos(tmp_path / "photos")
    config = tmp_path / "fit.yaml"
    args = ", ".join(f"{k}: {v}" for k, v in DATA.items())
    config.write_text(f"""
model:
  class_path: multimodal.tasks.ClassificationTask
  init_args:
    model:
      class_path: multimodal.ViT
      init_args:
        config: {{image_size: 16, patch_size: 8, in_channels: 3, num_classes: 2, dim: 16,
                  depth: 1, heads: 2}}
data:
  class_path: multimodal.data.vision.ImageClassificationDataModule
  init_args: {{train: {photos}, {args}}}
trainer:
  accelerator: cpu
  max_steps: 2
  limit_val_batches: 1
  enable_progress_bar: false
  logger: false
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {{dirpath: {tmp_path / "ckpt"}, save_last: true}}
""")
    cli_main(["fit", "--config", str(config)])
    ckpt = tmp_path / "ckpt" / "last.ckpt"
    assert "mean" not in mm.load(ckpt).data_arguments or \
        mm.load(ckpt).data_arguments["mean"] is None
    files, want = _fit_tensors(ImageClassificationDataModule(train=str(photos), **DATA))
    _same_through_embed(ckpt, files, want)
    # predict: a folder of those files, one line per file with the class and confidence
    # the model gives fit's tensors
    folder = tmp_path / "new"
    folder.mkdir()
    for i, f in enumerate(files):
        (folder / f"{i}{Path(f).suffix}").write_bytes(Path(f).read_bytes())
    capsys.readouterr()
    cli_main(["predict", "--ckpt_path", str(ckpt), "--data.init_args.predict", str(folder)])
    lines = [ln.split("\t") for ln in capsys.readouterr().out.splitlines() if "\t" in ln]
    model = mm.load(ckpt).model
    with torch.no_grad():
        probs = model(want).softmax(-1)
    assert [ln[0] for ln in lines] == [f"{i}{Path(f).suffix}" for i, f in enumerate(files)]
    for (_, name, conf), p in zip(lines, probs, strict=True):
        assert name == ("a", "b")[int(p.argmax())]
        assert float(conf) == pytest.approx(float(p.max()), abs=1e-3)
    assert read_image(files[0]).shape[0] == 3
