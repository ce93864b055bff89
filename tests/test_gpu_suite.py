"""benchmarks/gpu_suite.sh stays a prepared run: it parses, its default rows' time limits
add up to less than 9 minutes, and its helpers build the commands it runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
SUITE = ROOT / "benchmarks" / "gpu_suite.sh"
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_the_suite_parses() -> None:
    subprocess.run(["bash", "-n", str(SUITE)], check=True)


def test_an_unknown_option_is_refused() -> None:
    out = subprocess.run(["bash", str(SUITE), "--fast"], capture_output=True, text=True)
    assert out.returncode == 2 and "error: unknown option --fast" in out.stderr


def test_the_default_rows_fit_in_nine_minutes() -> None:
    """The sum of the limits of the issue-50 rows on the GPU (card, the training rows'
    `lim N`, mfu, the smoke row), each one `timeout`, is under 540 s."""
    text = SUITE.read_text()
    block = text[text.index('if [[ "$ROWS" == issue50'):text.index('if [[ "$ROWS" == issue41')]
    limits = [int(n) for n in re.findall(r'"\$\(lim (\d+)\)"', block)]
    assert len(limits) == 6  # main, long, igpt, caption, clip, mfu
    card = int(re.search(r"step card (\d+) nvidia-smi", block).group(1))
    smoke = int(re.search(r"SMOKE_LIMIT=(\d+)\n\s*MFU=\(--batch", text).group(1))
    assert sum(limits) + card + smoke < 540, (limits, card, smoke)


def test_the_training_rows_summary(tmp_path: Path) -> None:
    from fit_row import summarise

    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"name": "main", "command": "multimodal fit --config x.yaml",
                                "rc": 0, "device": "NVIDIA H200", "training_seconds": 18.5,
                                "steps": 6450, "steps_per_s": 348.6, "median_step_ms": 2.5,
                                "epochs": 15, "test": {"test/acc": 0.9071, "test/x": 1.0},
                                "stopped_by_max_time": True}) + "\n")
    table = summarise(rows).splitlines()
    assert table[0].startswith("| row | rc | device")
    assert table[2] == "| main | 0 | NVIDIA H200 | 18.5 | 6450 | 348.6 | 2.5 | 15 | acc 0.9071 " \
           "(stopped by max_time) | `multimodal fit --config x.yaml` |"


@pytest.mark.parametrize(("stem", "want", "absent"), [
    ("vit_fashion_mnist_ddp", ["--trainer.devices", "1", "--trainer.strategy", "auto"], []),
    ("vit_fashion_mnist", ["--trainer.precision", "bf16-mixed"], []),
    ("tts_voices", [], ["--trainer.precision"]),  # pinned 32-true: kept
])
def test_smoke_commands(stem: str, want: list[str], absent: list[str], tmp_path: Path) -> None:
    from smoke_configs import command

    cmd = command(ROOT / "configs" / f"{stem}.yaml", 30, "cpu", tmp_path, gpu_like=True)
    joined = " ".join(cmd)
    assert "--trainer.max_steps 30" in joined and "--trainer.accelerator cpu" in joined
    assert " ".join(want) in joined
    assert not [a for a in absent if a in cmd]
