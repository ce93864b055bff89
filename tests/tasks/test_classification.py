"""Training end to end: a real learning test, the CLI, resuming, predict."""

from __future__ import annotations

import io
import re
from pathlib import Path

import lightning as L
import pytest
import torch
import torchvision

import multimodal as mm
from multimodal.cli.callbacks import EpochSummary
from multimodal.cli.main import main as cli_main
from multimodal.data.vision import ImageClassificationDataModule
from multimodal.tasks import ClassificationTask

DIGITS_VIT = dict(image_size=8, patch_size=2, in_channels=1, num_classes=10, dim=48, depth=2,
                  heads=4, mlp_dim=96, pool="mean")


def _trainer(tmp_path: Path, **kw) -> L.Trainer:
    opts = dict(accelerator="cpu", logger=False, enable_checkpointing=False,
                enable_progress_bar=False, enable_model_summary=False,
                default_root_dir=tmp_path)
    opts.update(kw)
    return L.Trainer(**opts)


def test_tiny_vit_learns_digits(tmp_path):
    """A real learning test: a few seconds of training on 8x8 digits, > 90% held out."""
    L.seed_everything(0)
    dm = ImageClassificationDataModule("digits", batch_size=32, val_size=0.1, augment=False)
    task = ClassificationTask(mm.ViT(mm.ViTConfig(**DIGITS_VIT)),
                              optimizer={"lr": 3e-3, "weight_decay": 0.01})
    trainer = _trainer(tmp_path, max_epochs=20)
    trainer.fit(task, dm)
    result = trainer.test(task, dm, verbose=False)[0]
    assert result["test/acc"] > 0.90, result
    assert (tmp_path / "confusion_matrix.png").stat().st_size > 1000


def _weights(task: L.LightningModule) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in task.model.state_dict().items()}


class _Crash(RuntimeError):
    pass


class _CrashAtEpoch(L.Callback):
    """Kill the run when ``epoch`` starts, as a pre-empted job would die."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == self.epoch:
            raise _Crash(f"simulated crash at epoch {self.epoch}")


def test_interrupted_run_resumes_to_the_same_weights(tmp_path):
    """Kill a deterministic 3-epoch run after its first epoch, resume it from last.ckpt:
    the final weights equal those of an uninterrupted run."""

    def run(root: Path, ckpt_path: str | None = None, crash_at: int | None = None):
        L.seed_everything(0)
        dm = ImageClassificationDataModule("digits", batch_size=128, val_size=0.1,
                                           augment=False, seed=3)
        task = ClassificationTask(mm.ViT(mm.ViTConfig(**DIGITS_VIT)), optimizer={"lr": 3e-3})
        callbacks = [L.pytorch.callbacks.ModelCheckpoint(dirpath=root / "ckpt", save_last=True)]
        if crash_at is not None:
            callbacks.append(_CrashAtEpoch(crash_at))
        trainer = _trainer(root, max_epochs=3, callbacks=callbacks, enable_checkpointing=True)
        trainer.fit(task, dm, ckpt_path=ckpt_path)
        return task

    initial = _weights(ClassificationTask(mm.ViT(mm.ViTConfig(**DIGITS_VIT))))
    full = _weights(run(tmp_path / "full"))
    with pytest.raises(_Crash):
        run(tmp_path / "split", crash_at=1)
    resumed = _weights(run(tmp_path / "split", ckpt_path="last"))
    assert any(not torch.equal(initial[k], full[k]) for k in full)  # training moved them
    for k in full:
        torch.testing.assert_close(resumed[k], full[k], atol=1e-6, rtol=1e-6)


def _digits_config(tmp_path: Path) -> Path:
    cfg = tmp_path / "digits.yaml"
    vit = "\n".join(f"          {k}: {v}" for k, v in DIGITS_VIT.items())
    cfg.write_text(f"""
seed_everything: 0
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
  init_args: {{dataset: digits, batch_size: 64, val_size: 0.1, augment: false}}
trainer:
  accelerator: cpu
  max_epochs: 1
  enable_progress_bar: false
  default_root_dir: {tmp_path / "run"}
  logger:
    - class_path: lightning.pytorch.loggers.CSVLogger
      init_args: {{save_dir: {tmp_path / "run"}, name: logs}}
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {{dirpath: {tmp_path / "run" / "checkpoints"}, save_last: true}}
""")
    return cfg


def test_cli_fast_dev_run(tmp_path, monkeypatch, capsys):
    """``--trainer.fast_dev_run 2``: two training and two validation batches of the task
    the YAML names, finite losses, one summary line, no test run after fit."""
    calls: dict[str, list[float]] = {"train": [], "val": []}
    train_step, val_step = ClassificationTask.training_step, ClassificationTask.validation_step

    def training_step(self, batch, batch_idx):
        loss = train_step(self, batch, batch_idx)
        calls["train"].append(float(loss))
        return loss

    def validation_step(self, batch, batch_idx):
        calls["val"].append(batch_idx)
        return val_step(self, batch, batch_idx)

    monkeypatch.setattr(ClassificationTask, "training_step", training_step)
    monkeypatch.setattr(ClassificationTask, "validation_step", validation_step)
    cfg = _digits_config(tmp_path)
    cli_main(["fit", "--config", str(cfg), "--trainer.fast_dev_run", "2"])
    assert len(calls["train"]) == 2 and all(torch.isfinite(torch.tensor(calls["train"])))
    assert calls["val"] == [0, 1]
    out = capsys.readouterr().out
    assert re.search(r"^epoch 1/1  step 2  .*val/acc", out, re.MULTILINE), out[-2000:]
    assert "test/acc" not in out  # the CLI runs no test after a smoke run


def test_cli_fit_then_predict_a_folder(tmp_path, capsys):
    cfg = _digits_config(tmp_path)
    cli_main(["fit", "--config", str(cfg), "--model.init_args.optimizer.lr", "0.002"])
    out = capsys.readouterr().out
    assert "test/acc" in out  # test ran on the best checkpoint after fit
    # captured stdout is not a terminal: one plain line per validation, with its metrics
    (line,) = [ln for ln in out.splitlines() if ln.startswith("epoch ")]
    assert re.match(r"epoch 1/1  step \d+  \d+m\d\ds  .*val/acc 0\.\d+", line), line
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert last.is_file()
    # the checkpoint loads with weights_only=True (no pickled objects)
    ckpt = torch.load(last, map_location="cpu", weights_only=True)
    assert ckpt["multimodal_model"]["model_type"] == "ViT"
    assert mm.from_pretrained(last).config.num_classes == 10
    # predict: a folder of PNGs made from real digits, one class name per file
    from multimodal.data.sources.digits import load_digits

    digits = load_digits()
    folder = tmp_path / "pngs"
    folder.mkdir()
    for i in range(3):
        torchvision.io.write_png(digits.images[i][None], str(folder / f"img{i}.png"))
    cli_main(["predict", "--config", str(cfg), "--ckpt_path", str(last),
              "--data.init_args.predict", str(folder)])
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("img")]
    assert [ln.split("\t")[0] for ln in lines] == ["img0.png", "img1.png", "img2.png"]
    assert all(ln.split("\t")[1] in digits.class_names for ln in lines)


def test_epoch_summary_stays_quiet_on_a_terminal(tmp_path):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal, log = Terminal(), io.StringIO()
    task = ClassificationTask(mm.ViT(mm.ViTConfig(**DIGITS_VIT)))
    dm = ImageClassificationDataModule("digits", batch_size=64, val_size=0.1, augment=False)
    trainer = L.Trainer(accelerator="cpu", max_epochs=2, limit_train_batches=2,
                        limit_val_batches=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path,
                        callbacks=[EpochSummary(terminal), EpochSummary(log)])
    trainer.fit(task, dm)
    assert terminal.getvalue() == ""
    lines = log.getvalue().splitlines()
    assert [ln.split("  ")[:2] for ln in lines] == [["epoch 1/2", "step 2"],
                                                    ["epoch 2/2", "step 4"]]
    assert all("val/loss" in ln and "train/loss" in ln for ln in lines)


def test_head_and_data_disagree(tmp_path):
    dm = ImageClassificationDataModule("digits")
    task = ClassificationTask(mm.ViT(mm.ViTConfig(**{**DIGITS_VIT, "num_classes": 7})))
    with pytest.raises(ValueError, match="10 classes"):
        _trainer(tmp_path, fast_dev_run=1).fit(task, dm)


@pytest.mark.parametrize("precision", ["bf16-mixed"])
def test_bf16_mixed_runs_on_cpu(tmp_path, precision):
    """bf16-mixed on the CPU: the layers compute in bfloat16 under autocast, the weights
    stay float32 and are updated."""
    dm = ImageClassificationDataModule("digits", batch_size=32)
    task = ClassificationTask(mm.ViT(mm.ViTConfig(**DIGITS_VIT)))
    before = _weights(task)
    seen: list[torch.dtype] = []
    task.model.head.register_forward_hook(lambda m, args, out: seen.append(out.dtype))
    _trainer(tmp_path, fast_dev_run=2, precision=precision).fit(task, dm)
    assert seen and set(seen) == {torch.bfloat16}
    after = _weights(task)
    assert all(v.dtype == torch.float32 for v in after.values())
    assert not torch.equal(after["head.weight"], before["head.weight"])
