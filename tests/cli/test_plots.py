"""``multimodal plot``: a checkpoint's figures, its model and data picked from
``mm.load(path)``."""

from __future__ import annotations

import pytest
import torch

import multimodal as mm
from multimodal.cli.verbs import run
from multimodal.weights import config_to_dict


def _checkpoint(path, model: torch.nn.Module, data: dict) -> str:
    """A task checkpoint as Lightning writes one: the model under ``model.``, what it is
    under ``multimodal_model``, the data module's arguments."""
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                "multimodal_model": {"model_type": type(model).__name__,
                                     "model_config": config_to_dict(model.config)},
                "datamodule_hyper_parameters": data}, path)
    return str(path)


def test_pixels_draws_samples_and_completions_of_test_images(tmp_path, capsys):
    pytest.importorskip("sklearn")  # the 8x8 digits
    pytest.importorskip("matplotlib")
    torch.manual_seed(0)
    model = mm.ImageGPT(mm.ImageGPTConfig(image_size=8, vocab_size=16, dim=32, depth=1,
                                          heads=4, mlp_dim=64, num_classes=10))
    ckpt = _checkpoint(tmp_path / "igpt.ckpt", model, {"dataset": "digits", "batch_size": 8})
    assert run(["plot", "pixels", ckpt, "--out", str(tmp_path), "--name", "t",
                "--per_class", "2", "--num", "3"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(tmp_path / "t_samples.png"), str(tmp_path / "t_completion.png")]
    assert all((tmp_path / name).stat().st_size > 0
               for name in ("t_samples.png", "t_completion.png"))


def test_a_figure_of_the_wrong_model_is_one_error_line(tmp_path, capsys):
    vit = mm.ViT(mm.ViTConfig(image_size=8, patch_size=4, in_channels=1, num_classes=2,
                              dim=8, depth=1, heads=2, mlp_dim=16))
    ckpt = _checkpoint(tmp_path / "vit.ckpt", vit, {})
    assert run(["plot", "pixels", ckpt]) == 2
    assert run(["plot", "attention", ckpt]) == 2
    assert run(["plot", "bars", ckpt]) == 2
    err = capsys.readouterr().err
    assert "holds a ViT, not an ImageGPT" in err
    assert "holds no captioner with its tokenizer" in err
    assert "unknown figure 'bars'; one of attention, pixels" in err
