"""What every task shares: one optimiser config, one ``datamodule`` look-up."""

from __future__ import annotations

import pytest
import torch

import multimodal as mm
from multimodal.tasks.classification import ClassificationTask
from multimodal.tasks.language_model import LanguageModelTask
from multimodal.tasks.optim import OptimizerConfig


def _lm() -> mm.TextDecoder:
    return mm.TextDecoder(mm.TextDecoderConfig(vocab_size=20, max_len=8, dim=16, depth=1,
                                               heads=2))


def test_tasks_gather_their_keywords_into_one_optimizer_config() -> None:
    task = LanguageModelTask(_lm(), lr=0.01, betas=(0.8, 0.9))
    assert task.optimizer_config == OptimizerConfig(lr=0.01, weight_decay=0.1,
                                                    betas=(0.8, 0.9), warmup_fraction=0.05,
                                                    min_lr_ratio=0.1)
    vit = mm.ViT(mm.ViTConfig(image_size=8, patch_size=4, in_channels=1, num_classes=3,
                              dim=16, depth=1, heads=2))
    cls_task = ClassificationTask(vit, lr=0.002)
    assert cls_task.optimizer_config.lr == 0.002
    assert cls_task.optimizer_config.betas == (0.9, 0.999)  # a task without betas


def test_optimizer_config_builds_adamw_with_warmup_cosine() -> None:
    model = _lm()
    cfg = OptimizerConfig(lr=0.1, weight_decay=0.5, warmup_fraction=0.25, min_lr_ratio=0.0)
    out = cfg.build(model, total_steps=8)
    opt, sched = out["optimizer"], out["lr_scheduler"]["scheduler"]
    assert isinstance(opt, torch.optim.AdamW) and out["lr_scheduler"]["interval"] == "step"
    decays = sorted(g["weight_decay"] for g in opt.param_groups)
    assert decays == [0.0, 0.5]
    # warm-up over int(0.25 * 8) = 2 steps: lr(0) = 0.1 * 1/2, lr(1) = 0.1 * 2/2
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("lr", 0.0, "lr must be > 0"),
    ("warmup_fraction", 1.0, "warmup_fraction must be in"),
    ("min_lr_ratio", 1.5, "min_lr_ratio must be in"),
    ("betas", (0.9, 1.0), "betas must be"),
    ("weight_decay", -1.0, "weight_decay must be >= 0"),
])
def test_optimizer_config_refuses_bad_values(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        OptimizerConfig(**{field: value})


def test_datamodule_is_none_without_a_trainer() -> None:
    assert LanguageModelTask(_lm()).datamodule is None


def test_one_adamw_builder_plain_and_layer_decay_agree() -> None:
    """The plain groups are ``all/decay`` then ``all/no_decay`` (the layout checkpoints of
    the plain optimiser hold); ``layer_decay=1`` scales nothing, so every parameter gets the
    same rate and decay as without it; a frozen model is an error."""
    from multimodal.tasks.optim import adamw

    model = _lm()
    plain = adamw(model, 0.1, 0.5)
    assert [g["name"] for g in plain.param_groups] == ["all/decay", "all/no_decay"]
    decayed = {id(p) for p in plain.param_groups[0]["params"]}
    for name, p in model.named_parameters():  # the rule written out: matrices only
        want = p.dim() >= 2 and not name.endswith("_token") and "pos_embed" not in name
        assert (id(p) in decayed) == want, name
    layered = adamw(model, 0.1, 0.5, layer_decay=1.0)
    rate = {id(p): (g["lr"], g["weight_decay"]) for g in layered.param_groups
            for p in g["params"]}
    assert rate == {id(p): (g["lr"], g["weight_decay"]) for g in plain.param_groups
                    for p in g["params"]}
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no parameter is trainable"):
        adamw(model, 0.1)


def test_overrides_mean_the_same_for_a_preset_and_a_pretrained_model(tmp_path) -> None:
    """``overrides`` reaches into a nested config with a mapping, whether the model comes
    from a preset or from a folder; the folder's weights are kept."""
    from multimodal.tasks.captioning import CaptioningTask

    enc = mm.ViTConfig(image_size=16, patch_size=4, num_classes=0, dim=32, depth=1, heads=2,
                       mlp_dim=64)
    dec = mm.TextDecoderConfig(vocab_size=24, max_len=12, dim=32, depth=1, heads=4, mlp_dim=64)
    saved = mm.Captioner(mm.CaptionerConfig(encoder=enc, decoder=dec))
    saved.save_pretrained(tmp_path / "cap")
    task = CaptioningTask(pretrained=str(tmp_path / "cap"),
                          overrides={"decoder": {"dropout": 0.25}})
    config = task.model.config
    assert config.decoder.backbone.dropout == 0.25
    assert config.encoder.backbone.dropout == saved.config.encoder.backbone.dropout
    for name, value in saved.state_dict().items():
        torch.testing.assert_close(task.model.state_dict()[name], value)
    with pytest.raises(ValueError, match=r"has no field 'decoder\.dropuot'"):
        CaptioningTask(pretrained=str(tmp_path / "cap"), overrides={"decoder": {"dropuot": 0}})


def test_each_task_declares_its_models_and_where_they_come_from() -> None:
    """``accepts`` / ``model_sources`` on the task class: one ``model_from`` builds every
    task's model and names the task in its errors."""
    import multimodal.tasks as tasks

    for name in tasks._TASKS:
        cls = getattr(tasks, name)
        assert cls.accepts and all(isinstance(c, type) for c in cls.accepts), name
    assert tasks.TTSTask.model_sources == ("model", "preset")
    with pytest.raises(ValueError, match="TTSTask takes no pretrained: its model comes from "
                                         "model or preset"):
        tasks.TTSTask.model_from(pretrained="some/folder")
    with pytest.raises(ValueError, match="LanguageModelTask: model must be a TextDecoder, "
                                         "got ViT"):
        LanguageModelTask(mm.ViT(mm.ViTConfig(image_size=8, patch_size=4, in_channels=1,
                                              num_classes=2, dim=16, depth=1, heads=2)))
