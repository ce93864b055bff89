"""The inference verbs: argument parsing and output for :mod:`multimodal.pipelines`
(``embed``, ``zero_shot``, ``caption``, ``transcribe``, ``speak``).

    multimodal embed      --model FOLDER|CKPT --inputs DIR|MANIFEST --out emb.safetensors
    multimodal zero-shot  --model CLIP_FOLDER --labels "cat,dog" --inputs DIR [--out p.csv]
    multimodal caption    --model CKPT|FOLDER --inputs DIR [--out captions.csv]
    multimodal transcribe --model WHISPER_DIR --inputs DIR|FILES [--out transcripts.csv]
    multimodal speak      --model TTS_CKPT --text "..." --prompt voice.wav --out out.wav

``embed`` / ``zero-shot`` / ``caption`` take ``--batch_size``, ``--device`` and
``--skip_corrupt`` (leave unreadable inputs out and list them at the end, instead of
stopping at the first with an error naming it). Flags are spelled as in
:mod:`multimodal.cli.flags` (old spellings such as ``--batch-size`` still work); ``--out``
is checked before the work starts. Bad input prints ``error: ...`` and exits with status 2
(:func:`multimodal.cli.errors.guard`); an interrupted ``embed`` is resumed by running the
same command again. torch is imported when a verb runs, not for ``--help``.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import Any

from multimodal.cli.flags import (
    VerbParser,
    add_alias,
    check_out,
    model_path,
    parse,
    parse_labels,
)
from multimodal.moved import REMOVED_IN

__all__ = ["caption_main", "embed_main", "speak_main", "transcribe_main", "zero_shot_main"]


def _common(parser: argparse.ArgumentParser, batch_size: int) -> None:
    parser.add_argument("--inputs", required=True,
                        help="a folder (searched recursively) or a manifest (.csv / .jsonl "
                             "with a 'path' or 'text' column, or .txt: one text per line)")
    parser.add_argument("--batch_size", type=int, default=batch_size)
    parser.add_argument("--device", default=None,
                        help="cpu, cuda, cuda:1, ... (default: cuda when available)")
    parser.add_argument("--skip_corrupt", action="store_true",
                        help="leave unreadable inputs out (listed at the end) instead of "
                             "stopping with an error")
    add_alias(parser, "--batch-size", "--batch_size")
    add_alias(parser, "--skip-corrupt", "--skip_corrupt")


def _device(name: str | None) -> Any:
    import torch

    return torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))


def _floats(text: str | None) -> list[float] | None:
    return None if text is None else [float(v) for v in text.split(",")]


def embed_main(args: list[str]) -> int:
    """``multimodal embed``."""
    parser = VerbParser(
        prog="multimodal embed",
        description="One embedding per input (images, audio clips or texts) with an encoder "
                    "folder or checkpoint; writes them with the input ids. Run the same "
                    "command again to resume an interrupted run.")
    parser.add_argument("--model", required=True,
                        help="Hugging Face folder, save_pretrained folder, task .ckpt, or "
                             "an installed model's name (multimodal models)")
    parser.add_argument("--out", required=True, help="output file, .safetensors or .npy")
    _common(parser, 32)
    ns = parse(parser, args)
    check_out(ns.out, (".safetensors", ".npy"))
    ns.model = model_path(ns.model)  # after the cheap checks, before loading
    from multimodal.pipelines._loaders import model_encoder
    from multimodal.pipelines.embed import embed

    encoder = model_encoder(ns.model)
    encoder.to(_device(ns.device))
    ids, emb = embed(encoder, ns.inputs, ns.out, batch_size=ns.batch_size,
                     skip_corrupt=ns.skip_corrupt, model_name=str(ns.model))
    print(f"wrote {len(ids)} embeddings of {emb.shape[1]} dims to {ns.out}")
    return 0


def zero_shot_main(args: list[str]) -> int:
    """``multimodal zero-shot``."""
    parser = VerbParser(
        prog="multimodal zero-shot",
        description="Classify a folder of images by label names with a CLIP / SigLIP model; "
                    "prints file, label, probability.")
    parser.add_argument("--model", required=True,
                        help="CLIP / SigLIP folder or .ckpt (or an installed name)")
    parser.add_argument("--labels", required=True, help='comma-separated: "cat,dog,bird"')
    parser.add_argument("--templates", nargs="+", default=None,
                        help="prompt templates with {} for the label (their embeddings are "
                             "averaged); default: 'a photo of a {}.'")
    parser.add_argument("--activation", choices=("softmax", "sigmoid"), default=None,
                        help="default: softmax over the labels for CLIP, each label's sigmoid "
                             "for SigLIP")
    parser.add_argument("--out", default=None,
                        help="CSV file: file, label, probability and one column per label")
    _common(parser, 32)
    ns = parse(parser, args)
    labels = parse_labels(ns.labels)
    check_out(ns.out, (".csv",))
    ns.model = model_path(ns.model)  # after the cheap checks, before loading
    from multimodal.pipelines._loaders import model_encoder
    from multimodal.pipelines.zero_shot import DEFAULT_TEMPLATES, zero_shot

    encoder = model_encoder(ns.model)
    encoder.to(_device(ns.device))
    rows = zero_shot(encoder, ns.inputs, labels, ns.templates or DEFAULT_TEMPLATES,
                     batch_size=ns.batch_size,
                     skip_corrupt=ns.skip_corrupt, activation=ns.activation)
    for row in rows:
        print(f"{row.id}\t{row.label}\t{row.probability:.4f}")
    if ns.out:
        out = Path(ns.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["file", "label", "probability", *labels])
            for row in rows:
                writer.writerow([row.id, row.label, f"{row.probability:.6f}",
                                 *(f"{p:.6f}" for p in row.probabilities)])
        print(f"wrote {len(rows)} rows to {out}", file=sys.stderr)
    return 0


def caption_main(args: list[str]) -> int:
    """``multimodal caption``."""
    parser = VerbParser(
        prog="multimodal caption",
        description="Caption a folder of images with a captioner checkpoint or a "
                    "VisionEncoderDecoder folder; prints file and caption.")
    parser.add_argument("--model", required=True,
                        help="CaptioningTask .ckpt, or a folder (VisionEncoderDecoder layout "
                             "or save_pretrained) with tokenizer.json")
    parser.add_argument("--out", default=None, help="CSV file: file, caption")
    parser.add_argument("--max_new_tokens", type=int, default=None)
    parser.add_argument("--num_beams", type=int, default=1)
    parser.add_argument("--image_size", type=int, default=None,
                        help="override the model's image size")
    parser.add_argument("--mean", default=None, help="override the normalisation: r,g,b")
    parser.add_argument("--std", default=None, help="override the normalisation: r,g,b")
    _common(parser, 16)
    add_alias(parser, "--num-beams", "--num_beams")
    add_alias(parser, "--max-new-tokens", "--max_new_tokens")
    add_alias(parser, "--image-size", "--image_size")
    ns = parse(parser, args)
    check_out(ns.out, (".csv",))
    ns.model = model_path(ns.model)  # after the cheap checks, before loading
    from multimodal.pipelines._loaders import captioner
    from multimodal.pipelines.caption import CaptionerBundle, caption

    bundle = CaptionerBundle(*captioner(ns.model, image_size=ns.image_size,
                                        mean=_floats(ns.mean), std=_floats(ns.std)))
    bundle.model.to(_device(ns.device))
    rows = caption(bundle, ns.inputs, batch_size=ns.batch_size, skip_corrupt=ns.skip_corrupt,
                   max_new_tokens=ns.max_new_tokens, num_beams=ns.num_beams)
    for name, text in rows:
        print(f"{name}\t{text}")
    if ns.out:
        out = Path(ns.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["file", "caption"])
            writer.writerows(rows)
        print(f"wrote {len(rows)} captions to {out}", file=sys.stderr)
    return 0


def transcribe_main(args: list[str]) -> int:
    """``multimodal transcribe``: one line per file (``file<TAB>text``), optionally
    ``--out`` CSV / JSONL (:func:`multimodal.pipelines.transcribe.transcribe`)."""
    parser = VerbParser(
        prog="multimodal transcribe",
        description="Transcribe speech files with a Whisper model (a CTranslate2 Whisper "
                    "directory, a WhisperForConditionalGeneration folder or a saved Whisper).")
    parser.add_argument("--model", required=True,
                        help="Whisper directory, or an installed model's name "
                             "(whisper-tiny.en, whisper-base: multimodal models)")
    parser.add_argument("--inputs", required=True, nargs="+",
                        help="audio files and / or folders of audio files")
    parser.add_argument("--out", default=None, help="results file, .csv or .jsonl")
    parser.add_argument("--language", default=None,
                        help="language code (multilingual models; default: detected)")
    parser.add_argument("--task", default="transcribe", choices=["transcribe", "translate"])
    parser.add_argument("--num_beams", type=int, default=1, help="1: greedy")
    parser.add_argument("--batch_size", type=int, default=4, help="30 s windows per batch")
    parser.add_argument("--resample", action="store_true",
                        help="no longer needed (removed in 0.2): files not at 16 kHz are always "
                             "resampled (one note line says which)")
    parser.add_argument("--bf16", action="store_true",
                        help="run the layers in bfloat16 (CPUs with native bf16)")
    parser.add_argument("--compile", action="store_true",
                        help="decode through a static KV cache with a step compiled by "
                             "torch.compile (compiles once, then faster per token)")
    parser.add_argument("--quantize", default=None, choices=["int8", "int4"],
                        help="weight-only quantised decoder (packed CPU kernels)")
    parser.add_argument("--mix", action="store_true",
                        help="no longer needed (removed in 0.2): the channels of a multi-channel "
                             "file are always averaged")
    add_alias(parser, "--num-beams", "--num_beams")
    add_alias(parser, "--batch-size", "--batch_size")
    ns = parse(parser, args)
    for flag in ("resample", "mix"):  # what they asked for is always done now
        if getattr(ns, flag):
            print(f"note: --{flag} is no longer needed (removed in {REMOVED_IN}): every file "
                  "is read as 16 kHz mono", file=sys.stderr)
    check_out(ns.out, (".csv", ".jsonl"))
    ns.model = model_path(ns.model)  # after the cheap checks, before loading
    import torch

    from multimodal.pipelines.transcribe import transcribe, write_transcripts

    results = transcribe(ns.model, ns.inputs, language=ns.language, task=ns.task,
                         num_beams=ns.num_beams, batch_size=ns.batch_size,
                         resample=True, mix=True,  # one rule for every verb
                         compute_dtype=torch.bfloat16 if ns.bf16 else None,
                         compile=ns.compile, quantize=ns.quantize)
    for r in results:
        print(f"{r.file}\t{r.text}")
    if ns.out:
        print(f"wrote {write_transcripts(results, ns.out)}", file=sys.stderr)
    return 0


def speak_main(args: list[str]) -> int:
    """``multimodal speak``: text-to-speech with a TTSTask checkpoint
    (:func:`multimodal.pipelines.speak.synthesize`); writes a mono WAV."""
    parser = VerbParser(
        prog="multimodal speak",
        description="Speak TEXT in the voice of PROMPT (a few seconds of speech) with a "
                    "text-to-speech checkpoint (configs/tts_voices.yaml); writes a WAV.")
    parser.add_argument("--model", required=True, help="TTSTask checkpoint (.ckpt)")
    parser.add_argument("--text", required=True, help="what to say")
    parser.add_argument("--prompt", required=True,
                        help="audio file of the voice to imitate (any rate, mono or stereo)")
    parser.add_argument("--out", required=True, help="WAV file to write")
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="AR sampling temperature (0: greedy)")
    parser.add_argument("--top_k", type=int, default=5, help="0: no top-k")
    parser.add_argument("--top_p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    add_alias(parser, "--ckpt", "--model")
    add_alias(parser, "--top-k", "--top_k")
    add_alias(parser, "--top-p", "--top_p")
    ns = parse(parser, args)
    out = check_out(ns.out, (".wav",))
    ns.model = model_path(ns.model)  # after the cheap checks, before loading
    import soundfile as sf

    from multimodal.pipelines.speak import synthesize

    wave, rate = synthesize(ns.model, ns.text, ns.prompt, temperature=ns.temperature,
                            top_k=ns.top_k or None, top_p=ns.top_p, seed=ns.seed)
    assert out is not None
    out.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(out), wave.numpy(), rate)
    print(f"wrote {out} ({wave.numel() / rate:.2f} s at {rate} Hz)")
    return 0
