"""RunGuard without a host sync per step (#50, item 3): the non-finite flag stays on the
device and is the fused optimiser's ``found_inf`` (a bad step is not applied there), the
host reads it every ``check_every_n_steps``, at epoch ends, before validation and before
every checkpoint. Tiny digits ViT on CPU, as tests/cli/test_faults.py."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from multimodal.cli.faults import RunGuard
from multimodal.cli.saving import TrainingDiverged, nonfinite_parameter
from tests.cli.test_faults import Weights, poison_loss, trainer
from tests.cli.test_resume import digits


class CountingGuard(RunGuard):
    """Records the step counter at every host read of the flags."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.reads: list[int] = []

    def settle(self, trainer=None, optimizer=None) -> None:
        if self._slots and (trainer or self._trainer) is not None:
            self.reads.append(int((trainer or self._trainer).global_step))
        super().settle(trainer, optimizer)


def test_the_flag_is_read_every_n_steps_and_before_saves_only(tmp_path):
    L.seed_everything(0, verbose=False)
    task, data = digits()()
    guard = CountingGuard(check_every_n_steps=4)
    trainer(tmp_path, guard, epochs=2).fit(task, data)  # 5 steps an epoch
    # optimiser steps 3 and 7 (0-based: the 4th and 8th), the epoch ends (5, 10) with
    # their validation and checkpoint saves; no read at any other step
    assert set(guard.reads) == {3, 5, 7, 10}, guard.reads
    assert guard.every_n_steps(trainer(tmp_path)) == 4


def test_cpu_default_reads_every_step():
    run = L.Trainer(accelerator="cpu", logger=False, log_every_n_steps=7)
    assert RunGuard().every_n_steps(run) == 1
    assert RunGuard(check_every_n_steps=3).every_n_steps(run) == 3
    with pytest.raises(ValueError, match="check_every_n_steps must be >= 1"):
        RunGuard(check_every_n_steps=0)


def test_a_late_read_stops_with_the_weights_of_the_last_finite_step(tmp_path):
    """NaN at step 7 (0-based 6), read at the 8th step: the 7th was not applied on the
    device; last.ckpt has the step counter 7 and the weights (and AdamW moments) of the
    6 finite steps."""
    L.seed_everything(0, verbose=False)
    task, data = digits()()
    poison_loss(task, {6})
    weights = Weights()
    run = trainer(tmp_path, weights, RunGuard(check_every_n_steps=4))
    with pytest.raises(TrainingDiverged) as stop:
        run.fit(task, data)
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert str(stop.value).startswith("the training loss is not finite at step 7 (epoch 1, ")
    assert (f"{last} holds the weights of step 6, the last finite state (step 7 was not "
            f"applied; its step counter is 7)") in str(stop.value)
    saved = torch.load(last, weights_only=True)
    assert saved["global_step"] == 7
    after_six = next(after for step, _, after in weights.steps if step == 5)
    for name, value in saved["state_dict"].items():
        assert torch.equal(value, after_six[name]), name
    assert nonfinite_parameter(task) is None
    moments = [s["exp_avg"] for s in saved["optimizer_states"][0]["state"].values()]
    assert all(bool(torch.isfinite(m).all()) for m in moments)
    assert {float(s["step"]) for s in saved["optimizer_states"][0]["state"].values()} == {6.0}


def test_a_late_read_skips_the_steps_on_the_device(tmp_path):
    L.seed_everything(0, verbose=False)
    task, data = digits()()
    poison_loss(task, {1, 2})
    weights, guard = Weights(), RunGuard(on_nonfinite="skip", check_every_n_steps=4)
    with pytest.warns(UserWarning, match=r"not finite at step 2 \(epoch 0\) and 1 more up to "
                                         r"step 3: step skipped \(2 so far\)"):
        trainer(tmp_path, weights, guard).fit(task, data)
    assert guard.skipped == 2
    for step, before, after in weights.steps:
        same = all(torch.equal(before[k], after[k]) for k in before)
        assert same == (step in (1, 2)), step
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt",
                      weights_only=True)["callbacks"]["RunGuard"] == {"skipped": 2}


def test_a_not_fused_optimiser_is_read_every_step_and_still_skips(tmp_path, monkeypatch):
    """AdamW without the fused kernel has no ``found_inf``: the flag is read every step and
    the step's gradients dropped, as before."""
    monkeypatch.setenv("MULTIMODAL_FUSED_ADAMW", "0")
    L.seed_everything(0, verbose=False)
    task, data = digits()()
    poison_loss(task, {2})
    weights, guard = Weights(), RunGuard(on_nonfinite="skip", check_every_n_steps=4)
    with pytest.warns(UserWarning, match=r"not finite at step 3 \(epoch 0\): step skipped"):
        trainer(tmp_path, weights, guard, epochs=1).fit(task, data)
    assert not getattr(task.trainer.optimizers[0], "_step_supports_amp_scaling", False)
    assert guard.skipped == 1
    for step, before, after in weights.steps:
        assert all(torch.equal(before[k], after[k]) for k in before) == (step == 2), step


def test_a_save_between_reads_reads_first_and_never_saves_the_unread_step(tmp_path):
    """A plain ModelCheckpoint saving every step, reads every 100 steps: the save after
    the bad step reads the flag first and stops the run; its file is not written."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    L.seed_everything(0, verbose=False)
    task, data = digits()()
    poison_loss(task, {2})
    every = ModelCheckpoint(dirpath=tmp_path / "every", filename="{step}",
                            every_n_train_steps=1, save_top_k=-1)
    with pytest.raises(TrainingDiverged, match=r"not finite at step 3 .* holds the weights of "
                                                 r"step 2, the last finite state \(step 3 was "
                                                 r"not applied; its step counter is 3\)"):
        trainer(tmp_path, every, RunGuard(check_every_n_steps=100)).fit(task, data)
    assert sorted(p.name for p in (tmp_path / "every").glob("*.ckpt")) == \
        ["step=1.ckpt", "step=2.ckpt"]
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt",
                      weights_only=True)["global_step"] == 3
    assert not hasattr(task.trainer.optimizers[0], "found_inf")  # put back at teardown


@pytest.mark.slow  # two gloo processes: about 30 s on the busy 2-core box
def test_ddp_ranks_stop_together_at_a_late_read(tmp_path):
    """Only rank 1's loss is NaN (step 3); the flags are all-reduced on the device every
    step and read every 2 steps: both ranks drop the step, read it at the 4th step and
    stop together; last.ckpt has the step counter 3 and the weights of step 2."""
    import multimodal as mm
    from multimodal.data.vision import ImageClassificationDataModule
    from tests.cli.test_faults import NanOnRank
    from tests.cli.test_resume import DIGITS_VIT

    L.seed_everything(0, verbose=False)
    task = NanOnRank(mm.ViT(mm.ViTConfig(**DIGITS_VIT)), optimizer={"lr": 3e-3})
    data = ImageClassificationDataModule("digits", batch_size=16, val_size=32, limit_train=80,
                                         augment=False)
    run = trainer(tmp_path, RunGuard(check_every_n_steps=2), devices=2, strategy="ddp_spawn")
    with pytest.raises(Exception, match=r"training loss is not finite at step 3 .*holds the "
                                        r"weights of step 2"):
        run.fit(task, data)
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt",
                      weights_only=True)["global_step"] == 3
