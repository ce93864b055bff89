"""A fine-tune reads its pretrained PATH once: one resolution of the path, one
``torch.load`` of a checkpoint, one parse of a folder's ``config.json``, one model built
(with the overrides already in its config), through the task API and through
``multimodal fit``. Counted by wrapping the readers and the model's constructor."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import multimodal.installed
import multimodal.loading
import multimodal.tasks.pretrained as pretrained_mod
from multimodal import ViT, ViTConfig
from multimodal.cli.main import main as cli_main
from multimodal.tasks import ClassificationTask
from multimodal.weights import config_to_dict

ROOT = Path(__file__).resolve().parents[2]
CLASSES = ("ant", "bee", "cat")


def _vit(num_classes: int = 0) -> ViT:
    torch.manual_seed(0)
    return ViT(ViTConfig(image_size=8, patch_size=4, in_channels=3, num_classes=num_classes,
                         dim=16, depth=1, heads=2, mlp_dim=32))


def _checkpoint(path: Path, model: ViT) -> Path:
    """A checkpoint as one of our tasks writes it: the model under ``model.``, its type and
    config, the data module's arguments (image size, normalisation)."""
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                "multimodal_model": {"model_type": "ViT",
                                     "model_config": config_to_dict(model.config)},
                "class_names": ["x", "y"],
                "datamodule_hyper_parameters": {
                    "_class_path": "multimodal.data.vision.ImageClassificationDataModule",
                    "image_size": 8, "in_channels": 3, "mean": [0.5] * 3, "std": [0.25] * 3}},
               path)
    return path


def _images(root: Path, per_class: int = 4) -> Path:
    rng = np.random.default_rng(0)
    for c, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 80, (8, 8, 3)) + 80 * c
            Image.fromarray(pixels.astype(np.uint8)).save(root / name / f"{i}.png")
    return root


class Counts:
    """Wraps ``torch.load``, ``Path.read_text`` (of ``config.json``), ``resolve_weights``
    and ``ViT.__init__``; counts the calls that concern ``target`` (and real builds: a model
    built on ``meta`` to check shapes allocates nothing and is not counted)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, target: Path) -> None:
        self.target = str(target)
        self.loads = self.config_reads = self.resolutions = self.builds = self.meta_builds = 0
        load, read_text, resolve = torch.load, Path.read_text, multimodal.installed.resolve_weights
        init = ViT.__init__

        def counting_load(f, *args, **kwargs):
            self.loads += str(f) == self.target
            return load(f, *args, **kwargs)

        def counting_read_text(path, *args, **kwargs):
            self.config_reads += path.name == "config.json" and str(path.parent) == self.target
            return read_text(path, *args, **kwargs)

        def counting_resolve(path):
            self.resolutions += str(path) == self.target
            return resolve(path)

        def counting_init(model, *args, **kwargs):
            on_meta = torch.empty(()).device.type == "meta"
            self.meta_builds += on_meta
            self.builds += not on_meta
            init(model, *args, **kwargs)

        monkeypatch.setattr(torch, "load", counting_load)
        monkeypatch.setattr(Path, "read_text", counting_read_text)
        monkeypatch.setattr(multimodal.loading, "resolve_weights", counting_resolve)
        monkeypatch.setattr(ViT, "__init__", counting_init)

    def once(self) -> dict[str, int]:
        return {"resolutions": self.resolutions, "builds": self.builds}


def test_task_api_reads_a_checkpoint_once_and_builds_one_model(tmp_path, monkeypatch):
    """ClassificationTask(pretrained=ckpt) with a head of another class count and a changed
    dropout: one torch.load, one real ViT; the body's weights are the checkpoint's, the head
    is new, the config carries the overrides."""
    source = _vit(num_classes=2)
    ckpt = _checkpoint(tmp_path / "run.ckpt", source)
    counts = Counts(monkeypatch, ckpt)
    task = ClassificationTask(pretrained=str(ckpt), num_classes=3,
                              overrides={"drop_path": 0.1})
    assert counts.once() == {"resolutions": 1, "builds": 1} and counts.loads == 1
    model = task.model
    assert model.config.num_classes == 3 and model.config.drop_path == 0.1
    for name, value in source.state_dict().items():
        if not name.startswith("head"):
            torch.testing.assert_close(model.state_dict()[name], value, rtol=0, atol=0)
    assert model.head.weight.shape == (3, 16)


def test_an_override_that_changes_the_architecture_fails_before_a_model_is_built(
        tmp_path, monkeypatch):
    ckpt = _checkpoint(tmp_path / "run.ckpt", _vit())
    counts = Counts(monkeypatch, ckpt)
    with pytest.raises(ValueError, match=r"change the architecture: .*pos_embed"):
        ClassificationTask(pretrained=str(ckpt), num_classes=3, overrides={"image_size": 16})
    assert counts.builds == 0


def test_a_save_pretrained_folder_parses_its_config_once_per_load(tmp_path, monkeypatch):
    from multimodal.loading import load

    folder = _vit().save_pretrained(tmp_path / "vit")
    counts = Counts(monkeypatch, folder)
    load(folder)
    assert counts.config_reads == 1 and counts.builds == 1


def _fit(pretrained: Path, train: Path, root: Path) -> None:
    cli_main(["fit", "--config", str(ROOT / "configs" / "finetune_image.yaml"),
              "--model.init_args.pretrained", str(pretrained),
              "--model.init_args.finetune.regime", "full",
              "--data.init_args.train", str(train), "--data.init_args.batch_size", "4",
              "--data.init_args.num_workers", "0", "--data.init_args.val_size", "0",
              "--data.init_args.test_size", "0",
              "--trainer.max_steps", "1", "--trainer.min_steps", "0",
              "--trainer.max_epochs", "1", "--trainer.logger", "false",
              "--trainer.enable_progress_bar", "false", "--trainer.accelerator", "cpu",
              "--trainer.default_root_dir", str(root), "--early_stopping", "null",
              "--budget_minutes", "null", "--test_after_fit", "false"])


@pytest.mark.parametrize("kind", ["checkpoint", "save_pretrained"])
def test_multimodal_fit_reads_its_pretrained_path_once(kind, tmp_path, monkeypatch):
    """``multimodal fit --config configs/finetune_image.yaml`` from a checkpoint / a
    save_pretrained folder: the data follows the model (image size from PATH), the task
    builds the model, and PATH was resolved once, torch.load-ed or its config.json parsed
    once, and one ViT built."""
    train = _images(tmp_path / "photos")
    if kind == "checkpoint":
        path = _checkpoint(tmp_path / "run.ckpt", _vit(num_classes=2))
    else:
        path = _vit().save_pretrained(tmp_path / "vit")
    pretrained_mod.clear_sources()
    counts = Counts(monkeypatch, path)
    _fit(path, train, tmp_path / "out")
    assert counts.once() == {"resolutions": 1, "builds": 1}
    if kind == "checkpoint":
        assert counts.loads == 1
    else:
        assert counts.config_reads == 1
    assert any((tmp_path / "out").glob("version_*/checkpoints/last.ckpt"))


@pytest.mark.slow  # a fresh interpreter (the fast suite checks the main job's imports:
# tests/test_dependencies.py::test_main_job_first_step_and_text_embedding_never_import_torchaudio)
def test_loading_imports_no_gguf_or_ctranslate2_reader(tmp_path):
    """``import multimodal.loading``, and a text classifier fine-tuned from a BERT-style
    encoder's folder, leave the GGUF and CTranslate2 readers unimported."""
    code = f"""
import sys
import multimodal.loading
before = [m for m in sys.modules if 'gguf' in m or 'ctranslate2' in m]
import multimodal.cli.main
from multimodal import TextEncoder, TextEncoderConfig
from multimodal.tasks import ClassificationTask
folder = TextEncoder(TextEncoderConfig(vocab_size=50, max_len=16, dim=16, depth=1, heads=2,
                                       mlp_dim=32)).save_pretrained({str(tmp_path / "enc")!r})
ClassificationTask(pretrained=str(folder), num_classes=2)
after = [m for m in sys.modules if 'gguf' in m or 'ctranslate2' in m]
print(before, after)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.strip().splitlines()[-1]
    assert out == "[] []"


def test_the_one_model_holds_the_weights_with_ties_kept_and_a_drawn_head(tmp_path):
    """The model built from PATH takes its tensors (assigned, not drawn then copied over):
    weights tied in the architecture stay one parameter; a tensor given for two weights that
    are not tied becomes two (an update of one leaves the other); the new head is drawn as
    init_weights draws it (|w| <= 2 * 0.02, zero bias)."""
    from multimodal import TextEncoder, TextEncoderConfig
    from multimodal.tasks.pretrained import _build_loaded

    config = TextEncoderConfig(vocab_size=40, max_len=8, dim=16, depth=1, heads=2, mlp_dim=32,
                               mlm_head=True)
    source = TextEncoder(config)
    state = source.state_dict()
    model = _build_loaded(TextEncoder, config, dict(state))
    assert model.mlm.decoder.weight is model.tok_embed.weight  # tied: one parameter
    for name, value in state.items():
        torch.testing.assert_close(model.state_dict()[name], value, rtol=0, atol=0)
    # norm1's weight and norm2's given the same tensor: two parameters after the build
    shared = dict(state)
    shared["transformer.blocks.0.norm2.weight"] = shared["transformer.blocks.0.norm1.weight"]
    model = _build_loaded(TextEncoder, config, shared)
    with torch.no_grad():
        model.transformer.blocks[0].norm1.weight.add_(1.0)
    assert not torch.equal(model.transformer.blocks[0].norm1.weight,
                           model.transformer.blocks[0].norm2.weight)
    # a new head of 3 classes: drawn, the rest loaded
    headed = dataclasses.replace(config, num_classes=3)
    model = _build_loaded(TextEncoder, headed, dict(state))
    assert model.head.weight.abs().max() <= 0.04 and model.head.weight.std() > 0
    assert torch.equal(model.head.bias, torch.zeros(3))
    assert not any(p.is_meta for p in model.parameters())
