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


def _fit(tmp_path, few_labels: int, caplog, min_steps: int | None = None,
         **finetune) -> ClassificationTask:
    torch.manual_seed(0)
    task = ClassificationTask(mm.ViT(mm.ViTConfig(**VIT)),
                              optimizer={"lr": 3e-3, "warmup_fraction": 0.0},
                              finetune={"regime": "auto", "few_labels": few_labels,
                                        "probe_cs": [0.1, 1.0, 10.0], "probe_folds": 3,
                                        **finetune})
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False,
                        default_root_dir=tmp_path, max_epochs=2 if min_steps is None else 50,
                        min_steps=min_steps)
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


def test_contrastive_epochs_override_the_trainer_step_budget(tmp_path, caplog):
    """A step budget (min_steps 40 = 10 epochs of 4 batches, max_epochs 50) gives way to
    contrastive_epochs: 3 epochs, 12 optimiser steps; the schedule spans those steps."""
    task = _fit(tmp_path, few_labels=16, caplog=caplog, min_steps=40, contrastive_epochs=3)
    assert task.finetune.regime == "contrastive"
    assert task.trainer.current_epoch == 3 and task.trainer.global_step == 12
    assert task.trainer.estimated_stepping_batches == 12
    assert "contrastive runs 3 epochs (finetune.contrastive_epochs)" in caplog.text


def test_a_max_epochs_typed_on_the_command_line_wins_over_contrastive_epochs(
        tmp_path, caplog, monkeypatch):
    """``--trainer.max_epochs 1`` (the CLI sets the trainer's ``command_line_limits``) over a
    config's contrastive_epochs 3: one epoch of 4 steps, and the line says why."""
    original = L.Trainer.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.command_line_limits = {"max_epochs": 1}

    monkeypatch.setattr(L.Trainer, "__init__", init)
    task = _fit(tmp_path, few_labels=16, caplog=caplog, min_steps=40, contrastive_epochs=3)
    assert task.trainer.current_epoch == 1 and task.trainer.global_step == 4
    assert task.trainer.estimated_stepping_batches == 4
    assert "contrastive runs 1 epoch (--trainer.max_epochs 1 on the command line, over " \
        "finetune.contrastive_epochs)" in caplog.text


def test_a_fixed_contrastive_length_validates_once_at_the_end(tmp_path, caplog):
    """contrastive_epochs fixes the run's length, so nothing is chosen from validation: the
    trainer's EarlyStopping is dropped (it would stop on the noise of a few held-out
    examples), validation runs once, after the last epoch, and the probe is solved once,
    for it (not after every epoch)."""
    torch.manual_seed(0)
    task = ClassificationTask(mm.ViT(mm.ViTConfig(**VIT)),
                              optimizer={"lr": 3e-3, "warmup_fraction": 0.0},
                              finetune={"regime": "auto", "few_labels": 16,
                                        "probe_cs": [0.1, 1.0], "probe_folds": 3,
                                        "contrastive_epochs": 4})
    stop = L.pytorch.callbacks.EarlyStopping("val/loss", patience=1)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False,
                        default_root_dir=tmp_path, max_epochs=50, min_steps=40,
                        callbacks=[stop], num_sanity_val_steps=0)
    solves = []
    original = task._solve_head
    task._solve_head = lambda rows: (solves.append(task.current_epoch), original(rows))
    validated = []
    task.on_validation_epoch_end = lambda: validated.append(task.current_epoch)
    with caplog.at_level(logging.INFO):
        trainer.fit(task, DataLoader(_images(48, 0), batch_size=12, shuffle=True),
                    DataLoader(_images(12, 1), batch_size=12))
    assert trainer.current_epoch == 4 and trainer.global_step == 16
    assert stop not in trainer.callbacks and trainer.check_val_every_n_epoch == 4
    assert solves == [3] and validated == [3]
    assert "validation at the end, no early stopping" in caplog.text
    assert "val/acc" in trainer.callback_metrics


def test_without_contrastive_epochs_the_step_budget_holds(tmp_path, caplog):
    task = _fit(tmp_path, few_labels=16, caplog=caplog, min_steps=20)
    assert task.finetune.regime == "contrastive"
    assert task.trainer.global_step >= 20  # max_epochs 50: min_steps keeps it going


def test_few_labels_regime_linear_probe_solves_once(tmp_path, caplog):
    """few_labels_regime: linear_probe: one epoch whatever the budget; the body is the
    pretrained (here: initial) one, and the head the probe solved on its features."""
    torch.manual_seed(0)
    before = mm.ViT(mm.ViTConfig(**VIT)).state_dict()
    task = _fit(tmp_path, few_labels=16, caplog=caplog, min_steps=40,
                few_labels_regime="linear_probe")
    assert task.finetune.regime == "linear_probe"
    assert task.trainer.current_epoch == 1
    body = {k: v for k, v in task.model.state_dict().items() if not k.startswith("head")}
    for k, v in body.items():
        torch.testing.assert_close(v, before[k])
    task.eval()
    data = _images(48, 0)
    with torch.no_grad():
        x = task.head_inputs(data.tensors[0])
    # the C the cross-validation chose (its folds follow the shuffled batches), solved again:
    # a convex problem, one optimum whatever the row order
    fit = fit_probe(x, data.tensors[1], 3, [task.probe_fit.C], 3)
    torch.testing.assert_close(task.model.head.weight, fit.weight.float(), atol=1e-3, rtol=0)
    assert "linear_probe runs 1 epoch" in caplog.text


def test_new_finetune_keys_are_checked():
    with pytest.raises(ValueError, match="few_labels_regime"):
        FinetuneConfig(regime="auto", few_labels_regime="full")
    with pytest.raises(ValueError, match="contrastive_epochs"):
        FinetuneConfig(regime="auto", contrastive_epochs=0)
    config, why = choose_regime(FinetuneConfig(regime="auto",
                                               few_labels_regime="linear_probe"), 24, 3)
    assert config.regime == "linear_probe" and "auto -> linear_probe" in why


def test_without_a_validation_split_early_stopping_is_off(tmp_path, caplog):
    """A data module whose validation split is empty (min_held_out_per_class held none out):
    the full regime runs its step budget instead of failing on a missing val/loss."""

    class NoValidation(L.LightningDataModule):
        def train_dataloader(self):
            return DataLoader(_images(48, 0), batch_size=12, shuffle=True)

        def val_dataloader(self):
            return DataLoader(TensorDataset(torch.zeros(0, 3, 16, 16),
                                            torch.zeros(0, dtype=torch.long)))

    torch.manual_seed(0)
    task = ClassificationTask(mm.ViT(mm.ViTConfig(**VIT)), finetune={"regime": "full"})
    stop = L.pytorch.callbacks.EarlyStopping("val/loss", patience=1)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False,
                        default_root_dir=tmp_path, max_epochs=3, callbacks=[stop])
    with caplog.at_level(logging.INFO):
        trainer.fit(task, datamodule=NoValidation())
    assert trainer.current_epoch == 3 and stop not in trainer.callbacks
    assert "no validation split: validation and early stopping off" in caplog.text
