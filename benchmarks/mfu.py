"""ViT-B/16 training throughput on one GPU and its model FLOPs utilisation (MFU).

MFU = achieved model FLOP/s / the device's peak FLOP/s, where the model FLOPs of one
training step are 3 x the forward FLOPs (backward = 2 x forward: gradients with respect to
activations and to weights), and forward FLOPs = 2 x multiply-accumulates (MACs).
Recomputation (activation checkpointing) is not counted: it is work, not model FLOPs.

Forward MACs of a ViT per image, T = patches + 1 tokens, width D, MLP width F, L layers:

    patch embedding   P * (C * p * p) * D          (P = patches)
    per layer         T * D * 3D   (qkv)  +  2 * T * T * D   (Q K^T and A V)
                    + T * D * D    (proj) +  2 * T * D * F   (MLP)
    head              D * classes

ViT-B/16 at 224 px: T = 197, D = 768, F = 3072, L = 12 -> 17.56 GMACs = 35.1 GFLOPs
forward, 105 GFLOPs per image per training step. Peak: ``--peak-tflops`` (default 989,
H100 SXM dense bf16; H100 PCIe 756, A100 312, H200 989).

The step: bf16 autocast, ``torch.compile`` of the model, fused AdamW, random images and
labels already on the GPU (measures the model, not the data loader).

Run (GPU):
    PYTHONPATH=. python benchmarks/mfu.py --batch 128
    PYTHONPATH=. python benchmarks/mfu.py --batch 128 --no-compile --peak-tflops 756
Without a GPU, count the FLOPs only (analytic and torch's FlopCounterMode on meta tensors):
    PYTHONPATH=. python benchmarks/mfu.py --dry-run
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import multimodal as mm
from multimodal.nn.embed import as_pair

VIT_B16 = dict(image_size=224, patch_size=16, in_channels=3, num_classes=1000, dim=768,
               depth=12, heads=12, mlp_dim=3072)


def vit_forward_macs(cfg: mm.ViTConfig) -> int:
    """Multiply-accumulates of one image's forward pass (module docstring)."""
    gh, gw = cfg.grid_size
    ph, pw = as_pair(cfg.patch_size)
    patches = gh * gw
    t = patches + (1 if cfg.class_token else 0)
    d, f = cfg.dim, cfg.mlp_dim or 4 * cfg.dim
    embed = patches * cfg.in_channels * ph * pw * d
    layer = t * d * 3 * d + 2 * t * t * d + t * d * d + 2 * t * d * f
    head = d * cfg.num_classes
    return embed + cfg.depth * layer + head


def counted_forward_flops(cfg: mm.ViTConfig) -> int:
    """FLOPs of one image's forward as torch's FlopCounterMode counts them (the model
    moved to meta tensors: no compute)."""
    from torch.utils.flop_counter import FlopCounterMode

    model = mm.ViT(cfg).to("meta")
    h, w = as_pair(cfg.image_size)
    x = torch.empty(1, cfg.in_channels, h, w, device="meta")
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(x)
    return int(counter.get_total_flops())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=10, help="steps before timing")
    parser.add_argument("--peak-tflops", type=float, default=989.0,
                        help="device peak dense bf16 TFLOP/s (H100 SXM: 989)")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--model", default="ours", choices=["ours", "timm"],
                        help="timm: timm's vit_base_patch16_224 (random weights), the same "
                             "step, as the reference for the same recipe")
    parser.add_argument("--compile-mode", default=None,
                        help="torch.compile mode, e.g. max-autotune-no-cudagraphs "
                             "(default: torch's default)")
    parser.add_argument("--checkpoint-activations", action="store_true")
    parser.add_argument("--dry-run", action="store_true",
                        help="count FLOPs on CPU only, no training")
    args = parser.parse_args(argv)

    cfg = mm.ViTConfig(**VIT_B16, checkpoint_activations=args.checkpoint_activations)
    macs = vit_forward_macs(cfg)
    step_flops = 3 * 2 * macs  # per image: forward + backward
    print(f"ViT-B/16 {cfg.image_size} px: forward {macs / 1e9:.2f} GMACs = "
          f"{2 * macs / 1e9:.1f} GFLOPs per image; training step {step_flops / 1e9:.1f} GFLOPs "
          f"per image")
    if args.dry_run:
        counted = counted_forward_flops(cfg)
        print(f"torch FlopCounterMode: forward {counted / 1e9:.1f} GFLOPs per image "
              f"(analytic / counted = {2 * macs / counted:.4f})")
        return
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/mfu.py measures a GPU and none is visible "
                         "(torch.cuda.is_available() is False). Run it on a CUDA machine, "
                         "or pass --dry-run to only count the FLOPs on CPU.")

    device = torch.device("cuda")
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    if args.model == "timm":
        import timm

        model = timm.create_model("vit_base_patch16_224", pretrained=False,
                                  num_classes=cfg.num_classes).to(device).train()
    else:
        model = mm.ViT(cfg).to(device).train()
    step_model = model if args.no_compile else torch.compile(model, mode=args.compile_mode)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05, fused=True)
    x = torch.randn(args.batch, 3, 224, 224, device=device)
    y = torch.randint(0, cfg.num_classes, (args.batch,), device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(step_model(x).float(), y)
        loss.backward()
        opt.step()

    start = time.perf_counter()
    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - start
    torch.cuda.reset_peak_memory_stats()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(args.steps):
        step()
    end.record()
    torch.cuda.synchronize()
    seconds = begin.elapsed_time(end) / 1e3 / args.steps
    images_s = args.batch / seconds
    achieved = images_s * step_flops / 1e12
    compiled = "off" if args.no_compile else f"on ({args.compile_mode or 'default'})"
    print(f"model: {args.model}; device: {torch.cuda.get_device_name(device)}; batch {args.batch}; "
          f"compile {compiled}; fused AdamW; bf16 autocast; "
          f"activation checkpointing {'on' if args.checkpoint_activations else 'off'}")
    print("| step ms | images/s | achieved TFLOP/s | peak TFLOP/s | MFU | peak memory GiB "
          "| warm-up s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print(f"| {seconds * 1e3:.1f} | {images_s:.0f} | {achieved:.0f} | {args.peak_tflops:.0f} | "
          f"{achieved / args.peak_tflops:.1%} | "
          f"{torch.cuda.max_memory_allocated() / 2**30:.1f} | {warm_s:.0f} |")


if __name__ == "__main__":
    main()
