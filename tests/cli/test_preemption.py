"""Pre-emption and damaged checkpoints (#32): SIGTERM / SIGUSR1 save a resumable
``last.ckpt`` at the end of the step in progress and stop with 128 + the signal (0 after a
successful SLURM requeue); ``every_minutes`` saves on a clock; a truncated or corrupted
checkpoint is named, and ``--ckpt_path last`` falls back to the newest whole one."""

from __future__ import annotations

import os
import signal
import stat
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch

from multimodal.cli.callbacks import Preemption, checkpoint_problem, resume_checkpoint
from tests.cli.test_resume import digits
from tests.resume_runs import Record, assert_same_run, fit


class SendSignal(L.Callback):
    """Sends ``signum`` to this process at the start of training step ``step``."""

    def __init__(self, signum: int, step: int) -> None:
        self.signum, self.step = signum, step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


def signalled_fit(folder: Path, signum: int, step: int, **preemption) -> tuple[int, Record]:
    L.seed_everything(0, verbose=False)
    task, data = digits()()
    record = Record()
    trainer = L.Trainer(accelerator="cpu", max_epochs=2, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=folder,
                        enable_checkpointing=False, num_sanity_val_steps=0, limit_val_batches=2,
                        callbacks=[record, SendSignal(signum, step), Preemption(**preemption)])
    before = signal.getsignal(signum)
    with pytest.raises(SystemExit) as stop:
        trainer.fit(task, data)
    assert signal.getsignal(signum) is before or signum != signal.SIGTERM
    return stop.value.code, record


def test_sigterm_saves_the_step_in_progress_exits_143_and_resumes_exactly(tmp_path):
    code, record = signalled_fit(tmp_path / "cut", signal.SIGTERM, step=6)
    assert code == 143 == 128 + signal.SIGTERM
    last = tmp_path / "cut" / "checkpoints" / "last.ckpt"
    # the signal came during step 7 (global_step 6 -> 7): that step is finished and saved
    assert torch.load(last, weights_only=True)["global_step"] == 7
    assert [s for _, s, _ in record.seen] == list(range(7))
    assert not list(last.parent.glob("*.partial"))

    whole, full = fit(digits(), tmp_path / "whole", epochs=2)
    resumed, rest = fit(digits(), tmp_path / "resumed", epochs=2, ckpt_path=str(last))
    assert record.seen + rest.seen == full.seen
    assert_same_run(whole, resumed)


@pytest.fixture
def fake_scontrol(tmp_path, monkeypatch):
    """An ``scontrol`` on PATH that logs its arguments; exit status from $SCONTROL_STATUS."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/scontrol.log\n'
                      'exit "${SCONTROL_STATUS:-0}"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    return tmp_path / "scontrol.log"


def test_sigusr1_in_slurm_requeues_and_exits_0(tmp_path, fake_scontrol):
    code, _ = signalled_fit(tmp_path / "run", signal.SIGUSR1, step=3)
    assert code == 0
    assert fake_scontrol.read_text().split() == ["requeue", "4242"]
    assert torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt",
                      weights_only=True)["global_step"] == 4


def test_sigusr1_exits_138_when_the_requeue_fails(tmp_path, fake_scontrol, monkeypatch):
    monkeypatch.setenv("SCONTROL_STATUS", "1")
    code, _ = signalled_fit(tmp_path / "run", signal.SIGUSR1, step=3)
    assert code == 138 == 128 + signal.SIGUSR1
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()


def test_every_minutes_saves_last_on_a_clock(tmp_path, monkeypatch):
    clock = iter(range(0, 10_000, 20))  # 20 s per call of time.monotonic
    monkeypatch.setattr("multimodal.cli.callbacks.time.monotonic", lambda: next(clock))
    saves = []
    original = Preemption.save
    monkeypatch.setattr(Preemption, "save", lambda self, trainer, why: saves.append(
        trainer.global_step) or original(self, trainer, why))
    L.seed_everything(0, verbose=False)
    task, data = digits()()
    trainer = L.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path,
                        enable_checkpointing=False, limit_val_batches=0,
                        callbacks=[Preemption(every_minutes=1)])
    trainer.fit(task, data)
    # one clock read per step after setup: 60 s elapse every third step
    assert saves == [3]
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt",
                      weights_only=True)["global_step"] == 3


def test_preemption_rejects_bad_settings():
    with pytest.raises(ValueError, match="every_minutes"):
        Preemption(every_minutes=0)
    with pytest.raises(ValueError, match="SIGFOO"):
        Preemption(signals=("SIGFOO",))


# --- damaged checkpoints -----------------------------------------------------------------


@pytest.fixture
def checkpoints(tmp_path):
    """Checkpoints of steps 1 to 5 (``step=N.ckpt``) and ``last.ckpt`` (step 5) of one run,
    with increasing modification times."""
    folder = tmp_path / "ckpts"
    fit(digits(), folder, epochs=1)
    files = [folder / f"step={s}.ckpt" for s in range(1, 6)] + [folder / "last.ckpt"]
    for i, path in enumerate(files):
        os.utime(path, (1_000_000 + i, 1_000_000 + i))
    return folder


def truncate(path: Path, keep: float = 0.6) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_checkpoint_problem_names_truncation_and_corruption(checkpoints):
    last = checkpoints / "last.ckpt"
    assert checkpoint_problem(last) is None
    truncate(last)
    assert "truncated or corrupted" in checkpoint_problem(last)
    flip_byte(checkpoints / "step=4.ckpt")
    assert "CRC" in checkpoint_problem(checkpoints / "step=4.ckpt")
    (checkpoints / "empty.ckpt").write_bytes(b"")
    assert "empty" in checkpoint_problem(checkpoints / "empty.ckpt")
    (checkpoints / "text.ckpt").write_text("version https://git-lfs.github.com/spec/v1\n")
    assert "not a checkpoint" in checkpoint_problem(checkpoints / "text.ckpt")


def _trainer(folder: Path) -> L.Trainer:
    from lightning.pytorch.callbacks import ModelCheckpoint

    return L.Trainer(accelerator="cpu", logger=False, default_root_dir=folder.parent,
                     callbacks=[ModelCheckpoint(dirpath=folder)], enable_progress_bar=False)


def test_last_falls_back_to_the_newest_whole_checkpoint_with_a_warning(checkpoints):
    trainer = _trainer(checkpoints)
    assert resume_checkpoint(trainer, "last") == str(checkpoints / "last.ckpt")
    truncate(checkpoints / "last.ckpt")
    flip_byte(checkpoints / "step=5.ckpt")
    with pytest.warns(UserWarning) as caught:
        chosen = resume_checkpoint(trainer, "last")
    assert chosen == str(checkpoints / "step=4.ckpt")
    text = " ".join(str(w.message) for w in caught)
    assert "last.ckpt" in text and "step=5.ckpt" in text and "CRC" in text
    # and the run resumes from it: step 4 of the uninterrupted run
    assert torch.load(chosen, weights_only=True)["global_step"] == 4


def test_last_with_nothing_whole_starts_afresh_with_a_warning(checkpoints):
    for path in checkpoints.glob("*.ckpt"):
        truncate(path, keep=0.1)
    with pytest.warns(UserWarning, match="no whole checkpoint"):
        assert resume_checkpoint(_trainer(checkpoints), "last") is None


def test_a_damaged_named_checkpoint_is_an_error_naming_it(checkpoints):
    path = checkpoints / "step=3.ckpt"
    truncate(path)
    with pytest.raises(ValueError, match=r"step=3\.ckpt: truncated"):
        resume_checkpoint(_trainer(checkpoints), str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resume_checkpoint(_trainer(checkpoints), "best") == "best"


class SignalInValidation(L.Callback):
    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx,
                                  dataloader_idx=0) -> None:
        if not trainer.sanity_checking and batch_idx == 0:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_during_validation_saves_and_exits_143(tmp_path):
    L.seed_everything(0, verbose=False)
    task, data = digits()()
    trainer = L.Trainer(accelerator="cpu", max_epochs=2, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path,
                        enable_checkpointing=False, num_sanity_val_steps=0, limit_val_batches=2,
                        callbacks=[SignalInValidation(), Preemption()])
    with pytest.raises(SystemExit) as stop:
        trainer.fit(task, data)
    assert stop.value.code == 143
    # Lightning stops inside the first validation (end of epoch 0, step 5)
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 5
    whole, full = fit(digits(), tmp_path / "whole", epochs=2)
    resumed, rest = fit(digits(), tmp_path / "resumed", epochs=2, ckpt_path=str(last))
    assert rest.seen == full.seen[5:]
    assert_same_run(whole, resumed)


class SignalOnRank(L.Callback):
    """SIGTERM to the process of ``rank`` at the start of step ``step``."""

    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step = rank, step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.slow
def test_ddp_ranks_stop_together_and_exit_143(tmp_path):
    """2 gloo processes, SIGTERM to rank 1 only: both ranks save at the same step and exit
    with 143 (ranks agree by an all-reduce of their flags, here every step)."""
    from torch.multiprocessing import ProcessExitedException

    L.seed_everything(0, verbose=False)
    task, data = digits(augment=False)()
    record = Record()
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", max_epochs=2,
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path, enable_checkpointing=False,
                        num_sanity_val_steps=0, limit_val_batches=0,
                        callbacks=[record, SignalOnRank(1, 1),
                                   Preemption(sync_every_n_steps=1)])
    with pytest.raises(ProcessExitedException) as stop:
        trainer.fit(task, data)
    assert stop.value.exit_code == 143
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt",
                      weights_only=True)["global_step"] == 2


class _CountingStrategy:
    def __init__(self) -> None:
        self.root_device, self.reduced = torch.device("cpu"), 0

    def reduce(self, votes, reduce_op="sum"):
        self.reduced += 1
        return votes


def test_ranks_agree_every_n_steps_only():
    """Under DDP the flags are all-reduced (a host sync) every sync_every_n_steps batches
    and at the end of an epoch, not every step; one process never all-reduces."""
    from types import SimpleNamespace

    from lightning.pytorch.utilities.exceptions import SIGTERMException

    guard = Preemption(sync_every_n_steps=4)
    strategy = _CountingStrategy()
    run = SimpleNamespace(world_size=2, strategy=strategy, global_step=0)
    for _ in range(9):
        guard.on_train_batch_end(run, None, None, None, 0)
    assert strategy.reduced == 2  # after batches 4 and 8
    guard.on_train_epoch_end(run, None)
    assert strategy.reduced == 3  # the epoch's end (batch 9)
    saved = []
    guard.save = lambda trainer, why: saved.append(why) or "last.ckpt"
    guard.received = int(signal.SIGTERM)
    for _ in range(2):  # batches 10, 11: no agreement yet, the run goes on
        guard.on_train_batch_end(run, None, None, None, 0)
    assert saved == []
    with pytest.raises(SIGTERMException):
        guard.on_train_batch_end(run, None, None, None, 0)  # batch 12
    assert saved == ["received SIGTERM"]
    alone = _CountingStrategy()
    single = Preemption(sync_every_n_steps=4)
    for _ in range(5):
        single.on_train_batch_end(SimpleNamespace(world_size=1, strategy=alone), None, None,
                                  None, 0)
    assert alone.reduced == 0
    with pytest.raises(ValueError, match="sync_every_n_steps must be >= 1"):
        Preemption(sync_every_n_steps=0)
