"""Class paths that runs store still resolve.

A Lightning checkpoint records its task and data module as ``_class_path`` strings in
``hyper_parameters`` / ``datamodule_hyper_parameters`` (read back by ``multimodal predict
--ckpt_path``, ``pretrained:`` and the caption / embed verbs), and a run's ``config.yaml``
names the task, the model and the data module the same way. The strings below are the ones
runs wrote before the package's modules were regrouped (cli/, plots/, nn/embed.py,
data/sources/): none of them names a moved module, so no alias is needed; this test keeps
it that way. The model inside a checkpoint is stored by ``model_type`` (a class name, see
tests/models/test_backbone.py for the fixtures), never by module path.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import warnings
from pathlib import Path

import pytest
import yaml

STORED = [
    "multimodal.ViT",
    "multimodal.data.audio.AudioClassificationDataModule",
    "multimodal.data.captions.CaptionDataModule",
    "multimodal.data.numbers.NumberWordsDataModule",
    "multimodal.data.pixels.PixelDataModule",
    "multimodal.data.text.SourceClassificationDataModule",
    "multimodal.data.text.TextCorpusDataModule",
    "multimodal.data.text_classification.TextClassificationDataModule",
    "multimodal.data.text_pairs.TextPairsDataModule",
    "multimodal.data.tts.TTSDataModule",
    "multimodal.data.vision.ImageClassificationDataModule",
    "multimodal.tasks.ClassificationTask",
    "multimodal.tasks.ContrastiveTask",
    "multimodal.tasks.SequenceClassificationTask",
    "multimodal.tasks.autoregressive.AutoregressiveImageTask",
    "multimodal.tasks.captioning.CaptioningTask",
    "multimodal.tasks.contrastive.ContrastiveTask",
    "multimodal.tasks.language_model.LanguageModelTask",
    "multimodal.tasks.masked_lm.MaskedLMTask",
    "multimodal.tasks.tts.TTSTask",
]


@pytest.mark.parametrize("class_path", STORED)
def test_a_stored_class_path_resolves(class_path: str) -> None:
    module, name = class_path.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    assert isinstance(cls, type) and cls.__name__ == name


# ---- SequenceClassificationTask folded into ClassificationTask (a text classifier is a
# ClassificationTask over a TextEncoder): its stored class paths map onto it once

def _fit_text_classifier(root: Path) -> Path:
    from multimodal.cli.main import main as cli_main

    rows = [{"text": t, "label": "food"} for t in
            ("I baked bread", "The soup needs salt", "We ate pasta", "She fried eggs")] + \
        [{"text": t, "label": "sport"} for t in
         ("He scored a goal", "The match went long", "She ran a mile", "Our team won")]
    (root / "texts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cli_main(["fit", "--model", "multimodal.tasks.ClassificationTask",
                  "--model.preset", "bert_tiny", "--model.overrides",
                  '{"dim": 16, "depth": 1, "heads": 2, "mlp_dim": 32}',
                  "--data", "multimodal.data.text_classification.TextClassificationDataModule",
                  "--data.train", str(root / "texts.jsonl"), "--data.vocab_size", "60",
                  "--data.max_length", "16", "--data.batch_size", "4",
                  "--data.val_size", "2", "--data.test_size", "0",
                  "--trainer.max_steps", "2", "--trainer.default_root_dir", str(root / "run"),
                  "--trainer.enable_progress_bar", "false", "--test_after_fit", "false"])
    return root / "run" / "version_0" / "checkpoints" / "last.ckpt"


def _predict(ckpt: Path, texts: Path, capsys: pytest.CaptureFixture[str]) -> list[list[str]]:
    from multimodal.cli.main import main as cli_main

    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cli_main(["predict", "--ckpt_path", str(ckpt), "--data.init_args.predict", str(texts),
                  "--trainer.enable_progress_bar", "false"])
    return [line.split("\t") for line in capsys.readouterr().out.splitlines()
            if line.count("\t") == 2]


def test_a_checkpoint_naming_sequence_classification_task_loads_and_predicts_the_same(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A checkpoint written before the fold names the old class and holds its arguments
    (``init_from``, no ``modality``): ``multimodal predict --ckpt_path`` reads it as a
    ClassificationTask and prints what the same weights under today's class print."""
    import torch

    from multimodal.tasks import stored_task

    new = _fit_text_classifier(tmp_path)
    ckpt = torch.load(new, map_location="cpu", weights_only=True)
    assert ckpt["hyper_parameters"]["_class_path"] == "multimodal.tasks.ClassificationTask"
    assert not any(k.startswith("mlm.") for k in ckpt["state_dict"])  # a preset: no MLM head
    hp = {k: v for k, v in ckpt["hyper_parameters"].items() if k != "modality"}
    old_hp = {**hp, "_class_path": "multimodal.tasks.masked_lm.SequenceClassificationTask",
              "init_from": None}
    old = tmp_path / "old.ckpt"
    torch.save({**ckpt, "hyper_parameters": old_hp}, old)
    path, mapped = stored_task(old_hp["_class_path"], old_hp)
    assert path == "multimodal.tasks.ClassificationTask"
    assert "init_from" not in mapped and mapped["modality"] == "text"
    texts = tmp_path / "new.txt"
    texts.write_text("We roasted vegetables\nThe striker missed again\nA cake\n")
    want = _predict(new, texts, capsys)
    assert len(want) == 3 and {row[1] for row in want} <= {"food", "sport"}
    assert _predict(old, texts, capsys) == want


def test_sequence_classification_task_is_a_deprecated_classification_task() -> None:
    """The old name still builds, warns naming the new one, and computes what
    ClassificationTask computes on the same encoder: ``head(pool(encoder(ids)))``."""
    import torch

    import multimodal as mm
    from multimodal.tasks import ClassificationTask, SequenceClassificationTask

    torch.manual_seed(0)
    enc = mm.TextEncoder(mm.TextEncoderConfig(vocab_size=30, max_len=8, dim=16, depth=1,
                                              heads=2, num_classes=3, mlm_head=False))
    with pytest.warns(DeprecationWarning, match="use multimodal.tasks.ClassificationTask"):
        old = SequenceClassificationTask(enc)
    assert isinstance(old, ClassificationTask) and old.optimizer_config.lr == 5e-4
    ids = torch.randint(5, 30, (2, 8))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    new = ClassificationTask(enc).eval()
    old.eval()
    with torch.no_grad():
        hidden = enc(ids, attention_mask=mask)
        pooled = hidden[:, 0]  # [CLS] pooling (the config's default)
        want = enc.head(pooled)
        got_new = new({"input_ids": ids, "attention_mask": mask})
        got_old = old({"input_ids": ids, "attention_mask": mask})
    torch.testing.assert_close(got_new, want)
    torch.testing.assert_close(got_old, want)


# ---- the optimiser as one block: checkpoints written before it hold flat hyper-parameters
# (lr, weight_decay, warmup_fraction, min_lr_ratio), mapped into the block once, silently

def _flat_checkpoint(new: Path, old: Path) -> dict:
    """``new``'s checkpoint as one written before the block: its ``optimizer`` keys flat
    (a task other than LanguageModelTask took no ``betas``). Returns the stored block."""
    import torch

    ckpt = torch.load(new, map_location="cpu", weights_only=True)
    hp = dict(ckpt["hyper_parameters"])
    block = hp.pop("optimizer")
    assert block["betas"] == [0.9, 0.999]  # the full block, as plain types
    flat = {k: block[k] for k in ("lr", "weight_decay", "warmup_fraction", "min_lr_ratio")}
    torch.save({**ckpt, "hyper_parameters": {**hp, **flat}}, old)
    return block


def _optimizer_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "optimizer" in str(w.message)]


def test_stored_flat_optimizer_keys_map_into_the_block() -> None:
    from multimodal.tasks import stored_task

    hp = {"_class_path": "multimodal.tasks.masked_lm.SequenceClassificationTask",
          "lr": 5e-4, "weight_decay": 0.01, "warmup_fraction": 0.1, "min_lr_ratio": 0.01,
          "label_smoothing": 0.0, "init_from": None}
    path, mapped = stored_task(hp["_class_path"], hp)
    assert path == "multimodal.tasks.ClassificationTask"
    assert mapped == {"_class_path": hp["_class_path"], "label_smoothing": 0.0,
                      "modality": "text",
                      "optimizer": {"lr": 5e-4, "weight_decay": 0.01, "warmup_fraction": 0.1,
                                    "min_lr_ratio": 0.01}}
    # today's checkpoints hold the block alone: unchanged
    today = {"optimizer": {"lr": 1e-3}, "label_smoothing": 0.1}
    assert stored_task("multimodal.tasks.ClassificationTask", today)[1] == today


def test_a_checkpoint_with_flat_optimizer_keys_loads_with_the_same_settings_quietly(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``load_from_checkpoint``, ``multimodal predict --ckpt_path`` and a run read back with
    ``--config --ckpt_path`` (LightningCLI copies the stored hyper-parameters into the
    config) all train / predict with the stored settings and warn of no flat key."""
    from multimodal.cli.main import MultimodalCLI
    from multimodal.cli.main import main as cli_main
    from multimodal.tasks import ClassificationTask
    from multimodal.tasks.optim import OptimizerConfig

    new = _fit_text_classifier(tmp_path)
    old = tmp_path / "old.ckpt"
    block = _flat_checkpoint(new, old)
    want = OptimizerConfig(**block)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # (the class count comes from the data module, not the hyper-parameters)
        task = ClassificationTask.load_from_checkpoint(old, num_classes=2)
    assert task.optimizer_config == want and not _optimizer_warnings(caught)
    assert task.hparams["optimizer"] == block  # saved again as the block

    texts = tmp_path / "new.txt"
    texts.write_text("We roasted vegetables\nThe striker missed again\n")
    expected = _predict(new, texts, capsys)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        capsys.readouterr()
        cli_main(["predict", "--ckpt_path", str(old), "--data.init_args.predict", str(texts),
                  "--trainer.enable_progress_bar", "false"])
    got = [line.split("\t") for line in capsys.readouterr().out.splitlines()
           if line.count("\t") == 2]
    assert got == expected and not _optimizer_warnings(caught)

    class Parsed(Exception):
        pass

    def stop(cli: MultimodalCLI) -> None:
        raise Parsed(cli.config[cli.subcommand].model.init_args)

    monkeypatch.setattr(MultimodalCLI, "instantiate_classes", stop)
    [config] = (tmp_path / "run").rglob("config.yaml")  # the run's own, written by fit
    # LightningCLI reads the stored flat keys back (into model.dict_kwargs, the task taking
    # none of them): they move into the block, the checkpoint's values over the config's
    edited = tmp_path / "edited.yaml"
    run = yaml.safe_load(config.read_text())
    run["model"]["init_args"]["optimizer"] = {"lr": 0.5, "betas": [0.5, 0.6]}
    edited.write_text(yaml.safe_dump(run))
    with warnings.catch_warnings(record=True) as caught, pytest.raises(Parsed) as info:
        warnings.simplefilter("always")
        cli_main(["validate", "--config", str(edited), "--ckpt_path", str(old)])
    init = info.value.args[0]
    assert not {"lr", "weight_decay", "warmup_fraction", "min_lr_ratio"} & set(vars(init))
    assert OptimizerConfig.of(init["optimizer"], ClassificationTask.optimizer_defaults) \
        == dataclasses.replace(want, betas=(0.5, 0.6))  # betas: the checkpoint had none
    assert not _optimizer_warnings(caught)
