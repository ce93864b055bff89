"""Training-step throughput and peak memory: our CLIP vs open_clip's CLIP of the same shape.

    PYTHONPATH=.:<overlay with open-clip-torch> OMP_NUM_THREADS=1 python benchmarks/clip_speed.py

Both models: a ViT image tower (patch stem, class-token pooling, pre-norm) and a causal
text tower read at the end-of-text token, projections to ``embed_dim``, one learnable
logit scale. One step = forward both towers, symmetric InfoNCE on the batch, backward,
AdamW step. Throughput: the two models' steps are interleaved in one process (so load
from other jobs hits both alike) and the median step time of each is compared, in fp32 and
under CPU bf16 autocast (or CUDA when present). Peak memory: each model trains in a fresh
subprocess and reports its peak resident set (CPU, ``VmHWM``; both subprocesses import the same
libraries) and that peak minus the resident set after the imports, before the model is
built (what the model, its gradients, optimizer state and activations add), or
``torch.cuda.max_memory_allocated`` (GPU). ``--dtypes fp32`` skips bf16 (on a CPU without
native bf16, autocast emulates it and its timings say little).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F

SHAPE = dict(image_size=64, patch_size=8, width=256, layers=4, heads=4, mlp_ratio=4,
             context=32, vocab=1000, embed_dim=256)


def ours(s: dict[str, Any]) -> torch.nn.Module:
    import multimodal as mm

    return mm.CLIP(mm.CLIPConfig(
        vision=mm.ViTConfig(image_size=s["image_size"], patch_size=s["patch_size"],
                            dim=s["width"], depth=s["layers"], heads=s["heads"],
                            mlp_dim=s["mlp_ratio"] * s["width"], pool="cls", norm_eps=1e-5),
        text=mm.TextEncoderConfig(vocab_size=s["vocab"], max_len=s["context"], dim=s["width"],
                                  depth=s["layers"], heads=s["heads"],
                                  mlp_dim=s["mlp_ratio"] * s["width"], causal=True,
                                  norm_eps=1e-5),
        embed_dim=s["embed_dim"], text_pool="eot"))


def theirs(s: dict[str, Any]) -> torch.nn.Module:
    from open_clip.model import CLIP, CLIPTextCfg, CLIPVisionCfg

    return CLIP(s["embed_dim"],
                CLIPVisionCfg(layers=s["layers"], width=s["width"],
                              head_width=s["width"] // s["heads"], mlp_ratio=s["mlp_ratio"],
                              patch_size=s["patch_size"], image_size=s["image_size"]),
                CLIPTextCfg(context_length=s["context"], vocab_size=s["vocab"],
                            width=s["width"], heads=s["heads"], layers=s["layers"],
                            mlp_ratio=s["mlp_ratio"]))


def make_step(name: str, model: torch.nn.Module, device: str, dtype: torch.dtype | None):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def features(images: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if name == "ours":
            img, txt = model.forward_features(images, ids).unbind(1)
            return img, txt, model.scale()
        img, txt, scale = model(images, ids)  # open_clip: normalised features, exp(scale)
        return img, txt, scale

    def step(images: torch.Tensor, ids: torch.Tensor) -> None:
        with torch.autocast(device, dtype=dtype, enabled=dtype is not None):
            img, txt, scale = features(images, ids)
            logits = (scale * img @ txt.T).float()
            labels = torch.arange(images.shape[0], device=images.device)
            loss = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def batch(s: dict[str, Any], b: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    images = torch.randn(b, 3, s["image_size"], s["image_size"], generator=g)
    # ids in [3, vocab - 1), end-of-text = vocab - 1 last (open_clip pools at the argmax id)
    ids = torch.randint(3, s["vocab"] - 1, (b, s["context"]), generator=g)
    ids[:, -1] = s["vocab"] - 1
    return images.to(device), ids.to(device)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def throughput(b: int, steps: int, device: str, dtype: torch.dtype | None) -> dict[str, float]:
    torch.manual_seed(0)
    models = {"ours": ours(SHAPE).to(device), "open_clip": theirs(SHAPE).to(device)}
    runs = {k: make_step(k, m, device, dtype) for k, m in models.items()}
    data = batch(SHAPE, b, device)
    times: dict[str, list[float]] = {k: [] for k in runs}
    for i in range(steps + 2):
        for k, step in runs.items():
            sync(device)
            t = time.perf_counter()
            step(*data)
            sync(device)
            if i >= 2:  # warm-up
                times[k].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"ours_samples_per_s": b / med["ours"], "open_clip_samples_per_s": b / med["open_clip"],
            "ratio": med["open_clip"] / med["ours"]}


def resident_mib() -> float:
    """The current resident set of this process (Linux /proc), MiB."""
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_resident_mib() -> float:
    """Peak resident set of this process image (``VmHWM`` of /proc/self/status), MiB.
    Not ``getrusage``'s ``ru_maxrss``: Linux carries that across fork + exec, so a child
    started by this script would report the parent's peak (both models loaded)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def memory_child(name: str, b: int, steps: int, device: str, dtype_name: str) -> None:
    import open_clip  # noqa: F401  (same imports in both children)

    import multimodal  # noqa: F401

    base = resident_mib() if device != "cuda" else 0.0
    dtype = {"fp32": None, "bf16": torch.bfloat16}[dtype_name]
    torch.manual_seed(0)
    model = (ours if name == "ours" else theirs)(SHAPE).to(device)
    step = make_step(name, model, device, dtype)
    data = batch(SHAPE, b, device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for _ in range(steps):
        step(*data)
    peak = (torch.cuda.max_memory_allocated() / 2**20 if device == "cuda"
            else peak_resident_mib())
    print(json.dumps({"peak_mib": peak, "added_mib": peak - base}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--memory-child", nargs=2, metavar=("MODEL", "DTYPE"))
    parser.add_argument("--dtypes", default="fp32,bf16", help="comma-separated: fp32, bf16")
    args = parser.parse_args()
    if args.memory_child:
        memory_child(args.memory_child[0], args.batch, 3, args.device, args.memory_child[1])
        return
    print(f"shape {SHAPE}, batch {args.batch}, device {args.device}, "
          f"threads {torch.get_num_threads()}")
    dtypes = {"fp32": None, "bf16": torch.bfloat16}
    for dtype_name in args.dtypes.split(","):
        r = throughput(args.batch, args.steps, args.device, dtypes[dtype_name])
        mem, added = {}, {}
        for name in ("ours", "open_clip"):
            out = subprocess.run([sys.executable, __file__, "--batch", str(args.batch),
                                  "--device", args.device, "--memory-child", name, dtype_name],
                                 capture_output=True, text=True, check=True)
            result = json.loads(out.stdout.strip().splitlines()[-1])
            mem[name], added[name] = result["peak_mib"], result["added_mib"]
        print(f"{dtype_name}: ours {r['ours_samples_per_s']:.1f} samples/s, open_clip "
              f"{r['open_clip_samples_per_s']:.1f} samples/s, throughput ratio ours/open_clip "
              f"{r['ratio']:.2f}x; peak memory ours {mem['ours']:.0f} MiB, open_clip "
              f"{mem['open_clip']:.0f} MiB ({mem['ours'] / mem['open_clip']:.2f}x); above the "
              f"imports ours {added['ours']:.0f} MiB, open_clip {added['open_clip']:.0f} MiB "
              f"({added['ours'] / added['open_clip']:.2f}x)")


if __name__ == "__main__":
    main()
