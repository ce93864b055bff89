"""What a main-job recipe costs, as a ratio to a reference recipe, measured side by side.

    OMP_NUM_THREADS=1 python benchmarks/main_job_recipe.py \
        benchmarks/main_job_reference.yaml configs/vit_fashion_mnist.yaml

Each argument is a ``multimodal fit`` YAML (the first is the reference; extra
``--set NAME:key.path=value`` overrides make variants without writing files). For every
recipe the script builds the config's model (``model.init_args.model``), its AdamW, and its
data module's training and validation loaders (augmentation in the loader, as in a run),
then times, **interleaved** (one training step of every recipe per round, so background
load hits all alike), a training step = next batch from the loader + forward + label-
smoothed cross-entropy + backward + AdamW step, and an inference step on a validation
batch. With the medians,

    epoch cost  = train batches x median train step + val batches x median val step
    run cost    = max_epochs x epoch cost + test batches x median val step
    ratio       = run cost / reference run cost

and, given the reference's measured idle seconds per epoch (``--ref-epoch-s``, default 43:
the 21-epoch recipe on the idle 2-core CPU, ~15 min of training), the predicted idle
training time ``ratio x ref-epoch-s x ref epochs``. Lightning's own per-step bookkeeping
(logging, checkpoints, the progress line) is not in the step and is about the same per
step for every recipe here. ``compile: true`` recipes are timed compiled; their one-off
compile time is printed as a multiple of the reference's median training step.
"""

from __future__ import annotations

import argparse
import statistics
import time
from copy import deepcopy
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import yaml

from multimodal.data.vision import ImageClassificationDataModule
from multimodal.tasks.classification import ClassificationTask
from multimodal.tasks.optim import OPTIMIZER_KEYS, OptimizerConfig, adamw


def _set(cfg: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = cfg
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value


def _build_model(task: dict, num_classes: int) -> torch.nn.Module:
    """The config's model (a ``preset`` name plus ``overrides``, or a ``model`` spelled out);
    its class count comes from the data, as the CLI links it."""
    import importlib

    if task.get("preset") is not None:
        import multimodal as mm

        return mm.create_model(task["preset"], **{"num_classes": num_classes,
                                                  **(task.get("overrides") or {})})
    spec = task["model"]
    module, _, name = spec["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    config = cls.config_class(**{"num_classes": num_classes, **spec["init_args"]["config"]})
    return cls(config)


class Recipe:
    """One YAML's model, optimiser and loaders, stepped one batch at a time."""

    def __init__(self, name: str, cfg: dict) -> None:
        self.name = name
        task = cfg["model"]["init_args"]
        data_args = dict(cfg["data"]["init_args"])
        self.data = ImageClassificationDataModule(**data_args)
        self.model = _build_model(task, self.data.num_classes)
        self.smoothing = float(task.get("label_smoothing", 0.0))
        # the config's optimizer: block over the task's defaults (no flat key any more)
        flat = [k for k in OPTIMIZER_KEYS if k in task]
        if flat:
            raise ValueError(f"{name}: model.init_args.{flat[0]} was removed, write "
                             f"model.init_args.optimizer.{flat[0]}")
        opt = OptimizerConfig.of(task.get("optimizer"), ClassificationTask.optimizer_defaults)
        self.opt = adamw(self.model, opt.lr, opt.weight_decay, opt.betas)
        self.data.setup("fit")
        self.train_loader = self.data.train_dataloader()
        self.val_loader = self.data.val_dataloader()
        self.epochs = int(cfg["trainer"]["max_epochs"])
        self.n_train = len(self.train_loader)
        self.n_val = len(self.val_loader)
        self.n_test = -(-10_000 // self.data.batch_size)  # Fashion-MNIST's test split
        self.compile_s = 0.0
        if task.get("compile"):
            self.model.compile()
        self._train_iter = iter(self.train_loader)
        self._val_iter = iter(self.val_loader)
        self.train_times: list[float] = []
        self.val_times: list[float] = []
        self.params = sum(p.numel() for p in self.model.parameters())

    def _next(self, which: str) -> Any:
        it = getattr(self, f"_{which}_iter")
        try:
            return next(it)
        except StopIteration:
            loader = self.train_loader if which == "train" else self.val_loader
            setattr(self, f"_{which}_iter", iter(loader))
            return next(getattr(self, f"_{which}_iter"))

    def train_step(self, record: bool = True) -> float:
        t0 = time.perf_counter()
        x, y = self._next("train")
        self.model.train()
        loss = F.cross_entropy(self.model(x).float(), y, label_smoothing=self.smoothing)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        if record:
            self.train_times.append(dt)
        return dt

    @torch.no_grad()
    def val_step(self, record: bool = True) -> float:
        t0 = time.perf_counter()
        x, y = self._next("val")
        self.model.eval()
        F.cross_entropy(self.model(x).float(), y)
        dt = time.perf_counter() - t0
        if record:
            self.val_times.append(dt)
        return dt

    def run_cost(self) -> tuple[float, float]:
        train, val = statistics.median(self.train_times), statistics.median(self.val_times)
        epoch = self.n_train * train + self.n_val * val
        return epoch, self.epochs * epoch + self.n_test * val


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("configs", nargs="+", help="fit YAMLs; the first is the reference")
    p.add_argument("--set", action="append", default=[], metavar="NAME:KEY=VALUE",
                   help="a variant of the reference named NAME (repeat with the same NAME to "
                        "set several keys); VALUE is parsed as YAML")
    p.add_argument("--rounds", type=int, default=30, help="timed training steps per recipe")
    p.add_argument("--val-every", type=int, default=3, help="one val step every N rounds")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--ref-epoch-s", type=float, default=43.0,
                   help="the reference's idle seconds per epoch (training + validation)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    cfgs: dict[str, dict] = {}
    for path in args.configs:
        cfgs[Path(path).stem if Path(path).stem not in cfgs else path] = \
            yaml.safe_load(Path(path).read_text())
    ref_name = next(iter(cfgs))
    for item in args.set:
        name, _, assignment = item.partition(":")
        key, _, value = assignment.partition("=")
        if name not in cfgs:
            cfgs[name] = deepcopy(cfgs[ref_name])
        _set(cfgs[name], key, yaml.safe_load(value))

    recipes = [Recipe(name, cfg) for name, cfg in cfgs.items()]
    for r in recipes:  # warm-up (and compilation, timed against the reference's step)
        t0 = time.perf_counter()
        r.train_step(record=False)
        r.val_step(record=False)
        r.compile_s = time.perf_counter() - t0
        for _ in range(args.warmup - 1):
            r.train_step(record=False)
    for i in range(args.rounds):
        for r in recipes:
            r.train_step()
        if i % args.val_every == 0:
            for r in recipes:
                r.val_step()

    ref = recipes[0]
    ref_epoch, ref_run = ref.run_cost()
    ref_step = statistics.median(ref.train_times)
    print(f"threads {args.threads}, {args.rounds} interleaved training steps per recipe; "
          f"reference {ref.name!r} = {args.ref_epoch_s:g} s/epoch idle")
    print("| recipe | params | batch | steps/epoch | train step ms | val step ms | epochs "
          "| epoch cost / ref | run cost / ref | predicted idle training | first step / ref step |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in recipes:
        epoch, run = r.run_cost()
        predicted = run / ref_run * ref.epochs * args.ref_epoch_s
        print(f"| {r.name} | {r.params / 1e6:.2f} M | {r.data.batch_size} | {r.n_train} "
              f"| {1e3 * statistics.median(r.train_times):.1f} "
              f"| {1e3 * statistics.median(r.val_times):.1f} | {r.epochs} "
              f"| {epoch / ref_epoch:.3f} | {run / ref_run:.3f} "
              f"| {predicted / 60:.1f} min | {r.compile_s / ref_step:.1f} |")


if __name__ == "__main__":
    main()
