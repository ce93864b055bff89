"""ViT speed: our ViT vs timm, torchvision and transformers with the same configuration.

One process, the same threads, the same batch: a training step (forward + cross-entropy +
backward + AdamW) and inference (forward under ``torch.inference_mode``), images/s.
Warm-up steps first, then ``--repeats`` rounds that time each model once in turn
(interleaved, so a noisy neighbour slows all of them alike); the median is reported with
the ratio ours / peer (> 1: ours faster).

Our ViT is converted from the timm model (``multimodal.convert.from_timm``), so the two
hold the same weights and their logits are checked to agree before timing; the other
peers are checked to have the same number of parameters.

Run:
    PYTHONPATH=. python benchmarks/vit_speed.py --small          # 96 px, batch 8, quick
    PYTHONPATH=. python benchmarks/vit_speed.py                  # 224 px, batch 16, CPU fp32
    PYTHONPATH=. python benchmarks/vit_speed.py --device cuda --dtype bf16 --batch 256
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import multimodal as mm


@dataclass
class Shape:
    image_size: int = 224
    patch_size: int = 16
    dim: int = 192
    depth: int = 12
    heads: int = 3
    mlp_dim: int = 768
    num_classes: int = 1000


def build_models(s: Shape) -> dict[str, tuple[nn.Module, Callable[[nn.Module, Tensor], Tensor]]]:
    """name -> (model, forward(model, images) -> logits), all in train mode, fp32."""
    import timm
    import torchvision
    from transformers import ViTConfig as HFViTConfig
    from transformers import ViTForImageClassification

    timm_vit = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=s.image_size,
        patch_size=s.patch_size, embed_dim=s.dim, depth=s.depth, num_heads=s.heads,
        mlp_ratio=s.mlp_dim / s.dim, num_classes=s.num_classes,
    )
    ours = mm.convert.from_timm(timm_vit)
    tv = torchvision.models.VisionTransformer(
        image_size=s.image_size, patch_size=s.patch_size, num_layers=s.depth,
        num_heads=s.heads, hidden_dim=s.dim, mlp_dim=s.mlp_dim, num_classes=s.num_classes,
    )
    hf = ViTForImageClassification(HFViTConfig(
        image_size=s.image_size, patch_size=s.patch_size, hidden_size=s.dim,
        num_hidden_layers=s.depth, num_attention_heads=s.heads, intermediate_size=s.mlp_dim,
        num_labels=s.num_classes, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        attn_implementation="sdpa",
    ))

    def plain(m: nn.Module, x: Tensor) -> Tensor:
        return m(x)

    def hf_forward(m: nn.Module, x: Tensor) -> Tensor:
        return m(pixel_values=x).logits

    return {"ours": (ours, plain), "timm": (timm_vit, plain), "torchvision": (tv, plain),
            "transformers": (hf, hf_forward)}


def check_same(models: dict, s: Shape) -> None:
    """Same parameter count everywhere; ours == timm on the same weights."""
    counts = {k: sum(p.numel() for p in m.parameters()) for k, (m, _) in models.items()}
    if len(set(counts.values())) != 1:
        raise RuntimeError(f"configurations differ, parameter counts: {counts}")
    x = torch.randn(2, 3, s.image_size, s.image_size)
    (ours, f1), (timm_vit, f2) = models["ours"], models["timm"]
    ours.eval()
    timm_vit.eval()
    with torch.no_grad():
        torch.testing.assert_close(f1(ours, x), f2(timm_vit, x), atol=1e-4, rtol=1e-4)
    print(f"parameters: {counts['ours'] / 1e6:.2f} M in every model; ours == timm logits")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved_medians(fns: dict[str, Callable[[], object]], repeats: int, warmup: int,
                        device: torch.device) -> dict[str, float]:
    """Median seconds per call of each fn; rounds time every fn once, in turn."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync(device)
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            times[name].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="96 px images, batch 8")
    parser.add_argument("--image-size", type=int, default=None)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                        help="bf16: autocast (mixed precision), fp32 weights")
    parser.add_argument("--only", choices=["train", "infer"], default=None)
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda asked for, but no CUDA GPU is visible")
    image_size = args.image_size or (96 if args.small else 224)
    batch = args.batch or (8 if args.small else 16)
    shape = Shape(image_size=image_size)
    models = build_models(shape)
    check_same(models, shape)

    autocast_dtype = torch.bfloat16 if args.dtype == "bf16" else None
    x = torch.randn(batch, 3, image_size, image_size, device=device)
    y = torch.randint(0, shape.num_classes, (batch,), device=device)
    train_fns, infer_fns = {}, {}
    for name, (model, fwd) in models.items():
        model.to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")

        def train(model=model, fwd=fwd, opt=opt) -> None:
            model.train()
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=autocast_dtype,
                                enabled=autocast_dtype is not None):
                loss = F.cross_entropy(fwd(model, x).float(), y)
            loss.backward()
            opt.step()

        def infer(model=model, fwd=fwd) -> None:
            model.eval()
            with torch.inference_mode(), torch.autocast(
                device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None
            ):
                fwd(model, x)

        train_fns[name], infer_fns[name] = train, infer

    tokens = (image_size // shape.patch_size) ** 2 + 1
    print(f"ViT dim {shape.dim}, depth {shape.depth}, heads {shape.heads}, "
          f"{image_size} px / patch {shape.patch_size} ({tokens} tokens), "
          f"batch {batch}, {args.device} {args.dtype}, {args.threads} thread(s), "
          f"median of {args.repeats} interleaved repeats after {args.warmup} warm-up")
    results: dict[str, dict[str, float]] = {}
    for kind, fns in (("train", train_fns), ("infer", infer_fns)):
        if args.only and kind != args.only:
            continue
        med = interleaved_medians(fns, args.repeats, args.warmup, device)
        results[kind] = {k: batch / v for k, v in med.items()}

    kinds = list(results)
    header = "| model | " + " | ".join(f"{k} img/s | ours / it ({k})" for k in kinds) + " |"
    print(header)
    print("|" + " --- |" * (1 + 2 * len(kinds)))
    for name in models:
        cells = []
        for k in kinds:
            ips = results[k][name]
            cells += [f"{ips:.1f}", f"{results[k]['ours'] / ips:.2f}"]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
