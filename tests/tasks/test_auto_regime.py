"""``finetune.regime: auto``: the regime follows the labelled training set's size (few labels
a class -> contrastive tuning + the solved probe; more -> full fine-tuning or LoRA), chosen
when ``fit`` starts, logged, and what the run then does is that regime's training."""

from __future__ import annotations

import logging

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import multimodal as mm
from multimodal.tasks import ClassificationTask
from multimodal.tasks.finetune import FinetuneConfig, choose_regime
from multimodal.tasks.probe import fit_probe

pytest.importorskip("sklearn")

VIT = dict(image_size=16, patch_size=8, in_channels=3, num_classes=3, dim=32, depth=2,
           heads=2, mlp_dim=64)


@pytest.mark.parametrize(("examples", "classes", "solvable", "regime"), [
    (24, 3, True, "contrastive"),    # 8 a class
    (192, 3, True, "contrastive"),   # 64 a class: the bound is inclusive
    (195, 3, True, "full"),          # 65 a class
    (24, 3, False, "full"),          # few, but no head to solve
])
def test_choose_regime_by_labels_per_class(examples, classes, solvable, regime):
    config, why = choose_regime(FinetuneConfig(regime="auto", layer_decay=0.9), examples,
                                classes, solvable)
    assert config.regime == regime
    assert config.layer_decay == 0.9  # the rest of the block is kept
    assert f"auto -> {regime}" in why and f"{examples / classes:.1f} a class" in why


def test_choose_regime_many_labels_can_be_lora_and_other_regimes_pass_through():
    config, _ = choose_regime(FinetuneConfig(regime="auto", many_labels_regime="lora",
                                             few_labels=4), 100, 2)
    assert config.regime == "lora"
    unknown, why = choose_regime(FinetuneConfig(regime="auto"), None, 3)
    assert unknown.regime == "full" and "no length to count" in why
    given = FinetuneConfig(regime="full")
    assert choose_regime(given, 6, 3) == (given, "")
    with pytest.raises(ValueError, match="many_labels_regime"):
        FinetuneConfig(regime="auto", many_labels_regime="linear_probe")
    with pytest.raises(ValueError, match="few_labels"):
        FinetuneConfig(regime="auto", few_labels=-1)


def _images(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    means = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]])[y]
    return TensorDataset(means[:, :, None, None] + torch.randn(n, 3, 16, 16, generator=g), y)


def _fit(tmp_path, few_labels: int, caplog) -> ClassificationTask:
    torch.manual_seed(0)
    task = ClassificationTask(mm.ViT(mm.ViTConfig(**VIT)),
                              optimizer={"lr": 3e-3, "warmup_fraction": 0.0},
                              finetune={"regime": "auto", "few_labels": few_labels,
                                        "probe_cs": [0.1, 1.0, 10.0], "probe_folds": 3})
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False,
                        default_root_dir=tmp_path, max_epochs=2)
    with caplog.at_level(logging.INFO):
        trainer.fit(task, DataLoader(_images(48, 0), batch_size=12, shuffle=True))
    return task


def test_auto_with_few_labels_runs_the_contrastive_regime(tmp_path, caplog):
    task = _fit(tmp_path, few_labels=16, caplog=caplog)  # 48 examples, 16 a class
    assert task.finetune.regime == "contrastive"
    assert task.hparams.finetune == {"regime": "auto", "few_labels": 16,
                                     "probe_cs": [0.1, 1.0, 10.0], "probe_folds": 3}
    assert "regime auto -> contrastive (48 labelled training examples, 16.0 a class" \
        in caplog.text
    assert not any(p.requires_grad for p in task.model.head.parameters())
    task.eval()
    with torch.no_grad():  # the head is the probe solved on the tuned body's features
        data = _images(48, 0)
        x = task.head_inputs(data.tensors[0])
    fit = fit_probe(x, data.tensors[1], 3, [0.1, 1.0, 10.0], 3)
    torch.testing.assert_close(task.model.head.weight, fit.weight.float(), atol=1e-4, rtol=0)


def test_auto_with_more_labels_fine_tunes_in_full(tmp_path, caplog):
    task = _fit(tmp_path, few_labels=15, caplog=caplog)
    assert task.finetune.regime == "full"
    assert "regime auto -> full (48 labelled training examples, 16.0 a class > few_labels 15" \
        in caplog.text
    assert all(p.requires_grad for p in task.model.parameters())
