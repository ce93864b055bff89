"""Write built-in image datasets out as class-per-subfolder PNG trees (ImageFolder layout),
to prove the own-data path on real files.

    python data/make_image_folders.py fashion_mnist data/cache/fashion_mnist_png
        -> OUT/train/<k>_<class>/<n>.png (60000) and OUT/test/<k>_<class>/<n>.png (10000);
           the index prefix keeps the folder sort order equal to the label order.
    python data/make_image_folders.py emoji data/cache/emoji_png
        -> OUT/<category>/<image>.png: the 64x64 RGBA Twitter emoji (data/get_emoji.sh),
           one folder per Unicode category (Component skipped).

Idempotent: a tree whose marker file OUT/.complete exists is left as it is.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def fashion_mnist(out: Path) -> None:
    from torchvision.io import write_png

    from multimodal.data.sources.fashion_mnist import FASHION_MNIST_CLASSES, load_fashion_mnist

    folders = [f"{k}_{name.replace('/', '_')}" for k, name in enumerate(FASHION_MNIST_CLASSES)]
    for split in ("train", "test"):
        data = load_fashion_mnist(split=split)
        for folder in folders:
            (out / split / folder).mkdir(parents=True, exist_ok=True)
        for n, (image, label) in enumerate(zip(data.images, data.labels.tolist(), strict=True)):
            write_png(image.unsqueeze(0), str(out / split / folders[label] / f"{n:05d}.png"))
        print(f"{split}: {len(data)} PNGs in {out / split}")


def emoji(out: Path) -> None:
    from multimodal.data.sources.emoji import load_emoji_records

    records = load_emoji_records()
    for r in records:
        folder = out / r.category
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(r.path, folder / r.path.name)
    print(f"{len(records)} emoji in {len({r.category for r in records})} category folders")


def main(argv: list[str]) -> None:
    if len(argv) != 2 or argv[0] not in ("fashion_mnist", "emoji"):
        raise SystemExit("usage: python data/make_image_folders.py fashion_mnist|emoji OUT")
    out = Path(argv[1])
    if (out / ".complete").exists():
        print(f"{out} already complete")
        return
    {"fashion_mnist": fashion_mnist, "emoji": emoji}[argv[0]](out)
    (out / ".complete").touch()


if __name__ == "__main__":
    main(sys.argv[1:])
