"""Embedding a folder of PNGs: ours vs a plain transformers loop vs ONNX Runtime.

The same ViT-B/16-shape (or DINOv2-S/14-shape) model three ways, images/s over one folder:

- **ours**: the model saved as a Hugging Face folder (``save_pretrained`` + the image
  processor's ``preprocessor_config.json``), loaded with ``mm.load_encoder``; PNGs decoded
  and preprocessed in DataLoader workers (``--workers``) while the main process runs the
  forward (:mod:`multimodal.optimize`: compiled with ``--compile``, in the precision
  ``--precision`` picks: ``fp32``, ``bf16`` or ``auto`` = timed on this CPU), then the
  model's pooling (class token);
- **transformers**: ``AutoImageProcessor`` + the model in a plain loop, the same batch size
  and threads, class token of ``last_hidden_state``;
- **onnxruntime**: the transformers model exported with ``torch.onnx.export``, run by an
  ``InferenceSession`` with ``intra_op_num_threads`` = the same threads, the same processor
  loop.

The three are timed in interleaved rounds (one pass over the folder each per round); the
medians give images/s and the ratios. Embeddings are compared (cosine to transformers').
The folder holds ``--images`` random-content PNGs (``--size`` px, written once into
``--folder``); the issue asks for 10 000, the default is smaller so that a run fits a
shared machine, say which one you ran.

    PYTHONPATH=. python benchmarks/embed_speed.py --images 256 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from machine import machine_header
from PIL import Image


def make_folder(folder: Path, n: int, size: int, seed: int = 0) -> list[Path]:
    """``n`` PNGs of smooth random content (cheaper to decode than noise, like photos)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = sorted(folder.glob("*.png"))
    if len(paths) >= n:
        return paths[:n]
    rng = np.random.default_rng(seed)
    for i in range(len(paths), n):
        small = rng.integers(0, 256, (size // 16, size // 16, 3), dtype=np.uint8)
        img = Image.fromarray(small).resize((size, size), Image.BILINEAR)
        img.save(folder / f"{i:05d}.png")
    return sorted(folder.glob("*.png"))[:n]


def hf_model(kind: str) -> tuple[Any, Any]:
    import transformers as t

    torch.manual_seed(0)
    if kind == "vit-b16":
        model = t.ViTModel(t.ViTConfig(image_size=224, patch_size=16), add_pooling_layer=False)
        proc = t.ViTImageProcessor(size={"height": 224, "width": 224})
    elif kind == "dinov2-s14":
        model = t.Dinov2Model(t.Dinov2Config(image_size=224, patch_size=14, hidden_size=384,
                                             num_hidden_layers=12, num_attention_heads=6))
        proc = t.BitImageProcessor(size={"shortest_edge": 256},
                                   crop_size={"height": 224, "width": 224},
                                   do_center_crop=True, image_mean=[0.485, 0.456, 0.406],
                                   image_std=[0.229, 0.224, 0.225], do_convert_rgb=True)
    else:
        raise SystemExit(f"--model must be vit-b16 or dinov2-s14, got {kind!r}")
    return model.eval(), proc


class _Paths(torch.utils.data.Dataset):
    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> Path:
        return self.paths[i]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit-b16", choices=["vit-b16", "dinov2-s14"])
    parser.add_argument("--images", type=int, default=256,
                        help="PNGs in the folder (the issue's figure: 10000)")
    parser.add_argument("--size", type=int, default=256, help="PNG side in pixels")
    parser.add_argument("--folder", type=Path, default=None,
                        help="where the PNGs are written / reused (default: a temp dir)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1, help="ours: decoding workers")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "auto"])
    parser.add_argument("--compile", action="store_true", help="ours: compiled forward")
    parser.add_argument("--no-onnx", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(machine_header())

    import multimodal as mm
    from multimodal.optimize import optimize_encoder

    tmp = tempfile.TemporaryDirectory()
    folder = args.folder or Path(tmp.name) / "pngs"
    paths = make_folder(folder, args.images, args.size)
    model, proc = hf_model(args.model)
    hf_dir = Path(tmp.name) / "hf"
    model.save_pretrained(hf_dir)
    proc.save_pretrained(hf_dir)
    encoder = mm.load_encoder(hf_dir)
    example = encoder.preprocess([str(p) for p in paths[: args.batch]])
    backbone = optimize_encoder(encoder.backbone, compile=args.compile,
                                precision=args.precision, example=example)
    pool = encoder.backbone.pool
    loader = torch.utils.data.DataLoader(
        _Paths(paths), batch_size=args.batch, num_workers=args.workers,
        collate_fn=lambda batch: encoder.preprocess([str(p) for p in batch]),
        persistent_workers=args.workers > 0, prefetch_factor=2 if args.workers else None)

    def run_ours() -> torch.Tensor:
        out = []
        with torch.inference_mode():
            for pixels in loader:
                out.append(pool(backbone.forward_features(pixels)))
        return torch.cat(out)

    def batches() -> Any:
        for i in range(0, len(paths), args.batch):
            yield [Image.open(p).convert("RGB") for p in paths[i : i + args.batch]]

    def run_theirs() -> torch.Tensor:
        out = []
        with torch.inference_mode():
            for images in batches():
                pixels = proc(images=images, return_tensors="pt")["pixel_values"]
                out.append(model(pixel_values=pixels).last_hidden_state[:, 0])
        return torch.cat(out)

    fns: dict[str, Callable[[], torch.Tensor]] = {"ours": run_ours, "transformers": run_theirs}
    if not args.no_onnx:
        import onnxruntime as ort

        onnx_path = Path(tmp.name) / "model.onnx"
        start = time.perf_counter()
        torch.onnx.export(model, (example,), onnx_path, input_names=["pixel_values"],
                          output_names=["last_hidden_state"], dynamo=False,
                          dynamic_axes={"pixel_values": {0: "batch"},
                                        "last_hidden_state": {0: "batch"}})
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads
        opts.inter_op_num_threads = 1
        session = ort.InferenceSession(str(onnx_path), opts,
                                       providers=["CPUExecutionProvider"])
        print(f"onnx export + session: {time.perf_counter() - start:.1f} s")

        def run_onnx() -> torch.Tensor:
            out = []
            for images in batches():
                pixels = proc(images=images, return_tensors="np")["pixel_values"]
                hidden = session.run(None, {"pixel_values": pixels})[0]
                out.append(torch.from_numpy(hidden[:, 0]))
            return torch.cat(out)

        fns["onnxruntime"] = run_onnx

    start = time.perf_counter()
    first = {name: fn() for name, fn in fns.items()}  # warm-up (and ours' compilation)
    print(f"warm-up pass (all contestants, compilation included): "
          f"{time.perf_counter() - start:.1f} s")
    ref = first["transformers"]
    for name, emb in first.items():
        cos = torch.nn.functional.cosine_similarity(emb.float(), ref.float(), dim=1).min()
        print(f"{name}: embeddings {tuple(emb.shape)}, min cosine to transformers' "
              f"{float(cos):.6f}")
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(args.repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    rate = {name: len(paths) / statistics.median(t) for name, t in times.items()}
    print(f"{args.model}, {len(paths)} PNGs of {args.size} px, batch {args.batch}, "
          f"{args.threads} thread(s), ours: {args.workers} decoding worker(s), precision "
          f"{args.precision}, compile {args.compile}; median of {args.repeats} interleaved "
          "passes (images/s, min-max in brackets)")
    print("| pipeline | images/s | ours / it |")
    print("| --- | ---: | ---: |")
    for name, t in times.items():
        lo, hi = len(paths) / max(t), len(paths) / min(t)
        print(f"| {name} | {rate[name]:.1f} [{lo:.1f}-{hi:.1f}] | "
              f"{rate['ours'] / rate[name]:.2f} |")
    tmp.cleanup()


if __name__ == "__main__":
    main()
