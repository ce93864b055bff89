"""Round-trip quality of the log-mel RVQ codec (:class:`multimodal.MelRVQCodec`) on spoken words.

Fits the codebooks (K entries each, Q = max of ``--codebooks``) on clips of the training
voices of the offline spoken-words set (``data/cache/spoken_words``, split by voice with
:func:`multimodal.data.sources.spoken_words.split_voices`, seed 0, the classifier's default
split), then, on clips of the held-out test voices, for each ``q`` in ``--codebooks`` (RVQ is
greedy, so the first ``q`` codebooks of one fit are the ``q``-codebook codec):

* ``quantised``: RMS over frames and mel bins of ``x - x_hat`` (natural-log mel power; the
  codec's own log-mel, offset 1e-5), i.e. the error of the tokens alone;
* ``round trip``: RMS of ``x - logmel(decode(encode(wave)))``, tokens -> InverseMelScale ->
  Griffin-Lim -> waveform -> log-mel again (same frame count by construction);
* the row ``q = -`` is Griffin-Lim alone on the unquantised frames (the vocoder's floor).

Also: bit rate ``q * log2(K) * 100`` bit/s (100 frames/s), and the real-time factor of
encode and decode (seconds of compute per second of audio, one thread).
Not measured here: the spoken-word classifier's accuracy on round-tripped audio (needs a
trained classifier checkpoint; none is shipped).

Run: ``OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/codec_roundtrip.py``
(needs ``bash data/get_audio.sh``). Prints a Markdown table; ``--save`` writes the codec.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from pathlib import Path

import torch

from multimodal.data.sources.spoken_words import read_manifest, split_voices
from multimodal.tokenizers.audio import load_audio
from multimodal.tokenizers.codec import CodecConfig, MelRVQCodec


def _pick(rows: list[dict[str, str]], voices: list[str], n: int, seed: int) -> list[dict]:
    keep = set(voices)
    chosen = [r for r in rows if r["voice"] in keep]
    random.Random(seed).shuffle(chosen)
    return chosen[:n]


def _rms(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).pow(2).mean().sqrt())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--root", default="data/cache/spoken_words")
    p.add_argument("--train-clips", type=int, default=800)
    p.add_argument("--test-clips", type=int, default=200)
    p.add_argument("--codebooks", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--codebook-size", type=int, default=256)
    p.add_argument("--gl-iters", type=int, default=32)
    p.add_argument("--kmeans-iters", type=int, default=20)
    p.add_argument("--max-fit-frames", type=int, default=50_000)
    p.add_argument("--save", type=Path, default=None, help="write the fitted codec here")
    args = p.parse_args()
    torch.manual_seed(0)

    root = Path(args.root)
    rows = read_manifest(root)
    split = split_voices({r["voice"] for r in rows})
    train = _pick(rows, split["train"], args.train_clips, seed=0)
    test = _pick(rows, split["test"], args.test_clips, seed=1)
    config = CodecConfig(num_codebooks=max(args.codebooks), codebook_size=args.codebook_size,
                         griffin_lim_iters=args.gl_iters, kmeans_iters=args.kmeans_iters,
                         max_fit_frames=args.max_fit_frames)
    codec = MelRVQCodec(config)
    t0 = time.perf_counter()
    codec.fit([load_audio(root / r["path"]) for r in train])
    fit_s = time.perf_counter() - t0
    if args.save:
        codec.save(args.save)

    quant: dict[int, list[float]] = {q: [] for q in args.codebooks}
    trip: dict[int, list[float]] = {q: [] for q in args.codebooks}
    gl_only: list[float] = []
    enc_s = dec_s = audio_s = 0.0
    q_max = max(args.codebooks)
    for r in test:
        wave, rate = load_audio(root / r["path"])
        x = codec.log_mel(wave, rate)
        audio_s += wave.shape[-1] / rate
        t0 = time.perf_counter()
        tokens = codec.encode(wave, rate)
        enc_s += time.perf_counter() - t0
        for q in args.codebooks:
            quant[q].append(_rms(x, codec.decode_mel(tokens[:q])))
            t0 = time.perf_counter()
            out = codec.decode(tokens[:q])
            if q == q_max:
                dec_s += time.perf_counter() - t0
            trip[q].append(_rms(x, codec.log_mel(out)))
        gl_only.append(_rms(x, codec.log_mel(codec.mel_to_waveform(x))))

    k_bits = math.log2(args.codebook_size)
    print(f"codec: K={args.codebook_size}, fitted on {len(train)} clips of "
          f"{len(split['train'])} training voices in {fit_s:.0f} s; tested on {len(test)} clips "
          f"of {len(split['test'])} held-out voices ({audio_s:.0f} s of audio); "
          f"Griffin-Lim {args.gl_iters} iterations\n")
    print("| q | bit/s | quantised log-mel RMSE | round-trip log-mel RMSE |")
    print("| --- | --- | --- | --- |")
    for q in args.codebooks:
        print(f"| {q} | {q * k_bits * 100:.0f} | {statistics.mean(quant[q]):.3f} | "
              f"{statistics.mean(trip[q]):.3f} |")
    print(f"| - (Griffin-Lim on unquantised frames) | - | 0 | {statistics.mean(gl_only):.3f} |")
    print(f"\nreal-time factor (1 thread, shared machine): encode {enc_s / audio_s:.4f}, "
          f"decode q={q_max} {dec_s / audio_s:.3f}")


if __name__ == "__main__":
    main()
