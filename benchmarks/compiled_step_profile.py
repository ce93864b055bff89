"""Where the time of one greedy decoding step goes, eager vs ``generate(compile=True)``, on
the GPT-2-shape TextDecoder of ``benchmarks/generation_speed.py`` (random weights, dim
256, 6 layers, 8 heads, vocabulary 2048, batch 4, prompt 16, 64 new tokens).

Prints the wall time of both (median of ``--repeats``, interleaved; the compiled step is
compiled in the warm-up, its time printed apart), then for each a torch.profiler table of
one ``generate`` call (operators by self CPU time) and the per-step counts of operator
calls, to show what the compiled step still calls and what costs more than eager.

Run (issue 41 item 4: at 1 thread the compiled step measured 0.95x eager on Intel):
    PYTHONPATH=. python benchmarks/compiled_step_profile.py --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from multimodal.generation import compile_stats
from multimodal.models.text import TextDecoder, TextDecoderConfig


def _python_wrapper_backend() -> None:
    """Make ``generate(compile=True)`` compile its step with the Python wrapper and
    inductor's per-kernel profiler events (everything else as the package compiles it)."""
    import multimodal.generation as generation

    def counting_backend(cudagraphs: bool):
        def backend(gm, example_inputs):
            from torch._inductor.compile_fx import compile_fx

            generation._COMPILE_STATS["compilations"] += 1
            return compile_fx(gm, example_inputs, config_patches={
                "cpp_wrapper": False, "cpp.threads": generation.CPU_STEP_KERNEL_THREADS,
                "cpp.enable_kernel_profile": True})
        return backend
    generation._counting_backend = counting_backend


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", type=int, default=14)
    parser.add_argument("--python-wrapper", action="store_true",
                        help="compile with inductor's Python wrapper and kernel profiling, "
                             "so the profiler sees the GEMMs and each generated kernel "
                             "inside the compiled step (the default C++ wrapper is opaque)")
    args = parser.parse_args(argv)
    if args.python_wrapper:
        _python_wrapper_backend()

    from benchmarks.machine import machine_header

    print(machine_header())
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = TextDecoder(TextDecoderConfig(vocab_size=args.vocab, max_len=512, dim=args.dim,
                                          depth=args.depth, heads=args.heads)).eval()
    ids = torch.randint(0, args.vocab, (args.batch, args.prompt))
    runs = {"eager": lambda: model.generate(ids, max_new_tokens=args.new_tokens),
            "compiled": lambda: model.generate(ids, max_new_tokens=args.new_tokens,
                                               compile=True)}
    outs = {name: run() for name, run in runs.items()}  # warm up; compiles
    stats = compile_stats()
    print(f"compiled {stats['compilations']} graph(s) in {stats['compile_seconds']:.1f} s; "
          f"same tokens: {torch.equal(outs['eager'], outs['compiled'])}")
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    steps = args.new_tokens * args.batch
    for name, t in times.items():
        med = statistics.median(t)
        print(f"{name}: {steps / med:.0f} tok/s ({1e3 * med / args.new_tokens:.2f} ms a "
              f"step, runs {', '.join(f'{x:.3f}' for x in t)} s)")
    ratio = statistics.median(times["eager"]) / statistics.median(times["compiled"])
    print(f"compiled / eager speed: {ratio:.2f}x")

    for name, run in runs.items():
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            run()
        for e in prof.key_averages(group_by_input_shape=True):
            if e.key in ("aten::addmm", "aten::mm") and e.count >= args.new_tokens:
                print(f"{name}: {e.key} {e.input_shapes}: {e.count / args.new_tokens:.0f} a "
                      f"step, {e.self_cpu_time_total / e.count:.1f} us each")
        events = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in events)
        print(f"\n== {name}: {total / 1e3:.1f} ms self CPU in one generate "
              f"({total / 1e3 / args.new_tokens:.2f} ms a step) ==")
        print(f"{'op':<52} {'calls/step':>10} {'self ms':>9} {'share':>7}")
        for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:args.rows]:
            print(f"{e.key[:52]:<52} {e.count / args.new_tokens:>10.1f} "
                  f"{e.self_cpu_time_total / 1e3:>9.2f} {e.self_cpu_time_total / total:>7.1%}")


if __name__ == "__main__":
    main()
