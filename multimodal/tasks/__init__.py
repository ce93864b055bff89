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
    "Word2VecTask": "multimodal.tasks.word2vec",
}

# Class paths that stored runs (checkpoints' ``hyper_parameters["_class_path"]``, run
# config.yaml files) name, mapped once onto today's task: old path -> (new path, the
# hyper-parameters the new task does not take, those it takes in addition).
STORED_CLASS_PATHS: dict[str, tuple[str, tuple[str, ...], dict[str, Any]]] = {
    f"multimodal.tasks{module}.SequenceClassificationTask": (
        "multimodal.tasks.ClassificationTask", ("init_from",), {"modality": "text"})
    for module in ("", ".masked_lm")}

__all__ = sorted([*_TASKS, "STORED_CLASS_PATHS", "stored_task"])


def stored_task(class_path: str, hparams: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """``(class path, hyper-parameters)`` of today's task for those a checkpoint stored
    (:data:`STORED_CLASS_PATHS`); unchanged for a current class path. A folded task's
    stored hyper-parameters hold every argument it had (its own defaults included), so the
    mapped task trains and predicts as the old one did; ``init_from`` is dropped: the
    checkpoint already holds the weights it loaded. The flat optimiser keys of checkpoints
    written before the ``optimizer`` block (``lr``, ``weight_decay`` ...) move into it
    (:func:`~multimodal.tasks.optim.fold_stored_optimizer`)."""
    from multimodal.tasks.optim import fold_stored_optimizer

    hparams = fold_stored_optimizer(hparams)
    if class_path not in STORED_CLASS_PATHS:
        return class_path, hparams
    new, dropped, added = STORED_CLASS_PATHS[class_path]
    kept = {k: v for k, v in hparams.items() if k not in dropped}
    return new, {**kept, **added}


def __getattr__(name: str) -> Any:
    if name in _TASKS:
        return getattr(importlib.import_module(_TASKS[name]), name)
    raise AttributeError(f"module 'multimodal.tasks' has no attribute {name!r}")
