"""Attention time and peak memory: the SDPA kernel path vs the explicit path, by length.

Both are ``multimodal.nn.attention.scaled_dot_product_attention``: ``need_weights=False``
calls ``torch.nn.functional.scaled_dot_product_attention`` (flash / memory-efficient
kernels, no N x N matrix kept), ``need_weights=True`` computes
``softmax(Q K^T / sqrt(d)) V`` and returns the (B, H, N, N) weights. Fixed batch, heads and
head width; the sequence length N grows.

Time: one process, warm-up first, then interleaved repeats (both paths timed in turn at
each length), median per call. Peak memory, above the inputs:

- CPU: every (path, N) runs once in a fresh subprocess. After the inputs are allocated
  the kernel's resident-set high-water mark is reset (``5 > /proc/self/clear_refs``,
  Linux); peak = high-water mark (VmHWM) after the call minus resident set (VmRSS) before.
  Where that reset is refused, ru_maxrss deltas are used (these read 0 while the call
  stays below the peak left by ``import torch``).
- CUDA: ``torch.cuda.max_memory_allocated`` minus the memory allocated before the call.

Also printed: the theoretical size of one fp32/bf16 N x N weight tensor (B x H x N^2).

Run:
    PYTHONPATH=. python benchmarks/attention_memory.py --small        # N = 128 .. 1024
    PYTHONPATH=. python benchmarks/attention_memory.py                # N = 128 .. 4096
    PYTHONPATH=. python benchmarks/attention_memory.py --device cuda --dtype bf16 \
        --lengths 1024 2048 4096 8192 16384
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch

from multimodal.nn.attention import scaled_dot_product_attention

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
PATHS = {"sdpa": False, "explicit": True}


def inputs(args: argparse.Namespace, n: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(n)
    shape = (args.batch, args.heads, n, args.head_dim)
    return tuple(torch.randn(shape, generator=g).to(args.device, DTYPES[args.dtype])
                 for _ in range(3))


def run_once(q, k, v, need_weights: bool, causal: bool) -> None:
    with torch.inference_mode():
        scaled_dot_product_attention(q, k, v, need_weights=need_weights, causal=causal)


def _proc_status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak_rss() -> bool:
    """Reset this process's peak resident set (VmHWM) to the current one (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        _proc_status_kib("VmHWM")
    except OSError:
        return False
    return True


def child(args: argparse.Namespace) -> None:
    """Measure one (path, N) in this fresh process; print {"peak_bytes": ...} as JSON."""
    torch.set_num_threads(args.threads)
    n, need_weights = args.child_length, PATHS[args.child_path]
    run_once(*inputs(args, 16), need_weights, args.causal)  # lazy kernel/library set-up
    q, k, v = inputs(args, n)
    if args.device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        run_once(q, k, v, need_weights, args.causal)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    elif _reset_peak_rss():
        base = _proc_status_kib("VmRSS")
        run_once(q, k, v, need_weights, args.causal)
        peak = (_proc_status_kib("VmHWM") - base) * 1024
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        run_once(q, k, v, need_weights, args.causal)
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024  # KiB
    print(json.dumps({"peak_bytes": peak}))


def peak_memory(args: argparse.Namespace, path: str, n: int) -> int:
    cmd = [sys.executable, __file__, "--child-path", path, "--child-length", str(n),
           "--batch", str(args.batch), "--heads", str(args.heads),
           "--head-dim", str(args.head_dim), "--device", args.device, "--dtype", args.dtype,
           "--threads", str(args.threads)] + (["--causal"] if args.causal else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"memory child failed for {path} N={n}:\n{out.stderr[-2000:]}")
    return int(json.loads(out.stdout.strip().splitlines()[-1])["peak_bytes"])


def timings(args: argparse.Namespace, n: int) -> dict[str, float]:
    q, k, v = inputs(args, n)

    def sync() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize()

    for need in PATHS.values():
        for _ in range(args.warmup):
            run_once(q, k, v, need, args.causal)
    times: dict[str, list[float]] = {p: [] for p in PATHS}
    for _ in range(args.repeats):
        for path, need in PATHS.items():
            sync()
            start = time.perf_counter()
            run_once(q, k, v, need, args.causal)
            sync()
            times[path].append(time.perf_counter() - start)
    return {p: statistics.median(t) for p, t in times.items()}


def mib(b: float) -> str:
    return f"{b / 2**20:.1f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="lengths 128 .. 1024")
    parser.add_argument("--lengths", type=int, nargs="+", default=None)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="fp32", choices=list(DTYPES))
    parser.add_argument("--child-path", choices=list(PATHS), help=argparse.SUPPRESS)
    parser.add_argument("--child-length", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda asked for, but no CUDA GPU is visible")
    if args.child_path is not None:
        child(args)
        return
    torch.set_num_threads(args.threads)
    lengths = args.lengths or ([128, 256, 512, 1024] if args.small
                               else [128, 256, 512, 1024, 2048, 4096])
    elem = torch.finfo(DTYPES[args.dtype]).bits // 8
    print(f"batch {args.batch}, {args.heads} heads x {args.head_dim}, "
          f"{'causal' if args.causal else 'bidirectional'}, {args.device} {args.dtype}, "
          f"{args.threads} thread(s); time: median of {args.repeats} interleaved repeats; "
          f"memory: peak above inputs, fresh process per cell (MiB)")
    print("| N | sdpa ms | explicit ms | explicit / sdpa time | sdpa MiB | explicit MiB "
          "| explicit / sdpa memory | one N x N weight tensor MiB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for n in lengths:
        t = timings(args, n)
        mem = {p: peak_memory(args, p, n) for p in PATHS}
        ratio = mem["explicit"] / mem["sdpa"] if mem["sdpa"] > 0 else float("inf")
        weights = args.batch * args.heads * n * n * elem
        print(f"| {n} | {t['sdpa'] * 1e3:.2f} | {t['explicit'] * 1e3:.2f} | "
              f"{t['explicit'] / t['sdpa']:.2f} | {mib(mem['sdpa'])} | "
              f"{mib(mem['explicit'])} | {ratio:.1f} | {mib(weights)} |", flush=True)


if __name__ == "__main__":
    main()
