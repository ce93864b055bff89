"""Fine-tuning regimes (``finetune:`` keys of every task): frozen weights stay bit-identical
through training, each parameter group's learning rate is the layer-decay formula (and
timm's ``param_groups_layer_decay`` gives the same scales), LoRA merged = unmerged."""

from __future__ import annotations

import re
from collections import Counter

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import multimodal as mm
from multimodal.tasks import ClassificationTask
from multimodal.tasks.optim import param_groups
from multimodal.tasks.pretrained import HEAD_MODULES

VIT = dict(image_size=16, patch_size=8, in_channels=3, num_classes=3, dim=32, depth=3, heads=2,
           mlp_dim=64)


def _vit() -> mm.ViT:
    torch.manual_seed(0)
    return mm.ViT(mm.ViTConfig(**VIT))


def _fit(task, tmp_path, steps=4) -> L.Trainer:
    torch.manual_seed(1)
    data = TensorDataset(torch.randn(32, 3, 16, 16), torch.randint(0, 3, (32,)))
    trainer = L.Trainer(accelerator="cpu", max_steps=steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(task, DataLoader(data, batch_size=8))
    return trainer


def _snapshot(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _layer(name: str, depth: int) -> int:
    """The layer id by BEiT's rule (timm's grouping: the final norm with the last block),
    written out for ViT's names."""
    if name in ("cls_token", "pos_embed") or name.startswith("patch_embed."):
        return 0
    m = re.match(r"transformer\.blocks\.(\d+)\.", name)
    if m:
        return int(m.group(1)) + 1
    return depth if name.startswith("transformer.norm.") else depth + 1


def test_linear_probe_trains_only_the_head(tmp_path):
    task = ClassificationTask(_vit(), optimizer={"lr": 1e-2}, finetune={"regime": "linear_probe"})
    before = _snapshot(task.model)
    _fit(task, tmp_path)
    after = task.model.state_dict()
    for name, value in before.items():
        if name.startswith("head."):
            assert not torch.equal(value, after[name]), name
        else:
            assert torch.equal(value, after[name]), name  # bit-identical
    task.train()
    assert not task.model.transformer.training and task.model.head.training


def test_freeze_first_blocks(tmp_path):
    task = ClassificationTask(_vit(), optimizer={"lr": 1e-2}, finetune={"freeze_blocks": 2})
    before = _snapshot(task.model)
    _fit(task, tmp_path)
    after = task.model.state_dict()
    for name, value in before.items():
        frozen = _layer(name, 3) <= 2
        assert torch.equal(value, after[name]) == frozen, name


def test_layer_decay_and_head_lr_groups(tmp_path):
    lr, decay, head_lr = 1e-3, 0.5, 3e-2
    task = ClassificationTask(_vit(), optimizer={"lr": lr, "warmup_fraction": 0.0},
                              finetune={"layer_decay": decay, "head_lr": head_lr})
    trainer = _fit(task, tmp_path, steps=1)
    groups = trainer.optimizers[0].param_groups
    names = {id(p): n for n, p in task.model.named_parameters()}
    seen = 0
    for group in groups:
        for p in group["params"]:
            name = names[id(p)]
            want = head_lr if name.startswith("head.") else lr * decay ** (3 + 1 - _layer(name, 3))
            assert group["initial_lr"] == pytest.approx(want, rel=1e-12), name
            no_decay = p.dim() < 2 or name in ("cls_token", "pos_embed")
            assert group["weight_decay"] == (0.0 if no_decay else 0.05), name
            seen += 1
    assert seen == len(list(task.model.parameters()))


def test_layer_decay_scales_match_timm():
    """The same ViT in timm and converted to ours: timm's param_groups_layer_decay and ours
    give every scale to the same number of weights."""
    timm = pytest.importorskip("timm")
    from timm.optim import param_groups_layer_decay

    torch.manual_seed(0)
    theirs = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32,
                               patch_size=8, embed_dim=32, depth=3, num_heads=2, num_classes=3)
    ours = mm.convert.convert(theirs)
    decay = 0.7
    t_groups = param_groups_layer_decay(theirs, weight_decay=0.05, layer_decay=decay,
                                        no_weight_decay_list=theirs.no_weight_decay())
    t_count = Counter()
    for g in t_groups:
        t_count[(round(g["lr_scale"], 9), g["weight_decay"] > 0)] += sum(
            p.numel() for p in g["params"])
    o_groups = param_groups(ours, 1.0, 0.05, layer_decay=decay, heads=HEAD_MODULES)
    o_count = Counter()
    for g in o_groups:
        o_count[(round(g["lr"], 9), g["weight_decay"] > 0)] += sum(
            p.numel() for p in g["params"])
    assert o_count == t_count


def test_lora_merged_equals_unmerged(tmp_path):
    task = ClassificationTask(_vit(), optimizer={"lr": 1e-2},
                              finetune={"regime": "lora", "lora_rank": 4, "lora_alpha": 8})
    before = _snapshot(task.model)
    _fit(task, tmp_path)
    after = task.model.state_dict()
    for name, value in before.items():  # base weights frozen, bit-identical
        if not name.startswith("head.") and "lora_" not in name:
            assert torch.equal(value, after[name]), name
    assert any(not torch.equal(before[n], after[n]) for n in before if "lora_B" in n)
    task.eval()
    x = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        unmerged = task(x)
    merged = mm.from_pretrained(task.save_pretrained(tmp_path / "merged"))
    assert type(merged) is mm.ViT and not any("lora" in n for n in merged.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(merged(x), unmerged, atol=1e-5, rtol=1e-5)
    # a checkpoint of the LoRA run loads as the merged model
    ckpt = {"state_dict": task.state_dict(), "hyper_parameters": dict(task.hparams)}
    task.on_save_checkpoint(ckpt)
    torch.save(ckpt, tmp_path / "lora.ckpt")
    with torch.no_grad():
        torch.testing.assert_close(mm.from_pretrained(tmp_path / "lora.ckpt")(x), unmerged,
                                   atol=1e-5, rtol=1e-5)


def test_bad_finetune_keys_are_named():
    with pytest.raises(ValueError, match="regime must be one of"):
        ClassificationTask(_vit(), finetune={"regime": "half"})
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['rank'\]"):
        ClassificationTask(_vit(), finetune={"regime": "lora", "rank": 4})
    with pytest.raises(ValueError, match="freeze_blocks=9 but ViT has 3 blocks"):
        ClassificationTask(_vit(), finetune={"freeze_blocks": 9})
    with pytest.raises(ValueError, match="layer_decay must be in"):
        ClassificationTask(_vit(), finetune={"layer_decay": 1.5})
