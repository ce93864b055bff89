"""The CLI's default checkpointing (#38): ``last.ckpt`` is the latest state whatever the
monitored metric does (Lightning 2.6's ``save_last`` writes it only when a top-k checkpoint
is saved), a SIGKILL loses at most the epoch in progress, ties between epochs go to the lower
validation loss and then the later step, a too small validation split is named, and
``trainer.min_steps`` is a step budget that raises ``max_epochs``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

from multimodal.cli.callbacks import Preemption, RunCheckpoint, StepBudget, resume_checkpoint
from multimodal.cli.main import MultimodalCLI
from multimodal.tasks import ClassificationTask
from tests.cli.test_resume import digits
from tests.resume_runs import Record, assert_same_run, fit

STEPS_PER_EPOCH = 5  # digits(): 80 training images, batch 16


class Constant(L.Callback):
    """Logs ``val/never`` = 0.5 at every validation: a metric that never improves; and keeps
    ``val/loss`` of every validation (``losses[step]``)."""

    def __init__(self) -> None:
        self.losses: dict[int, float] = {}

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        pl_module.log("val/never", 0.5)

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.losses[trainer.global_step] = float(trainer.callback_metrics["val/loss"])


def run(folder: Path, checkpoint: ModelCheckpoint, epochs: int = 3, **trainer_args
        ) -> tuple[L.Trainer, Constant]:
    L.seed_everything(0, verbose=False)
    task, data = digits()()
    constant = Constant()
    args = dict(accelerator="cpu", max_epochs=epochs, logger=False, enable_progress_bar=False,
                enable_model_summary=False, default_root_dir=folder, num_sanity_val_steps=0,
                limit_val_batches=2, callbacks=[constant, checkpoint])
    trainer = L.Trainer(**{**args, **trainer_args})
    trainer.fit(task, data)
    return trainer, constant


def step_of(path: Path | str) -> int:
    return int(torch.load(path, weights_only=True, map_location="cpu")["global_step"])


def test_last_is_the_final_step_when_the_metric_never_improves(tmp_path):
    # Lightning's own: last.ckpt stays where the metric last improved (the first epoch)
    run(tmp_path / "lightning", ModelCheckpoint(dirpath=tmp_path / "lightning" / "ckpt",
                                                monitor="val/never", mode="max",
                                                save_last=True))
    assert step_of(tmp_path / "lightning" / "ckpt" / "last.ckpt") == STEPS_PER_EPOCH
    # ours: the final step
    folder = tmp_path / "ours" / "ckpt"
    trainer, _ = run(tmp_path / "ours", RunCheckpoint(dirpath=folder, monitor="val/never",
                                                      mode="max"))
    assert trainer.global_step == 3 * STEPS_PER_EPOCH
    assert step_of(folder / "last.ckpt") == 3 * STEPS_PER_EPOCH
    assert not list(folder.glob(".*partial")) and not list(folder.glob("last-v*.ckpt"))


def test_last_is_written_at_every_epoch_end_without_validation(tmp_path):
    folder = tmp_path / "ckpt"
    steps = []
    original = RunCheckpoint._save_last_checkpoint

    def spy(self, trainer, candidates):
        steps.append(trainer.global_step)
        original(self, trainer, candidates)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RunCheckpoint, "_save_last_checkpoint", spy)
        run(tmp_path, RunCheckpoint(dirpath=folder, monitor=None), limit_val_batches=0)
    assert steps == [5, 10, 15]
    assert step_of(folder / "last.ckpt") == 15


def test_short_epochs_write_last_at_most_every_n_seconds_and_at_the_end(tmp_path):
    folder = tmp_path / "ckpt"
    steps = []
    original = RunCheckpoint._save_last_checkpoint

    def spy(self, trainer, candidates):
        steps.append(trainer.global_step)
        original(self, trainer, candidates)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RunCheckpoint, "_save_last_checkpoint", spy)
        run(tmp_path, RunCheckpoint(dirpath=folder, monitor="val/never", mode="max",
                                    last_every_seconds=3600), epochs=4)
    assert steps == [5, 20]  # the first epoch end (with the best), then the end of training
    assert step_of(folder / "last.ckpt") == 20
    with pytest.raises(ValueError, match="last_every_seconds must be >= 0"):
        RunCheckpoint(last_every_seconds=-1)


def test_ties_go_to_the_lower_val_loss_then_the_later_step(tmp_path):
    trainer, constant = run(tmp_path / "a", RunCheckpoint(dirpath=tmp_path / "a" / "c",
                                                          monitor="val/never", mode="max"))
    best_step = min(constant.losses, key=lambda s: (constant.losses[s], -s))
    assert step_of(trainer.checkpoint_callback.best_model_path) == best_step
    assert "the lower val/loss, then the later step" in trainer.checkpoint_callback.best_reason()
    # without the second key: the later step (Lightning keeps the first)
    trainer, _ = run(tmp_path / "b", RunCheckpoint(dirpath=tmp_path / "b" / "c", tie_break=None,
                                                   monitor="val/never", mode="max"))
    assert step_of(trainer.checkpoint_callback.best_model_path) == 3 * STEPS_PER_EPOCH
    trainer, _ = run(tmp_path / "c", ModelCheckpoint(dirpath=tmp_path / "c" / "c",
                                                     monitor="val/never", mode="max"))
    assert step_of(trainer.checkpoint_callback.best_model_path) == STEPS_PER_EPOCH


def test_a_better_value_still_wins_and_top_k_keeps_the_best_keys(tmp_path):
    """Ranked by val/loss (min): the best is the lowest loss; with save_top_k=2 the two
    lowest are kept."""
    folder = tmp_path / "c"
    trainer, constant = run(tmp_path, RunCheckpoint(dirpath=folder, monitor="val/loss",
                                                    mode="min", save_top_k=2), epochs=4)
    ranked = sorted(constant.losses, key=lambda s: (constant.losses[s], -s))
    callback = trainer.checkpoint_callback
    assert step_of(callback.best_model_path) == ranked[0]
    assert sorted(step_of(p) for p in callback.best_k_models) == sorted(ranked[:2])
    on_disk = sorted(step_of(p) for p in folder.glob("*.ckpt") if p.name != "last.ckpt")
    assert on_disk == sorted(ranked[:2])


def test_a_small_validation_split_is_named_and_the_test_says_what_it_reads(tmp_path):
    callback = RunCheckpoint(dirpath=tmp_path / "c", monitor="val/never", mode="max")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer, _ = run(tmp_path, callback)
    messages = [str(w.message) for w in caught]
    assert [m for m in messages if "the validation split has 32 examples (< 50)" in m], messages
    assert callback.val_examples == 32
    # too few to rank: the test after fit reads the latest state
    path, why = MultimodalCLI.checkpoint_to_test(SimpleNamespace(trainer=trainer))
    assert path == str(tmp_path / "c" / "last.ckpt") and step_of(path) == 15
    assert why == ("the latest state: 32 validation examples (< 50) are too few to rank "
                   "checkpoints by val/never")
    # enough: the best, with its value and the tie rule
    callback.min_val_examples = 32
    path, why = MultimodalCLI.checkpoint_to_test(SimpleNamespace(trainer=trainer))
    assert path == callback.best_model_path
    assert why.startswith("the highest val/never 0.5000 at step ")
    assert why.endswith("an equal value goes to the lower val/loss, then the later step")


def test_the_minutes_clock_and_the_epoch_ends_share_one_last_ckpt(tmp_path, monkeypatch):
    clock = iter(range(0, 100_000, 20))  # 20 s per read: every_minutes=1 saves every 3rd step
    monkeypatch.setattr("multimodal.cli.callbacks.time.monotonic", lambda: next(clock))
    folder = tmp_path / "checkpoints"
    trainer, _ = run(tmp_path, RunCheckpoint(dirpath=folder, monitor="val/never", mode="max"),
                     epochs=2)
    del trainer
    L.seed_everything(0, verbose=False)
    task, data = digits()()
    trainer = L.Trainer(accelerator="cpu", max_epochs=2, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path / "b",
                        num_sanity_val_steps=0, limit_val_batches=2,
                        callbacks=[Constant(), Preemption(every_minutes=1),
                                   RunCheckpoint(dirpath=tmp_path / "b" / "checkpoints",
                                                 monitor="val/never", mode="max")])
    trainer.fit(task, data)
    names = sorted(p.name for p in (tmp_path / "b" / "checkpoints").glob("*.ckpt"))
    assert [n for n in names if n.startswith("last")] == ["last.ckpt"], names
    assert step_of(tmp_path / "b" / "checkpoints" / "last.ckpt") == 2 * STEPS_PER_EPOCH


KILLED_RUN = """
import sys, time
import lightning as L, torch
torch.set_num_threads(1)
sys.path.insert(0, {root!r})
from multimodal.cli.callbacks import RunCheckpoint
from tests.cli.test_checkpoints import Constant, STEPS_PER_EPOCH
from tests.cli.test_resume import digits

class Report(L.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        print(trainer.global_step, flush=True)
        time.sleep(0.2)

L.seed_everything(0, verbose=False)
task, data = digits()()
trainer = L.Trainer(accelerator="cpu", max_epochs=4, logger=False, enable_progress_bar=False,
                    enable_model_summary=False, default_root_dir={folder!r},
                    num_sanity_val_steps=0, limit_val_batches=2,
                    callbacks=[Constant(), Report(),
                               RunCheckpoint(dirpath={folder!r} + "/checkpoints",
                                             monitor="val/never", mode="max")])
trainer.fit(task, data)
"""


@pytest.mark.slow
def test_sigkill_loses_at_most_the_epoch_in_progress_and_last_resumes(tmp_path):
    folder = tmp_path / "killed"
    root = str(Path(__file__).parents[2])
    env = {**os.environ, "PYTHONPATH": root}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_RUN.format(root=root,
                                                                     folder=str(folder))],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env, cwd=root)
    kill_at = 2 * STEPS_PER_EPOCH + 2  # in the third epoch
    deadline = time.monotonic() + 300
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip().isdigit() and int(line) >= kill_at:
            break
        assert time.monotonic() < deadline, "the run did not reach the third epoch"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    last = folder / "checkpoints" / "last.ckpt"
    # the metric stopped improving after the first epoch; last.ckpt is still the end of the
    # second one: only the epoch in progress is lost
    state = torch.load(last, weights_only=True, map_location="cpu")
    assert (state["global_step"], state["epoch"]) == (2 * STEPS_PER_EPOCH, 1)
    # --ckpt_path last finds it (the best checkpoint is older) ...
    probe = L.Trainer(accelerator="cpu", logger=False, default_root_dir=folder,
                      callbacks=[RunCheckpoint(dirpath=folder / "checkpoints")])
    assert resume_checkpoint(probe, "last") == str(last)
    # ... and the resumed run trains from there to the weights of an uninterrupted one
    whole, full = fit(digits(), tmp_path / "whole", epochs=4)
    resumed, rest = fit(digits(), tmp_path / "resumed", epochs=4, ckpt_path=str(last))
    assert [s for _, s, _ in rest.seen] == list(range(2 * STEPS_PER_EPOCH, 4 * STEPS_PER_EPOCH))
    assert rest.seen == full.seen[2 * STEPS_PER_EPOCH:]
    assert_same_run(whole, resumed)


def test_min_steps_raises_max_epochs_before_the_schedule_is_made(tmp_path):
    L.seed_everything(0, verbose=False)
    task, data = digits()()
    budget = StepBudget()
    stop = EarlyStopping(monitor="val/loss", patience=1)
    trainer = L.Trainer(accelerator="cpu", max_epochs=1, min_steps=38, logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path, enable_checkpointing=False,
                        limit_val_batches=1, num_sanity_val_steps=0,
                        callbacks=[budget, stop, Record()])
    trainer.fit(task, data)
    # ceil(38 / 5) = 8 epochs; early stopping cannot end the run before 38 steps
    assert trainer.max_epochs == 8
    assert trainer.global_step >= 38
    assert trainer.estimated_stepping_batches == 40  # the schedule spans the whole run
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    assert budget.message == ("step budget: at least 38 optimiser steps (trainer.min_steps), "
                              "5 an epoch: max_epochs 1 raised to 8; then early stopping on "
                              "val/loss (patience 1 validations)")
    if trainer.global_step == 40:  # ran to the end: the cosine reached its floor
        lr = scheduler.get_last_lr()[0]
        opt = task.optimizer_config
        assert lr == pytest.approx(opt.lr * opt.min_lr_ratio, rel=1e-6)


def test_min_steps_below_max_epochs_changes_nothing(tmp_path):
    L.seed_everything(0, verbose=False)
    task, data = digits()()
    budget = StepBudget()
    trainer = L.Trainer(accelerator="cpu", max_epochs=2, min_steps=3, logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path, enable_checkpointing=False,
                        limit_val_batches=0, callbacks=[budget])
    trainer.fit(task, data)
    assert trainer.max_epochs == 2 and trainer.global_step == 10
    assert budget.message is not None and "already gives 10" in budget.message


def _budget_run(tmp_path, budget: StepBudget, min_steps: int = 40, max_epochs: int = 1,
                **trainer_args) -> tuple[L.Trainer, ClassificationTask]:
    L.seed_everything(0, verbose=False)
    task, data = digits()()
    trainer = L.Trainer(accelerator="cpu", max_epochs=max_epochs, min_steps=min_steps,
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path, enable_checkpointing=False,
                        limit_val_batches=0, callbacks=[budget], **trainer_args)
    trainer.fit(task, data)
    return trainer, task


def test_a_max_epochs_on_the_command_line_is_not_raised_by_the_budget(tmp_path):
    budget = StepBudget(given={"max_epochs": 1})
    trainer, _ = _budget_run(tmp_path, budget)
    assert trainer.max_epochs == 1 and trainer.global_step == STEPS_PER_EPOCH
    assert budget.message == ("step budget: 5 optimiser steps: --trainer.max_epochs 1 on the "
                              "command line limits the run (5 an epoch), not trainer.min_steps "
                              "40")


@pytest.mark.parametrize("given", [{"max_steps": 7}, {}])
def test_max_steps_caps_the_budget_and_the_line_says_so(tmp_path, given):
    budget = StepBudget(given=given)
    trainer, _ = _budget_run(tmp_path, budget, max_steps=7)
    assert trainer.global_step == 7 and trainer.max_epochs == 2  # ceil(7 / 5), not 8
    who = "--trainer.max_steps 7 on the command line" if given else "trainer.max_steps 7"
    assert budget.message == (f"step budget: 7 optimiser steps ({who} caps trainer.min_steps "
                              "40), 5 an epoch: max_epochs 1 raised to 2")


def test_a_time_budget_cuts_a_raised_run_and_rescales_its_schedule(tmp_path, monkeypatch):
    """A fake clock, one second a call: 2 steps timed at 1 s each, 20 s of budget -> the
    40-step budget (8 epochs of 5) is cut to 20 steps (4 epochs), and the warm-up + cosine
    schedule, rescaled, still ends at its floor at the last step."""
    import multimodal.cli.callbacks as callbacks

    ticks = iter(range(1000))
    monkeypatch.setattr(callbacks, "time", SimpleNamespace(monotonic=lambda: next(ticks)))
    monkeypatch.setattr(StepBudget, "TIME_AFTER_STEPS", 2)
    monkeypatch.setattr(StepBudget, "TIME_AFTER_SECONDS", 0.0)
    budget = StepBudget(minutes=20 / 60)
    trainer, task = _budget_run(tmp_path, budget)
    assert trainer.global_step == 20 and trainer.max_epochs == 4
    assert budget.time_message == (
        "time budget: 40 steps would take ~0.7 min at 1.00 s a step; the run is cut to 20 "
        "steps (4 epochs) to fit 0.333333 min (--budget_minutes); the learning-rate "
        "schedule is rescaled to end with it")
    opt = task.optimizer_config
    lr = trainer.lr_scheduler_configs[0].scheduler.get_last_lr()[0]
    assert lr == pytest.approx(opt.lr * opt.min_lr_ratio, rel=1e-6, abs=1e-12)
    # a limit typed on the command line is not cut by the time budget
    ticks = iter(range(1000))
    budget = StepBudget(minutes=20 / 60, given={"max_steps": 30})
    trainer, _ = _budget_run(tmp_path, budget, max_steps=30)
    assert trainer.global_step == 30 and budget.time_message is None


def _digits_config(tmp_path: Path) -> Path:
    from tests.cli.test_resume import DIGITS_VIT

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
  max_epochs: 1
  min_steps: 5
  limit_val_batches: 1
  enable_model_summary: false
  default_root_dir: {tmp_path / "run"}
""")
    return cfg


def test_the_cli_default_budget_and_test_after_fit_say_what_they_do(tmp_path, caplog, capsys):
    """Through ``multimodal fit``: the default checkpoint is a RunCheckpoint, ``min_steps``
    raises ``max_epochs`` (one line says so), last.ckpt holds the final step, and the test
    after fit names the checkpoint it reads and why."""
    import logging

    from multimodal.cli.main import main as cli_main

    cfg = _digits_config(tmp_path)
    with caplog.at_level(logging.INFO):
        cli_main(["fit", "--config", str(cfg)])
    text = caplog.text + capsys.readouterr().out
    # 2 steps an epoch: ceil(5 / 2) = 3 epochs
    assert "step budget: at least 5 optimiser steps (trainer.min_steps), 2 an epoch: " \
        "max_epochs 1 raised to 3" in text
    folder = tmp_path / "run" / "version_0" / "checkpoints"
    assert step_of(folder / "last.ckpt") == 6
    (line,) = [ln for ln in text.splitlines() if "test after fit: " in ln]
    assert f"test after fit: {folder / 'last.ckpt'} (the latest state: 32 validation " \
        "examples (< 50) are too few to rank checkpoints by val/acc_macro)" in line


def test_a_limit_typed_on_the_command_line_wins_over_the_configs_budget(tmp_path, caplog,
                                                                        capsys):
    """``multimodal fit --config X --trainer.max_epochs 1`` trains one epoch (2 steps), not
    the config's min_steps 5, and the budget line names the limit that ran."""
    import logging

    from multimodal.cli.main import command_line_limits
    from multimodal.cli.main import main as cli_main

    assert command_line_limits(["fit", "--trainer.max_epochs", "1", "--trainer.max_steps=9",
                                "--trainer.min_steps", "3"]) == {"max_epochs": 1,
                                                                 "max_steps": 9}
    cfg = _digits_config(tmp_path)
    with caplog.at_level(logging.INFO):
        cli_main(["fit", "--config", str(cfg), "--trainer.max_epochs", "1",
                  "--test_after_fit", "false"])
    text = caplog.text + capsys.readouterr().out
    assert "step budget: 2 optimiser steps: --trainer.max_epochs 1 on the command line " \
        "limits the run (2 an epoch), not trainer.min_steps 5" in text
    (last,) = (tmp_path / "run").glob("**/last.ckpt")
    assert step_of(last) == 2


def test_a_rerun_keeps_the_first_runs_checkpoints_and_last_finds_the_newest(tmp_path):
    """Two ``fit`` of one config: each run's checkpoints in its own ``version_N/checkpoints``
    (the logs' N), the first run's files byte for byte as they were; ``--ckpt_path last``
    resumes from the newest across versions, and ``test`` given a checkpoint logs under the
    run folder."""
    from multimodal.cli.main import main as cli_main
    from multimodal.cli.main import run_root

    cfg = _digits_config(tmp_path)
    short = ["--trainer.min_steps", "0", "--test_after_fit", "false"]
    root = tmp_path / "run"
    cli_main(["fit", "--config", str(cfg), *short])
    first = root / "version_0" / "checkpoints" / "last.ckpt"
    before = first.read_bytes()
    cli_main(["fit", "--config", str(cfg), *short, "--trainer.max_epochs", "2"])
    second = root / "version_1" / "checkpoints" / "last.ckpt"
    assert first.read_bytes() == before and step_of(first) == 2 and step_of(second) == 4
    assert (root / "version_1" / "metrics.csv").is_file()  # the logs' version, the same N
    assert not (root / "checkpoints").exists()
    # --ckpt_path last: the newest whole checkpoint, whichever version holds it
    probe = L.Trainer(accelerator="cpu", logger=False, default_root_dir=root,
                      callbacks=[RunCheckpoint(dirpath=root / "version_2" / "checkpoints")])
    assert resume_checkpoint(probe, "last") == str(second)
    # a resumed run continues the run it resumes, in that run's folder (its best is kept)
    cli_main(["fit", "--config", str(cfg), *short, "--trainer.max_epochs", "3",
              "--ckpt_path", "last"])
    assert step_of(second) == 6 and first.read_bytes() == before
    assert not (root / "version_2" / "checkpoints").exists()
    assert (root / "version_2" / "metrics.csv").is_file()  # its logs: a new version
    os.utime(first, (time.time() + 60, time.time() + 60))
    assert resume_checkpoint(probe, "last") == str(first)
    # test given a checkpoint and no root: its logs go to the run folder, as a new version
    assert run_root(first) == run_root(root / "checkpoints" / "old.ckpt") == root
    cli_main(["test", "--config", str(cfg), "--ckpt_path", str(second),
              "--trainer.default_root_dir", "null", "--trainer.limit_test_batches", "1"])
    assert (root / "version_3" / "metrics.csv").is_file()


OWN_DATA_CONFIGS = ("finetune_text", "finetune_image", "finetune_audio", "finetune_clip",
                    "vit_imagefolder", "audio_folder", "caption_manifest", "gpt_textfiles",
                    "seq2seq_pairs")


@pytest.mark.parametrize("stem", OWN_DATA_CONFIGS)
def test_every_own_data_config_has_a_step_budget_and_early_stopping(stem):
    import yaml
    from jsonargparse import dict_to_namespace

    from multimodal.cli.main import add_run_defaults

    path = Path(__file__).parents[2] / "configs" / f"{stem}.yaml"
    text = path.read_text()
    parsed = yaml.safe_load(text)
    trainer = parsed["trainer"]
    assert trainer["min_steps"] >= 100
    config = dict_to_namespace(parsed)
    add_run_defaults(config)  # `early_stopping: N` becomes the callback the run gets
    stops = [c for c in config.trainer.callbacks
             if c.class_path == "lightning.pytorch.callbacks.EarlyStopping"]
    assert len(stops) == 1 and stops[0].init_args.monitor == "val/loss"
    assert stops[0].init_args.patience == parsed["early_stopping"] >= 1
    assert "whatever the data size (trainer.min_steps" in text  # the comment says so
    if trainer.get("max_steps") is None:  # epochs: the budget fits in them for large data
        assert trainer["max_epochs"] >= 5
    # sized by time as well (#52): a budget raised for small data is cut to what fits
    assert 0 < parsed["budget_minutes"] <= 10
    workers = parsed["data"]["init_args"].get("num_workers", 0)
    assert workers in (0, "auto")  # data in memory: none; files: chosen for the machine
