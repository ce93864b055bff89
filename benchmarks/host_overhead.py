"""Host overhead per training step: the time a step takes when the model costs ~nothing,
i.e. Lightning's loop, our task's hooks, logging, callbacks and the optimiser's Python -
the floor that no GPU step of the same loop can go below (issue 50, item 3).

The run is ``multimodal fit`` as a user starts it (MultimodalCLI: the run's default
callbacks, TensorBoard + CSV loggers, the checkpoint callback, the LR monitor), on a
ClassificationTask whose ViT is 1 block of width 8 over 4 tokens, fed by an in-memory data
module whose batches are made once (so the loader costs nothing either). A callback times
every step (``on_train_batch_start`` to the next one), in wall time and in the process's
CPU time (one thread: the host work itself, which other jobs on a shared machine disturb
far less than the wall time); the first ``--skip`` steps are left out.

Before / after: ``--old-tree DIR`` runs the same measurement with the package of another
checkout (e.g. ``git worktree add /tmp/main main`` or ``git archive main | tar -x -C DIR``)
in alternating subprocesses, so both see the same machine load; the report gives the
median and the spread (min - max of the per-run medians) of each.

    python benchmarks/host_overhead.py                         # this tree, 5 runs
    python benchmarks/host_overhead.py --old-tree /tmp/main    # interleaved old / new
    python benchmarks/host_overhead.py --progress-bar          # with the tqdm bar drawn

``--config FILE`` times a shipped config's own steps instead (its model and data, on the
CPU, no validation), e.g. the main job against main's checkout (issue 50, item 5):

    python benchmarks/host_overhead.py --config configs/vit_fashion_mnist.yaml \
        --steps 100 --skip 10 --repeats 3 --old-tree /tmp/main
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

CONFIG = """\
seed_everything: 0
model:
  class_path: multimodal.tasks.ClassificationTask
  init_args:
    preset: vit_fashion_mnist
    overrides: {{stem: patch, patch_size: 4, dim: 8, depth: 1, heads: 1, mlp_dim: 8}}
data:
  class_path: host_overhead.InMemoryImages
  init_args: {{batches: {batches}, batch_size: {batch_size}}}
trainer:
  max_steps: {steps}
  accelerator: cpu
  precision: 32-true
  num_sanity_val_steps: 0
  limit_val_batches: 0
  enable_progress_bar: {bar}
  default_root_dir: {root}
"""


def _data_module() -> Any:
    import lightning as L
    import torch
    from torch.utils.data import DataLoader

    class InMemoryImages(L.LightningDataModule):
        """``batches`` ready batches of 8x8 grey images and labels of 2 classes, made once:
        the loader hands them out as they are (``batch_size=None``)."""

        class_names: ClassVar[list[str]] = ["a", "b"]
        model_sizes: ClassVar[dict[str, int]] = {"image_size": 8, "in_channels": 1}

        def __init__(self, batches: int = 50, batch_size: int = 8) -> None:
            super().__init__()
            g = torch.Generator().manual_seed(0)
            self.data = [(torch.rand(batch_size, 1, 8, 8, generator=g),
                          torch.randint(0, 2, (batch_size,), generator=g))
                         for _ in range(batches)]

        def train_dataloader(self) -> DataLoader:
            return DataLoader(self.data, batch_size=None, shuffle=False)

        def val_dataloader(self) -> DataLoader:
            return DataLoader(self.data[:1], batch_size=None)

    return InMemoryImages


def __getattr__(name: str) -> Any:  # host_overhead.InMemoryImages, made on first use
    if name == "InMemoryImages":
        cls = _data_module()
        cls.__module__ = __name__
        globals()[name] = cls
        return cls
    raise AttributeError(name)


def worker(args: argparse.Namespace) -> None:
    """One ``multimodal fit``; prints one JSON line of per-step seconds."""
    import lightning as L

    from multimodal.cli.main import MultimodalCLI, run_lightning

    times: list[float] = []
    cpu: list[float] = []

    class StepTimer(L.Callback):
        def on_train_batch_start(self, *a: Any) -> None:
            times.append(time.perf_counter())
            cpu.append(time.process_time())

    original = MultimodalCLI.instantiate_trainer

    def with_timer(self: Any, **kwargs: Any) -> Any:
        trainer = original(self, **kwargs)
        trainer.callbacks.append(StepTimer())
        return trainer

    MultimodalCLI.instantiate_trainer = with_timer  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as root:
        if args.config is not None:
            run_lightning(["fit", "--config", str(args.config), "--trainer.max_steps",
                           str(args.steps), "--trainer.max_epochs", "-1",
                           "--trainer.accelerator", "cpu", "--trainer.limit_val_batches",
                           "0", "--trainer.num_sanity_val_steps", "0",
                           "--trainer.default_root_dir", root, "--test_after_fit", "false",
                           "--trainer.enable_progress_bar",
                           "true" if args.progress_bar else "false", *args.extra])
        else:
            config = Path(root) / "host.yaml"
            config.write_text(CONFIG.format(steps=args.steps, batches=args.batches,
                                            batch_size=args.batch_size, root=root,
                                            bar="true" if args.progress_bar else "false"))
            run_lightning(["fit", "--config", str(config), "--test_after_fit", "false",
                           *args.extra])
    steps = [b - a for a, b in itertools.pairwise(times)][args.skip:]
    used = [b - a for a, b in itertools.pairwise(cpu)][args.skip:]
    print("RESULT " + json.dumps({"median_ms": 1e3 * statistics.median(steps),
                                  "mean_ms": 1e3 * statistics.fmean(steps),
                                  "cpu_ms": 1e3 * statistics.fmean(used),
                                  "steps": len(steps)}), flush=True)


def _run(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{HERE}",
           "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--steps",
           str(args.steps), "--skip", str(args.skip), "--batches", str(args.batches),
           "--batch-size", str(args.batch_size)]
    if args.progress_bar:
        cmd.append("--progress-bar")
    if args.config is not None:
        cmd += ["--config", str(args.config.resolve())]
    cmd += ["--", *args.extra] if args.extra else []
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tree)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise SystemExit(f"error: the run in {tree} printed no result:\n{out.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--skip", type=int, default=50, help="first steps left out")
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--progress-bar", action="store_true",
                        help="draw Lightning's tqdm bar (a terminal run); else plain lines")
    parser.add_argument("--old-tree", type=Path, default=None,
                        help="another checkout whose package is timed in alternation")
    parser.add_argument("--config", type=Path, default=None,
                        help="time this config's own model and data instead")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("extra", nargs="*", help="more `multimodal fit` options (after --)")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    sys.path.insert(0, str(REPO))
    from benchmarks.machine import machine_header

    print(machine_header())
    what = f"{args.config}" if args.config else f"the ~free model, batch {args.batch_size}"
    print(f"{args.repeats} run(s) x {args.steps} steps (first {args.skip} left out) of "
          f"{what}, progress bar {'on' if args.progress_bar else 'off'}"
          + (f", interleaved with {args.old_tree}" if args.old_tree else ""))
    trees = {"new": REPO} if args.old_tree is None else {"old": args.old_tree.resolve(),
                                                          "new": REPO}
    results: dict[str, list[float]] = {k: [] for k in trees}
    used: dict[str, list[float]] = {k: [] for k in trees}
    for i in range(args.repeats):
        for name, tree in (trees.items() if i % 2 == 0 else reversed(trees.items())):
            r = _run(tree, args)
            results[name].append(r["median_ms"])
            used[name].append(r["cpu_ms"])
            print(f"  run {i + 1} {name}: wall {r['median_ms']:.3f} ms/step (median; mean "
                  f"{r['mean_ms']:.3f}), CPU {r['cpu_ms']:.3f} ms/step, {r['steps']} steps",
                  flush=True)
    # wall time per step moves with the machine's load; the process's CPU time per step
    # (one thread) is the host work itself, and far less sensitive to other jobs
    for name in trees:
        w, c = results[name], used[name]
        print(f"{name}: wall median {statistics.median(w):.3f} ms/step "
              f"(runs {min(w):.3f} - {max(w):.3f}); CPU median {statistics.median(c):.3f} "
              f"ms/step (runs {min(c):.3f} - {max(c):.3f})")
    if "old" in results:
        for label, table in (("wall", results), ("CPU", used)):
            ratio = statistics.median(table["new"]) / statistics.median(table["old"])
            print(f"new / old ({label}): {ratio:.2f}")


if __name__ == "__main__":
    main()
