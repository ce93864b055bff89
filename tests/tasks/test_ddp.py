"""Data-parallel training: 2 CPU processes (gloo) train one tiny ViT on the 8x8 digits.

DDP all-reduces the gradients, so after training every replica must hold bit-identical
weights, and those must have moved from the initial ones. Each rank writes its
state_dict (and the indices of the samples it saw) in ``on_train_end``.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch

import multimodal as mm
from multimodal.data.vision import ImageClassificationDataModule
from multimodal.tasks import ClassificationTask

DIGITS_VIT = dict(image_size=8, patch_size=2, in_channels=1, num_classes=10, dim=32, depth=2,
                  heads=4, mlp_dim=64, pool="mean")


class SaveReplica(L.Callback):
    """Writes ``rank{r}.pt`` = {"state": model state_dict, "seen": sample count} per rank."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.seen = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.seen += int(batch[1].shape[0])

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        state = {k: v.detach().cpu().clone() for k, v in pl_module.model.state_dict().items()}
        torch.save({"state": state, "seen": self.seen, "world": trainer.world_size},
                   Path(self.folder) / f"rank{trainer.global_rank}.pt")


@pytest.mark.slow
def test_ddp_replicas_stay_identical(tmp_path):
    L.seed_everything(0)
    task = ClassificationTask(mm.ViT(mm.ViTConfig(**DIGITS_VIT)), optimizer={"lr": 3e-3})
    initial = {k: v.clone() for k, v in task.model.state_dict().items()}
    dm = ImageClassificationDataModule("digits", batch_size=32, val_size=0.1, augment=False)
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp_spawn", max_epochs=1, limit_train_batches=8,
        limit_val_batches=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
        callbacks=[SaveReplica(str(tmp_path))],
    )
    trainer.fit(task, dm)

    r0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    assert r0["world"] == r1["world"] == 2
    assert r0["seen"] == r1["seen"] == 8 * 32  # each rank its own 8 batches
    assert r0["state"].keys() == initial.keys()
    for k in initial:
        assert torch.equal(r0["state"][k], r1["state"][k]), f"replicas differ at {k}"
    moved = [k for k in initial if not torch.equal(r0["state"][k], initial[k])]
    assert len(moved) > len(initial) // 2, moved


def _load_yaml(name: str) -> dict:
    import yaml

    return yaml.safe_load((Path(__file__).parents[2] / "configs" / name).read_text())


def test_ddp_config_is_the_main_job_data_parallel():
    main, ddp = _load_yaml("vit_fashion_mnist.yaml"), _load_yaml("vit_fashion_mnist_ddp.yaml")
    assert ddp["model"] == main["model"]
    assert ddp["trainer"]["strategy"] == "ddp"
    devices = ddp["trainer"]["devices"] * ddp["trainer"]["num_nodes"]
    # batch_size is per process: the global batch (hence lr and schedule) stays the same
    assert ddp["data"]["init_args"]["batch_size"] * devices \
        == main["data"]["init_args"]["batch_size"]
    # the same images (size, augmentation, split) and the same number of epochs
    other = {k: v for k, v in ddp["data"]["init_args"].items() if k != "batch_size"}
    assert other == {k: v for k, v in main["data"]["init_args"].items() if k != "batch_size"}
    assert ddp["trainer"]["max_epochs"] == main["trainer"]["max_epochs"]


def test_fsdp_config_wraps_and_checkpoints_each_block():
    from lightning.pytorch.cli import LightningArgumentParser
    from lightning.pytorch.strategies import FSDPStrategy, Strategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from multimodal.nn.block import Block
    from multimodal.tasks.presets import preset_config

    cfg = _load_yaml("vit_base_fsdp.yaml")
    assert cfg["trainer"]["precision"] == "bf16-mixed"
    args, data = cfg["model"]["init_args"], cfg["data"]["init_args"]
    _, vit = preset_config(args["preset"], args.get("overrides"),
                           {"image_size": data["image_size"], "in_channels": 1})
    mlp = vit.mlp_dim or 4 * vit.dim  # unset: the usual 4 x width
    assert (vit.image_size, vit.patch_size, vit.dim, vit.depth, vit.heads, mlp) \
        == (224, 16, 768, 12, 12, 3072)  # ViT-B/16
    parser = LightningArgumentParser()
    parser.add_argument("--strategy", type=Strategy)
    strategy = parser.instantiate(parser.parse_object({"strategy": cfg["trainer"]["strategy"]}))
    strategy = strategy.strategy
    assert isinstance(strategy, FSDPStrategy)
    for policy in (strategy.kwargs["auto_wrap_policy"],
                   strategy._activation_checkpointing_kwargs["auto_wrap_policy"]):
        assert isinstance(policy, ModuleWrapPolicy)
        assert set(policy._module_classes) == {Block}
