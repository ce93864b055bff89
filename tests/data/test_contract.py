"""The data-module contract (multimodal.data.contract): every data module declares its
modality, and where it has them its class names and model sizes; ``follow`` fills in what a
pretrained model implies."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import lightning as L
import pytest

import multimodal.data
from multimodal.data.contract import DataContract, follow_settings
from multimodal.data.splits import SplitDataModule

MODALITIES = {"image", "audio", "text", "text-text", "image+text", "text-audio"}


def _data_modules() -> list[type]:
    found = {}
    for info in pkgutil.walk_packages(multimodal.data.__path__, "multimodal.data."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, L.LightningDataModule) and cls.__module__ == info.name \
                    and not cls.__name__.startswith("_") and cls is not SplitDataModule:
                found[cls.__name__] = cls
    return sorted(found.values(), key=lambda c: c.__name__)


def test_every_data_module_declares_the_contract() -> None:
    modules = _data_modules()
    assert len(modules) >= 9, [c.__name__ for c in modules]
    for cls in modules:
        # Word2Vec's corpus has no held-out split (analogies judge it): the rest of the
        # contract still holds for it
        assert issubclass(cls, SplitDataModule) or cls.__name__ == "Word2VecDataModule", \
            cls.__name__
        assert cls.modality in MODALITIES, (cls.__name__, cls.modality)
        assert inspect.ismethod(cls.follow), cls.__name__  # a classmethod
        assert isinstance(inspect.getattr_static(cls, "model_sizes"), property), cls.__name__


def test_classification_data_give_what_their_model_reads() -> None:
    """A classifier checks the data's modality against its model's: each classification
    module names its model's modality."""
    import multimodal as mm
    from multimodal.data.audio import AudioClassificationDataModule
    from multimodal.data.text import SourceClassificationDataModule
    from multimodal.data.text_classification import TextClassificationDataModule
    from multimodal.data.vision import ImageClassificationDataModule

    assert ImageClassificationDataModule.modality == mm.ViT.modality == "image"
    assert AudioClassificationDataModule.modality == mm.AudioClassifier.modality == "audio"
    for cls in (SourceClassificationDataModule, TextClassificationDataModule):
        assert cls.modality == mm.TextEncoder.modality == "text"


def test_instances_satisfy_the_protocol(tmp_path) -> None:
    from multimodal.data.numbers import NumberWordsDataModule
    from multimodal.data.text_classification import TextClassificationDataModule

    texts = tmp_path / "t.csv"
    texts.write_text("text,label\n" + "".join(f"word {i},{'xy'[i % 2]}\n" for i in range(8)))
    labelled = TextClassificationDataModule(train=str(texts), vocab_size=50, max_length=24)
    numbers = NumberWordsDataModule(train_size=100, held_out=40, val_size=10, test_size=10)
    for dm in (labelled, numbers):
        assert isinstance(dm, DataContract)
    assert labelled.class_names == ["x", "y"] and numbers.class_names is None
    # the labelled texts declare the sizes a text model needs (the WordPiece not trained)
    assert labelled.model_sizes == {"vocab_size": 50, "max_len": 24}
    assert labelled.datasets == {}


class _Images:
    def __init__(self, train: str | None = None, image_size: int = 32,
                 mean: list[float] | None = None, std: list[float] | None = None) -> None:
        pass


def test_follow_fills_defaults_keeps_choices_and_skips_what_it_does_not_take() -> None:
    settings = {"image_size": 224, "mean": [0.5, 0.5, 0.5], "std": [0.2, 0.2, 0.2],
                "tokenizer": "folder"}
    args, warnings = follow_settings(_Images, settings, {"train": "x", "mean": [0.1, 0.1, 0.1]},
                                     "the pretrained model M")
    assert args == {"train": "x", "image_size": 224, "mean": [0.1, 0.1, 0.1],
                    "std": [0.2, 0.2, 0.2]}
    assert warnings == ["warning: data mean=[0.1, 0.1, 0.1] but the pretrained model M "
                        "expects mean=[0.5, 0.5, 0.5]; the data setting is kept"]
    # within 1e-6 counts as the same: no warning
    same, quiet = follow_settings(_Images, {"mean": [0.5, 0.5, 0.5]},
                                  {"mean": [0.5 + 1e-8, 0.5, 0.5]})
    assert quiet == [] and same["mean"][0] == pytest.approx(0.5)


def test_a_classifier_refuses_data_of_another_modality(monkeypatch) -> None:
    from types import SimpleNamespace

    import multimodal as mm
    from multimodal.tasks import ClassificationTask

    vit = mm.ViT(mm.ViTConfig(image_size=8, patch_size=4, in_channels=1, num_classes=2,
                              dim=16, depth=1, heads=2))
    task = ClassificationTask(vit)
    data = SimpleNamespace(modality="audio", class_names=["a", "b"])
    monkeypatch.setattr(ClassificationTask, "datamodule", property(lambda self: data))
    with pytest.raises(ValueError, match=r"the model reads image \(ViT\) but the data "
                                         r"module SimpleNamespace gives audio"):
        task.setup("fit")
