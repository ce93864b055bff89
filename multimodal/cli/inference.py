"""The ``multimodal embed`` / ``zero-shot`` / ``caption`` verbs: argument parsing and output
for the loops of :mod:`multimodal.inference`.

    multimodal embed     --model FOLDER|CKPT --inputs DIR|MANIFEST --out emb.safetensors
    multimodal zero-shot --model CLIP_FOLDER --labels "cat,dog" --inputs DIR [--out p.csv]
    multimodal caption   --model CKPT|FOLDER --inputs DIR [--out captions.csv]

Each takes ``--batch_size``, ``--device`` and ``--skip_corrupt`` (leave unreadable inputs
out and list them at the end, instead of stopping at the first with an error naming it).
Bad input prints ``error: ...`` and exits with status 2; an interrupted ``embed`` is
resumed by running the same command again.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Callable
from pathlib import Path

import torch

__all__ = ["VERBS", "run_verb"]


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


def _device(name: str | None) -> torch.device:
    return torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))


def _floats(text: str | None) -> list[float] | None:
    return None if text is None else [float(v) for v in text.split(",")]


def embed_main(args: list[str]) -> int:
    from multimodal.inference import embed, load_model_encoder

    parser = argparse.ArgumentParser(
        prog="multimodal embed",
        description="One embedding per input (images, audio clips or texts) with an encoder "
                    "folder or checkpoint; writes them with the input ids. Run the same "
                    "command again to resume an interrupted run.")
    parser.add_argument("--model", required=True,
                        help="Hugging Face folder, save_pretrained folder or task .ckpt")
    parser.add_argument("--out", required=True, help="output file, .safetensors or .npy")
    _common(parser, 32)
    ns = parser.parse_args(args)
    encoder = load_model_encoder(ns.model)
    encoder.to(_device(ns.device))
    ids, emb = embed(encoder, ns.inputs, ns.out, batch_size=ns.batch_size,
                     skip_corrupt=ns.skip_corrupt, model_name=str(ns.model))
    print(f"wrote {len(ids)} embeddings of {emb.shape[1]} dims to {ns.out}")
    return 0


def zero_shot_main(args: list[str]) -> int:
    from multimodal.inference import DEFAULT_TEMPLATES, load_model_encoder, zero_shot

    parser = argparse.ArgumentParser(
        prog="multimodal zero-shot",
        description="Classify a folder of images by label names with a CLIP / SigLIP model; "
                    "prints file, label, probability.")
    parser.add_argument("--model", required=True, help="CLIP / SigLIP folder or .ckpt")
    parser.add_argument("--labels", required=True, help='comma-separated: "cat,dog,bird"')
    parser.add_argument("--templates", nargs="+", default=list(DEFAULT_TEMPLATES),
                        help="prompt templates with {} for the label (their embeddings are "
                             "averaged); default: 'a photo of a {}.'")
    parser.add_argument("--activation", choices=("softmax", "sigmoid"), default=None,
                        help="default: softmax over the labels for CLIP, each label's sigmoid "
                             "for SigLIP")
    parser.add_argument("--out", default=None,
                        help="CSV file: file, label, probability and one column per label")
    _common(parser, 32)
    ns = parser.parse_args(args)
    labels = [x.strip() for x in ns.labels.split(",") if x.strip()]
    encoder = load_model_encoder(ns.model)
    encoder.to(_device(ns.device))
    rows = zero_shot(encoder, ns.inputs, labels, ns.templates, batch_size=ns.batch_size,
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
    from multimodal.inference import caption, load_captioner

    parser = argparse.ArgumentParser(
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
    ns = parser.parse_args(args)
    bundle = load_captioner(ns.model, image_size=ns.image_size, mean=_floats(ns.mean),
                            std=_floats(ns.std))
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


VERBS: dict[str, Callable[[list[str]], int]] = {
    "embed": embed_main, "zero-shot": zero_shot_main, "caption": caption_main}


def run_verb(verb: str, args: list[str]) -> int:
    """Run one inference verb; bad input prints ``error: ...`` and returns 2."""
    try:
        return VERBS[verb](args)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        again = " (run the same command again to resume)" if verb == "embed" else ""
        print(f"interrupted{again}", file=sys.stderr)
        return 130
