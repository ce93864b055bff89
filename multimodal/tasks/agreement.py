"""Model and data agree at one moment: :func:`reconcile`.

The CLI calls it once per run, in the step that makes the data module
(``multimodal.cli.main.MultimodalCLI.make_data``: the data module built with the settings
the pretrained model sets, then this), before the task's model is built; the links from the
data section to the task read its answer. It takes what the model needs from the data (the
class names, the sizes a preset's config takes: ``model_sizes``) and, with a pretrained
model, checks that the data can feed that model (:func:`check_data_fits`: the modality, the
tokenizer's size against the embedding's rows, ``max_length`` against ``max_len``, a
waveform's sampling rate against the model's front end) on the model's part built on
``meta`` (no weights), so a contradiction is one error before any weight is read or any
step is taken.

A data module it has checked is remembered with the source (:func:`agreed`): the task
built from that source has nothing left to check in ``setup``. Without the CLI
(``Trainer.fit(task, datamodule=...)``) a classifier's ``setup`` runs the same
:func:`check_data_fits` on the built model: one rule, in one place.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

__all__ = ["Agreement", "DataMismatch", "agreed", "check_data_fits", "reconcile"]

_AGREED: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Agreement:
    """What :func:`reconcile` decided: the task's ``class_names`` and ``data_sizes``
    (None where the data gives none), and whether the data was checked against the
    pretrained model (``checked``)."""

    class_names: list[str] | None
    data_sizes: dict[str, int] | None
    checked: bool = False


class DataMismatch(ValueError):
    """The data cannot feed the model; ``key``: the data module argument at fault
    (``modality``, ``tokenizer``, ``max_length``, ``sample_rate``)."""

    def __init__(self, what: str, key: str) -> None:
        super().__init__(what)
        self.key = key


def _class_names(datamodule: Any) -> list[str] | None:
    names = getattr(datamodule, "class_names", None)  # the data-module contract
    return [str(n) for n in names] if names else None


def _model_sizes(datamodule: Any) -> dict[str, int] | None:
    sizes = getattr(datamodule, "model_sizes", None)  # the data-module contract
    return {str(k): int(v) for k, v in sizes.items() if v is not None} if sizes else None


def check_data_fits(datamodule: Any, model: nn.Module) -> None:
    """A :class:`DataMismatch` (a ValueError) where ``datamodule`` cannot feed ``model``
    (built, or on ``meta``): the data's ``modality`` is not the model's; a text model's
    tokenizer has more ids (``vocab_size``) than its embedding has rows, or ``max_length``
    > ``max_len``; the data gives waveforms (``features`` false) at a ``sample_rate`` other
    than the model's front end's."""
    kind, ours = getattr(datamodule, "modality", None) or None, getattr(model, "modality", None)
    if kind is not None and ours is not None and kind != ours:
        raise DataMismatch(f"the model reads {ours} ({type(model).__name__}) but the data "
                           f"module {type(datamodule).__name__} gives {kind}", "modality")
    from multimodal.models.text import TextEncoder

    cfg = getattr(model, "config", None)
    if isinstance(model, TextEncoder):  # the data's tokens must fit the model
        vocab = getattr(datamodule, "vocab_size", None)
        length = getattr(datamodule, "max_length", None)
        if isinstance(vocab, int) and vocab > cfg.vocab_size:
            raise DataMismatch(f"the data's tokenizer has {vocab} tokens but the model's "
                               f"embedding has {cfg.vocab_size} rows (vocab_size): use the "
                               "model's own tokenizer (data tokenizer: the model folder)",
                               "tokenizer")
        if isinstance(length, int) and length > cfg.max_len:
            raise DataMismatch(f"data max_length {length} exceeds the model's max_len "
                               f"{cfg.max_len}", "max_length")
    rate, wants = getattr(datamodule, "sample_rate", None), getattr(cfg, "sample_rate", None)
    if getattr(datamodule, "features", True) is False and isinstance(rate, int) \
            and isinstance(wants, int) and rate != wants:
        raise DataMismatch(f"the data's waveforms are at {rate} Hz but the model's front "
                           f"end expects {wants} Hz (its sample_rate)", "sample_rate")


def reconcile(datamodule: Any, task: type | None, init: Mapping[str, Any],
              source: Any = None) -> Agreement:
    """Model and data agreed, once (module docstring): the data's class names and model
    sizes for ``task`` (its class; ``init``: its arguments as configured) and, for a task
    whose ``checks_data`` is true (a classifier) with ``source`` (a
    :class:`~multimodal.tasks.pretrained.PretrainedSource`), the data checked against the
    part of its model ``task`` trains (:func:`check_data_fits`, on ``meta``). A
    :class:`DataMismatch` names the contradiction."""
    checked = False
    accepts = getattr(task, "accepts", None)
    if source is not None and isinstance(accepts, tuple) and task is not None \
            and getattr(task, "checks_data", False):
        modality = init.get("modality") if "modality" in init else None
        try:  # on meta: no weight read, nothing allocated
            part = source.part_on_meta(modality, accepts, task.__name__)
        except ValueError:  # no part the task trains: the task's own build says so
            part = None
        if part is None:
            return Agreement(_class_names(datamodule), _model_sizes(datamodule))
        check_data_fits(datamodule, part)
        checked = True
        _AGREED[datamodule] = source
    return Agreement(_class_names(datamodule), _model_sizes(datamodule), checked)


def agreed(datamodule: Any, source: Any) -> bool:
    """Whether :func:`reconcile` checked ``datamodule`` against ``source``'s model."""
    try:
        return source is not None and _AGREED.get(datamodule) is source
    except TypeError:  # not weakly referable: never recorded
        return False
