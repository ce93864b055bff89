"""The smoke row of ``benchmarks/gpu_suite.sh``: every shipped config trains a few steps on
the device (``multimodal fit --config configs/X.yaml --trainer.max_steps N``), in parallel
subprocesses, each with its own time limit; one line per config and a count at the end.

Configs made for the user's own files get a few made-up ones (the fixtures of
``tests/cli/test_configs.py``), the fine-tuning configs a small random pretrained folder
(``tests/pretrained_folders.py``, written with transformers). A config whose data is not
on this machine (``bash data/get.sh ...`` not run) is reported as skipped, with the
message, not as passed; FSDP is skipped on a CPU. ``--gpu-like`` (for a CPU run) gives the
configs that leave the precision to the run ``bf16-mixed``, as a GPU run picks, so the
fused AdamW + bf16 + clipping combination of every config is exercised on the CPU too.

    python benchmarks/smoke_configs.py --steps 30 --jobs 4            # on the GPU machine
    python benchmarks/smoke_configs.py --device cpu --steps 2 --gpu-like
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
NO_DATA = ("bash data/get", "not found", "No such file", "does not exist", "get_tts",
           "get_emoji", "not installed")


OWN_DATA = ("vit_imagefolder", "caption_manifest", "audio_folder", "speaker_id",
            "gpt_textfiles", "bert_source_cls")
"""The configs ``tests/cli/test_configs.py``'s ``_own_data`` makes files for."""


def own_files(stem: str, root: Path) -> list[str]:
    """Arguments that point a config for the user's files at made-up ones."""
    if stem not in OWN_DATA and not stem.startswith("finetune_"):
        return []
    if stem == "gpt_textfiles":  # enough documents for its train / val / test split
        (root / "texts").mkdir(parents=True, exist_ok=True)
        for i in range(12):
            (root / "texts" / f"{i}.txt").write_text(f"Chapter {i}. There was text.\n" * 200)
        return ["--data.init_args.train", str(root / "texts")]
    sys.path.insert(0, str(REPO))
    from tests.cli.test_configs import _own_data

    args = _own_data(stem, root / "own")
    if args or not stem.startswith("finetune_"):
        return args
    import numpy as np

    from tests import pretrained_folders as pf

    folder = root / "pretrained"
    if stem == "finetune_image":
        from PIL import Image

        for c, cls in enumerate(("cat", "dog")):
            (root / "photos" / cls).mkdir(parents=True, exist_ok=True)
            for i in range(20):
                Image.fromarray(np.full((32, 32, 3), 40 * c + i, np.uint8)).save(
                    root / "photos" / cls / f"{i}.png")
        return ["--model.init_args.pretrained", str(pf.vit_folder(folder)),
                "--data.init_args.train", str(root / "photos")]
    if stem == "finetune_text":
        rows = "".join(f"red circle {i},a\nblue square {i},b\n" for i in range(60))
        (root / "texts.csv").write_text("text,label\n" + rows)
        return ["--model.init_args.pretrained", str(pf.bert_folder(folder)),
                "--data.init_args.train", str(root / "texts.csv"),
                "--data.init_args.max_length", "32"]  # the small folder's max_len is 64
    if stem == "finetune_clip":
        from PIL import Image

        (root / "pairs").mkdir(parents=True, exist_ok=True)
        lines = []
        for i in range(40):
            Image.fromarray(np.full((32, 32, 3), 6 * i, np.uint8)).save(
                root / "pairs" / f"{i}.png")
            lines.append(f"{i}.png,a {'red' if i % 2 else 'blue'} circle\n")
        (root / "pairs" / "captions.csv").write_text("image,caption\n" + "".join(lines))
        return ["--model.init_args.pretrained", str(pf.clip_folder(folder)),
                "--data.init_args.train", str(root / "pairs" / "captions.csv")]
    if stem == "finetune_audio":
        import soundfile as sf

        for c, cls in enumerate(("low", "high")):
            (root / "clips" / cls).mkdir(parents=True, exist_ok=True)
            for i in range(20):
                t = np.arange(16000) / 16000
                wave = 0.1 * np.sin(2 * np.pi * (200 + 400 * c + i) * t).astype(np.float32)
                sf.write(str(root / "clips" / cls / f"{i}.wav"), wave, 16000)
        return ["--model.init_args.pretrained", str(pf.ast_folder(folder)),
                "--data.init_args.train", str(root / "clips")]
    return []


def command(path: Path, steps: int, device: str, root: Path, gpu_like: bool) -> list[str]:
    config = yaml.safe_load(path.read_text())
    trainer = config.get("trainer") or {}
    args = [sys.executable, "-m", "multimodal.cli", "fit", "--config", str(path),
            "--trainer.max_steps", str(steps), "--trainer.max_epochs", "-1",
            "--trainer.limit_val_batches", "2", "--trainer.limit_test_batches", "2",
            "--trainer.num_sanity_val_steps", "0", "--trainer.default_root_dir", str(root),
            "--trainer.accelerator", "cpu" if device == "cpu" else "auto",
            "--test_after_fit", "false", "--trainer.max_time", "null",
            "--trainer.enable_checkpointing", "false"]  # no checkpoint files to carry back
    if config.get("early_stopping") is not None:
        # stopped by max_steps before its first validation, Lightning's EarlyStopping
        # (strict) fails on the missing val/loss: the smoke row trains, it does not stop
        args += ["--early_stopping", "null"]
    if trainer.get("min_steps"):
        args += ["--trainer.min_steps", str(min(steps, int(trainer["min_steps"])))]
    if trainer.get("devices") not in (None, 1, "1", "auto"):
        args += ["--trainer.devices", "1"]  # one device: the smoke row, not the scaling
    if isinstance(trainer.get("strategy"), str) and trainer["strategy"].startswith("ddp"):
        args += ["--trainer.strategy", "auto"]
    if gpu_like and trainer.get("precision") in (None, "auto"):
        args += ["--trainer.precision", "bf16-mixed"]
    if "vit_base" in path.stem:  # ViT-B at 224 px: a small batch keeps it a smoke test
        args += ["--data.init_args.batch_size", "8", "--data.init_args.num_workers", "2"]
    return args + own_files(path.stem, root)


def run_one(path: Path, args: argparse.Namespace) -> tuple[str, str, float, str]:
    stem = path.stem
    root = args.out / stem
    root.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load(path.read_text())
    strategy = str((config.get("trainer") or {}).get("strategy", ""))
    if args.device == "cpu" and "FSDP" in strategy:
        return stem, "skipped", 0.0, "FSDP needs CUDA"
    start = time.perf_counter()
    try:
        cmd = command(path, args.steps, args.device, root, args.gpu_like)
    except Exception as e:  # a fixture that cannot be made here (no transformers ...)
        return stem, "skipped", 0.0, f"own files not made: {type(e).__name__}: {e}"[:300]
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": str(args.threads)}
    try:
        out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return stem, "FAILED", time.perf_counter() - start, f"over {args.timeout} s"
    seconds = time.perf_counter() - start
    (root / "log.txt").write_text(" ".join(cmd) + "\n\n" + out.stdout + out.stderr)
    if out.returncode == 0:
        return stem, "passed", seconds, ""
    last = [line for line in (out.stderr + out.stdout).splitlines() if line.strip()]
    message = last[-1][:300] if last else f"exit {out.returncode}"
    if any(k in message for k in NO_DATA):
        return stem, "skipped", seconds, f"no data here: {message}"
    return stem, "FAILED", seconds, message


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--device", choices=["auto", "cpu"], default="auto")
    parser.add_argument("--jobs", type=int, default=4, help="configs at once")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads per config")
    parser.add_argument("--timeout", type=int, default=150, help="seconds per config")
    parser.add_argument("--gpu-like", action="store_true",
                        help="bf16-mixed where the config leaves the precision to the run")
    parser.add_argument("--out", type=Path, default=Path("smoke_out"))
    parser.add_argument("--only", nargs="*", default=None, help="config stems")
    args = parser.parse_args()
    args.out = args.out.resolve()
    configs = sorted((REPO / "configs").glob("*.yaml"))
    if args.only:
        configs = [c for c in configs if c.stem in args.only]
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(lambda p: run_one(p, args), configs))
    for stem, status, seconds, message in results:
        print(f"{stem:28s} {status:8s} {seconds:6.1f} s  {message}", flush=True)
    counts = {s: sum(r[1] == s for r in results) for s in ("passed", "skipped", "FAILED")}
    print(f"smoke: {counts['passed']} passed, {counts['skipped']} skipped, "
          f"{counts['FAILED']} failed of {len(results)} configs, {args.steps} steps each, "
          f"{time.perf_counter() - start:.0f} s")
    sys.exit(1 if counts["FAILED"] else 0)


if __name__ == "__main__":
    main()
