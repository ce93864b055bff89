"""What every data module declares to the task it feeds: the one place model and data agree.

* ``modality``: what an item is (``"image"``, ``"audio"``, ``"text"``, ``"text-text"`` for
  pairs, ``"image+text"`` for captioned images, ``"text-audio"`` for speech): a classifier
  checks it against its model's, and a pretrained folder's part is picked by it.
* ``class_names``: the classes in label order, or None where items have none; a
  classifier's head has ``len(class_names)`` outputs.
* ``model_sizes``: the sizes a model of these data must have, by config field name
  (``image_size``, ``in_channels``, ``n_mels``, ``vocab_size``, ``max_len`` ...): the
  ``multimodal`` CLI links them into the task's ``data_sizes``, which a preset takes.
* ``follow(settings, given)``: the other way round, the data arguments a pretrained model
  implies (:func:`multimodal.tasks.pretrained.data_settings`: image size, mean / std, the
  folder's tokenizer, waveforms for the model's own audio front end) filled in where the
  config left the module's default.

:class:`~multimodal.data.splits.SplitDataModule`, the base of every data module, holds the
defaults; each module declares what it has.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

__all__ = ["DataContract", "follow_settings"]


@runtime_checkable
class DataContract(Protocol):
    """The attributes a task reads from its data module (module docstring)."""

    modality: str
    class_names: list[str] | None

    @property
    def model_sizes(self) -> dict[str, int]: ...

    @classmethod
    def follow(cls, settings: Mapping[str, Any], given: Mapping[str, Any]
               ) -> tuple[dict[str, Any], list[str]]: ...


def _defaults(cls: type) -> dict[str, Any]:
    return {n: p.default for n, p in inspect.signature(cls.__init__).parameters.items()
            if p.default is not inspect.Parameter.empty}


def _differs(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) != len(b) or any(abs(float(x) - float(y)) > 1e-6
                                       for x, y in zip(a, b, strict=True))
    return a != b


def follow_settings(cls: type, settings: Mapping[str, Any], given: Mapping[str, Any],
                    source: str = "the pretrained model") -> tuple[dict[str, Any], list[str]]:
    """``(arguments, warnings)``: the data module ``cls``'s arguments ``given`` with each of
    ``settings`` that ``cls`` takes filled in where ``given`` leaves it unset, None or at the
    module's default; a setting the module does not take is skipped. A value set away from
    the model's is kept, with a warning naming both (``source`` names the model)."""
    defaults = _defaults(cls)
    args, warnings = dict(given), []
    for key, value in settings.items():
        if key not in defaults:
            continue
        current = args.get(key, defaults[key])
        if current is None or current == defaults[key]:
            args[key] = value
        elif _differs(current, value):
            warnings.append(f"warning: data {key}={current!r} but {source} expects "
                            f"{key}={value!r}; the data setting is kept")
    return args, warnings
