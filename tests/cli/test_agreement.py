"""Model and data agree at one moment in a ``multimodal fit`` from a pretrained path
(:func:`multimodal.tasks.agreement.reconcile`): once, when the data module is made, before
the task builds its model; a classifier's ``setup`` then checks nothing again; a data
setting the pretrained model cannot take is one error line naming the data argument,
raised before the model is built."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import multimodal.tasks.agreement as agreement
import multimodal.tasks.pretrained as pretrained_mod
from multimodal import ViT
from multimodal.cli.main import main as cli_main
from multimodal.models.text import TextEncoder, TextEncoderConfig
from tests.tasks.test_read_once import _checkpoint, _fit, _images, _vit

ROOT = Path(__file__).resolve().parents[2]


class Calls:
    """Counts :func:`reconcile` and :func:`check_data_fits` calls and the models built
    (outside ``meta``) before the first reconcile returned; ``events``: the order of the
    data following the model (``follow``), the data module made (``data``), the agreement
    (``reconcile``) and the model built (``model``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, model_cls: type[nn.Module]) -> None:
        import lightning as L

        import multimodal.cli.main as cli

        self.reconciles = self.checks = self.built = self.built_before = 0
        self.answers: list[agreement.Agreement] = []
        self.events: list[str] = []
        reconcile, check, init = agreement.reconcile, agreement.check_data_fits, \
            model_cls.__init__
        follow, data_init = cli.follow_pretrained, L.LightningDataModule.__init__

        def counting_reconcile(*args, **kwargs):
            self.reconciles += 1
            self.events.append("reconcile")
            self.built_before = self.built
            self.answers.append(reconcile(*args, **kwargs))
            return self.answers[-1]

        def counting_follow(*args, **kwargs):
            self.events.append("follow")
            return follow(*args, **kwargs)

        def counting_data_init(module, *args, **kwargs):
            self.events.append("data")
            data_init(module, *args, **kwargs)

        monkeypatch.setattr(cli, "follow_pretrained", counting_follow)
        monkeypatch.setattr(L.LightningDataModule, "__init__", counting_data_init)

        def counting_check(*args, **kwargs):
            self.checks += 1
            return check(*args, **kwargs)

        def counting_init(model, *args, **kwargs):
            real = torch.empty(()).device.type != "meta"  # not a shape check's build
            self.built += real
            self.events += ["model"] * real
            init(model, *args, **kwargs)

        monkeypatch.setattr(agreement, "reconcile", counting_reconcile)
        monkeypatch.setattr(agreement, "check_data_fits", counting_check)
        monkeypatch.setattr(model_cls, "__init__", counting_init)


def test_a_fit_from_a_checkpoint_reconciles_model_and_data_once(tmp_path, monkeypatch):
    """3 classes of images, a 2-class checkpoint: the one agreement (the data module made
    with the checkpoint's settings, then its class names and the check, before any model is
    built) gives the task the data's 3 class names, checks the data against the checkpoint's
    ViT once, and setup does not check again; the run trains a 3-class head."""
    train = _images(tmp_path / "photos")
    path = _checkpoint(tmp_path / "run.ckpt", _vit(num_classes=2))
    pretrained_mod.clear_sources()
    calls = Calls(monkeypatch, ViT)
    _fit(path, train, tmp_path / "out")
    assert calls.reconciles == 1 and calls.checks == 1
    assert calls.built_before == 0 and calls.built == 1
    assert calls.events == ["follow", "data", "reconcile", "model"]  # in one make_data
    (answer,) = calls.answers
    assert answer.checked and answer.class_names == ["ant", "bee", "cat"]
    (last,) = (tmp_path / "out").glob("version_*/checkpoints/last.ckpt")
    ckpt = torch.load(last, map_location="cpu", weights_only=True)
    assert ckpt["class_names"] == ["ant", "bee", "cat"]
    assert ckpt["state_dict"]["model.head.weight"].shape[0] == 3


def test_without_the_cli_setup_checks_the_data_itself():
    """``Trainer.fit(task, datamodule)`` has no agreement: the classifier's setup runs the
    same check (here: max_length over the model's max_len)."""
    from multimodal.tasks import ClassificationTask

    encoder = TextEncoder(TextEncoderConfig(vocab_size=40, max_len=16, dim=16, depth=1,
                                            heads=2, mlp_dim=32, num_classes=2))
    task = ClassificationTask(encoder)
    data = SimpleNamespace(vocab_size=40, max_length=20, class_names=["a", "b"])
    task._trainer = SimpleNamespace(datamodule=data)
    assert not agreement.agreed(data, task.pretrained_source)
    with pytest.raises(agreement.DataMismatch, match="max_length 20 exceeds the model's "
                                                     "max_len 16"):
        task._setup_data("fit")


@pytest.mark.parametrize("option, value, key, message", [
    ("max_length", "100", "max_length", "data max_length 100 exceeds the model's max_len 64"),
])
def test_a_data_setting_the_model_cannot_take_is_one_error_at_the_agreement(
        option, value, key, message, tmp_path, monkeypatch, capsys):
    """A BERT-style folder (max_len 64) and ``--data.init_args.max_length 100``: exit 2,
    one line ``error: ... (--data.init_args.max_length)``, from the one agreement, before
    any model is built."""
    pytest.importorskip("transformers")
    from tests import pretrained_folders as folders

    bert = folders.bert_folder(tmp_path / "bert")
    texts = tmp_path / "texts.csv"
    texts.write_text("text,label\n" + "\n".join(
        f"{w} {i},{'ab'[i % 2]}" for i, w in enumerate(["rain", "sun", "cake", "fish"] * 3))
        + "\n")
    pretrained_mod.clear_sources()
    calls = Calls(monkeypatch, TextEncoder)
    with pytest.raises(SystemExit) as info:
        cli_main(["fit", "--config", str(ROOT / "configs" / "finetune_text.yaml"),
                  "--model.init_args.pretrained", str(bert),
                  "--data.init_args.train", str(texts), f"--data.init_args.{option}", value,
                  "--trainer.accelerator", "cpu", "--trainer.logger", "false",
                  "--trainer.default_root_dir", str(tmp_path / "run")])
    assert info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines()
              if line.startswith("error:")]
    assert errors == [f"error: {message} (--data.init_args.{key})"]
    assert calls.reconciles == 1 and calls.built == 0
    assert not any((tmp_path / "run").glob("version_*/checkpoints/*.ckpt"))


def test_each_contradiction_names_its_data_argument():
    """check_data_fits on its own: modality, tokenizer size, max_length, sampling rate, each
    a DataMismatch whose key is the data argument at fault; data that fits passes."""
    encoder = TextEncoder(TextEncoderConfig(vocab_size=40, max_len=16, dim=16, depth=1,
                                            heads=2, mlp_dim=32, num_classes=2))
    fits = SimpleNamespace(modality="text", vocab_size=40, max_length=16)
    agreement.check_data_fits(fits, encoder)
    cases = [(SimpleNamespace(modality="image"), encoder, "modality"),
             (SimpleNamespace(vocab_size=41), encoder, "tokenizer"),
             (SimpleNamespace(max_length=17), encoder, "max_length")]
    audio = nn.Module()
    audio.config = SimpleNamespace(sample_rate=16000)
    agreement.check_data_fits(SimpleNamespace(features=False, sample_rate=16000), audio)
    agreement.check_data_fits(SimpleNamespace(features=True, sample_rate=8000), audio)
    cases.append((SimpleNamespace(features=False, sample_rate=8000), audio, "sample_rate"))
    for data, model, key in cases:
        with pytest.raises(agreement.DataMismatch) as info:
            agreement.check_data_fits(data, model)
        assert info.value.key == key


def test_without_lightnings_instantiators_the_data_still_follows_the_model(tmp_path):
    """``load_from_checkpoint_support=False`` (no instantiators, so no make_data): the data
    follows the checkpoint before instantiation, and the links still carry one agreement."""
    from multimodal.cli.main import MultimodalCLI

    train = _images(tmp_path / "photos")
    path = _checkpoint(tmp_path / "run.ckpt", _vit(num_classes=2))
    pretrained_mod.clear_sources()
    cli = MultimodalCLI(args=["--config", str(ROOT / "configs" / "finetune_image.yaml"),
                              "--model.init_args.pretrained", str(path),
                              "--data.init_args.train", str(train),
                              "--trainer.logger", "false", "--trainer.accelerator", "cpu",
                              "--trainer.default_root_dir", str(tmp_path / "out")],
                        run=False, load_from_checkpoint_support=False)
    assert cli.datamodule.image_size == 8 and list(cli.datamodule.mean) == [0.5] * 3
    assert cli.model.class_names == ["ant", "bee", "cat"]
    assert agreement.agreed(cli.datamodule, cli.model.pretrained_source)
