"""Text generation speed: our GPT-2 (one decoding loop, preallocated KV cache) vs
transformers' ``generate``, greedy and beam search, same weights.

A small random GPT-2 (``GPT2LMHeadModel(GPT2Config(...))``) is converted with
``multimodal.convert.from_hf``; both decode the same prompts (batch x prompt tokens) for
exactly ``--new-tokens`` tokens (no end-of-sequence token), with the KV cache on. One
process, the same threads; warm-up first, then interleaved repeats (ours and theirs timed
in turn); the median gives generated tokens/s = batch x new tokens / seconds (for beam
search: tokens of the returned sequences, the beams are not counted). The generated
sequences are compared too ("same output": fraction of identical rows).
``--compile`` adds ours with ``generate(..., compile=True)`` (static KV cache, one compiled
one-token step): its first call's compilation is reported apart, then it is timed in the
same interleaved rounds. The spread (min-max over the repeats) follows each median.

ImageGPT pixel sampling is benchmarked separately: ``benchmarks/igpt_sampling.py``.

Run:
    PYTHONPATH=. python benchmarks/generation_speed.py --small     # quick
    PYTHONPATH=. python benchmarks/generation_speed.py
    PYTHONPATH=. python benchmarks/generation_speed.py --device cuda --batch 32
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from machine import machine_header

import multimodal as mm
from multimodal.generation import compile_stats


def build(args: argparse.Namespace) -> tuple[torch.nn.Module, torch.nn.Module]:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=args.vocab, n_positions=args.max_len, n_embd=args.dim,
                     n_layer=args.depth, n_head=args.heads, resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    theirs = GPT2LMHeadModel(cfg).eval()
    theirs.generation_config.pad_token_id = 0
    ours = mm.convert.from_hf(theirs).eval()
    return ours, theirs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="2 layers, 16 new tokens")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=None)
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--depth", type=int, default=None)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compile", action="store_true",
                        help="also time generate(compile=True) (static cache, compiled step)")
    args = parser.parse_args(argv)
    args.depth = args.depth or (2 if args.small else 6)
    new = args.new_tokens or (16 if args.small else 64)
    if args.prompt + new > args.max_len:
        raise SystemExit(f"prompt + new tokens ({args.prompt + new}) > --max-len {args.max_len}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda asked for, but no CUDA GPU is visible")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    ours, theirs = build(args)
    ours.to(device)
    theirs.to(device)
    ids = torch.randint(0, args.vocab, (args.batch, args.prompt), device=device)
    mask = torch.ones_like(ids)

    def run_ours(beams: int, compile: bool = False) -> torch.Tensor:
        return ours.generate(ids, max_new_tokens=new, num_beams=beams, compile=compile)

    def run_theirs(beams: int) -> torch.Tensor:
        with torch.no_grad():
            return theirs.generate(ids, attention_mask=mask, max_new_tokens=new,
                                   min_new_tokens=new, do_sample=False, num_beams=beams,
                                   use_cache=True, early_stopping=False, length_penalty=1.0)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def timed(fn: Callable[[], torch.Tensor]) -> float:
        sync()
        start = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - start

    print(machine_header())
    print(f"GPT-2 dim {args.dim}, depth {args.depth}, heads {args.heads}, vocab {args.vocab}; "
          f"batch {args.batch}, prompt {args.prompt}, {new} new tokens, {args.device}, "
          f"{args.threads} thread(s); median of {args.repeats} interleaved repeats "
          "(min-max in brackets)")
    rows = []
    for label, beams in (("greedy", 1), (f"beam search ({args.beams} beams)", args.beams)):
        fns: dict[str, Callable[[], torch.Tensor]] = {
            "ours": lambda beams=beams: run_ours(beams),
            "theirs": lambda beams=beams: run_theirs(beams)}
        a, b = run_ours(beams), run_theirs(beams)  # warm-up, and the outputs to compare
        same = (a.shape == b.shape) and float((a == b).all(dim=1).float().mean())
        note = ""
        if args.compile:
            before = compile_stats()
            start = time.perf_counter()
            c = run_ours(beams, True)
            after = compile_stats()
            note = (f"compiled: first call {time.perf_counter() - start:.1f} s, compiling "
                    f"{after['compile_seconds'] - before['compile_seconds']:.1f} s "
                    f"({after['compilations'] - before['compilations']:.0f} graph(s)); same "
                    f"tokens as eager: {torch.equal(a, c)}")
            fns["compiled"] = lambda beams=beams: run_ours(beams, True)
        for _ in range(args.warmup - 1):
            for fn in fns.values():
                fn()
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(args.repeats):
            for name, fn in fns.items():
                times[name].append(timed(fn))
        tok = args.batch * new
        rate = {name: tok / statistics.median(t) for name, t in times.items()}
        spread = {name: f"[{tok / max(t):.0f}-{tok / min(t):.0f}]" for name, t in times.items()}
        rows.append((label, rate, spread, same, note))
    print("| decoding | ours tokens/s | compiled tokens/s | transformers tokens/s | "
          "ours / transformers | compiled / transformers | same output |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for label, rate, spread, same, _ in rows:
        comp = rate.get("compiled")
        comp_cell = f"{comp:.0f} {spread['compiled']}" if comp else "-"
        comp_ratio = f"{comp / rate['theirs']:.2f}" if comp else "-"
        print(f"| {label} | {rate['ours']:.0f} {spread['ours']} | {comp_cell} | "
              f"{rate['theirs']:.0f} {spread['theirs']} | {rate['ours'] / rate['theirs']:.2f} | "
              f"{comp_ratio} | {same:.2f} |")
    for label, *_, note in rows:
        if note:
            print(f"{label}: {note}")
    print(f"compilations in total: {compile_stats()['compilations']:.0f} (a repeat with the "
          "same shapes compiles nothing)")

if __name__ == "__main__":
    main()
