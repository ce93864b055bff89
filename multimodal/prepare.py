"""``multimodal-prepare``: convert your own data into LitData streaming shards, once.

    multimodal-prepare images ROOT OUT [--image-size 256] [--val VAL] [--test TEST]
                       [--val-size 0.1] [--test-size 0.1] [--seed 0] [--workers 2]

ROOT (and VAL / TEST) is a class-per-subfolder folder or a ``path,label`` manifest; the
splits are made exactly as ``ImageClassificationDataModule`` makes them (given, or seeded
held-out fractions) and written to ``OUT/train``, ``OUT/val``, ``OUT/test`` (OUT a folder or
an object-store URL). Train from them with ``--data.init_args.shards OUT``.
"""

from __future__ import annotations

import argparse
import sys

from multimodal.data.shards import write_image_shards


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="multimodal-prepare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    kinds = parser.add_subparsers(dest="kind", required=True)
    images = kinds.add_parser("images", help="image classification: folder or manifest")
    images.add_argument("root", help="class-per-subfolder folder or path,label manifest")
    images.add_argument("out", help="output folder or object-store URL")
    images.add_argument("--image-size", type=int, default=None,
                        help="store resized (shorter side) as PNG; default: original bytes")
    images.add_argument("--val", default=None, help="validation folder/manifest")
    images.add_argument("--test", default=None, help="test folder/manifest")
    images.add_argument("--val-size", type=float, default=0.1)
    images.add_argument("--test-size", type=float, default=0.1)
    images.add_argument("--seed", type=int, default=0)
    images.add_argument("--workers", type=int, default=1)
    return parser


def main(argv: list[str] | None = None) -> dict[str, int]:
    from multimodal.data.vision import ImageClassificationDataModule

    args = _parser().parse_args(argv)
    dm = ImageClassificationDataModule(
        train=args.root, val=args.val, test=args.test, image_size=args.image_size or 1,
        val_size=_size(args.val_size), test_size=_size(args.test_size), seed=args.seed,
    )
    splits = dm._load_file_splits()
    sizes = write_image_shards(splits, args.out, args.image_size, num_workers=args.workers)
    print(f"wrote {sizes} ({len(dm.class_names)} classes) to {args.out}")
    return sizes


def _size(value: float) -> int | float:
    return int(value) if value >= 1 else value


if __name__ == "__main__":
    main(sys.argv[1:])
