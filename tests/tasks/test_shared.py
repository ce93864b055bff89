"""What every task shares: one optimiser config, one ``datamodule`` look-up."""

from __future__ import annotations

import inspect
import re
import warnings
from pathlib import Path

import pytest
import torch
import yaml

import multimodal as mm
from multimodal.tasks.base import ModelTask
from multimodal.tasks.classification import ClassificationTask
from multimodal.tasks.language_model import LanguageModelTask
from multimodal.tasks.optim import OptimizerConfig
from multimodal.tasks.seq2seq import Seq2SeqTask


def _lm() -> mm.TextDecoder:
    return mm.TextDecoder(mm.TextDecoderConfig(vocab_size=20, max_len=8, dim=16, depth=1,
                                               heads=2))


def _vit() -> mm.ViT:
    return mm.ViT(mm.ViTConfig(image_size=8, patch_size=4, in_channels=1, num_classes=3,
                               dim=16, depth=1, heads=2))


# Each task's optimiser defaults as its flat keywords had them before the block:
# (lr, weight_decay, betas, warmup_fraction, min_lr_ratio).
FORMER_DEFAULTS = {
    "ClassificationTask": (1e-3, 0.05, (0.9, 0.999), 0.05, 0.01),
    "AutoregressiveImageTask": (1e-3, 0.05, (0.9, 0.999), 0.05, 0.01),
    "CaptioningTask": (1e-3, 0.05, (0.9, 0.999), 0.05, 0.01),
    "ContrastiveTask": (1e-3, 0.1, (0.9, 0.999), 0.05, 0.01),
    "LanguageModelTask": (1e-3, 0.1, (0.9, 0.95), 0.05, 0.1),
    "MaskedLMTask": (1e-3, 0.01, (0.9, 0.999), 0.05, 0.1),
    "SequenceClassificationTask": (5e-4, 0.01, (0.9, 0.999), 0.1, 0.01),
    "Seq2SeqTask": (1e-3, 0.01, (0.9, 0.999), 0.05, 0.01),
    "TTSTask": (1e-3, 0.01, (0.9, 0.999), 0.05, 0.05),
}


@pytest.mark.parametrize("name", sorted(FORMER_DEFAULTS))
def test_every_task_keeps_its_optimizer_defaults_and_takes_the_block(name: str) -> None:
    import multimodal.tasks as tasks

    cls = getattr(tasks, name)
    d = cls.optimizer_defaults
    assert (d.lr, d.weight_decay, d.betas, d.warmup_fraction, d.min_lr_ratio) == \
        FORMER_DEFAULTS[name]
    # the block is ModelTask's keyword (each task forwards it); the flat ones are gone
    assert inspect.signature(ModelTask.__init__).parameters["optimizer"].default is None
    assert not {"lr", "weight_decay", "betas", "warmup_fraction", "min_lr_ratio"} & \
        set(inspect.signature(cls.__init__).parameters)


def test_a_partial_block_keeps_the_task_defaults() -> None:
    task = LanguageModelTask(_lm(), optimizer={"lr": 0.01})
    assert task.optimizer_config == OptimizerConfig(lr=0.01, weight_decay=0.1,
                                                    betas=(0.9, 0.95), warmup_fraction=0.05,
                                                    min_lr_ratio=0.1)
    cls_task = ClassificationTask(_vit(), optimizer={"weight_decay": 0.2, "betas": [0.8, 0.9]})
    assert cls_task.optimizer_config == OptimizerConfig(lr=1e-3, weight_decay=0.2,
                                                        betas=(0.8, 0.9), warmup_fraction=0.05,
                                                        min_lr_ratio=0.01)
    # a whole OptimizerConfig is taken as it is
    whole = OptimizerConfig(lr=0.5)
    assert LanguageModelTask(_lm(), optimizer=whole).optimizer_config is whole
    # what a checkpoint stores: every key of the block, plain types, no flat key
    assert task.hparams["optimizer"] == {"lr": 0.01, "weight_decay": 0.1, "betas": [0.9, 0.95],
                                         "warmup_fraction": 0.05, "min_lr_ratio": 0.1}
    assert not {"lr", "weight_decay", "betas"} & set(task.hparams)


def _schedule(out: dict, steps: int) -> list[float]:
    opt, sched = out["optimizer"], out["lr_scheduler"]["scheduler"]
    rates = []
    for _ in range(steps):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return rates


def test_the_block_gives_adamw_groups_and_the_warmup_cosine_schedule() -> None:
    """AdamW groups (names, rate, decay, betas) as the block says, and the schedule is the
    formula: warm-up to ``lr`` over ``w = int(0.25 * 8) = 2`` steps, then
    ``lr * (r + (1 - r) * (1 + cos(pi * (t - w) / (T - w))) / 2)``."""
    import math

    keys = {"lr": 0.01, "weight_decay": 0.2, "betas": (0.8, 0.9), "warmup_fraction": 0.25,
            "min_lr_ratio": 0.1}
    torch.manual_seed(0)
    task = LanguageModelTask(_lm(), optimizer=dict(keys))
    out = task.optimizer_config.build(task.model, total_steps=8)
    assert [(g["name"], g["initial_lr"], g["weight_decay"], g["betas"])
            for g in out["optimizer"].param_groups] == [
        ("all/decay", 0.01, 0.2, (0.8, 0.9)), ("all/no_decay", 0.01, 0.0, (0.8, 0.9))]
    want = [0.01 * (t + 1) / 2 if t < 2 else
            0.01 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (t - 2) / 6))) for t in range(8)]
    assert _schedule(out, 8) == pytest.approx(want, rel=1e-12)


def test_a_flat_optimizer_keyword_is_one_error_naming_the_block() -> None:
    """The flat keywords of earlier releases are gone: given to a task, one TypeError
    names the block's spelling, in Python and on the command line."""
    with pytest.raises(TypeError, match=r"^ClassificationTask: lr= was removed \(one "
                       r"optimizer block\): write optimizer=\{'lr': 0.002\} "
                       r"\(--model.init_args.optimizer.lr\)$"):
        ClassificationTask(_vit(), lr=0.002)
    with pytest.raises(TypeError, match=r"^LanguageModelTask: weight_decay=, betas= were "
                       r"removed .*\{'weight_decay': 0.1, 'betas': \[0.8, 0.9\]\}"):
        LanguageModelTask(_lm(), betas=(0.8, 0.9), weight_decay=0.1,
                          optimizer=OptimizerConfig())
    # any other unknown keyword is Python's own error, named for the task
    with pytest.raises(TypeError, match=r"^Seq2SeqTask.__init__\(\) got an unexpected "
                       r"keyword argument 'label_smothing'$"):
        Seq2SeqTask(preset="seq2seq_numbers", label_smothing=0.1)


@pytest.mark.parametrize(("block", "message"), [
    ({"lrr": 0.1}, r"optimizer: unknown key\(s\) \['lrr'\]; keys: \['lr', "),
    ({"lr": "abc"}, "optimizer: lr must be a number, got 'abc'"),
    ({"betas": 0.9}, "optimizer: betas must be two numbers"),
    ({"lr": -1.0}, "optimizer: lr must be > 0"),
    ("fast", "optimizer must be a mapping of OptimizerConfig keys"),
])
def test_a_bad_block_is_one_error(block: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ClassificationTask(_vit(), optimizer=block)


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


# ---- one home for the shared keywords: ModelTask's signature; each task declares its own

NINE_TASKS = ("ClassificationTask", "AutoregressiveImageTask", "LanguageModelTask",
              "MaskedLMTask", "SequenceClassificationTask", "Seq2SeqTask", "CaptioningTask",
              "ContrastiveTask", "TTSTask")
FLAT_OPTIMIZER = {"lr", "weight_decay", "betas", "warmup_fraction", "min_lr_ratio"}
# what a task passes to its parent itself, so that the CLI does not offer it
FIXED_BY_TASK = {"AutoregressiveImageTask": {"pretrained"}, "TTSTask": {"pretrained"}}


def _own(cls: type) -> set[str]:
    return {n for n, p in inspect.signature(cls.__init__).parameters.items()
            if n != "self" and p.kind is not p.VAR_KEYWORD}


def _shared() -> set[str]:
    from multimodal.tasks.base import ModelTask

    return _own(ModelTask) - {"model"}


def test_the_shared_keywords_are_model_tasks_and_no_task_repeats_one() -> None:
    import multimodal.tasks as tasks

    assert _shared() == {"pretrained", "preset", "overrides", "data_sizes", "compile",
                         "optimizer", "finetune"}
    for name in NINE_TASKS:
        cls = getattr(tasks, name)
        own = _own(cls)
        assert not own & (_shared() | FLAT_OPTIMIZER), (name, own & _shared())
        assert list(inspect.signature(cls.__init__).parameters)[1] == "model", name
        # the rest reaches ModelTask through **kwargs
        assert any(p.kind is p.VAR_KEYWORD
                   for p in inspect.signature(cls.__init__).parameters.values()), name


@pytest.mark.parametrize("name", NINE_TASKS)
def test_jsonargparse_offers_each_task_its_own_and_the_shared_keywords(name: str) -> None:
    """What LightningCLI reads from a task's signature (``fit --help``, ``--print_config``,
    a config's keys): jsonargparse follows ``super().__init__(model, **kwargs)`` up to
    ModelTask, so every task offers its own keywords and the shared ones, and no flat
    optimiser key."""
    from jsonargparse import ArgumentParser

    import multimodal.tasks as tasks

    cls = getattr(tasks, name)
    parser = ArgumentParser(exit_on_error=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parser.add_class_arguments(cls, "model", fail_untyped=False)
    offered = {a.dest.split(".")[1] for a in parser._actions
               if a.dest.startswith("model.") and not a.dest.endswith(".help")}
    chain = set().union(*(_own(c) for c in cls.__mro__[:cls.__mro__.index(ModelTask) + 1]))
    assert offered == chain - FIXED_BY_TASK.get(name, set())
    assert _shared() - FIXED_BY_TASK.get(name, set()) <= offered
    assert not offered & FLAT_OPTIMIZER


def test_fit_help_of_a_task_lists_its_own_and_the_shared_options(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``fit --model.help`` lists a task's own and the shared options, ``--print_config``
    writes them (the data's sizes excepted: linked from the data module when it is built)."""
    from multimodal.cli.main import main
    from multimodal.tasks import CaptioningTask

    config = Path(__file__).parents[2] / "configs" / "caption_scenes.yaml"
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(config), "--model.help", "multimodal.tasks.CaptioningTask"])
    listed = set(re.findall(r"^  --model\.(\w+) ", capsys.readouterr().out, re.M))
    assert listed == _own(CaptioningTask) | _shared()
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(config), "--print_config"])
    init = yaml.safe_load(capsys.readouterr().out)["model"]["init_args"]
    assert set(init) == (_own(CaptioningTask) | _shared()) - {"data_sizes"}  # linked later


def test_stored_hyperparameters_with_flat_and_stale_keys_load(tmp_path: Path) -> None:
    """``load_from_checkpoint`` of hyper-parameters written by earlier releases: flat
    optimiser keys move into the block (its own keys winning), a keyword no task takes any
    more is left out (as Lightning leaves out what a signature lacks), with or without
    LightningCLI's instantiator; the deprecated SequenceClassificationTask's own
    ``modality`` reads back."""
    import lightning

    from multimodal.tasks import SequenceClassificationTask

    with pytest.warns(DeprecationWarning):
        task = SequenceClassificationTask(preset="bert_tiny", num_classes=2, overrides={
            "dim": 16, "depth": 1, "heads": 2, "mlp_dim": 32})
    stored = {k: v for k, v in task.hparams.items() if k != "optimizer"}
    assert stored["modality"] == "text" and "init_from" in stored
    old = {**stored, "lr": 0.02, "weight_decay": 0.3, "removed_long_ago": 1}
    cli = {"_instantiator": "lightning.pytorch.cli.instantiate_module",
           "_class_path": "multimodal.tasks.masked_lm.SequenceClassificationTask"}
    for extra in ({}, cli):
        path = tmp_path / "old.ckpt"
        torch.save({"state_dict": task.state_dict(), "hyper_parameters": {**old, **extra},
                    "pytorch-lightning_version": lightning.__version__}, path)
        for cls in (SequenceClassificationTask, ClassificationTask):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                loaded = cls.load_from_checkpoint(path)
            assert (loaded.optimizer_config.lr, loaded.optimizer_config.weight_decay) == \
                (0.02, 0.3), (cls.__name__, extra)
            assert "removed_long_ago" not in loaded.hparams
            for name, value in task.state_dict().items():
                torch.testing.assert_close(loaded.state_dict()[name], value)
