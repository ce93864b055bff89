"""A folder in the Hugging Face layout (``config.json`` + safetensors) -> our model,
without transformers."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from torch import Tensor, dtype, nn

from multimodal.convert.common import (
    HF_CONVERTERS,
    HF_MODEL_TYPES,
    HF_TIED,
    HFConfig,
    dry_run,
    meta_parameters,
    traced,
)
from multimodal.files import path_kind
from multimodal.weights import check_depth, name_list, read_safetensors_header


class _FolderModel:
    """What the converters read from a model: ``config`` and ``state_dict()``. Subclassed
    under the architecture's class name, the name the converters dispatch on."""

    def __init__(self, config: HFConfig, state: dict[str, Tensor]) -> None:
        self.config = config
        self._state = state

    def state_dict(self) -> dict[str, Tensor]:
        return self._state


def _weight_files(folder: Path) -> list[Path]:
    """``[model.safetensors]`` or the shards ``model.safetensors.index.json`` names, all
    present; pickle-only folders refused."""
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text()).get("weight_map")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as err:
            raise ValueError(f"{index} is not a JSON object: {err}") from None
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index} has no 'weight_map'")
        shards = sorted(set(map(str, weight_map.values())))
        absent = [s for s in shards if not (folder / s).is_file()]
        if absent:
            raise FileNotFoundError(f"{index} names shards that are not in {folder}: "
                                    + name_list(absent))
        return [folder / s for s in shards]
    pickles = sorted(p.name for p in folder.iterdir()
                     if p.suffix in (".bin", ".pt", ".pth", ".ckpt", ".pkl"))
    if pickles:
        raise ValueError(f"{folder} holds only pickled weights ({', '.join(pickles)}); they "
                         "are refused because loading them can execute code. Save the model "
                         "as safetensors (save_pretrained(..., safe_serialization=True))")
    raise FileNotFoundError(f"{folder} has no model.safetensors or "
                            "model.safetensors.index.json")


def read_hf_header(folder: str | Path) -> dict[str, tuple[Path, dtype, tuple[int, ...]]]:
    """``{name: (file, dtype, shape)}`` for every tensor of the folder, from the safetensors
    headers alone (no tensor read); truncated or non-safetensors files, and an index that
    disagrees with its shards, are refused naming the file."""
    folder = Path(folder)
    files = _weight_files(folder)
    out: dict[str, tuple[Path, dtype, tuple[int, ...]]] = {}
    for file in files:
        for name, (dt, shape) in read_safetensors_header(file).items():
            out[name] = (file, dt, shape)
    index = folder / "model.safetensors.index.json"
    if files != [folder / "model.safetensors"]:
        listed = set(json.loads(index.read_text())["weight_map"])
        if set(out) != listed:
            raise ValueError(f"{index} and its shards disagree: in the index only: "
                             f"{_capped(sorted(listed - set(out)))}; in the shards only: "
                             f"{_capped(sorted(set(out) - listed))}")
    return out


def _capped(names: list[str], limit: int = 20) -> str:
    return repr(names) if len(names) <= limit else f"[{name_list(names, limit)}]"


def read_hf_weights(folder: str | Path) -> dict[str, Tensor]:
    """The tensors of ``model.safetensors``, or of every shard named by
    ``model.safetensors.index.json``, every header checked before the first tensor is read
    (:func:`read_hf_header`). Pickled checkpoints (``pytorch_model.bin``, ...) are
    refused: unpickling can run code."""
    from safetensors.torch import load_file

    folder = Path(folder)
    files = sorted({file for file, _, _ in read_hf_header(folder).values()}) or \
        _weight_files(folder)
    state: dict[str, Tensor] = {}
    for file in files:
        try:
            state.update(load_file(str(file)))
        except (SafetensorError, OSError) as err:
            raise ValueError(f"{file} could not be read as safetensors: {err}") from None
    return state


def dry_convert(converter: Callable[[Any], nn.Module], arch: str, config: HFConfig,
                config_file: Path, data: Mapping[str, Any],
                header: Mapping[str, tuple[Path, dtype, tuple[int, ...]]],
                rename: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Run ``converter`` on ``meta`` stand-ins of the file's tensors (shapes and dtypes of
    the header): every shape the config implies is checked, in the file's names, and the
    model is built on ``meta``, before a byte of weights is read or a parameter allocated."""
    state = rename({name: traced(file.name, name, dt, shape)
                    for name, (file, dt, shape) in header.items()})
    snapshot = type(arch, (_FolderModel,), {})(config, state)
    try:
        with dry_run(config_file, data):
            converter(snapshot)
    except (TypeError, ZeroDivisionError, RuntimeError, AttributeError, KeyError,
            IndexError, OverflowError) as err:  # sizes that are no sizes: 0 heads, -5, "32"
        raise ValueError(f"{config_file} describes no model that can be built: "
                         f"{type(err).__name__}: {err}") from None


def _folder_converter(arch: str, folder: Path, data: dict[str, Any]) -> Callable[[Any], nn.Module]:
    """The converter of ``arch``; a whole Whisper takes its special tokens (languages, task
    and ``<|notimestamps|>`` ids) from the folder's vocabulary when it has one, else from
    the standard vocabulary layout (:func:`~multimodal.convert.hf_audio.whisper_from_hf`)."""
    converter = HF_CONVERTERS[arch]
    sot = data.get("decoder_start_token_id")
    if arch == "WhisperForConditionalGeneration" and isinstance(sot, int) and any(
            (folder / name).is_file()
            for name in ("tokenizer.json", "vocabulary.txt", "vocabulary.json")):
        from multimodal.convert.ctranslate2 import whisper_special_tokens

        tokens = whisper_special_tokens(folder, sot)
        return lambda model: converter(model, **tokens)
    return converter


def from_hf_folder(folder: str | Path, *, config: dict[str, Any] | None = None) -> nn.Module:
    """A folder in the Hugging Face layout -> our model, without transformers. (A
    CTranslate2 Whisper directory, ``model.bin`` + ``config.json``, is recognised too:
    :func:`multimodal.convert.ctranslate2.from_ctranslate2`.) A model comes out whole: a
    ``WhisperForConditionalGeneration`` folder, like a CTranslate2 one, is a
    :class:`~multimodal.Whisper`, encoder and decoder (its encoder: ``model.encoder``, or
    :func:`multimodal.loading.select_part`).

    Reads ``config.json`` (its ``architectures``, else its ``model_type``) and the
    safetensors weights (one file or shards), then runs the same converter as for a live
    transformers model, so the result is identical. Errors name what is wrong: no
    ``config.json``, an unsupported architecture (with the supported ones), missing or
    unconverted keys, mis-shaped tensors, a missing shard, pickle-only weights.

    A GGUF file (``*.gguf``, or any file starting with the GGUF magic) is read by
    :func:`multimodal.convert.gguf.from_gguf` instead.

    ``config``: the folder's ``config.json`` already parsed (by
    :func:`multimodal.loading.locate`, which found the folder to be of kind ``hf``): not
    read again.
    """
    folder = Path(folder)
    if config is not None:
        return _convert_folder(folder, folder / "config.json", config)
    # llama.cpp's one file (anything named *.gguf gets the GGUF reader's own error)
    if folder.suffix.lower() == ".gguf" or (folder.is_file() and path_kind(folder) == "gguf"):
        from multimodal.convert.gguf import from_gguf  # imported only for such a file

        return from_gguf(folder)
    if folder.is_file():
        raise ValueError(f"{folder} is a file, not a Hugging Face layout folder (config.json "
                         "and model.safetensors)")
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder")
    if path_kind(folder) == "ctranslate2":  # faster-whisper's layout: model.bin
        from multimodal.convert.ctranslate2 import from_ctranslate2

        return from_ctranslate2(folder)
    config_file = folder / "config.json"
    try:
        data = json.loads(config_file.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{config_file} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{config_file}: expected a JSON object, got {type(data).__name__}")
    return _convert_folder(folder, config_file, data)


def _convert_folder(folder: Path, config_file: Path, data: dict[str, Any]) -> nn.Module:
    """The Hugging Face folder ``folder`` whose ``config.json`` says ``data``, converted."""
    model_type = data.get("model_type")
    known = HF_MODEL_TYPES.get(model_type or "")
    archs = [a for a in data.get("architectures") or [] if a in HF_CONVERTERS]
    arch = archs[0] if archs else (known.base_class if known else None)
    if arch is None:
        raise ValueError(
            f"{config_file}: unsupported model (model_type={model_type!r}, architectures="
            f"{data.get('architectures')}); supported model_type: {sorted(HF_MODEL_TYPES)}, "
            f"architectures: {sorted(HF_CONVERTERS)}")
    header = read_hf_header(folder)
    check_depth(config_file, data, header, next(iter(header.values()))[0].name
                if header else "the weights")
    prefix = known.prefix if known else ""
    config = HFConfig(data, config_file)

    def rename(state: dict[str, Any]) -> dict[str, Any]:
        if known and arch == known.base_class and prefix and state and all(
            k.startswith(prefix) for k in state
        ):  # a base model saved inside its task model's naming
            state = {k[len(prefix):]: v for k, v in state.items()}
        if arch in HF_TIED and getattr(config, "tie_word_embeddings", model_type != "llama"):
            omitted, source = HF_TIED[arch]
            if omitted not in state and source in state:
                state[omitted] = state[source]
        return state

    converter = _folder_converter(arch, folder, data)
    try:
        dry_convert(converter, arch, config, config_file, data, header, rename)
        snapshot = type(arch, (_FolderModel,), {})(config, rename(read_hf_weights(folder)))
        with meta_parameters():  # the folder's tensors become the parameters: one copy
            return converter(snapshot)
    except ValueError as err:
        raise ValueError(f"{folder}: {err}") from None
