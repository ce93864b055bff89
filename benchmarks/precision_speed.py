"""fp32 vs bf16 autocast on this machine, per model size: where ``precision: auto`` should
switch (multimodal/precision.py, multimodal/cli/precision.py, docs/precision.md).

For each ViT size, one process, the same threads and batch: a training step (forward +
cross-entropy + backward + AdamW, fp32 weights and optimizer state) and inference (forward
under ``torch.inference_mode``), once in fp32 and once under
``torch.autocast(device, dtype=torch.bfloat16)`` (what Lightning's ``bf16-mixed`` runs).
Warm-up steps first, then ``--repeats`` rounds that time fp32 and bf16 once each in turn
(interleaved, so background load hits both alike); the median images/s and the ratio
bf16 / fp32 (> 1: bf16 faster) are printed as a Markdown table, with the CPU's bf16 flags
and what ``choose_precision`` would pick for each size, so the table says whether the
size threshold fits this machine.

Run:
    PYTHONPATH=. python benchmarks/precision_speed.py --small        # two small sizes, quick
    PYTHONPATH=. python benchmarks/precision_speed.py                # four sizes, 1 thread
    PYTHONPATH=. python benchmarks/precision_speed.py --sizes tiny224 --batch 16 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import multimodal as mm
from multimodal.cli.precision import model_shape
from multimodal.precision import BF16_FLAGS, choose_precision, cpu_flags


@dataclass(frozen=True)
class Size:
    image_size: int
    patch_size: int
    in_channels: int
    dim: int
    depth: int
    heads: int
    mlp_dim: int
    num_classes: int = 10


SIZES = {
    # the main job's ViT (configs/vit_fashion_mnist.yaml): 128 wide, 16 patches + cls
    "fmnist": Size(28, 7, 1, 128, 4, 4, 256),
    # the same images in 4 px patches at ViT-Tiny's width: 49 patches + cls
    "fmnist-p4-w192": Size(28, 4, 1, 192, 6, 3, 768),
    # ViT-Tiny/16 at 96 px: 36 patches + cls
    "tiny96": Size(96, 16, 3, 192, 12, 3, 768),
    # ViT-Tiny/16 at 224 px: 196 patches + cls (the 1.55x on avx512_bf16)
    "tiny224": Size(224, 16, 3, 192, 12, 3, 768),
}


def build(size: Size) -> nn.Module:
    return mm.ViT(mm.ViTConfig(image_size=size.image_size, patch_size=size.patch_size,
                               in_channels=size.in_channels, num_classes=size.num_classes,
                               dim=size.dim, depth=size.depth, heads=size.heads,
                               mlp_dim=size.mlp_dim))


def steps(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, device: str,
          bf16: bool) -> tuple[Callable[[], None], Callable[[], None]]:
    """(training step, inference step) of ``model`` in fp32 or under bf16 autocast."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def train() -> None:
        model.train()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def infer() -> None:
        model.eval()
        with torch.inference_mode(), torch.autocast(device, dtype=torch.bfloat16,
                                                    enabled=bf16):
            model(images)

    return train, infer


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_pair(fns: dict[str, Callable[[], None]], warmup: int, repeats: int,
              device: str) -> dict[str, float]:
    """Median seconds per call of each function, timed once each per round in turn."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            _sync(device)
            start = time.perf_counter()
            fn()
            _sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", choices=sorted(SIZES),
                        default=["fmnist", "fmnist-p4-w192", "tiny96", "tiny224"])
    parser.add_argument("--small", action="store_true", help="fmnist and tiny96 only")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.small:
        args.sizes = ["fmnist", "tiny96"]
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    flags = cpu_flags()
    bf16_flags = sorted(flags & BF16_FLAGS) or ["none"]
    simd = sorted(f for f in flags if f in {"avx2", "avx512f", "avx512_vnni", "amx_tile"})
    print(f"device {args.device}, {args.threads} thread(s), batch {args.batch}, "
          f"{args.repeats} interleaved repeats; CPU bf16 flags: {', '.join(bf16_flags)} "
          f"(SIMD: {', '.join(simd) or 'unknown'}); torch capability "
          f"{torch.backends.cpu.get_cpu_capability()}\n")
    print("| size | width | tokens | auto picks | step | fp32 img/s | bf16 img/s | bf16/fp32 |")
    print("| --- | ---: | ---: | --- | --- | ---: | ---: | ---: |")
    for name in args.sizes:
        size = SIZES[name]
        model = build(size).to(args.device)
        dim, tokens = model_shape(model.config)
        pick = choose_precision(dim, tokens)[0] if args.device == "cpu" else "-"
        images = torch.randn(args.batch, size.in_channels, size.image_size, size.image_size,
                             device=args.device)
        labels = torch.randint(0, size.num_classes, (args.batch,), device=args.device)
        # two copies with the same initial weights, one per precision
        model32, model16 = model, build(size).to(args.device)
        model16.load_state_dict(model32.state_dict())
        train32, infer32 = steps(model32, images, labels, args.device, bf16=False)
        train16, infer16 = steps(model16, images, labels, args.device, bf16=True)
        for step, fns in (("train", {"fp32": train32, "bf16": train16}),
                          ("infer", {"fp32": infer32, "bf16": infer16})):
            t = time_pair(fns, args.warmup, args.repeats, args.device)
            print(f"| {name} | {dim} | {tokens} | {pick} | {step} | "
                  f"{args.batch / t['fp32']:.1f} | {args.batch / t['bf16']:.1f} | "
                  f"{t['fp32'] / t['bf16']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
