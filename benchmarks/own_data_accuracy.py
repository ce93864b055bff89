"""Same ViT, same epochs, three ways to feed Fashion-MNIST: in memory, PNG class folder,
LitData shards. Reports each path's test accuracy (issue: your own data, "proof on real
data": folder and shards within 0.5 points of the in-memory path).

    bash data/get_folders.sh /tmp/folders   # OUT/fashion_mnist_png/{train,test}/<k>_<class>/<n>.png
    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/own_data_accuracy.py \
        --folder /tmp/folders/fashion_mnist_png --epochs 3 --seeds 0 1

The model, optimiser and data settings are those of ``--config`` (default
``benchmarks/main_job_reference.yaml``, the 28-px main-job recipe: every path then feeds the
model the files' own pixels, no resize); only ``max_epochs`` is cut, the same for all three
paths. With several ``--seeds`` every path runs once per seed (model init and augmentation
draw); the table gives each path's mean and range, and its mean's distance to the in-memory
mean next to the in-memory runs' own range. What is made the
same, and how a user gets the same with their own data:

- **split**: the in-memory module holds out ``val_size`` rows of the IDX file (a seeded
  permutation of rows in file order). A folder lists its files in another order (class,
  then name), so the same rule picks other images. The script therefore writes the
  in-memory split as two ``path,label`` manifests (the folder's PNG names are the IDX row
  numbers) and gives them as ``train`` / ``val`` -- the documented way to fix a split for
  your own files; the shards are prepared from the same manifests. Test: the official
  10 000 (``folder/test``, PNGs of ``t10k``).
- **statistics**: computed on the training images in every path; the files' module takes
  ``stats_samples`` of them, set here to all of them (the default, 5000, gives values that
  differ in the 3rd decimal).
- **transforms**: the same uint8 pipeline (random shift by ``image_size // 8`` with zero
  fill, horizontal flip, then ``(x / 255 - mean) / std``); PNG is lossless, so pixels are
  identical. With 0 workers the folder path draws the same random numbers as the memory
  one; the shards path's order comes from LitData's own shuffle.

Each path runs in its own process (``--path``), one after the other; prints a JSON line per
path and a table at the end.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

CONFIG = Path(__file__).resolve().parent / "main_job_reference.yaml"
PATHS = ("memory", "folder", "shards")


def write_split_manifests(folder: Path, work: Path) -> tuple[Path, Path]:
    """The in-memory module's train / val rows as manifests over ``folder/train``."""
    from multimodal.data.vision import ImageClassificationDataModule

    data = _config()["data"]["init_args"]
    dm = ImageClassificationDataModule(dataset="fashion_mnist", val_size=data["val_size"],
                                       seed=0)
    dm.setup("fit")
    by_row = {int(p.stem): p for p in (folder / "train").glob("*/*.png")}
    if len(by_row) != 60000:
        raise SystemExit(f"{folder}/train holds {len(by_row)} PNGs, expected 60000")
    out = {}
    for split in ("train", "val"):
        path = work / f"{split}.csv"
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["path", "label"])
            for row in dm.split_indices[split].tolist():
                png = by_row[row]
                writer.writerow([str(png.relative_to(folder)), png.parent.name])
        out[split] = path
    # the manifests sit in the folder's parent: paths are relative to the manifest
    return out["train"], out["val"]


def _config() -> dict:
    return yaml.safe_load(CONFIG.read_text())


def _use_config(path: str) -> None:
    global CONFIG
    CONFIG = Path(path)
    image_size = _config()["data"]["init_args"].get("image_size")
    if image_size not in (None, 28):
        raise SystemExit(f"{path}: image_size {image_size}; this comparison feeds 28-px files "
                         "unresized, use a 28-px recipe")


def datamodule(path: str, folder: Path, work: Path):
    from multimodal.data.vision import ImageClassificationDataModule

    data = dict(_config()["data"]["init_args"])
    common = dict(batch_size=data["batch_size"], augment=data["augment"], seed=0)
    if path == "memory":
        return ImageClassificationDataModule(dataset="fashion_mnist",
                                             val_size=data["val_size"], **common)
    own = dict(image_size=28, in_channels=1, stats_samples=60000, **common)
    if path == "folder":
        return ImageClassificationDataModule(
            train=str(folder / "train.csv"), val=str(folder / "val.csv"),
            test=str(folder / "test"), **own)
    return ImageClassificationDataModule(shards=str(work / "shards"), **own)


def run_one(path: str, folder: Path, work: Path, epochs: int, seed: int | None = None) -> dict:
    import lightning as L
    import torch

    import multimodal as mm
    from multimodal.tasks import ClassificationTask

    config = _config()
    seed = config["seed_everything"] if seed is None else seed
    L.seed_everything(seed)
    model_args = dict(config["model"]["init_args"])
    vit = mm.ViT(mm.ViTConfig(**model_args.pop("model")["init_args"]["config"]))
    task = ClassificationTask(vit, **model_args)
    dm = datamodule(path, folder, work)
    trainer = L.Trainer(accelerator="cpu", max_epochs=epochs, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=str(work / path))
    start = time.perf_counter()
    trainer.fit(task, dm)
    fit_s = time.perf_counter() - start
    test = trainer.test(task, dm, verbose=False)[0]
    return {"path": path, "epochs": epochs, "seed": seed, "test_acc": test["test/acc"],
            "mean": [round(m, 6) for m in dm.mean], "std": [round(s, 6) for s in dm.std],
            "fit_seconds": round(fit_s), "torch_threads": torch.get_num_threads()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", required=True,
                        help="Fashion-MNIST PNG tree of data/get_folders.sh (train/, test/)")
    parser.add_argument("--config", default=str(CONFIG), help="a 28-px ViT recipe")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workdir", default="/tmp/mm_own_data_accuracy")
    parser.add_argument("--path", choices=PATHS,
                        help="run only this path, in this process")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed_everything for --path (default: the config's)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="run every path once per seed (default: the config's seed)")
    args = parser.parse_args()
    _use_config(args.config)
    folder, work = Path(args.folder), Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    if args.path:
        print(json.dumps(run_one(args.path, folder, work, args.epochs, args.seed)), flush=True)
        return
    write_split_manifests(folder, folder)
    if not (work / "shards" / "multimodal.json").exists():
        subprocess.run([sys.executable, "-m", "multimodal.cli.prepare", "images",
                        str(folder / "train.csv"), str(work / "shards"),
                        "--val", str(folder / "val.csv"), "--test", str(folder / "test")],
                       check=True)
    seeds = args.seeds or [_config()["seed_everything"]]
    acc: dict[str, list[float]] = {path: [] for path in PATHS}
    for seed in seeds:  # seed-major: a slow machine hits every path alike
        for path in PATHS:
            out = subprocess.run([sys.executable, __file__, "--folder", str(folder),
                                  "--config", str(CONFIG), "--epochs", str(args.epochs),
                                  "--workdir", str(work), "--path", path, "--seed", str(seed)],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"{path} seed {seed} failed:\n{out.stderr[-3000:]}")
            result = json.loads(out.stdout.strip().splitlines()[-1])
            acc[path].append(100 * result["test_acc"])
            print(json.dumps(result), flush=True)
    ref = statistics.mean(acc["memory"])
    spread = max(acc["memory"]) - min(acc["memory"])
    print(f"\nViT of {CONFIG.name}, {args.epochs} epochs, seeds {seeds}; in-memory runs' own "
          f"range {spread:.2f} points")
    print("| source | test acc per seed | mean | range | mean vs memory (points) |")
    print("| --- | --- | ---: | ---: | ---: |")
    for path, values in acc.items():
        per_seed = " / ".join(f"{v:.2f}" for v in values)
        print(f"| {path} | {per_seed} | {statistics.mean(values):.2f} % | "
              f"{max(values) - min(values):.2f} | {statistics.mean(values) - ref:+.2f} |")


if __name__ == "__main__":
    main()
