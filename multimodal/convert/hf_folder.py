"""A folder in the Hugging Face layout (``config.json`` + safetensors) -> our model,
without transformers."""

from __future__ import annotations

import json
from pathlib import Path

from torch import Tensor, nn

from multimodal.convert.common import (
    HF_CONVERTERS,
    HF_MODEL_TYPES,
    HF_TIED,
    HFConfig,
    meta_parameters,
)
from multimodal.convert.ctranslate2 import from_ctranslate2, is_ctranslate2_dir


class _FolderModel:
    """What the converters read from a model: ``config`` and ``state_dict()``. Subclassed
    under the architecture's class name, the name the converters dispatch on."""

    def __init__(self, config: HFConfig, state: dict[str, Tensor]) -> None:
        self.config = config
        self._state = state

    def state_dict(self) -> dict[str, Tensor]:
        return self._state


def read_hf_weights(folder: str | Path) -> dict[str, Tensor]:
    """The tensors of ``model.safetensors``, or of every shard named by
    ``model.safetensors.index.json``. Pickled checkpoints (``pytorch_model.bin``, ...) are
    refused: unpickling can run code."""
    from safetensors.torch import load_file

    folder = Path(folder)
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        return load_file(str(single))
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index} has no 'weight_map'")
        shards = sorted(set(weight_map.values()))
        absent = [s for s in shards if not (folder / s).is_file()]
        if absent:
            raise FileNotFoundError(f"{index} names shards that are not in {folder}: "
                                    + ", ".join(absent))
        state: dict[str, Tensor] = {}
        for shard in shards:
            state.update(load_file(str(folder / shard)))
        listed = set(weight_map)
        if set(state) != listed:
            raise ValueError(f"{index} and its shards disagree: in the index only: "
                             f"{sorted(listed - set(state))}; in the shards only: "
                             f"{sorted(set(state) - listed)}")
        return state
    pickles = sorted(p.name for p in folder.iterdir()
                     if p.suffix in (".bin", ".pt", ".pth", ".ckpt", ".pkl"))
    if pickles:
        raise ValueError(f"{folder} holds only pickled weights ({', '.join(pickles)}); they "
                         "are refused because loading them can execute code. Save the model "
                         "as safetensors (save_pretrained(..., safe_serialization=True))")
    raise FileNotFoundError(f"{folder} has no model.safetensors or "
                            "model.safetensors.index.json")


def from_hf_folder(folder: str | Path) -> nn.Module:
    """A folder in the Hugging Face layout -> our model, without transformers. (A
    CTranslate2 Whisper directory, ``model.bin`` + ``config.json``, is recognised too:
    :func:`multimodal.convert.ctranslate2.from_ctranslate2`.)

    Reads ``config.json`` (its ``architectures``, else its ``model_type``) and the
    safetensors weights (one file or shards), then runs the same converter as for a live
    transformers model, so the result is identical. Errors name what is wrong: no
    ``config.json``, an unsupported architecture (with the supported ones), missing or
    unconverted keys, mis-shaped tensors, a missing shard, pickle-only weights.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder")
    if is_ctranslate2_dir(folder):  # faster-whisper's layout: model.bin, no safetensors
        return from_ctranslate2(folder)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{folder} has no config.json (a Hugging Face layout folder "
                                "holds config.json and model.safetensors)")
    try:
        data = json.loads(config_file.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{config_file} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{config_file}: expected a JSON object, got {type(data).__name__}")
    model_type = data.get("model_type")
    known = HF_MODEL_TYPES.get(model_type or "")
    archs = [a for a in data.get("architectures") or [] if a in HF_CONVERTERS]
    arch = archs[0] if archs else (known.base_class if known else None)
    if arch is None:
        raise ValueError(
            f"{config_file}: unsupported model (model_type={model_type!r}, architectures="
            f"{data.get('architectures')}); supported model_type: {sorted(HF_MODEL_TYPES)}, "
            f"architectures: {sorted(HF_CONVERTERS)}")
    state = read_hf_weights(folder)
    prefix = known.prefix if known else ""
    if known and arch == known.base_class and prefix and state and all(
        k.startswith(prefix) for k in state
    ):  # a base model saved inside its task model's naming
        state = {k[len(prefix):]: v for k, v in state.items()}
    config = HFConfig(data, config_file)
    if arch in HF_TIED and getattr(config, "tie_word_embeddings", model_type != "llama"):
        omitted, source = HF_TIED[arch]
        if omitted not in state and source in state:
            state[omitted] = state[source]
    snapshot = type(arch, (_FolderModel,), {})(config, state)
    try:
        with meta_parameters():  # the folder's tensors become the parameters: one copy
            return HF_CONVERTERS[arch](snapshot)
    except ValueError as err:
        raise ValueError(f"{folder}: {err}") from None
