"""A long run survives what goes wrong on a cluster (#51): divergence stops the run at the
last finite state, a failed checkpoint write keeps the previous files, loader workers ignore
the job's signals, an out-of-memory error names the fix. Fault injection on CPU, tiny
models (the digits ViT of tests/cli/test_resume.py)."""

from __future__ import annotations

import errno
import logging
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch

from multimodal.cli.callbacks import Preemption, RunCheckpoint
from multimodal.cli.faults import RunGuard
from multimodal.cli.saving import CheckpointWriteError, TrainingDiverged, nonfinite_parameter
from multimodal.tasks import ClassificationTask
from tests.cli.test_resume import DIGITS_VIT, digits


def poison_loss(task: L.LightningModule, steps: set[int]) -> None:
    """The training loss of the optimiser steps in ``steps`` (0-based) becomes NaN."""
    step = task.training_step

    def poisoned(batch, batch_idx):
        loss = step(batch, batch_idx)
        return loss * float("nan") if task.trainer.global_step in steps else loss

    task.training_step = poisoned


class Weights(L.Callback):
    """The weights before and after every training step: ``(step, before, after)``."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, dict, dict]] = []
        self._before: dict = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._before = {k: v.clone() for k, v in pl_module.state_dict().items()}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        after = {k: v.clone() for k, v in pl_module.state_dict().items()}
        self.steps.append((trainer.global_step - 1, self._before, after))


def trainer(folder: Path, *callbacks: L.Callback, epochs: int = 2, **kwargs) -> L.Trainer:
    checkpoint = RunCheckpoint(dirpath=folder / "checkpoints", monitor="val/loss", mode="min",
                               filename="best-{step}", save_top_k=2)
    return L.Trainer(accelerator="cpu", max_epochs=epochs, logger=False,
                     enable_progress_bar=False, enable_model_summary=False,
                     default_root_dir=folder, num_sanity_val_steps=0, limit_val_batches=1,
                     callbacks=[checkpoint, Preemption(), *callbacks], **kwargs)


def all_finite(path: Path) -> bool:
    state = torch.load(path, weights_only=True)["state_dict"]
    return all(bool(torch.isfinite(v).all()) for v in state.values() if v.is_floating_point())


# --- 3. divergence -------------------------------------------------------------------------


def test_a_nan_loss_stops_the_run_and_last_holds_the_last_finite_step(tmp_path):
    L.seed_everything(0, verbose=False)
    task, data = digits()()
    poison_loss(task, {6})  # 5 steps an epoch: the second step of epoch 1
    run = trainer(tmp_path, RunGuard())
    with pytest.raises(TrainingDiverged) as stop:
        run.fit(task, data)
    last = tmp_path / "checkpoints" / "last.ckpt"
    message = str(stop.value)
    lr = run.optimizers[0].param_groups[0]["lr"]  # the schedule's, at step 7
    assert message.startswith(f"the training loss is not finite at step 7 (epoch 1, lr {lr:.3g}): "
                              f"the run stopped; {last} holds step 6, the last finite state")
    assert torch.load(last, weights_only=True)["global_step"] == 6
    # the poisoned step was not applied: the weights in memory are finite too
    assert nonfinite_parameter(task) is None
    files = sorted((tmp_path / "checkpoints").glob("*.ckpt"))
    assert len(files) >= 2 and all(all_finite(f) for f in files)
    assert not list((tmp_path / "checkpoints").glob(".*partial"))


def test_skip_drops_the_nonfinite_steps_and_counts_them(tmp_path):
    L.seed_everything(0, verbose=False)
    task, data = digits()()
    poison_loss(task, {2, 3})
    weights, guard = Weights(), RunGuard(on_nonfinite="skip")
    with pytest.warns(UserWarning, match="not finite at step 3 .*step skipped"):
        trainer(tmp_path, weights, guard).fit(task, data)
    assert guard.skipped == 2
    for step, before, after in weights.steps:
        same = all(torch.equal(before[k], after[k]) for k in before)
        assert same == (step in (2, 3)), step  # skipped steps leave the weights as they were
    assert nonfinite_parameter(task) is None
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt",
                      weights_only=True)["callbacks"]["RunGuard"] == {"skipped": 2}


class InfGradient(L.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_after_backward(self, trainer, pl_module) -> None:
        if trainer.global_step == self.step:
            next(p for p in pl_module.parameters() if p.grad is not None).grad[0] = math.inf


def test_an_infinite_gradient_with_a_finite_loss_stops_too(tmp_path):
    L.seed_everything(0, verbose=False)
    task, data = digits()()
    with pytest.raises(TrainingDiverged, match="the gradient norm is not finite at step 3 "):
        trainer(tmp_path, InfGradient(2), RunGuard()).fit(task, data)
    assert nonfinite_parameter(task) is None
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt",
                      weights_only=True)["global_step"] == 2


def test_no_checkpoint_is_written_with_nonfinite_weights(tmp_path):
    L.seed_everything(0, verbose=False)
    task, data = digits()()
    run = trainer(tmp_path, RunGuard(), epochs=1)
    run.fit(task, data)
    last = tmp_path / "checkpoints" / "last.ckpt"
    before = last.read_bytes()
    with torch.no_grad():
        next(task.parameters())[0] = float("nan")
    with pytest.raises(TrainingDiverged, match=r"weights are not finite at step 5 \(model\."):
        Preemption().save(run, "test")
    with pytest.raises(TrainingDiverged, match="not writing"):
        run.checkpoint_callback._save_checkpoint(run, str(tmp_path / "checkpoints" / "x.ckpt"))
    assert last.read_bytes() == before
    assert not (tmp_path / "checkpoints" / "x.ckpt").exists()


def digits_config(tmp_path: Path, trainer: str = "") -> Path:
    """A CLI config of the digits ViT (32 training images, 2 steps an epoch)."""
    vit = "\n".join(f"          {k}: {v}" for k, v in DIGITS_VIT.items())
    cfg = tmp_path / "digits.yaml"
    cfg.write_text(f"""
model:
  class_path: multimodal.tasks.ClassificationTask
  init_args:
    model:
      class_path: multimodal.ViT
      init_args:
        config:
{vit}
    optimizer: {{lr: 0.003}}
data:
  class_path: multimodal.data.vision.ImageClassificationDataModule
  init_args: {{dataset: digits, batch_size: 16, val_size: 32, limit_train: 32,
               augment: false}}
trainer:
  accelerator: cpu
  limit_val_batches: 1
  logger: false
  enable_model_summary: false
  default_root_dir: {tmp_path / "run"}
  {trainer}
""")
    return cfg


def test_the_cli_prints_one_line_and_skips_the_test_after_fit(tmp_path, monkeypatch, capsys):
    from multimodal.cli.verbs import run

    step = ClassificationTask.training_step

    def poisoned(self, batch, batch_idx):
        loss = step(self, batch, batch_idx)
        return loss * float("nan") if self.trainer.global_step == 3 else loss

    monkeypatch.setattr(ClassificationTask, "training_step", poisoned)
    cfg = digits_config(tmp_path, "max_epochs: 3")
    code = run(["fit", "--config", str(cfg)])
    err = capsys.readouterr().err
    last = tmp_path / "run" / "version_0" / "checkpoints" / "last.ckpt"
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(lines) == 1
    assert re.match(r"error: the training loss is not finite at step 4 \(epoch 1, lr "
                    r"[0-9.e+-]+\): the run stopped; " + re.escape(str(last)) +
                    " holds step 3, the last finite state", lines[0])
    assert "test after fit" not in err
    assert torch.load(last, weights_only=True)["global_step"] == 3


# --- 4. a full disk ------------------------------------------------------------------------


def failing_writer(run: L.Trainer, monkeypatch, code: int = errno.ENOSPC) -> list[str]:
    """The trainer's checkpoint writer writes half a file, then fails with ``code``."""
    io, tried = run.strategy.checkpoint_io, []

    def save_checkpoint(checkpoint, path, storage_options=None):
        tried.append(str(path))
        Path(path).write_bytes(b"PK\x03\x04" + b"\0" * 100)
        raise OSError(code, {errno.ENOSPC: "No space left on device",
                             errno.EIO: "Input/output error"}[code])

    monkeypatch.setattr(io, "save_checkpoint", save_checkpoint)
    return tried


class FailFrom(L.Callback):
    """From training step ``step`` on, every checkpoint write fails."""

    def __init__(self, step: int, monkeypatch, code: int = errno.ENOSPC) -> None:
        self.step, self.monkeypatch, self.code, self.tried = step, monkeypatch, code, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step and self.tried is None:
            self.tried = failing_writer(trainer, self.monkeypatch, self.code)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_a_failed_write_keeps_last_and_best_and_stops_naming_the_path(tmp_path, monkeypatch,
                                                                      code):
    L.seed_everything(0, verbose=False)
    task, data = digits()()
    fail = FailFrom(6, monkeypatch, code)
    run = trainer(tmp_path, fail, RunGuard(), epochs=3)
    folder = tmp_path / "checkpoints"
    with pytest.raises(CheckpointWriteError) as stop:
        run.fit(task, data)
    reason = "No space left on device" if code == errno.ENOSPC else "Input/output error"
    assert str(stop.value).startswith(f"could not write {folder}")
    assert f": {reason} (" in str(stop.value) and " free in " in str(stop.value)
    assert "the previous checkpoints are kept" in str(stop.value)
    assert fail.tried  # it did try
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 5
    assert all(all_finite(f) for f in folder.glob("*.ckpt"))  # all whole and readable
    assert not list(folder.glob(".*partial"))


def test_continue_goes_on_without_the_save(tmp_path, monkeypatch):
    L.seed_everything(0, verbose=False)
    task, data = digits()()
    guard = RunGuard(on_save_error="continue")
    run = trainer(tmp_path, FailFrom(6, monkeypatch), guard, epochs=3)
    with pytest.warns(UserWarning, match="the run goes on without this save"):
        run.fit(task, data)
    assert run.global_step == 15 and guard.failed_saves >= 2
    folder = tmp_path / "checkpoints"
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 5
    assert all(all_finite(f) for f in folder.glob("*.ckpt"))
    cb = run.checkpoint_callback
    assert all(Path(p).is_file() for p in cb.best_k_models)


class NanOnRank(ClassificationTask):
    """The loss of rank ``rank`` is NaN at step ``step`` (module level: ddp_spawn pickles)."""

    poison = (1, 2)

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        rank, step = self.poison
        return loss * float("nan") if (self.global_rank, self.trainer.global_step) == \
            (rank, step) else loss


@pytest.mark.slow  # two gloo processes: about 15 s
def test_ddp_ranks_stop_together_at_a_nan_on_one_rank(tmp_path):
    """Only rank 1's loss is NaN: the flag is all-reduced, both ranks stop at the same step
    (no hang) and last.ckpt holds the step before."""
    import multimodal as mm
    from multimodal.data.vision import ImageClassificationDataModule

    L.seed_everything(0, verbose=False)
    task = NanOnRank(mm.ViT(mm.ViTConfig(**DIGITS_VIT)), optimizer={"lr": 3e-3})
    data = ImageClassificationDataModule("digits", batch_size=16, val_size=32, limit_train=80,
                                         augment=False)
    run = trainer(tmp_path, RunGuard(), devices=2, strategy="ddp_spawn")
    with pytest.raises(Exception, match="training loss is not finite at step 3"):
        run.fit(task, data)
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt",
                      weights_only=True)["global_step"] == 2


# --- 1. the job's signal to the whole process group ------------------------------------

ROOT = Path(__file__).resolve().parents[2]

GROUP_CONFIG = """
seed_everything: 0
model:
  class_path: multimodal.tasks.ClassificationTask
  init_args:
    model:
      class_path: multimodal.ViT
      init_args:
        config: {{image_size: 8, patch_size: 2, in_channels: 1, num_classes: 10, dim: 32,
                  depth: 2, heads: 4, mlp_dim: 64, pool: mean}}
    optimizer: {{lr: 0.003}}
data:
  class_path: multimodal.data.vision.ImageClassificationDataModule
  init_args: {{dataset: digits, batch_size: 16, val_size: 32, limit_train: 80,
               augment: false, num_workers: 2}}
trainer:
  max_epochs: 100
  accelerator: cpu
  precision: 32-true
  logger: false
  enable_progress_bar: false
  limit_val_batches: 1
  default_root_dir: {root}
  callbacks:
    - class_path: tests.resume_runs.Slow
      init_args: {{seconds: 0.05}}
    - class_path: tests.resume_runs.Mark
      init_args: {{path: {root}/steps}}
"""


def start_group(args: list[str], root: Path) -> subprocess.Popen:
    """``multimodal ARGS`` in a new session (its own process group, as under ``timeout`` or
    a job manager), one CPU thread."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "multimodal.cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def wait_for(check, seconds: float = 120.0) -> None:
    end = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.1)


@pytest.mark.parametrize("signum", [signal.SIGTERM, pytest.param(
    signal.SIGUSR1, marks=pytest.mark.slow)], ids=["SIGTERM", "SIGUSR1"])
def test_the_job_signal_to_the_whole_group_saves_and_exits_128_plus(tmp_path, signum):
    """2 loader workers; the signal to every process of the group: the workers ignore it,
    the main process saves last.ckpt at the step in progress and exits 128 + the signal."""
    root = tmp_path / "run"
    root.mkdir()
    (root / "config.yaml").write_text(GROUP_CONFIG.format(root=root))
    run = start_group(["fit", "--config", str(root / "config.yaml"),
                       "--test_after_fit", "false"], root)
    steps = root / "steps"
    wait_for(lambda: run.poll() is not None or (steps.is_file() and steps.read_text()
                                                and int(steps.read_text()) >= 3))
    os.killpg(run.pid, signum)
    out, _ = run.communicate(timeout=120)
    assert run.returncode == 128 + signum, out[-3000:]
    assert "error:" not in out and "killed by signal" not in out
    last = root / "version_0" / "checkpoints" / "last.ckpt"  # the first run's folder
    saved = torch.load(last, weights_only=True)["global_step"]
    assert saved == int(steps.read_text())  # the step in progress, finished and saved
    assert f"received {signal.Signals(signum).name}: saved" in out


@pytest.mark.slow  # a fit, then predict in its own process: about 40 s on a busy machine
def test_the_job_signal_to_the_whole_group_stops_predict_without_a_crash(tmp_path):
    """``multimodal predict`` with 2 loader workers, SIGTERM to the group: the process ends by
    the signal (143 in a shell), no error about a dead worker, and writes no partial file."""
    import numpy as np
    from PIL import Image

    from multimodal.cli.verbs import run

    cfg = digits_config(tmp_path, "max_epochs: 1")
    assert run(["fit", "--config", str(cfg), "--test_after_fit", "false"]) == 0
    ckpt = tmp_path / "run" / "version_0" / "checkpoints" / "last.ckpt"
    images = tmp_path / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    for i in range(400):
        Image.fromarray(rng.integers(0, 255, (8, 8), dtype=np.uint8)).save(images / f"{i}.png")
    root = tmp_path / "out"
    root.mkdir()
    before = set(tmp_path.rglob("*"))
    run = start_group(["predict", "--config", str(cfg), "--ckpt_path", str(ckpt),
                       "--data.init_args.predict", str(images), "--data.init_args.batch_size",
                       "4", "--data.init_args.num_workers", "2",
                       "--trainer.callbacks+=tests.resume_runs.Slow",
                       "--trainer.callbacks.init_args.seconds=0.1",
                       "--trainer.callbacks+=tests.resume_runs.Mark",
                       f"--trainer.callbacks.init_args.path={root}/steps",
                       "--trainer.default_root_dir", str(root)], root)
    steps = root / "steps"
    wait_for(lambda: run.poll() is not None or (steps.is_file() and steps.read_text()
                                                and int(steps.read_text()) >= 3))
    assert run.poll() is None, run.communicate()[0][-3000:]
    os.killpg(run.pid, signal.SIGTERM)
    out, _ = run.communicate(timeout=120)
    assert run.returncode in (143, -signal.SIGTERM), out[-3000:]
    assert "error:" not in out and "killed by signal" not in out
    new = {p for p in set(tmp_path.rglob("*")) - before if p.is_file()}
    assert new <= {root / "steps"}, new


# --- 2. an error in a loader worker is the error ------------------------------------------


def broken_png(path: Path) -> None:
    """A PNG whose header is valid and whose body is garbage."""
    import numpy as np
    from PIL import Image

    Image.fromarray(np.zeros((8, 8), dtype=np.uint8)).save(path)
    data = bytearray(path.read_bytes())
    data[40:] = bytes((i * 37 + 11) % 256 for i in range(len(data) - 40))
    path.write_bytes(bytes(data))


def image_folder(folder: Path, n: int = 6, broken: int | None = 3) -> Path:
    import numpy as np
    from PIL import Image

    for c in ("a", "b"):
        (folder / c).mkdir(parents=True)
        for i in range(n):
            Image.fromarray(np.full((8, 8), 20 * i, dtype=np.uint8)).save(folder / c / f"{i}.png")
    if broken is not None:
        broken_png(folder / "a" / f"{broken}.png")
    return folder


@pytest.mark.parametrize("workers", [0, 2])
def test_a_worker_error_is_the_one_line_of_no_workers(tmp_path, workers):
    from torch.utils.data import DataLoader

    from multimodal.cli.errors import describe
    from multimodal.data.readers import scan_class_folders
    from multimodal.data.vision_datasets import FileImageDataset
    from multimodal.files import IMAGE_EXTENSIONS

    folder = image_folder(tmp_path / "imgs")
    files = scan_class_folders(str(folder), IMAGE_EXTENSIONS)
    dataset = FileImageDataset(files, 1, lambda x: x.float())
    with pytest.raises(Exception) as caught:
        list(DataLoader(dataset, batch_size=4, num_workers=workers))
    line = describe(caught.value, "fit")
    assert "\n" not in line and "Traceback" not in line and "DataLoader" not in line
    assert str(folder / "a" / "3.png") in line
    assert line.endswith("(--data)"), line


def test_worker_error_text_is_parsed_to_its_message():
    from multimodal.cli.errors import worker_error

    text = ('Caught KeyError in DataLoader worker process 1.\nOriginal Traceback (most recent '
            'call last):\n  File "/x/multimodal/data/readers.py", line 3, in read\n    row["y"]'
            '\nKeyError: "row 7 of labels.csv has no column \'y\'"\n')
    assert worker_error(text) == ('"row 7 of labels.csv has no column \'y\'"',
                                  ["/x/multimodal/data/readers.py"], "KeyError")
    assert worker_error("some other error") is None


def test_skip_corrupt_is_the_same_with_and_without_workers(tmp_path):
    from multimodal.data.vision import ImageClassificationDataModule

    folder = image_folder(tmp_path / "imgs", n=8)
    seen = {}
    for workers in (0, 2):
        data = ImageClassificationDataModule(train=str(folder), image_size=8, in_channels=1,
                                             batch_size=4, val_size=0, test_size=0,
                                             skip_corrupt=True, num_workers=workers,
                                             augment=False, verify_files=False)  # the
        # loader's own skipping (verify_files leaves the file out before any loader reads)
        data.setup("fit")
        seen[workers] = [tuple(t.clone() for t in batch) for batch in data.train_dataloader()]
    assert len(seen[0]) == len(seen[2]) == 4
    for a, b in zip(seen[0], seen[2], strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert sum(int(batch[2]) for batch in seen[2]) == 1  # the broken file, skipped once


# --- 5. out of memory ------------------------------------------------------------------------


@pytest.mark.parametrize("verb", ["fit", "predict"])
def test_out_of_memory_names_the_batch_the_model_and_the_fix(tmp_path, monkeypatch, capsys,
                                                            verb):
    from multimodal.cli.verbs import run

    cfg = digits_config(tmp_path, "max_epochs: 1")
    if verb == "predict":
        assert run(["fit", "--config", str(cfg), "--test_after_fit", "false"]) == 0
        folder = image_folder(tmp_path / "imgs", n=2, broken=None) / "a"
    hook = "training_step" if verb == "fit" else "predict_step"

    def out_of_memory(self, batch, batch_idx):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; "
                                     "79.1 GiB total capacity)")

    monkeypatch.setattr(ClassificationTask, hook, out_of_memory)
    capsys.readouterr()
    args = ["fit", "--config", str(cfg)] if verb == "fit" else \
        ["predict", "--config", str(cfg), "--ckpt_path",
         str(tmp_path / "run" / "version_0" / "checkpoints" / "last.ckpt"),
         "--data.init_args.predict", str(folder)]
    assert run(args) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    params = sum(p.numel() for p in __import__("multimodal").ViT(
        __import__("multimodal").ViTConfig(**DIGITS_VIT)).parameters())
    assert lines == [
        f"error: out of GPU memory with batch size 16 (ViT, {params / 1e6:.3g}M parameters): "
        "try --data.init_args.batch_size 8, --trainer.accumulate_grad_batches 2 (the same "
        f"effective batch), or --trainer.precision bf16-mixed (multimodal {verb})"]


def test_out_of_memory_in_another_verb_is_one_line_too():
    from multimodal.cli.errors import describe

    err = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore")
    assert describe(err, "embed") == "out of GPU memory: try a smaller --batch_size (half), " \
        "or --device cpu (multimodal embed)"


# --- 6. a dead loader worker -----------------------------------------------------------------


class KillWorker(L.Callback):
    """SIGKILL to one training loader worker after step ``step`` (as the OOM killer would)."""

    def __init__(self, step: int) -> None:
        self.step, self.done = step, False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step and not self.done:
            import multiprocessing

            self.done = True
            workers = [p for p in multiprocessing.active_children() if p.daemon]
            os.kill(workers[0].pid, signal.SIGKILL)


def test_a_dead_worker_stops_the_run_naming_its_signal_and_resumes_exactly(tmp_path):
    from tests.resume_runs import assert_same_run
    from tests.resume_runs import fit as plain_fit

    make = digits(num_workers=2)
    L.seed_everything(0, verbose=False)
    task, data = make()
    guard = RunGuard()
    run = trainer(tmp_path / "cut", KillWorker(3), guard, epochs=2)
    with pytest.raises((RuntimeError, ConnectionError, EOFError)):  # as torch finds it
        run.fit(task, data)
    error = guard.worker_death_error(run.global_step)
    saved_step = run.global_step
    last = tmp_path / "cut" / "checkpoints" / "last.ckpt"
    assert str(error) == ("a data loader worker died, killed by SIGKILL (the out-of-memory "
                          "killer? fewer --data.init_args.num_workers or a smaller batch use "
                          f"less memory): the run stopped; {last} holds step {saved_step}: "
                          "resume with --ckpt_path last")
    assert torch.load(last, weights_only=True)["global_step"] == saved_step >= 3
    whole, full = plain_fit(make, tmp_path / "whole", epochs=2)
    resumed, rest = plain_fit(make, tmp_path / "resumed", epochs=2, ckpt_path=str(last))
    assert rest.seen == full.seen[saved_step:]
    assert_same_run(whole, resumed)


def test_the_cli_names_a_dead_worker_in_one_line(tmp_path, capsys):
    from multimodal.cli.verbs import run

    cfg = digits_config(tmp_path, """max_epochs: 2
  callbacks:
    - class_path: tests.cli.test_faults.KillWorker
      init_args: {step: 1}""")
    cfg.write_text(cfg.read_text().replace("augment: false", "augment: false, num_workers: 2"))
    assert run(["fit", "--config", str(cfg)]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    last = tmp_path / "run" / "version_0" / "checkpoints" / "last.ckpt"
    step = torch.load(last, weights_only=True)["global_step"]
    assert lines == ["error: a data loader worker died, killed by SIGKILL (the out-of-memory "
                     "killer? fewer --data.init_args.num_workers or a smaller batch use less "
                     f"memory): the run stopped; {last} holds step {step}: resume with "
                     "--ckpt_path last (multimodal fit)"]


def test_batch_size_auto_finds_the_largest_that_fits_and_stores_it(tmp_path, monkeypatch,
                                                                   capsys, caplog):
    """A step that runs out of memory above 20 images: the search (from the config's 16)
    settles on 20, says so, trains with it and stores it with the checkpoint."""
    from multimodal.cli.verbs import run

    step = ClassificationTask.training_step
    tried: list[int] = []

    def limited(self, batch, batch_idx):
        tried.append(len(batch[0]))
        if len(batch[0]) > 20:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return step(self, batch, batch_idx)

    monkeypatch.setattr(ClassificationTask, "training_step", limited)
    cfg = digits_config(tmp_path, "max_steps: 1")
    with caplog.at_level(logging.INFO):
        code = run(["fit", "--config", str(cfg), "--data.init_args.batch_size", "auto",
                    "--test_after_fit", "false"])
    assert code == 0, capsys.readouterr().err
    assert "batch_size auto: 20 " in caplog.text
    assert any(size > 20 for size in tried) and tried[-1] == 20  # went past, came back
    last = tmp_path / "run" / "version_0" / "checkpoints" / "last.ckpt"
    stored = torch.load(last, weights_only=False)["datamodule_hyper_parameters"]
    assert stored["batch_size"] == 20
