"""A classifier trained from a folder of RGBA images: the Twitter emoji by Unicode category
(issue: your own data, "proof on real data"). Reports held-out test accuracy against chance.

    bash data/get_folders.sh /tmp/folders   # OUT/emoji_png/<category>/<emoji>.png, 64x64 RGBA
    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/emoji_folder_accuracy.py \
        --folder /tmp/folders/emoji_png --epochs 30

The data come through ``ImageClassificationDataModule(train=<folder>, in_channels=4)``: the
four channels are kept (alpha carries the shape), images are resized to ``--image-size``,
and 20 % / 10 % of the files are held out (seeded) for test / validation. No horizontal
flips: they would mirror text and flags. Reported: accuracy (share of test images right) and
the task's ``test/acc`` (torchmetrics' default macro average: mean per-class recall, chance
1 / classes); chance for the first is the share of the largest class in the test split
(always answering it).
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", required=True)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import lightning as L
    import torch

    import multimodal as mm
    from multimodal.data.vision import ImageClassificationDataModule
    from multimodal.tasks import ClassificationTask

    L.seed_everything(args.seed)
    dm = ImageClassificationDataModule(
        train=args.folder, in_channels=4, image_size=args.image_size, batch_size=64,
        val_size=0.1, test_size=0.2, augment=True, flip=False, random_resized_crop=0.6,
        seed=args.seed)
    dm.setup("fit")
    vit = mm.ViT(mm.ViTConfig(image_size=args.image_size, patch_size=4, in_channels=4,
                              num_classes=dm.num_classes, dim=96, depth=4, heads=4,
                              mlp_dim=192, pool="mean"))
    task = ClassificationTask(vit, optimizer={"lr": 2e-3, "weight_decay": 0.05},
                              label_smoothing=0.1)
    trainer = L.Trainer(accelerator="cpu", max_epochs=args.epochs, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir="/tmp/mm_emoji_folder")
    start = time.perf_counter()
    trainer.fit(task, dm)
    seconds = time.perf_counter() - start
    test = trainer.test(task, dm, verbose=False)[0]
    labels = dm._load_file_splits()["test"].labels
    counts = torch.bincount(labels, minlength=dm.num_classes)
    vit.eval()
    with torch.no_grad():
        right = sum(int((vit(x).argmax(-1) == y).sum()) for x, y in dm.test_dataloader())
    print(json.dumps({
        "classes": dm.class_names, "train": len(dm.split_dataset("train")),
        "val": len(dm.split_dataset("val")), "test": len(labels), "epochs": args.epochs,
        "test_acc": round(right / len(labels), 4),
        "test_acc_macro": round(test["test/acc"], 4),  # the task's metric: mean class recall
        "chance_uniform": round(1 / dm.num_classes, 4),
        "chance_majority": round(int(counts.max()) / len(labels), 4),
        "fit_seconds": round(seconds)}))


if __name__ == "__main__":
    main()
