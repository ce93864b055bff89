"""Text->image (and image->text) retrieval of held-out emoji with a CLIP trained by
configs/clip_emoji.yaml, against chance.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/clip_emoji.py \
        runs/clip_emoji/version_0/checkpoints/last.ckpt

Each test caption ("an emoji of a red apple") ranks every test emoji picture (emoji never
seen in training); recall@k is the share whose own picture is among the top k (a
picture with an identical caption also counts). Chance recall@k = k / number of test emoji.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from clip_scenes import duplicates, load

from multimodal.data.captions import CaptionDataModule
from multimodal.models.clip import tokenize_texts
from multimodal.tasks.contrastive import recall_at_k


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--split", default="test")
    args = parser.parse_args()
    model, tok, dm_args = load(args.checkpoint)
    dm = CaptionDataModule(**dm_args)
    dm.setup("test")
    data = dm.split_dataset(args.split)
    images = torch.stack([data[i][0] for i in range(len(data))])
    captions = dm.captions(args.split)
    with torch.no_grad():
        sim = model.encode_image(images) @ model.encode_text(
            **tokenize_texts(tok, captions, model.config.text_pool)).T
    same = duplicates(captions)
    n = len(captions)
    ks = (1, 5, 10)
    t2i, i2t = recall_at_k(sim.T, same, ks), recall_at_k(sim, same, ks)
    print(f"{n} held-out {args.split} emoji ({len(set(captions))} distinct captions)")
    print("| k | text->image R@k | image->text R@k | chance k/N |")
    print("|---|---|---|---|")
    for k in ks:
        print(f"| {k} | {t2i[k]:.3f} | {i2t[k]:.3f} | {k / n:.3f} |")
    for i in range(5):
        top = sim[:, i].argsort(descending=True)[:3].tolist()
        print(f"{captions[i]!r}: top images of {[captions[j] for j in top]}")


if __name__ == "__main__":
    main()
