"""Where one ImageGPT decoding step's time goes: torch.profiler's operator table and
cProfile's Python-function table for ``ImageGPT.generate`` on the sampling benchmark's
configuration (random weights, plain multinomial sampling).

``--compile``: the same with ``generate(compile=True)`` (static KV cache, the one-token
step compiled by inductor; compiled in the warm-up, not profiled), to see what stays
outside the compiled step (embedding, vocabulary head, sampling, the Python loop).

Run:
    PYTHONPATH=. python benchmarks/igpt_step_profile.py --threads 2 --image-size 16
    PYTHONPATH=. python benchmarks/igpt_step_profile.py --threads 2 --image-size 16 --compile
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats

import torch
from torch.profiler import ProfilerActivity, profile

from multimodal.models.image_gpt import ImageGPT, ImageGPTConfig


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", type=int, default=15, help="table rows to print")
    parser.add_argument("--compile", action="store_true",
                        help="generate(compile=True): the compiled static-cache step")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = ImageGPTConfig(image_size=args.image_size, vocab_size=args.vocab, dim=args.dim,
                         depth=args.depth, heads=args.heads, mlp_dim=4 * args.dim)
    model = ImageGPT(cfg).eval()
    steps = cfg.num_pixels

    def run() -> torch.Tensor:
        return model.generate(num_images=args.batch, do_sample=True, compile=args.compile,
                              generator=torch.Generator().manual_seed(0))

    run()  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    print(f"torch.profiler, one generate(compile={args.compile}) of {steps} steps, batch "
          f"{args.batch}, {args.threads} thread(s); self CPU time per step in microseconds")
    print("| op | calls / step | self CPU us / step | % |")
    print("| --- | ---: | ---: | ---: |")
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events)
    for e in events[: args.rows]:
        print(f"| {e.key} | {e.count / steps:.1f} | {e.self_cpu_time_total / steps:.0f} | "
              f"{100 * e.self_cpu_time_total / total:.1f} |")
    print(f"| all ops | {sum(e.count for e in events) / steps:.0f} | {total / steps:.0f} | 100 |")

    prof_py = cProfile.Profile()
    prof_py.enable()
    run()
    prof_py.disable()
    out = io.StringIO()
    pstats.Stats(prof_py, stream=out).sort_stats("tottime").print_stats(args.rows)
    print("cProfile (Python functions, tottime = own time):")
    print(out.getvalue())


if __name__ == "__main__":
    main()
