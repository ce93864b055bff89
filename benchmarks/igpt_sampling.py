"""Sampling speed: our ImageGPT (KV cache, one decoding loop) vs Hugging Face transformers.

Both models get the same configuration (width, depth, heads, MLP width, vocabulary,
image size), random weights, and draw ``batch`` images token by token with plain
multinomial sampling at temperature 1 (no top-k / top-p) in one process on the same
threads. Reported: the median over ``--repeats`` runs of generated tokens per second
(batch x pixels / seconds) for each and the ratio ours / theirs. The runs are
interleaved (ours, theirs, ours, ...) so that a slow spell of the machine hits both.
Also printed: the CPU seconds of each run (``process_time``; on a machine shared with other
jobs, with one thread, the fairer comparison), a digest of our tokens (the same digest
before and after a change = the same images for the same seed), and the streaming limit:
the bytes every run must read (all weights every step + the KV cache so far,
:func:`streamed_bytes`) over the bandwidth of a large copy (:func:`copy_bandwidth`), and
the fraction each run reaches (by wall time and by CPU time).

Run:
    PYTHONPATH=. python benchmarks/igpt_sampling.py            # 32x32 = 1024 tokens, 8 layers
    PYTHONPATH=. python benchmarks/igpt_sampling.py --small    # 16x16 = 256 tokens, quick
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import time
from collections.abc import Callable

import torch
from machine import machine_header

from multimodal.generation import compile_stats
from multimodal.models.image_gpt import ImageGPT, ImageGPTConfig


def hf_model(cfg: ImageGPTConfig) -> torch.nn.Module:
    """transformers' ImageGPTForCausalImageModeling with the same shape as ``cfg``
    (its vocabulary is our pixel tokens + 1 start-of-sequence token)."""
    from transformers import ImageGPTConfig as HFConfig
    from transformers import ImageGPTForCausalImageModeling

    h, w = cfg.grid
    hf_cfg = HFConfig(vocab_size=cfg.vocab_size + 1, n_positions=h * w, n_embd=cfg.dim,
                      n_layer=cfg.depth, n_head=cfg.heads, n_inner=cfg.mlp_dim,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return ImageGPTForCausalImageModeling(hf_cfg).eval()


def interleaved_medians(fns: dict[str, Callable[[], object]], repeats: int,
                        cpu: dict[str, float] | None = None) -> dict[str, float]:
    """Median wall time of each function, one warm-up each, then ``repeats`` rounds that
    run every function once in turn (so slow spells of a shared machine hit all of them).
    ``cpu``: filled with the median CPU time of this process per call (``process_time``:
    on a machine shared with other jobs, the time this process actually ran; with one
    thread the fairer measure when the load varies)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    cpu_times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            times[name].append(time.perf_counter() - start)
            cpu_times[name].append(time.process_time() - start_cpu)
    if cpu is not None:
        cpu.update({name: statistics.median(t) for name, t in cpu_times.items()})
    return {name: statistics.median(t) for name, t in times.items()}


def streamed_bytes(cfg: ImageGPTConfig, batch: int) -> float:
    """Bytes one ``generate`` must read from memory at least, when neither the weights nor
    the KV cache stay in the CPU's caches between steps: every step reads every weight
    (blocks, final norm, lm_head; fp32) once, and the keys and values of every layer for the
    tokens so far (step t attends over t + 1 cached tokens: the start token and t pixels).
    Formula: ``steps x weight bytes + sum_t (t + 1) x depth x 2 x batch x dim x 4``."""
    d, mlp, steps = cfg.dim, cfg.mlp_dim, cfg.num_pixels
    block = d * 3 * d + 3 * d + d * d + d + d * mlp + mlp + mlp * d + d + 4 * d
    weights = 4 * (cfg.depth * block + 2 * d + d * cfg.vocab_size)
    kv_per_token = cfg.depth * 2 * batch * d * 4
    return steps * weights + kv_per_token * steps * (steps + 1) / 2


def copy_bandwidth(mib: int = 256, repeats: int = 5) -> float:
    """Measured memory bandwidth in bytes/s: the best of ``repeats`` copies of an fp32
    tensor of ``mib`` MiB (far larger than the CPU's caches) into another, on this
    process's threads, counting the bytes read and the bytes written (2 x ``mib`` MiB)."""
    x = torch.ones(mib * 2**20 // 4)
    y = torch.empty_like(x)
    y.copy_(x)  # touch the destination's pages once
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        y.copy_(x)
        best = min(best, time.perf_counter() - start)
    return 2 * x.numel() * 4 / best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="16x16 images (256 tokens)")
    parser.add_argument("--image-size", type=int, default=None)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compile", action="store_true",
                        help="also time ours with generate(compile=True): a static KV cache "
                             "and one compiled fixed-shape step (compile time reported apart)")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    print(machine_header())
    torch.manual_seed(0)
    size = args.image_size or (16 if args.small else 32)
    cfg = ImageGPTConfig(image_size=size, vocab_size=args.vocab, dim=args.dim,
                         depth=args.depth, heads=args.heads, mlp_dim=4 * args.dim)
    ours = ImageGPT(cfg).eval().to(args.device)
    theirs = hf_model(cfg).to(args.device)
    n_tokens = args.batch * size * size
    sos = torch.full((args.batch, 1), args.vocab, dtype=torch.long, device=args.device)

    last: dict[str, torch.Tensor] = {}

    def run_ours() -> torch.Tensor:
        gen = torch.Generator(device=args.device).manual_seed(0)
        last["ours"] = ours.generate(num_images=args.batch, do_sample=True, generator=gen)
        return last["ours"]

    @torch.no_grad()
    def run_theirs() -> torch.Tensor:
        out = theirs.generate(input_ids=sos, attention_mask=torch.ones_like(sos),
                              max_new_tokens=size * size, min_new_tokens=size * size,
                              do_sample=True, top_k=0, top_p=1.0, temperature=1.0,
                              pad_token_id=args.vocab, use_cache=True)
        assert out.shape == (args.batch, size * size + 1), out.shape
        return out

    fns: dict[str, Callable[[], object]] = {"ours": run_ours, "theirs": run_theirs}
    if args.compile:
        def run_compiled() -> torch.Tensor:
            gen = torch.Generator(device=args.device).manual_seed(0)
            return ours.generate(num_images=args.batch, do_sample=True, generator=gen,
                                 compile=True)

        start = time.perf_counter()
        first = run_compiled()
        first_s = time.perf_counter() - start
        same = torch.equal(first, run_ours())
        stats = compile_stats()
        print(f"compiled ours: first run {first_s:.1f} s, of which compiling the step "
              f"{stats['compile_seconds']:.1f} s ({stats['compilations']:.0f} compilation(s)); "
              f"same tokens as eager: {same}")
        fns["compiled"] = run_compiled
    cpu: dict[str, float] = {}
    medians = interleaved_medians(fns, args.repeats, cpu)
    t_ours, t_theirs = medians["ours"], medians["theirs"]
    print(f"ImageGPT sampling: {size}x{size} = {size * size} tokens/image, batch {args.batch}, "
          f"dim {args.dim}, depth {args.depth}, heads {args.heads}, vocab {args.vocab}, "
          f"{args.device}, {torch.get_num_threads()} thread(s), median of {args.repeats} "
          "interleaved runs")
    print("| implementation | seconds | tokens/s |")
    print("| --- | ---: | ---: |")
    print(f"| multimodal ImageGPT.generate (KV cache) | {t_ours:.2f} | {n_tokens / t_ours:.0f} |")
    print(f"| transformers ImageGPTForCausalImageModeling.generate | {t_theirs:.2f} | "
          f"{n_tokens / t_theirs:.0f} |")
    if "compiled" in medians:
        t_comp = medians["compiled"]
        print(f"| multimodal, generate(compile=True) (static cache, compiled step) | "
              f"{t_comp:.2f} | {n_tokens / t_comp:.0f} |")
        print(f"compiled / eager ours (tokens/s): {t_ours / t_comp:.2f}x; compiled / theirs: "
              f"{t_theirs / t_comp:.2f}x; compilations after the timed runs: "
              f"{compile_stats()['compilations']:.0f} (no recompiles when unchanged)")
    print(f"ratio (ours / theirs, tokens/s): {t_theirs / t_ours:.2f}x")
    bandwidth = copy_bandwidth()
    moved = streamed_bytes(cfg, args.batch)
    limit = moved / bandwidth
    print(f"streaming limit: {moved / 1e9:.1f} GB read per run ({moved / cfg.num_pixels / 1e6:.1f}"
          f" MB per step: weights + KV cache) / {bandwidth / 1e9:.1f} GB/s measured copy "
          f"bandwidth (read + written) = {limit:.2f} s; ours reaches {limit / t_ours:.0%} of it "
          f"by wall time ({limit / cpu['ours']:.0%} by CPU time), transformers "
          f"{limit / t_theirs:.0%} ({limit / cpu['theirs']:.0%})")
    digest = hashlib.sha1(last["ours"].cpu().numpy().tobytes()).hexdigest()[:12]
    print(f"ours' tokens (seed 0): sha1 {digest} (the same digest = the same images)")
    print(f"CPU seconds of this process per run: ours {cpu['ours']:.2f}, theirs "
          f"{cpu['theirs']:.2f}; ratio (theirs / ours) {cpu['theirs'] / cpu['ours']:.2f}x "
          f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    if "compiled" in cpu:
        print(f"CPU seconds of the compiled runs: {cpu['compiled']:.2f}; theirs / compiled "
              f"{cpu['theirs'] / cpu['compiled']:.2f}x, eager / compiled "
              f"{cpu['ours'] / cpu['compiled']:.2f}x")


if __name__ == "__main__":
    main()
