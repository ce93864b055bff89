"""Own-data input pipeline speed and memory (issue: your own data).

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/data_throughput.py            # throughput
    PYTHONPATH=. python benchmarks/data_throughput.py --manifest-rows 1000000      # memory

Throughput: a class-per-subfolder tree of ``--files`` small PNGs (Fashion-MNIST training
images, 28x28, written once into ``--workdir``) is read for one epoch, images/s, by three
pipelines doing the same work (decode, convert to RGB, resize to ``--image-size``, random
flip, float + normalise, batches of ``--batch-size``), each with 0 and ``--workers`` worker
processes:

- ``ours/folder``: ``ImageClassificationDataModule(train=<folder>)`` (torchvision.io decode,
  transforms.v2 on tensors);
- ``ours/shards``: the same images after ``multimodal-prepare images`` (LitData shards of
  the encoded PNG bytes), read by the same data module with ``shards=``;
- ``torchvision``: ``torchvision.datasets.ImageFolder`` (its default PIL loader) with the
  same v2 transforms, in a plain ``DataLoader``.

The pipelines run interleaved, ``--repeats`` times each, so load from other jobs hits all
alike; the table gives medians and the ratio to torchvision.

Memory: ``--manifest-rows N`` writes a ``path,label`` CSV of N rows (they name a handful of
real files over and over, so the existence check passes without N files on disk) and, in a
fresh subprocess, builds the data module's splits from it (class list included); reported:
the peak resident set (``VmHWM``, reset after the imports) above the resident set after the
imports, in MiB, and per row in bytes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

MEAN, STD = (0.286, 0.286, 0.286), (0.353, 0.353, 0.353)


def write_folder(root: Path, n: int) -> Path:
    """``n`` Fashion-MNIST training images as ``root/<class>/<i>.png`` (kept between runs)."""
    from torchvision.io import write_png

    from multimodal.data.sources.fashion_mnist import load_fashion_mnist

    folder = root / f"fmnist_png_{n}"
    done = folder / ".complete"
    if done.exists():
        return folder
    data = load_fashion_mnist(split="train")
    for i in range(n):
        cls = folder / data.class_names[int(data.labels[i])].replace("/", "-")
        cls.mkdir(parents=True, exist_ok=True)
        write_png(data.images[i].reshape(1, 28, 28).to(torch.uint8), str(cls / f"{i}.png"))
    done.touch()
    return folder


def ours_loader(folder: Path | None, shards: Path | None, args: argparse.Namespace,
                workers: int):
    from multimodal.data.vision import ImageClassificationDataModule

    dm = ImageClassificationDataModule(
        train=None if folder is None else str(folder),
        shards=None if shards is None else str(shards),
        image_size=args.image_size, in_channels=3, batch_size=args.batch_size,
        num_workers=workers, val_size=0.05, test_size=0.05, augment=False, flip=True,
        mean=list(MEAN), std=list(STD))
    dm.setup("fit")
    return dm.train_dataloader()


def torchvision_loader(folder: Path, args: argparse.Namespace, workers: int):
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import v2

    transform = v2.Compose([
        v2.ToImage(), v2.Resize([args.image_size, args.image_size], antialias=True),
        v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(list(MEAN), list(STD))])
    dataset = ImageFolder(str(folder), transform=transform)
    return torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                                       num_workers=workers, drop_last=False,
                                       persistent_workers=False)


def images_per_second(loader) -> float:
    start, count = time.perf_counter(), 0
    for batch in loader:
        count += len(batch[0])
    return count / (time.perf_counter() - start)


def throughput(args: argparse.Namespace) -> None:
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    folder = write_folder(work, args.files)
    from multimodal.data.shards import MIN_CHUNKS

    # the chunking policy in the name: shards of an older writer are not reused
    shards = work / f"fmnist_shards_{args.files}_{args.image_size}_min{MIN_CHUNKS}chunks"
    if not (shards / "multimodal.json").exists():
        # in its own process: LitData's writer threads would stay behind in this one
        subprocess.run([sys.executable, "-m", "multimodal.cli.prepare", "images", str(folder),
                        str(shards), "--image-size", str(args.image_size), "--val-size",
                        "0.05", "--test-size", "0.05"], check=True)
    rows = []
    for workers in (0, args.workers):
        makers = {
            "ours/folder": lambda w=workers: ours_loader(folder, None, args, w),
            "ours/shards": lambda w=workers: ours_loader(None, shards, args, w),
            "torchvision": lambda w=workers: torchvision_loader(folder, args, w),
        }
        speeds: dict[str, list[float]] = {name: [] for name in makers}
        for _ in range(args.repeats):
            for name, make in makers.items():
                speeds[name].append(images_per_second(make()))
        ref = statistics.median(speeds["torchvision"])
        for name, values in speeds.items():
            med = statistics.median(values)
            rows.append((workers, name, med, min(values), max(values), med / ref))
    print(f"\n{args.files} PNG files, image_size {args.image_size}, batch {args.batch_size}, "
          f"{args.repeats} interleaved epochs each")
    print("| workers | pipeline | images/s median | min-max | vs torchvision |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for workers, name, med, lo, hi, ratio in rows:
        print(f"| {workers} | {name} | {med:,.0f} | {lo:,.0f}-{hi:,.0f} | {ratio:.2f}x |")


def _status_mib(field: str) -> float:
    """``VmRSS`` / ``VmHWM`` of this process from ``/proc/self/status``, in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"{field} not in /proc/self/status")


def manifest_child(manifest: str) -> None:
    """Runs in a fresh process: peak RSS of building the splits of a big manifest, above
    the resident set after the imports (the high-water mark is reset there through
    ``/proc/self/clear_refs``, so the imports' own peak does not hide a smaller one)."""
    from multimodal.data.vision import ImageClassificationDataModule

    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current VmRSS
    baseline = _status_mib("VmRSS")
    dm = ImageClassificationDataModule(train=manifest, image_size=28, in_channels=1,
                                       val_size=0.01, test_size=0.01, mean=0.5, std=0.5)
    start = time.perf_counter()
    splits = dm._load_file_splits()
    seconds = time.perf_counter() - start
    rows = sum(len(s) for s in splits.values())
    print(json.dumps({"rows": rows, "baseline_mib": baseline,
                      "peak_mib": _status_mib("VmHWM"), "seconds": seconds}))


def manifest_memory(args: argparse.Namespace) -> None:
    work = Path(args.workdir)
    folder = write_folder(work, 100)
    files = sorted(p.relative_to(folder) for p in folder.rglob("*.png"))
    manifest = folder / f"manifest_{args.manifest_rows}.csv"
    with open(manifest, "w") as f:
        f.write("path,label\n")
        for i in range(args.manifest_rows):
            path = files[i % len(files)]
            f.write(f"{path},{path.parent}\n")
    out = subprocess.run([sys.executable, __file__, "--manifest-child", str(manifest)],
                         capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    grown = result["peak_mib"] - result["baseline_mib"]
    print(f"\nmanifest of {result['rows']:,} rows: splits built in {result['seconds']:.1f} s; "
          f"peak RSS {result['peak_mib']:.0f} MiB, {grown:.0f} MiB above the baseline after "
          f"imports ({grown * 2**20 / result['rows']:.0f} bytes per row)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "mm_data_bench"))
    parser.add_argument("--manifest-rows", type=int, default=0,
                        help="measure memory over a manifest of this many rows instead")
    parser.add_argument("--manifest-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.manifest_child:
        manifest_child(args.manifest_child)
    elif args.manifest_rows:
        manifest_memory(args)
    else:
        throughput(args)


if __name__ == "__main__":
    main()
