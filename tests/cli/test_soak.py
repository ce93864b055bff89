"""Soak test (#32, slow): ``multimodal fit`` on a small ViT, killed at 5 random points (SIGKILL
and SIGTERM mixed) and resumed with ``--ckpt_path last`` each time (the last resume after
``last.ckpt`` was cut short, as by a full disk), ends with the weights of the uninterrupted
run, bit for bit (one CPU thread)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

CONFIG = """
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
  init_args: {{dataset: digits, batch_size: 16, val_size: 32, limit_train: 320,
               augment: true, flip: true}}
trainer:
  max_epochs: 3
  accelerator: cpu
  precision: 32-true
  logger: false
  enable_progress_bar: false
  limit_val_batches: 2
  val_check_interval: 10
  default_root_dir: {root}
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {{every_n_train_steps: 1, save_last: true, save_top_k: -1,
                   filename: "{{step}}"}}
    - class_path: tests.resume_runs.Slow
      init_args: {{seconds: 0.08}}
"""
STEPS = 60  # 3 epochs of 20 batches


def start(root: Path) -> subprocess.Popen:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.yaml").write_text(CONFIG.format(root=root))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "multimodal.cli", "fit", "--config", str(root / "config.yaml"),
           "--ckpt_path", "last", "--test_after_fit", "false"]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def steps_saved(root: Path) -> int:
    # every restart is a new run, in its own version_N/checkpoints
    steps = [int(p.stem.split("=")[1])
             for p in root.glob("version_*/checkpoints/step=*.ckpt")]
    return max(steps, default=0)


def newest_last(root: Path) -> Path:
    return max(root.glob("version_*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


@pytest.mark.slow
def test_killed_five_times_ends_like_the_uninterrupted_run(tmp_path):
    whole = start(tmp_path / "whole")
    out, _ = whole.communicate(timeout=600)
    assert whole.returncode == 0, out[-3000:]

    rng = random.Random(32)
    kinds = [signal.SIGKILL, signal.SIGTERM, signal.SIGKILL, signal.SIGTERM,
             rng.choice([signal.SIGKILL, signal.SIGTERM])]
    root, log = tmp_path / "cut", []
    for kind in kinds:
        target = min(steps_saved(root) + rng.randint(2, 9), STEPS - 3)
        run = start(root)
        while steps_saved(root) < target and run.poll() is None:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.1))  # anywhere in a step, or in a checkpoint write
        run.send_signal(kind)
        out, _ = run.communicate(timeout=600)
        log.append((kind.name, target, run.returncode))
        expected = -signal.SIGKILL if kind == signal.SIGKILL else 128 + signal.SIGTERM
        assert run.returncode == expected, (log, out[-3000:])
    # the disk filled up while last.ckpt was written: --ckpt_path last falls back
    last = newest_last(root)
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    final = start(root)
    out, _ = final.communicate(timeout=600)
    assert final.returncode == 0, out[-3000:]
    assert "skipping" in out and "last.ckpt" in out, out[-3000:]

    a = weights(newest_last(tmp_path / "whole"))
    last = newest_last(root)  # the final run's, in a version of its own
    b = weights(last)
    assert torch.load(last, weights_only=True)["global_step"] == STEPS
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), (key, log)
