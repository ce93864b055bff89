"""``multimodal-prepare``: convert your own data into LitData streaming shards, once.

    multimodal-prepare images   ROOT OUT [--image-size 256] [--val VAL] [--test TEST]
                                [--val-size 0.1] [--test-size 0.2]
    multimodal-prepare audio    ROOT OUT [--val VAL] [--test TEST] [--val-size 0.1]
                                [--test-size 0.2] [--skip-corrupt]
    multimodal-prepare captions MANIFEST OUT [--image-size 64] [--image-root DIR]
                                [--val VAL] [--test TEST] [--val-size 0.1] [--test-size 0.1]
    multimodal-prepare text     SOURCE OUT [--block-size 128] [--vocab-size 8000]
                                [--tokenizer tok.json] [--val VAL] [--test TEST]
    multimodal-prepare labelled-text SOURCE OUT [--tokenizer tok.json|FOLDER]
                                [--max-length 128] [--vocab-size 8000] [--classes a,b]
                                [--val VAL] [--test TEST] [--val-size 0.1] [--test-size 0.1]
    multimodal-prepare text-pairs SOURCE OUT [--tokenizer tok.json|FOLDER]
                                [--max-source-len 64] [--max-target-len 64]
                                [--vocab-size 8000] [--val VAL] [--test TEST]
    (every kind: [--seed 0] [--workers 1])

The source is what the task's DataModule reads as ``train`` (a class-per-subfolder folder or
``path,label`` manifest; an ``image,caption`` manifest or COCO-captions JSON; ``.txt`` /
JSONL text; a ``text,label`` CSV / JSONL or a folder of class subfolders of ``.txt``; a
``source<TAB>target`` TSV or a ``source,target`` CSV / JSONL) and the splits are made
exactly as that DataModule makes them (given, or seeded held-out fractions with its
defaults). They are written to ``OUT/train``, ``OUT/val``,
``OUT/test`` (OUT a folder or an object-store URL); images and audio stay encoded, text is
stored as token ids (language modelling: blocks) of the given ``--tokenizer`` (a Hugging Face
or own ``tokenizer.json``) or of a WordPiece trained on the training split, the tokenizer
written beside (``OUT/tokenizer.json``; pairs: ``OUT/source_tokenizer.json`` and
``OUT/target_tokenizer.json``) and its special ids in ``OUT/multimodal.json``. Train from
them with ``--data.init_args.shards OUT``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from multimodal.data.shards import write_image_shards, write_shards
from multimodal.data.text_tokenizer import specials_to_dict
from multimodal.tokenizers.io import tokenizer_file, tokenizer_to_json


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="multimodal-prepare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    kinds = parser.add_subparsers(dest="kind", required=True)

    def kind(name: str, help: str, source: str, val: float, test: float):
        p = kinds.add_parser(name, help=help)
        p.add_argument("root", help=source)
        p.add_argument("out", help="output folder or object-store URL")
        p.add_argument("--val", default=None, help="validation source (same kind)")
        p.add_argument("--test", default=None, help="test source (same kind)")
        p.add_argument("--val-size", type=float, default=val,
                       help="fraction (< 1) or count held out for validation")
        p.add_argument("--test-size", type=float, default=test,
                       help="fraction (< 1) or count held out for testing")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--workers", type=int, default=1)
        p.add_argument("--chunk-bytes", default=None,
                       help="size of a shard chunk, e.g. 64MB (default: per split, at least "
                            "64 chunks where the items allow, 64 KB to 64 MB each)")
        return p

    images = kind("images", "image classification: folder or manifest",
                  "class-per-subfolder folder or path,label manifest", 0.1, 0.2)
    images.add_argument("--image-size", type=int, default=None,
                        help="store resized (shorter side) as PNG; default: original bytes")
    audio = kind("audio", "audio classification: folder or manifest (files' bytes kept)",
                 "class-per-subfolder folder or path,label manifest", 0.1, 0.2)
    audio.add_argument("--skip-corrupt", action="store_true",
                       help="leave out unreadable / too short files instead of an error")
    captions = kind("captions", "image-caption pairs: manifest or COCO JSON",
                    "image,caption .csv / .jsonl, or COCO-captions .json", 0.1, 0.1)
    captions.add_argument("--image-size", type=int, default=None,
                          help="store resized (shorter side) as PNG; default: original bytes")
    captions.add_argument("--image-root", default=None,
                          help="folder image paths are relative to (default: the manifest's)")
    text = kind("text", "language modelling: .txt files, folder, glob or JSONL",
                ".txt file, folder of them, glob or JSONL with a text field", 0.05, 0.05)
    text.add_argument("--block-size", type=int, default=128)
    text.add_argument("--vocab-size", type=int, default=8000)
    text.add_argument("--chunk-chars", type=int, default=4000)
    text.add_argument("--cased", action="store_true", help="do not lowercase")
    text.add_argument("--tokenizer", default=None,
                      help="a tokenizer.json to use (default: trained on the training split)")
    labelled = kind("labelled-text", "text classification: text,label CSV / JSONL or a "
                    "folder of class subfolders of .txt",
                    ".csv / .tsv / .jsonl with text and label, or a class-per-subfolder "
                    "folder of .txt files", 0.1, 0.1)
    labelled.add_argument("--max-length", type=int, default=128)
    labelled.add_argument("--classes", default=None,
                          help="class names in index order, comma separated")
    pairs = kind("text-pairs", "sequence to sequence: source/target TSV, CSV or JSONL",
                 "source<TAB>target .tsv, or .csv / .jsonl with source and target", 0.1, 0.1)
    pairs.add_argument("--max-source-len", type=int, default=64)
    pairs.add_argument("--max-target-len", type=int, default=64)
    pairs.add_argument("--separate-vocabularies", action="store_true",
                       help="train one WordPiece per side (default: one shared)")
    labelled.add_argument("--cased", action="store_true", help="do not lowercase (trained "
                          "WordPiece only; as the data module's lowercase: false)")
    pairs.add_argument("--lowercase", action="store_true", help="lowercase (trained "
                       "WordPiece only; as the data module's lowercase: true)")
    for p in (labelled, pairs):
        p.add_argument("--vocab-size", type=int, default=8000)
        p.add_argument("--tokenizer", default=None,
                       help="a tokenizer.json (Hugging Face or own) or a folder holding one "
                            "(default: a WordPiece trained on the training split)")
    return parser


def main(argv: list[str] | None = None) -> dict[str, int]:
    args = _parser().parse_args(argv)
    sizes = {"images": _images, "audio": _audio, "captions": _captions, "text": _text,
             "labelled-text": _labelled_text, "text-pairs": _text_pairs}[args.kind](args)
    print(f"wrote {args.kind} {sizes} to {args.out}")
    return sizes


def _images(args: argparse.Namespace) -> dict[str, int]:
    from multimodal.data.vision import ImageClassificationDataModule

    dm = ImageClassificationDataModule(
        train=args.root, val=args.val, test=args.test, image_size=args.image_size or 1,
        val_size=_size(args.val_size), test_size=_size(args.test_size), seed=args.seed,
    )
    return write_image_shards(dm._load_file_splits(), args.out, args.image_size,
                              num_workers=args.workers, chunk_bytes=args.chunk_bytes)


def _audio(args: argparse.Namespace) -> dict[str, int]:
    from multimodal.data.audio import AudioClassificationDataModule
    from multimodal.data.readers.audio import AudioShardEncoder

    dm = AudioClassificationDataModule(
        train=args.root, val=args.val, test=args.test, val_size=_size(args.val_size),
        test_size=_size(args.test_size), seed=args.seed, skip_corrupt=args.skip_corrupt)
    splits = dm._file_lists()  # header-checked, as the module checks them
    return write_shards("audio", {k: AudioShardEncoder(v) for k, v in splits.items()},
                        args.out, {"classes": dm.class_names}, args.workers,
                        args.chunk_bytes)


def _captions(args: argparse.Namespace) -> dict[str, int]:
    from multimodal.data.captions import CaptionDataModule
    from multimodal.data.readers.captions import CaptionShardEncoder

    dm = CaptionDataModule(train=args.root, val=args.val, test=args.test,
                           image_root=args.image_root, val_size=_size(args.val_size),
                           test_size=_size(args.test_size), seed=args.seed)
    splits = dm.read_file_splits()
    captions = {k: {"captions": list(v.captions), "image_index": v.image_index.tolist()}
                for k, v in splits.items() if len(v)}
    return write_shards("captions",
                        {k: CaptionShardEncoder(v, args.image_size) for k, v in splits.items()},
                        args.out, {"image_size": args.image_size}, args.workers, args.chunk_bytes,
                        sidecars={"captions.json": json.dumps(captions)})


def _text(args: argparse.Namespace) -> dict[str, int]:
    from multimodal.data.text import BlockShardEncoder, TextCorpusDataModule

    with tempfile.TemporaryDirectory() as tmp:
        tok_path = None if args.tokenizer else str(Path(tmp, "tokenizer.json"))
        dm = TextCorpusDataModule(
            train=args.root, val=args.val, test=args.test, block_size=args.block_size,
            vocab_size=args.vocab_size, lowercase=not args.cased,
            val_size=_size(args.val_size), test_size=_size(args.test_size),
            seed=args.seed, chunk_chars=args.chunk_chars, tokenizer_path=tok_path,
            tokenizer=args.tokenizer)
        dm.setup("fit")  # trains (and saves) or loads the tokenizer, packs the blocks
        tokenizer = Path(tok_path or tokenizer_file(args.tokenizer)).read_text(encoding="utf-8")
    encoders = {k: BlockShardEncoder(d.blocks) for k, d in dm.datasets.items()}
    return write_shards("text", encoders, args.out,
                        {"block_size": args.block_size, "vocab_size": dm.vocab_size,
                         "specials": specials_to_dict(dm.specials)},
                        args.workers, args.chunk_bytes,
                        sidecars={"tokenizer.json": tokenizer})


def _labelled_text(args: argparse.Namespace) -> dict[str, int]:
    from multimodal.data.text_classification import (
        SHARD_KIND,
        LabelledShardEncoder,
        TextClassificationDataModule,
    )

    classes = args.classes.split(",") if args.classes else None
    dm = TextClassificationDataModule(
        train=args.root, val=args.val, test=args.test, classes=classes,
        tokenizer=args.tokenizer, vocab_size=args.vocab_size, lowercase=not args.cased,
        max_length=args.max_length, val_size=_size(args.val_size),
        test_size=_size(args.test_size), seed=args.seed)
    splits = dm.encoded_splits()  # read, split, labels checked, tokenizer trained / loaded
    return write_shards(SHARD_KIND, {k: LabelledShardEncoder(*v) for k, v in splits.items()},
                        args.out,
                        {"classes": dm.class_names, "integer_labels": dm._resolved()[1],
                         "max_length": args.max_length, "vocab_size": dm.vocab_size,
                         "specials": specials_to_dict(dm.specials)},
                        args.workers, args.chunk_bytes,
                        sidecars={"tokenizer.json": tokenizer_to_json(dm.tokenizer)})


def _text_pairs(args: argparse.Namespace) -> dict[str, int]:
    from multimodal.data.text_pairs import SHARD_KIND, PairShardEncoder, TextPairsDataModule

    dm = TextPairsDataModule(
        train=args.root, val=args.val, test=args.test, tokenizer=args.tokenizer,
        vocab_size=args.vocab_size, shared_vocabulary=not args.separate_vocabularies,
        lowercase=args.lowercase, max_source_len=args.max_source_len,
        max_target_len=args.max_target_len, val_size=_size(args.val_size),
        test_size=_size(args.test_size), seed=args.seed)
    splits = dm.encoded_splits()
    meta: dict[str, object] = {"max_source_len": args.max_source_len,
                               "max_target_len": args.max_target_len}
    sidecars = {}
    for side in ("source", "target"):
        tok = getattr(dm, f"{side}_tokenizer")
        meta[f"{side}_vocab_size"] = int(tok.vocab_size)
        meta[f"{side}_specials"] = specials_to_dict(dm.specials(side))
        sidecars[f"{side}_tokenizer.json"] = tokenizer_to_json(tok)
    return write_shards(SHARD_KIND, {k: PairShardEncoder(v) for k, v in splits.items()},
                        args.out, meta, args.workers, args.chunk_bytes, sidecars=sidecars)


def _size(value: float) -> int | float:
    return int(value) if value >= 1 else value


if __name__ == "__main__":
    main(sys.argv[1:])
