"""The pretrained path through the ``multimodal`` command: ``fit`` from a Hugging Face ViT
folder on a folder of 3 classes with no num_classes anywhere (the count and the names come
from the data, the image size and normalisation from the folder's preprocessor_config.json),
then ``predict`` with only ``--ckpt_path`` and ``--data.init_args.predict``; predict on a
folder after training on shards; the model summary counts the ViT's FLOPs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from jsonargparse import Namespace
from PIL import Image

from multimodal.cli.main import follow_pretrained
from multimodal.cli.main import main as cli_main

pytest.importorskip("transformers")
from tests import pretrained_folders as folders  # needs transformers

ROOT = Path(__file__).resolve().parents[2]
CLASSES = ("ant", "bee", "cat")
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _images(root, per_class=6, size=40):
    rng = np.random.default_rng(0)
    for c, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 80, (size, size, 3)) + 80 * c
            Image.fromarray(pixels.astype(np.uint8)).save(root / name / f"{i}.png")
    return root


def _config(tmp_path, train, **data):
    cfg = {
        "seed_everything": 0,
        "model": {"class_path": "multimodal.tasks.ClassificationTask",
                  "init_args": {"optimizer": {"lr": 0.001}}},
        "data": {"class_path": "multimodal.data.vision.ImageClassificationDataModule",
                 "init_args": {"train": str(train), "batch_size": 6, "val_size": 3,
                               "test_size": 3, "augment": False, **data}},
        "trainer": {"max_epochs": 1, "accelerator": "cpu", "logger": False,
                    "default_root_dir": str(tmp_path / "run"),
                    "callbacks": [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                                   "init_args": {"save_last": True}}]},
    }
    path = tmp_path / "finetune.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_fit_from_a_folder_then_predict_with_only_the_checkpoint(tmp_path, capsys):
    vit = folders.vit_folder(tmp_path / "vit")
    train = _images(tmp_path / "photos")
    cli_main(["fit", "--config", str(_config(tmp_path, train)), "--model.init_args.pretrained",
              str(vit), "--test_after_fit", "false"])
    out = capsys.readouterr()
    assert "Total FLOPs: 0" not in out.out + out.err
    last = tmp_path / "run" / "version_0" / "checkpoints" / "last.ckpt"
    ckpt = torch.load(last, map_location="cpu", weights_only=True)
    assert ckpt["class_names"] == list(CLASSES)
    assert ckpt["multimodal_model"]["model_config"]["num_classes"] == 3
    data = ckpt["datamodule_hyper_parameters"]  # the data followed the model's folder
    assert data["image_size"] == 32 and data["mean"] == MEAN and data["std"] == STD
    # predict: nothing but the checkpoint and the folder
    pngs = tmp_path / "pngs"
    pngs.mkdir()
    for i, name in enumerate(CLASSES):
        src = train / name / "0.png"
        (pngs / f"img{i}.png").write_bytes(src.read_bytes())
    cli_main(["predict", "--ckpt_path", str(last), "--data.init_args.predict", str(pngs),
              "--trainer.logger", "false", "--trainer.default_root_dir", str(tmp_path / "p")])
    lines = [ln.split("\t") for ln in capsys.readouterr().out.splitlines()
             if ln.startswith("img")]
    assert [ln[0] for ln in lines] == ["img0.png", "img1.png", "img2.png"]
    assert all(ln[1] in CLASSES for ln in lines)


def test_overriding_the_model_preprocessing_warns_with_both_values(tmp_path):
    vit = folders.vit_folder(tmp_path / "vit")
    cfg = Namespace(model=Namespace(class_path="multimodal.tasks.ClassificationTask",
                                    init_args=Namespace(pretrained=str(vit), modality=None)),
                    data=Namespace(class_path="multimodal.data.vision."
                                              "ImageClassificationDataModule",
                                   init_args=Namespace(train="x", image_size=64,
                                                       mean=None, std=None)))
    warnings = follow_pretrained(cfg)
    assert len(warnings) == 1 and "image_size=64" in warnings[0] \
        and "image_size=32" in warnings[0]
    assert cfg.data.init_args.mean == MEAN and cfg.data.init_args.image_size == 64
    assert cfg.model.init_args.modality == "image"  # picks a CLIP folder's tower
    pre = json.loads((vit / "preprocessor_config.json").read_text())
    assert pre["size"]["height"] == 32


def test_a_loader_of_files_is_plain_whatever_the_training_source(tmp_path):
    """ShardLoaderMixin.loader: a dataset that is not streamed (the predict folder) gets a
    plain DataLoader even with shards set (fast; the real shards run is below)."""
    from torch.utils.data import DataLoader

    from multimodal.data.vision import ImageClassificationDataModule

    pngs = tmp_path / "pngs"
    pngs.mkdir()
    Image.fromarray(np.zeros((8, 8), dtype=np.uint8)).save(pngs / "a.png")
    dm = ImageClassificationDataModule("digits", predict_dir=str(pngs), mean=0.0, std=1.0)
    dm.shards = str(tmp_path / "shards")  # as if trained on shards
    assert type(dm.predict_dataloader()) is DataLoader


@pytest.mark.slow
def test_predict_dir_after_training_on_shards_uses_a_plain_loader(tmp_path):
    from torch.utils.data import DataLoader

    from multimodal.cli.prepare import main as prepare
    from multimodal.data.vision import ImageClassificationDataModule

    _images(tmp_path / "in", per_class=4, size=8)
    prepare(["images", str(tmp_path / "in"), str(tmp_path / "out"), "--val-size", "3",
             "--test-size", "3"])
    pngs = tmp_path / "pngs"
    pngs.mkdir()
    (pngs / "a.png").write_bytes((tmp_path / "in" / "ant" / "0.png").read_bytes())
    dm = ImageClassificationDataModule(shards=str(tmp_path / "out"), image_size=8, mean=0.5,
                                       std=0.25, predict_dir=str(pngs), batch_size=2)
    loader = dm.predict_dataloader()
    assert type(loader) is DataLoader
    images, names = next(iter(loader))
    assert images.shape == (1, 3, 8, 8) and list(names) == ["a.png"]


@pytest.mark.parametrize("height,width", [(30, 50), (37, 61)])
def test_image_data_follows_a_clip_style_processor(tmp_path, height, width):
    """shortest_edge resize + centre crop + bicubic + CLIP's mean/std, as data module
    arguments (data_settings), give the inputs of the repo's transformers-parity
    ImagePreprocessor for the same preprocessor_config.json, on non-square images: 30x50
    (resized 36x60, crop offset 14) and 37x61 (resized 36x59, offset 13.5, floored to 13 as
    transformers does, where torchvision's CenterCrop would round it to 14)."""
    from multimodal.convert.hf_preprocess import ImagePreprocessor
    from multimodal.data.vision import ImageClassificationDataModule
    from multimodal.tasks.pretrained import data_settings

    pre = {"image_processor_type": "CLIPImageProcessor", "do_resize": True,
           "size": {"shortest_edge": 36}, "resample": 3, "do_center_crop": True,
           "crop_size": {"height": 32, "width": 32}, "do_rescale": True,
           "rescale_factor": 1 / 255, "do_normalize": True,
           "image_mean": [0.48145466, 0.4578275, 0.40821073],
           "image_std": [0.26862954, 0.26130258, 0.27577711]}
    folder = tmp_path / "clip"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "preprocessor_config.json").write_text(json.dumps(pre))
    settings = data_settings(folder)
    assert settings["image_size"] == 32 and settings["resize"] == 36
    assert settings["interpolation"] == "bicubic"
    _images(tmp_path / "photos", per_class=2, size=40)
    pngs = tmp_path / "pngs"
    pngs.mkdir()
    pixels = np.random.default_rng(1).integers(0, 256, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(pngs / "wide.png")
    dm = ImageClassificationDataModule(train=str(tmp_path / "photos"), **settings)
    dm.predict = str(pngs)
    ours, names = next(iter(dm.predict_dataloader()))
    assert list(names) == ["wide.png"]
    theirs = ImagePreprocessor.from_dict(pre)([str(pngs / "wide.png")])
    assert ours.shape == theirs.shape == (1, 3, 32, 32)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


class OwnTexts:
    """Stands for a text data module with the ``tokenizer`` argument (textdata's modules)."""

    def __init__(self, train: str | None = None, tokenizer: str | None = None,
                 max_length: int = 128) -> None:
        self.train, self.tokenizer, self.max_length = train, tokenizer, max_length


def test_text_data_takes_the_folder_tokenizer_unless_set(tmp_path):
    bert = folders.bert_folder(tmp_path / "bert")

    def config(**data):
        return Namespace(
            model=Namespace(class_path="multimodal.tasks.ClassificationTask",
                            init_args=Namespace(pretrained=str(bert))),
            data=Namespace(class_path=f"{__name__}.OwnTexts",
                           init_args=Namespace(train="t.csv", **data)))

    cfg = config(tokenizer=None)
    assert follow_pretrained(cfg) == [] and cfg.data.init_args.tokenizer == str(bert)
    cfg = config(tokenizer="other/tokenizer.json")
    (warning,) = follow_pretrained(cfg)
    assert "other/tokenizer.json" in warning and str(bert) in warning
    assert cfg.data.init_args.tokenizer == "other/tokenizer.json"


def test_a_text_classifier_refuses_data_whose_tokenizer_is_too_big(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from multimodal.tasks import ClassificationTask

    bert = folders.bert_folder(tmp_path / "bert")
    task = ClassificationTask(modality="text", pretrained=str(bert), num_classes=2)
    data = SimpleNamespace(vocab_size=30522, max_length=32, num_classes=2,
                           class_names=["a", "b"])
    monkeypatch.setattr(ClassificationTask, "datamodule", property(lambda self: data))
    with pytest.raises(ValueError, match=r"tokenizer has 30522 tokens but the model's "
                                         r"embedding has 55 rows"):
        task.setup("fit")
    data.vocab_size, data.max_length = 55, 100
    with pytest.raises(ValueError, match="max_length 100 exceeds the model's max_len 64"):
        task.setup("fit")
    data.max_length = 64
    task.setup("fit")
    assert task.class_names == ["a", "b"]


def test_predict_from_a_checkpoint_without_data_arguments_says_so(tmp_path, capsys):
    ckpt = {"state_dict": {}, "hyper_parameters": {
        "_class_path": "multimodal.tasks.ClassificationTask"},
        "multimodal_model": {"model_type": "ViT", "model_config": {}}}
    torch.save(ckpt, tmp_path / "x.ckpt")
    with pytest.raises(SystemExit) as info:
        cli_main(["predict", "--ckpt_path", str(tmp_path / "x.ckpt"),
                  "--data.init_args.predict", "texts.txt"])
    assert info.value.code == 2
    assert "holds no data module arguments" in capsys.readouterr().err


FOOD = ["bread and jam", "pasta with garlic", "pizza and salad", "rice with beans",
        "tomato soup", "chocolate cake", "grilled fish", "eggs and toast"]
SKY = ["rain all day", "cold north wind", "clear sunny sky", "snow tonight",
       "storm from the west", "fog at noon", "freezing night", "clouds and drizzle"]


def test_text_fine_tuning_from_a_folder_through_the_cli(tmp_path, capsys):
    """configs/finetune_text.yaml with a BERT folder (its tokenizer.json tokenises the data),
    no class count anywhere; predict with the checkpoint alone prints class names."""
    bert = folders.bert_folder(tmp_path / "bert")
    texts = tmp_path / "texts.csv"
    rows = [f"{t},food" for t in FOOD] + [f"{t},sky" for t in SKY]
    texts.write_text("text,label\n" + "\n".join(rows) + "\n")
    config = ROOT / "configs" / "finetune_text.yaml"
    cli_main(["fit", "--config", str(config), "--model.init_args.pretrained", str(bert),
              "--data.init_args.train", str(texts), "--data.init_args.max_length", "32",
              "--data.init_args.val_size", "4", "--data.init_args.test_size", "4",
              "--data.init_args.batch_size", "4", "--trainer.max_epochs", "1",
              "--trainer.min_steps", "0",  # one epoch, not the config's step budget
              "--trainer.default_root_dir", str(tmp_path / "run"), "--test_after_fit",
              "false"])
    last = tmp_path / "run" / "version_0" / "checkpoints" / "last.ckpt"
    ckpt = torch.load(last, map_location="cpu", weights_only=True)
    assert ckpt["class_names"] == ["food", "sky"]
    assert ckpt["datamodule_hyper_parameters"]["tokenizer"] == str(bert)
    new = tmp_path / "new.txt"
    new.write_text("soup and bread\nsnow and wind\n")
    capsys.readouterr()
    cli_main(["predict", "--ckpt_path", str(last), "--data.init_args.predict", str(new),
              "--trainer.logger", "false", "--trainer.default_root_dir", str(tmp_path / "p")])
    lines = [ln.split("\t") for ln in capsys.readouterr().out.splitlines() if "\t" in ln]
    assert len(lines) == 2 and all(ln[1] in ("food", "sky") for ln in lines)
    # embed from the checkpoint alone: its tokenizer is the folder's the data module was given
    from multimodal.encoder import load_encoder
    from multimodal.tokenizers.hf_json import HFTokenizer

    texts = ["soup and bread", "snow and wind today"]
    found = load_encoder(last)
    assert found.tokenizer is not None
    given = load_encoder(last, tokenizer=HFTokenizer.from_file(bert / "tokenizer.json"))
    torch.testing.assert_close(found.encode(texts), given.encode(texts))
