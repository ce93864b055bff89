"""Time from ``multimodal fit --config configs/finetune_text.yaml`` to its first training
step, two source trees side by side: this one and another (``--old``, e.g. main before the
pretrained path was read once), interleaved run by run, the median of ``--runs`` each.

Each run is a fresh interpreter running the CLI in process (the same argv as the command)
on a small labelled text file, with the real all-MiniLM-L6-v2 (installed from its wheel),
``--trainer.max_steps 1`` and a callback that prints the clock at the first training batch.
Reported per tree: the seconds from launching the interpreter to that batch (``total``), and
from the CLI's entry (after ``import multimodal.cli.main``) to it (``fit``: resolution of
the pretrained path, data settings, model build, data set-up, Lightning's start).

Run (the old tree: a checkout of the commit before, e.g.
``mkdir /tmp/old && git archive c97d8c6 | tar -x -C /tmp/old``):

    python benchmarks/time_to_first_step.py --old /tmp/old --runs 3
    python benchmarks/time_to_first_step.py --old /tmp/old --runs 5 --what task

``--what task`` times only what reads the pretrained path (the data settings and the
classifier built from it, after the imports).

A child run is ``python benchmarks/time_to_first_step.py --child OUT_DIR`` with the tree to
time first on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]

FOOD = ["soup and bread", "a bowl of rice", "fresh apples", "warm pasta", "cheese and ham",
        "a plate of beans", "hot tea and cake", "grilled fish"]
SKY = ["snow and wind", "a cloudy morning", "rain all day", "a clear blue sky",
       "thunder at night", "fog over the hills", "a cold breeze", "sun after rain"]


def _child(out: Path) -> None:
    """One run: the CLI in process, a timestamp at the first training batch."""
    import lightning as L

    import multimodal.cli.main as cli

    entered = time.time()

    class FirstStep(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == 0 and trainer.global_step == 0:
                print(f"TTFS entered={entered:.6f} first_step={time.time():.6f}", flush=True)

    sys.modules["__main__"].FirstStep = FirstStep  # type: ignore[attr-defined]
    texts = out / "texts.csv"
    texts.write_text("text,label\n" + "".join(f"{t},food\n" for t in FOOD)
                     + "".join(f"{t},sky\n" for t in SKY))
    cli.main(["fit", "--config", str(Path.cwd() / "configs" / "finetune_text.yaml"),
              "--data.init_args.train", str(texts), "--data.init_args.batch_size", "8",
              "--trainer.max_steps", "1", "--trainer.min_steps", "0",
              "--trainer.max_epochs", "1", "--trainer.accelerator", "cpu",
              "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
              "--trainer.enable_checkpointing", "false", "--trainer.callbacks+=__main__.FirstStep",
              "--trainer.default_root_dir", str(out / "run"), "--early_stopping", "null",
              "--budget_minutes", "null", "--test_after_fit", "false"])


def _child_task() -> None:
    """The part of the run that reads the pretrained path, alone: the data settings the
    CLI asks for, then the classifier built from all-MiniLM-L6-v2 with the config's
    ``overrides`` (the imports done before the clock starts)."""
    import multimodal.cli.main  # noqa: F401  (what the CLI imports)
    from multimodal.tasks import ClassificationTask
    from multimodal.tasks.pretrained import data_settings

    entered = time.time()
    data_settings("all-MiniLM-L6-v2")
    ClassificationTask(pretrained="all-MiniLM-L6-v2", num_classes=2, overrides={"dropout": 0.1})
    print(f"TTFS entered={entered:.6f} first_step={time.time():.6f}", flush=True)


def _run(tree: Path, what: str = "fit") -> tuple[float, float]:
    """(total, fit) seconds of one child run with ``tree`` first on the path."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with tempfile.TemporaryDirectory() as tmp:
        start = time.time()
        done = subprocess.run([sys.executable, str(HERE), "--child", tmp, "--what", what],
                              env=env, cwd=tree, capture_output=True, text=True)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("TTFS ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"error: the run in {tree} failed ({done.returncode}):\n"
                         f"{done.stderr[-3000:]}")
    values = dict(part.split("=") for part in line.split()[1:])
    first, entered = float(values["first_step"]), float(values["entered"])
    return first - start, first - entered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, help="the other source tree (before)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--what", choices=["fit", "task"], default="fit",
                        help="fit: the whole command to its first step; task: only the data "
                             "settings and the model built from the pretrained path")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        _child(args.child) if args.what == "fit" else _child_task()
        return
    trees = {"new": ROOT}
    if args.old is not None:
        trees = {"old": args.old.resolve(), **trees}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    for i in range(args.runs):
        for name, tree in trees.items():  # interleaved: old, new, old, new ...
            times[name].append(_run(tree, args.what))
            total, fit = times[name][-1]
            print(f"run {i + 1} {name}: total {total:.2f} s, fit {fit:.2f} s", flush=True)
    what = "the first training step" if args.what == "fit" else "the task built"
    print(f"\nmedian seconds to {what} (launch -> it | after the imports -> it)")
    medians = {name: (statistics.median(t for t, _ in v), statistics.median(f for _, f in v))
               for name, v in times.items()}
    for name, (total, fit) in medians.items():
        print(f"  {name:4s} {total:6.2f} | {fit:6.2f}")
    if "old" in medians:
        (ot, of), (nt, nf) = medians["old"], medians["new"]
        print(f"  new / old: {nt / ot:.2f} | {nf / of:.2f}")


if __name__ == "__main__":
    main()
