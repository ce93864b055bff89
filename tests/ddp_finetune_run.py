"""One run of tests/tasks/test_pretrained_ddp.py: 2 CPU processes (gloo, Lightning's ``ddp``
launcher re-runs this script for rank 1) fine-tune a Hugging Face ViT folder on a folder of
images. Each process builds its own task from the folder; the new head is drawn in the
task's ``setup`` from the data's class count. Every rank writes its weights right after
``setup`` (before DDP broadcasts anything) and after training.

    python -m tests.ddp_finetune_run VIT_FOLDER IMAGES_FOLDER OUT_FOLDER

(as a module: run by path, the script's folder ``tests/`` would come first on ``sys.path``
and its ``tokenizers`` test package would shadow the Hugging Face ``tokenizers``; Lightning
relaunches a ``-m`` run for rank 1 with ``-m`` too)
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning as L
import torch

from multimodal.data.vision import ImageClassificationDataModule
from multimodal.tasks import ClassificationTask


def _save(task: ClassificationTask, file: Path) -> None:
    torch.save({k: v.detach().cpu().clone() for k, v in task.model.state_dict().items()}, file)


class Recording(ClassificationTask):
    out: Path

    def setup(self, stage: str) -> None:
        super().setup(stage)
        _save(self, self.out / f"start{self.global_rank}.pt")

    def on_train_end(self) -> None:
        _save(self, self.out / f"end{self.global_rank}.pt")


def main(vit: str, images: str, out: str) -> None:
    L.seed_everything(int(torch.randint(0, 10_000, ()).item()))  # ranks differ on purpose
    Recording.out = Path(out)
    task = Recording(pretrained=vit, optimizer={"lr": 1e-2}, finetune={"layer_decay": 0.8})
    dm = ImageClassificationDataModule(train=images, image_size=32, mean=0.5, std=0.25,
                                       batch_size=4, val_size=2, test_size=2, augment=False)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=3,
                        limit_val_batches=0, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=out)
    trainer.fit(task, dm)


if __name__ == "__main__":
    main(*sys.argv[1:4])
