"""Embedding a folder of PNGs: ours vs a plain transformers loop vs ONNX Runtime.

The same model, random weights, several ways, images/s over one folder: ``--model vit-b16``
(ViT-B/16 shape: 768 wide, 12 layers, 224 px) or ``--model dinov2-s14`` (DINOv2-S/14
shape: 384 wide, 12 layers, 6 heads, patch 14, 256 px resize + 224 px crop).

- **ours**: the model saved as a Hugging Face folder (``save_pretrained`` + the image
  processor's ``preprocessor_config.json``), loaded with ``mm.load_encoder``; PNGs decoded
  and preprocessed in DataLoader workers (``--workers``) while the main process runs the
  forward in the precision ``--precision`` picks (``fp32``, ``bf16`` or ``auto`` = timed on
  this CPU, :mod:`multimodal.optimize`), then the model's pooling (class token);
- **ours compiled fp32** (with ``--compile``): the same, the encoder compiled by
  ``torch.compile`` (:func:`multimodal.optimize.compile_encoder`) in fp32: ours against
  ONNX Runtime at equal precision;
- **transformers**: ``AutoImageProcessor`` + the model in a plain loop, the same batch size
  and threads, class token of ``last_hidden_state``;
- **onnxruntime**: the transformers model exported with ``torch.onnx.export`` (needs the
  ``onnx`` package; ``--no-onnx`` without it), fp32, run by an ``InferenceSession`` with
  ``intra_op_num_threads`` = the same threads, the same processor loop.

The folder: ``--images`` PNGs of ``--size`` px with smooth random content, written once
into ``--folder`` (default ``data/cache/embed_speed/png<size>``, git-ignored) on every
core with progress, and reused by every later run (image i is the same whatever
``--images``, so a larger run only adds files). 10 000 PNGs of 256 px: about 0.8 GB,
written in a few minutes on 2 cores.

Warm-up: every contestant embeds the first batch and the last, partial one (every batch
shape a pass meets: a compiled forward compiles them before timing); those embeddings
are compared (cosine to transformers'). Then ``--repeats`` interleaved passes over the
whole folder (a slow spell of a shared machine hits every contestant); the medians give
images/s and the ratios to transformers and ONNX Runtime. From 1000 images each pass shows
a progress bar (``--progress`` for fewer). A pass over 10 000 images takes the better
part of an hour per contestant at fp32 on 2 threads: for the issue's figure use
``--repeats 1``. ``--profile``: torch.profiler over one batch of each torch model and
ONNX Runtime's profiler over one batch, before the timing.

    PYTHONPATH=. python benchmarks/embed_speed.py --images 256 --threads 2
    PYTHONPATH=. python benchmarks/embed_speed.py --images 10000 --repeats 1 --threads 2 \
        --precision auto --compile --model dinov2-s14
    PYTHONPATH=. python benchmarks/embed_speed.py --images 64 --batch 16 --threads 1 \
        --compile --profile

Where the fp32 time goes (``--profile``, ViT-B/16, batch 16, 1 thread, on a 2-core Intel
Xeon with AVX-512 and AMX under a load average of 7): the Linear GEMMs (``aten::addmm``)
take 83 % of ours eager, 83 % of ours compiled and 83 % of transformers; ONNX Runtime's
MatMul + FusedMatMul 87 %. The rest: attention (the CPU flash kernel) 8 %, the bias
copied into each GEMM's output 3.5 %, GELU 2 %, residual adds 1.5 %, layer norms 1 %.
Compilation fuses only that elementwise rest (GELU, adds, norms: about 5 %), so the
compiled fp32 encoder cannot gain more than ~1.1x over eager at this size, and at equal
precision every contestant runs at its GEMM library's speed. On that Intel CPU torch's
fp32 GEMM (MKL) is as fast as ONNX Runtime's (MLAS) or faster (a 3152 x 768 x 3072
product at 1 thread: 72 vs 58 GFLOP/s), and ours fp32 ties ONNX Runtime (40 images:
eager 0.83x, compiled 0.90x, within the noise of that load). The 0.45x measured earlier
was on an AMD EPYC: there torch's fp32 Linear goes to MKL, whose AVX-512 kernels are
chosen for Intel CPUs, while MLAS uses AVX-512 on any CPU; with GEMMs at 83-87 % of the
forward that alone would explain a 2x (not measured here: check on an AMD CPU with the
single-GEMM comparison above before acting on it). bf16 (``--precision auto`` on a CPU
with native bf16) is the lever that changes the GEMM itself.
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

DEFAULT_FOLDER = Path(__file__).resolve().parents[1] / "data" / "cache" / "embed_speed"


def _write_png(job: tuple[Path, int, int, int]) -> None:
    """PNG ``i`` of ``size`` px from the seed ``(seed, i)``: smooth random content (16x16
    random colours, bilinearly upsampled), written to a temporary name, then renamed."""
    path, size, seed, i = job
    rng = np.random.default_rng([seed, i])
    small = rng.integers(0, 256, (max(size // 16, 1),) * 2 + (3,), dtype=np.uint8)
    img = Image.fromarray(small).resize((size, size), Image.BILINEAR)
    partial = path.with_name(path.name + ".part")
    img.save(partial, format="PNG", compress_level=1)
    partial.replace(path)


def make_folder(folder: Path, n: int, size: int, seed: int = 0) -> list[Path]:
    """``n`` PNGs of smooth random content (cheaper to decode than noise, like photos) in
    ``folder``: image ``i`` is drawn from the seed ``(seed, i)``, so it is the same image
    whatever ``n``; the ones already there are reused, the missing ones written on every
    core, with progress (zlib level 1: 3.5x faster to write than PIL's default 6, as fast
    to decode; an interrupted run leaves no half-written PNG)."""
    import os
    from concurrent.futures import ProcessPoolExecutor

    from multimodal.progress import progress

    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{i:05d}.png" for i in range(n)]
    jobs = [(p, size, seed, i) for i, p in enumerate(paths) if not p.exists()]
    if jobs:
        with ProcessPoolExecutor(os.cpu_count() or 1) as pool:
            for _ in progress(pool.map(_write_png, jobs, chunksize=16), total=len(jobs),
                              desc=f"writing PNGs into {folder}", unit="images"):
                pass
    return paths


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


def _warmup_paths(paths: list[Path], batch: int) -> list[Path]:
    """The first batch and the last (partial) one: every batch shape a pass meets, so
    that a compiled forward has compiled them all before the timed passes."""
    tail = len(paths) % batch
    return paths[:batch] + (paths[len(paths) - tail:] if tail and len(paths) > batch else [])


def profile_batch(label: str, fn: Callable[[], Any], rows: int = 12) -> None:
    """torch.profiler over one call of ``fn``: the ops with the most self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    print(f"--- profile: {label} (one batch) ---")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def profile_onnx(session_path: Path, threads: int, pixels: np.ndarray, rows: int = 12) -> None:
    """ONNX Runtime's own profiler over one call: self time per operator type."""
    import json

    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.enable_profiling = True
    opts.profile_file_prefix = str(session_path.with_name("ort_profile"))  # beside the model
    session = ort.InferenceSession(str(session_path), opts, providers=["CPUExecutionProvider"])
    for _ in range(2):  # the second run is the one read
        session.run(None, {"pixel_values": pixels})
    trace = Path(session.end_profiling())
    events = json.loads(trace.read_text())
    trace.unlink()
    last = [ev for ev in events if ev.get("name") == "model_run"][-1]
    events = [ev for ev in events if last["ts"] <= ev.get("ts", -1) <= last["ts"] + last["dur"]]
    per_op: dict[str, float] = {}
    for ev in events:
        if ev.get("cat") == "Node" and ev.get("name", "").endswith("_kernel_time"):
            op = ev.get("args", {}).get("op_name", "?")
            per_op[op] = per_op.get(op, 0.0) + ev["dur"] / 1000
    total = sum(per_op.values())
    print("--- profile: onnxruntime (one batch, kernel time by operator type) ---")
    for op, ms in sorted(per_op.items(), key=lambda kv: -kv[1])[:rows]:
        print(f"{op:>24s} {ms:9.1f} ms {100 * ms / total:5.1f} %")
    print(f"{'total':>24s} {total:9.1f} ms")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit-b16", choices=["vit-b16", "dinov2-s14"])
    parser.add_argument("--images", type=int, default=256,
                        help="PNGs in the folder (the issue's figure: 10000)")
    parser.add_argument("--size", type=int, default=256, help="PNG side in pixels")
    parser.add_argument("--folder", type=Path, default=None,
                        help="where the PNGs are written once and reused (default: "
                             "data/cache/embed_speed/png<size>)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1, help="ours: decoding workers")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "auto"],
                        help="ours: the precision of the 'ours' contestant")
    parser.add_argument("--compile", action="store_true",
                        help="add the contestant 'ours compiled fp32' (torch.compile)")
    parser.add_argument("--no-onnx", action="store_true")
    parser.add_argument("--profile", action="store_true",
                        help="profile one batch of each model (torch.profiler / onnxruntime's "
                             "profiler) before timing")
    parser.add_argument("--progress", action="store_true",
                        help="a progress bar per timed pass (default: on from 1000 images)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(machine_header())

    import multimodal as mm
    from multimodal.optimize import optimize_encoder
    from multimodal.progress import progress

    tmp = tempfile.TemporaryDirectory()
    folder = args.folder or DEFAULT_FOLDER / f"png{args.size}"
    paths = make_folder(folder, args.images, args.size)
    warm_paths = _warmup_paths(paths, args.batch)
    model, proc = hf_model(args.model)
    hf_dir = Path(tmp.name) / "hf"
    model.save_pretrained(hf_dir)
    proc.save_pretrained(hf_dir)
    encoder = mm.load_encoder(hf_dir)
    example = encoder.preprocess([str(p) for p in paths[: args.batch]])
    backbones = {"ours": optimize_encoder(encoder.backbone, precision=args.precision,
                                          example=example)}
    if args.compile:
        backbones["ours compiled fp32"] = optimize_encoder(
            mm.load_encoder(hf_dir).backbone, compile=True, precision="fp32")

    def loader(subset: list[Path], workers: int) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(
            _Paths(subset), batch_size=args.batch, num_workers=workers,
            collate_fn=lambda batch: encoder.preprocess([str(p) for p in batch]),
            persistent_workers=workers > 0, prefetch_factor=2 if workers else None)

    full_loader = loader(paths, args.workers)
    show = args.progress or len(paths) >= 1000

    def bar(name: str, subset: list[Path]) -> Any:
        return progress(total=len(subset), desc=name, unit="images",
                        disable=not show or subset is not paths)

    def run_ours(name: str, subset: list[Path]) -> torch.Tensor:
        backbone = backbones[name]
        out = []
        with torch.inference_mode(), bar(name, subset) as b:
            for pixels in full_loader if subset is paths else loader(subset, 0):
                out.append(backbone.pool(backbone.forward_features(pixels)))
                b.update(len(pixels))
        return torch.cat(out)

    def batches(subset: list[Path]) -> Any:
        for i in range(0, len(subset), args.batch):
            yield [Image.open(p).convert("RGB") for p in subset[i : i + args.batch]]

    def run_theirs(subset: list[Path]) -> torch.Tensor:
        out = []
        with torch.inference_mode(), bar("transformers", subset) as b:
            for images in batches(subset):
                pixels = proc(images=images, return_tensors="pt")["pixel_values"]
                out.append(model(pixel_values=pixels).last_hidden_state[:, 0])
                b.update(len(images))
        return torch.cat(out)

    fns: dict[str, Callable[[list[Path]], torch.Tensor]] = {
        name: (lambda subset, name=name: run_ours(name, subset)) for name in backbones}
    fns["transformers"] = run_theirs
    onnx_path = Path(tmp.name) / "model.onnx"
    if not args.no_onnx:
        import onnxruntime as ort

        start = time.perf_counter()
        try:
            torch.onnx.export(model, (example,), onnx_path, input_names=["pixel_values"],
                              output_names=["last_hidden_state"], dynamo=False,
                              dynamic_axes={"pixel_values": {0: "batch"},
                                            "last_hidden_state": {0: "batch"}})
        except Exception as err:  # the exporter needs the onnx package
            raise SystemExit(f"ONNX export failed ({type(err).__name__}: {err}); install "
                             "onnx, or run with --no-onnx") from err
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads
        opts.inter_op_num_threads = 1
        session = ort.InferenceSession(str(onnx_path), opts,
                                       providers=["CPUExecutionProvider"])
        print(f"onnx export + session: {time.perf_counter() - start:.1f} s")

        def run_onnx(subset: list[Path]) -> torch.Tensor:
            out = []
            with bar("onnxruntime", subset) as b:
                for images in batches(subset):
                    pixels = proc(images=images, return_tensors="np")["pixel_values"]
                    hidden = session.run(None, {"pixel_values": pixels})[0]
                    out.append(torch.from_numpy(hidden[:, 0]))
                    b.update(len(images))
            return torch.cat(out)

        fns["onnxruntime"] = run_onnx

    start = time.perf_counter()
    # warm-up on every batch shape (ours compiled: its compilations), embeddings compared
    first = {name: fn(warm_paths) for name, fn in fns.items()}
    print(f"warm-up on {len(warm_paths)} images (all contestants, compilation included): "
          f"{time.perf_counter() - start:.1f} s")
    ref = first["transformers"]
    for name, emb in first.items():
        cos = torch.nn.functional.cosine_similarity(emb.float(), ref.float(), dim=1).min()
        print(f"{name}: embeddings {tuple(emb.shape)}, min cosine to transformers' "
              f"{float(cos):.6f}")
    if args.profile:
        with torch.inference_mode():
            for name, backbone in backbones.items():
                profile_batch(name, lambda b=backbone: b.forward_features(example))
            profile_batch("transformers", lambda: model(pixel_values=example))
        if not args.no_onnx:
            profile_onnx(onnx_path, args.threads, example.numpy())
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(args.repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn(paths)
            times[name].append(time.perf_counter() - start)
    rate = {name: len(paths) / statistics.median(t) for name, t in times.items()}
    print(f"{args.model}, {len(paths)} PNGs of {args.size} px, batch {args.batch}, "
          f"{args.threads} thread(s), ours: {args.workers} decoding worker(s), precision "
          f"{args.precision}; median of {args.repeats} interleaved passes (images/s, "
          "min-max in brackets); ratios: this row's rate over that contestant's")
    others = [n for n in ("transformers", "onnxruntime") if n in rate]
    print("| pipeline | images/s | " + " | ".join(f"/ {n}" for n in others) + " |")
    print("| --- | ---: |" + " ---: |" * len(others))
    for name, t in times.items():
        lo, hi = len(paths) / max(t), len(paths) / min(t)
        ratios = " | ".join(f"{rate[name] / rate[n]:.2f}" for n in others)
        print(f"| {name} | {rate[name]:.1f} [{lo:.1f}-{hi:.1f}] | {ratios} |")
    tmp.cleanup()


if __name__ == "__main__":
    main()
