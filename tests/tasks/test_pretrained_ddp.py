"""Fine-tuning from a folder with 2 CPU processes (gloo): both ranks build the task from the
folder themselves and start from bit-identical weights, the new head included (drawn from a
fixed seed, not the ranks' differing global seeds), and stay identical through training."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("transformers")
from tests import pretrained_folders as folders  # needs transformers

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_two_ranks_fine_tune_a_folder_identically(tmp_path):
    vit = folders.vit_folder(tmp_path / "vit")
    rng = np.random.default_rng(0)
    for c in ("ant", "bee", "cat"):
        (tmp_path / "img" / c).mkdir(parents=True)
        for i in range(8):
            pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "img" / c / f"{i}.png")
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    run = subprocess.run([sys.executable, "-m", "tests.ddp_finetune_run",
                          str(vit), str(tmp_path / "img"), str(out)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    start = [torch.load(out / f"start{r}.pt", weights_only=True) for r in (0, 1)]
    end = [torch.load(out / f"end{r}.pt", weights_only=True) for r in (0, 1)]
    assert start[0]["head.weight"].shape == (3, 32)  # the new head, from the data
    for name in start[0]:
        assert torch.equal(start[0][name], start[1][name]), f"ranks start apart at {name}"
        assert torch.equal(end[0][name], end[1][name]), f"ranks end apart at {name}"
    assert not torch.equal(start[0]["head.weight"], end[0]["head.weight"])  # it trained
