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

import importlib

import pytest

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
