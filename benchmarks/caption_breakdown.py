"""Where does a scene captioner go wrong? Per-object accuracy on seen vs held-out pairs.

Loads a CaptioningTask checkpoint trained on procedural scenes, captions a split greedily
and prints: scene match (``caption_matches_scene``), exact match, the accuracy of each
named object (size, colour and shape at its place in the caption) split by whether its
(colour, shape) pair was held out of training and by the number of shapes in the scene,
and the most frequent confusions (true pair -> named pair).

Run:
    PYTHONPATH=. python benchmarks/caption_breakdown.py \\
        runs/caption_scenes/version_0/checkpoints/last.ckpt
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch

from multimodal.data.captions import CaptionDataModule
from multimodal.data.sources.scenes import caption_matches_scene, parse_caption
from multimodal.loading import load
from multimodal.models.captioner import decode_captions


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--split", default="test", choices=("val", "test"))
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    loaded = load(args.checkpoint)  # a CaptioningTask checkpoint: model, tokenizer, data
    model, tokenizer = loaded.model, loaded.tokenizer
    dm = CaptionDataModule(**loaded.data_arguments)
    if dm.dataset != "scenes":
        raise SystemExit(f"{args.checkpoint} was trained on {dm.dataset!r}, not on scenes")
    dm.setup()
    dataset, scenes = dm.split_dataset(args.split), dm.scenes(args.split)
    held = set(dm.scene_config().holdout)

    preds: list[str] = []
    for start in range(0, len(dataset), args.batch_size):
        stop = min(start + args.batch_size, len(dataset))
        images = torch.stack([dataset[i][0] for i in range(start, stop)])
        preds += decode_captions(model.generate(images), tokenizer, model.config.eos_token_id)

    right, total, confusions = Counter(), Counter(), Counter()
    for pred, scene in zip(preds, scenes, strict=True):
        try:
            named = parse_caption(pred).objects
        except ValueError:
            named = ()
        for k, shape in enumerate(scene.shapes):
            pair = (shape.colour, shape.shape)
            key = ("held-out" if pair in held else "seen", len(scene.shapes))
            total[key] += 1
            if k < len(named) and named[k] == (shape.size, shape.colour, shape.shape):
                right[key] += 1
            elif k < len(named):
                confusions[(" ".join(pair), " ".join(named[k][1:]))] += 1

    n = len(scenes)
    refs = [tokenizer.normalize(s.caption) for s in scenes]
    print(f"{args.split}: {n} scenes")
    print(f"scene match {sum(map(caption_matches_scene, preds, scenes)) / n:.3f}, "
          f"exact match {sum(p == r for p, r in zip(preds, refs, strict=True)) / n:.3f}")
    print("| object's pair | shapes in scene | objects named right |")
    print("| --- | ---: | ---: |")
    for key in sorted(total):
        print(f"| {key[0]} | {key[1]} | {right[key]}/{total[key]} = "
              f"{right[key] / total[key]:.2f} |")
    print("most frequent confusions (true -> named):",
          ", ".join(f"{a} -> {b} ({c})" for (a, b), c in confusions.most_common(8)))


if __name__ == "__main__":
    main()
