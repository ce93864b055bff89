"""The ``multimodal`` command: LightningCLI over every task and data module.

    multimodal fit      --config configs/vit_fashion_mnist.yaml [--trainer.max_epochs 3 ...]
    multimodal validate --config ... --ckpt_path best
    multimodal test     --config ... --ckpt_path last
    multimodal predict  --config ... --ckpt_path best --data.predict_dir my_images/

Every value of the YAML can be overridden on the command line. ``fit`` resumes an
interrupted run with ``--ckpt_path last`` and, unless ``--test_after_fit false``,
tests the best checkpoint when training ends. When standard output is not a terminal
(a log file, a batch job) every validation also prints one plain line of metrics.
"""

from __future__ import annotations

import os
import sys

import lightning as L
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from multimodal.callbacks import EpochSummary


class MultimodalCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument("--test_after_fit", type=bool, default=True,
                            help="after fit, run test on the best checkpoint")

    def after_fit(self) -> None:
        if not self.config.fit.get("test_after_fit", True) or self.trainer.fast_dev_run:
            return
        has_test = type(self.datamodule).test_dataloader is not L.LightningDataModule \
            .test_dataloader
        if has_test:
            best = getattr(self.trainer.checkpoint_callback, "best_model_path", "")
            self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=best or None)


def main(args: list[str] | None = None) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    MultimodalCLI(
        L.LightningModule,
        L.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_kwargs={"overwrite": True},
        trainer_defaults={"callbacks": [EpochSummary()]},  # plain lines when not a terminal
        args=args,
        auto_configure_optimizers=False,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
