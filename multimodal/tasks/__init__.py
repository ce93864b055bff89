"""LightningModules: the training logic, kept apart from the models.

Imported lazily, so that using one task does not import every other task's dependencies.
"""

from __future__ import annotations

import importlib
from typing import Any

_TASKS = {
    "ModelTask": "multimodal.tasks.base",
    "ClassificationTask": "multimodal.tasks.classification",
    "AutoregressiveImageTask": "multimodal.tasks.autoregressive",
    "LanguageModelTask": "multimodal.tasks.language_model",
    "MaskedLMTask": "multimodal.tasks.masked_lm",
    "SequenceClassificationTask": "multimodal.tasks.masked_lm",
    "Seq2SeqTask": "multimodal.tasks.seq2seq",
    "CaptioningTask": "multimodal.tasks.captioning",
    "ContrastiveTask": "multimodal.tasks.contrastive",
    "TTSTask": "multimodal.tasks.tts",
}

__all__ = sorted(_TASKS)


def __getattr__(name: str) -> Any:
    if name in _TASKS:
        return getattr(importlib.import_module(_TASKS[name]), name)
    raise AttributeError(f"module 'multimodal.tasks' has no attribute {name!r}")
