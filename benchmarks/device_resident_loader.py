"""One training epoch of the main job's batches (Fashion-MNIST at 32x32, batch 128), the
DataLoader path against the split held on the device (``device_resident``), interleaved,
medians; with and without the random shifts and flips.

    python benchmarks/device_resident_loader.py                 # CPU, 5 rounds
    python benchmarks/device_resident_loader.py --device cuda   # held on the GPU

On the GPU the DataLoader path's batches are copied to it (as Lightning does) and the clock
stops after a synchronize, so both rows are the time to have every batch on the device.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from multimodal.data.device_batches import DeviceBatches
from multimodal.data.vision import ImageClassificationDataModule


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dataset", default="fashion_mnist")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    loaders = {}
    for augment in (False, True):
        for held in (False, True):
            data = ImageClassificationDataModule(args.dataset, batch_size=128, val_size=5000,
                                                 image_size=32, augment=augment,
                                                 device_resident=held)
            data.setup("fit")
            if held:
                split = data.resident_split("train")
                assert split is not None and split.transform is not None
                loaders[(augment, held)] = DeviceBatches(
                    [a.to(device) for a in split.arrays], 128, shuffle=True,
                    transform=split.transform.to(device))
            else:
                loaders[(augment, held)] = data.train_dataloader()
    times: dict[tuple[bool, bool], list[float]] = {}
    for r in range(args.rounds):
        for key, loader in loaders.items():
            loader.sampler.set_epoch(r)
            start = time.perf_counter()
            for x, y in loader:
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.setdefault(key, []).append(time.perf_counter() - start)
    for (augment, held), runs in times.items():
        print(f"augment={augment!s:5} device_resident={held!s:5} on {device}: median "
              f"{statistics.median(runs):.3f} s an epoch ({len(loaders[(augment, held)])} "
              f"batches; rounds {', '.join(f'{t:.3f}' for t in runs)})")


if __name__ == "__main__":
    main()
