"""The weight format: ``config.json`` + ``model.safetensors``; no pickle anywhere.

This module sits below the models: it knows how a model's config and weights are written and
read, and finds a ``model_type``'s class in :data:`multimodal.registry.MODEL_CLASSES` (the
classes models register with :func:`multimodal.registry.register_model`). It never imports
a model; what needs every model
(``multimodal.from_pretrained`` by ``model_type``, checkpoints, encoders) is in
:mod:`multimodal.loading` and :mod:`multimodal.checkpoints`, above the models.

>>> model.save_pretrained("out/vit")
>>> same = type(model).from_pretrained("out/vit")     # or multimodal.from_pretrained
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re
import typing
from collections.abc import Container, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file, save_model
from torch import Tensor, nn

from multimodal.registry import MODEL_CLASSES, model_class

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
FORMAT_VERSION = 1

M = TypeVar("M", bound="PretrainedMixin")


def umask_mode(path: str | Path) -> Path:
    """Give ``path`` the mode any file this process creates gets (``0o666`` less the umask,
    0644 usually): safetensors writes its files 0600, readable by their owner only."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)
    return Path(path)


def save_safetensors(tensors: dict[str, Tensor], path: str | Path,
                     metadata: dict[str, str] | None = None) -> Path:
    """``safetensors.torch.save_file`` with the usual file mode (:func:`umask_mode`)."""
    save_file(tensors, str(path), metadata=metadata)
    return umask_mode(path)


def config_to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def config_from_dict(cls: type, data: dict[str, Any]) -> Any:
    """Rebuild a (possibly nested) dataclass config from JSON; unknown keys are an error.

    JSON has no tuples, so lists come back as tuples (configs hold no mutable lists).
    Init-only keywords are accepted as well as fields: a model config's flat backbone
    keywords read the configs saved before the backbone was nested
    (:mod:`multimodal.models.backbone`).
    """
    hints = typing.get_type_hints(cls)
    accepted = set(inspect.signature(cls).parameters)
    unknown = set(data) - accepted
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields: {sorted(unknown)}")
    kwargs = {}
    for name, value in data.items():
        sub = _dataclass_in(hints[name])
        if sub is not None and isinstance(value, dict):
            value = config_from_dict(sub, value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    return cls(**kwargs)


def _dataclass_in(hint: Any) -> type | None:
    if dataclasses.is_dataclass(hint):
        return hint
    return next((a for a in typing.get_args(hint) if dataclasses.is_dataclass(a)), None)


def read_meta(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """``(config file, its JSON)`` of a folder written by ``save_pretrained`` (or the
    ``config.json`` itself)."""
    path = Path(path)
    cfg_file = path / CONFIG_NAME if path.is_dir() else path
    if not cfg_file.is_file():
        raise FileNotFoundError(f"no {CONFIG_NAME} in {path}: expected a folder written by "
                                "save_pretrained")
    try:
        meta = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{cfg_file} is not valid JSON: {err}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict):
        raise ValueError(f"{cfg_file}: expected an object with 'model_type' and 'config'")
    return cfg_file, meta


def build_model(model_cls: type[M], config: dict[str, Any] | Any) -> M:
    """``model_cls(config)``, the config given as a dataclass or as its JSON dict."""
    if isinstance(config, dict):
        config = config_from_dict(model_cls.config_class, config)
    return model_cls(config)


class PretrainedMixin:
    """Adds ``save_pretrained`` / ``from_pretrained`` and ``num_params`` to a model built
    from ``self.config``."""

    config_class: type

    def save_pretrained(self, path: str | Path) -> Path:
        """Write ``config.json`` and ``model.safetensors`` into the folder ``path``."""
        assert isinstance(self, nn.Module)
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        meta = {"model_type": type(self).__name__, "format_version": FORMAT_VERSION,
                "config": config_to_dict(self.config)}
        (path / CONFIG_NAME).write_text(json.dumps(meta, indent=2))
        save_model(self, str(path / WEIGHTS_NAME))  # handles tied weights
        umask_mode(path / WEIGHTS_NAME)  # safetensors writes 0600
        return path

    @classmethod
    def from_pretrained(cls: type[M], path: str | Path, *, strict: bool = True) -> M:
        """Rebuild a model of this class (or a subclass) from a ``save_pretrained`` folder."""
        cfg_file, meta = read_meta(path)
        kind = meta.get("model_type")
        model_cls = cls if kind == cls.__name__ else MODEL_CLASSES.get(kind)
        if model_cls is None or not issubclass(model_cls, cls):
            raise ValueError(f"{path} holds a {kind}, not a {cls.__name__}")
        weights = cfg_file.parent / WEIGHTS_NAME
        if not weights.is_file():
            raise FileNotFoundError(f"weights file {weights} not found")
        # sizes and names checked from the header first: a hostile config.json (dim
        # 10000000, depth 100000) is refused before anything is allocated
        check_against_header(model_cls, meta["config"], cfg_file, weights, strict=strict)
        model = build_model(model_cls, meta["config"])
        load_state_dict_checked(model, load_safetensors(weights), strict=strict)
        return model.eval()

    def num_params(self, trainable_only: bool = False) -> int:
        """Number of parameters (tied weights counted once)."""
        assert isinstance(self, nn.Module)
        return sum(p.numel() for p in self.parameters()
                   if p.requires_grad or not trainable_only)


#: safetensors' dtype names -> torch's (the dtypes a header may declare)
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2, "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64,
}
#: a header larger than this is refused before it is read (safetensors' own limit)
MAX_HEADER_BYTES = 100_000_000


def name_list(names: typing.Iterable[str], limit: int = 20, sep: str = ", ") -> str:
    """``"a, b, c"``, or the first ``limit`` names and ``"... and 1 599 980 more"``: an
    error message stays readable however many names a hostile file produces."""
    names = list(names)
    shown = sep.join(names[:limit])
    if len(names) <= limit:
        return shown
    more = f"{len(names) - limit:,}".replace(",", " ")
    return f"{shown}{sep}... and {more} more"


def read_safetensors_header(file: str | Path) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """The ``{name: (dtype, shape)}`` that a safetensors file declares, read from its header
    alone (no tensor is read, whatever the sizes), and checked as the format requires:
    the 8-byte length, a JSON object, known dtypes, byte ranges that match each shape and
    dtype and tile the data exactly. A truncated file, a pickle or any other file renamed
    ``.safetensors`` is refused with a :class:`ValueError` naming the file.

    The layout: ``u64 n`` (little-endian), ``n`` bytes of JSON ``{name: {"dtype", "shape",
    "data_offsets": [begin, end]}, "__metadata__": {...}}``, then the data."""
    file = Path(file)
    if not file.is_file():
        raise FileNotFoundError(f"weights file {file} not found")
    size = file.stat().st_size
    refused = (f"{file} is not a safetensors file" + " ({}); pickled checkpoints are refused "
               "because loading them can execute code")
    with file.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(refused.format(f"{size} bytes, shorter than the 8-byte header "
                                            "length"))
        n = int.from_bytes(head, "little")
        if n > min(size - 8, MAX_HEADER_BYTES):
            raise ValueError(refused.format(f"its first 8 bytes declare a {n:,}-byte header; "
                                            f"the file has {size:,} bytes"))
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(refused.format(f"its header is not JSON: {err}")) from None
    if not isinstance(header, dict):
        raise ValueError(refused.format("its header is not a JSON object"))
    header.pop("__metadata__", None)
    out: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
    spans = []
    for name, entry in header.items():
        try:
            dtype = SAFETENSORS_DTYPES[entry["dtype"]]
            shape = tuple(int(d) for d in entry["shape"])
            begin, end = (int(o) for o in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{file}: tensor {name} has a malformed header entry {entry!r}"
                             ) from None
        if any(d < 0 for d in shape):
            raise ValueError(f"{file}: tensor {name} declares a negative size {shape}")
        nbytes = dtype.itemsize * _prod(shape)
        if end - begin != nbytes or begin < 0:
            raise ValueError(f"{file}: tensor {name} ({entry['dtype']}, {shape}) needs "
                             f"{nbytes:,} bytes but its data_offsets span {begin}..{end}")
        out[name] = (dtype, shape)
        spans.append((begin, end, name))
    data = size - 8 - n
    at = 0
    for begin, end, name in sorted(spans):
        if begin != at:
            raise ValueError(f"{file}: tensor {name} starts at data byte {begin:,}, expected "
                             f"{at:,} (overlapping or gapped tensors)")
        at = end
    if at != data:
        what = "truncated" if at > data else "has trailing bytes"
        raise ValueError(f"{file} is {what}: its header declares {at:,} bytes of tensor data, "
                         f"the file holds {data:,}")
    return out


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# ======================================================================================
# checking a config against a weights file before anything is allocated
# ======================================================================================


_VALUE_READS = {torch.Tensor.item: 0, torch.Tensor.__bool__: False, torch.Tensor.__int__: 0,
                torch.Tensor.__float__: 0.0, torch.Tensor.__index__: 0}


class _AllOnMeta(torch.overrides.TorchFunctionMode):
    """Factory calls that name a device (``device="cpu"``) still land on ``meta``; a
    constructor that reads a value of a meta tensor (torchaudio's filter-bank sanity
    check, say) reads 0 / False: the dry run builds shapes, the real run computes values."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        if func in _VALUE_READS and args and isinstance(args[0], Tensor) and args[0].is_meta:
            return _VALUE_READS[func]
        if func is torch.Tensor.tolist and args[0].is_meta:
            return torch.zeros(args[0].shape, dtype=args[0].dtype, device="cpu").tolist()
        if kwargs.get("device") is not None:
            kwargs["device"] = "meta"
        flat = [*args, *kwargs.values()]
        if any(isinstance(a, Tensor) and a.is_meta for a in flat):  # no cpu / meta mixes
            args = tuple(_meta(a) for a in args)
            kwargs = {k: _meta(v) for k, v in kwargs.items()}
        return func(*args, **kwargs)


def _meta(x: Any) -> Any:
    if isinstance(x, Tensor) and not x.is_meta and not isinstance(x, nn.Parameter):
        return x.to("meta")
    if isinstance(x, (list, tuple)) and any(isinstance(t, Tensor) for t in x):
        return type(x)(_meta(t) for t in x)
    return x


@contextmanager
def meta_build() -> Iterator[None]:
    """Models built inside have every tensor on ``meta`` (parameters and buffers, even
    those a module computes on the CPU on purpose): nothing is allocated, whatever sizes a
    config declares, so a config can be checked against a file's header first."""
    with torch.device("meta"), _AllOnMeta():
        yield


def config_int_fields(config: Mapping[str, Any], prefix: str = "") -> dict[str, int]:
    """Integer fields of a (nested) JSON config: ``{"text_config.hidden_size": 512, ...}``."""
    out: dict[str, int] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update(config_int_fields(value, f"{prefix}{key}."))
        elif isinstance(value, int) and not isinstance(value, bool):
            out[prefix + key] = value
    return out


def fields_hint(config_name: str, fields: Mapping[str, int], expected: Any, got: Any) -> str:
    """``" (config.json: hidden_size=32)"``: the config fields whose values are the
    expected sizes that the file's tensor does not have (all expected sizes if none)."""
    expected, got = tuple(expected), tuple(got)
    differing = {e for i, e in enumerate(expected) if i >= len(got) or got[i] != e} or \
        set(expected)
    named = [f"{k}={v}" for k, v in fields.items() if v in differing and v > 1]
    return f" ({config_name}: {', '.join(named[:6])})" if named else ""


#: config fields that count layers (checked against the layers that the weights hold)
DEPTH_FIELDS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "encoder_layers",
                "decoder_layers", "depth")
_LAYER_KEY = re.compile(r"^(.*?(?:^|\.)(?:layers?|h|blocks|block|resblocks))\.(\d+)\.")


def check_depth(config_file: Path, config: Mapping[str, Any], names: Iterable[str],
                weights_name: str) -> None:
    """No layer-count field of a config (nested ones included) exceeds the numbered layers
    the weights hold (``encoder.layer.0`` ... ``encoder.layer.11``): models are built and
    converted layer by layer, so a hostile ``num_hidden_layers: 100000`` is refused before
    anything loops over it."""
    groups: dict[str, set[int]] = {}
    for name in names:
        match = _LAYER_KEY.match(name)
        if match:
            groups.setdefault(match.group(1), set()).add(int(match.group(2)))
    if not groups:  # layers not numbered in the names (an RNN's weight_ih_l0): no check
        return
    most_name, most = max(groups.items(), key=lambda g: len(g[1]))
    for key, value in config_int_fields(config).items():
        if key.rsplit(".", 1)[-1] in DEPTH_FIELDS and value > len(most):
            raise ValueError(f"{config_file}: {key} = {value:,}, but {weights_name} holds "
                             f"{len(most)} layers ({most_name}.{min(most)} ... {most_name}."
                             f"{max(most)})")


def check_against_header(model_cls: type[M], config: dict[str, Any], cfg_file: Path,
                         weights_file: Path, strict: bool = True) -> None:
    """``model_cls(config)`` built on ``meta`` (:func:`meta_build`) against the header of
    ``weights_file`` (:func:`read_safetensors_header`): every size error names the tensor,
    both shapes and the config fields behind the expected one; missing / unexpected
    tensors are listed (capped). Nothing is allocated and no tensor read."""
    check_against_shapes(model_cls, config, read_safetensors_header(weights_file), cfg_file,
                         weights_file, strict)


def check_against_shapes(model_cls: type[M], config: dict[str, Any],
                         header: Mapping[str, tuple[torch.dtype, tuple[int, ...]]],
                         cfg_file: Path | str, weights_file: Path | str,
                         strict: bool = True) -> None:
    """:func:`check_against_header` for ``{name: (dtype, shape)}`` from anywhere."""
    cfg_file, weights_file = Path(cfg_file), Path(weights_file)
    check_depth(cfg_file, config, header, weights_file.name)
    compare_shapes(meta_model(model_cls, config, cfg_file), header, config, cfg_file,
                   weights_file, strict)


def meta_model(model_cls: type[M], config: dict[str, Any], cfg_file: Path | str) -> M:
    """``model_cls(config)`` with every tensor on ``meta`` (:func:`meta_build`); a config
    that builds nothing (0 heads, a negative or non-integer size) is a ``ValueError``
    naming ``cfg_file``. Run :func:`check_depth` first: the layers are Python objects."""
    try:
        with meta_build():
            return build_model(model_cls, config)
    except (TypeError, ZeroDivisionError, RuntimeError, AttributeError, KeyError,
            IndexError, OverflowError) as err:
        raise ValueError(f"{cfg_file} describes no model that can be built: "
                         f"{type(err).__name__}: {err}") from None


def compare_shapes(shadow: nn.Module, header: Mapping[str, tuple[torch.dtype, tuple[int, ...]]],
                   config: Mapping[str, Any], cfg_file: Path | str, weights_file: Path | str,
                   strict: bool = True) -> None:
    """The tensors of a model built on ``meta`` against ``{name: (dtype, shape)}`` of a
    file: mis-shaped (with the config fields behind the expected size), non-float,
    missing and unexpected tensors, each list capped."""
    cfg_file = Path(cfg_file)
    own = shadow.state_dict()
    fields = config_int_fields(config)
    shapes, dtypes = [], []
    for name in [k for k in own if k in header]:  # in the model's order
        dtype, shape = header[name]
        need = tuple(own[name].shape)
        if need != tuple(shape):
            shapes.append(f"{name}: expected {need}, got {tuple(shape)}"
                          f"{fields_hint(cfg_file.name, fields, need, shape)}")
        elif own[name].is_floating_point() and not dtype.is_floating_point:
            dtypes.append(f"{name} ({dtype})")
    missing = [k for k in own if k not in header and not is_tied_alias(shadow, k, header)]
    unexpected = [k for k in header if k not in own]
    problems = []
    if shapes:
        problems.append("mis-shaped: " + name_list(shapes, 8, sep="; "))
    if dtypes:
        problems.append("not floating point: " + name_list(dtypes))
    if strict and missing:
        problems.append("missing: " + name_list(missing))
    if strict and unexpected:
        problems.append("unexpected: " + name_list(unexpected))
    if problems:
        raise ValueError(f"{weights_file} does not fit {cfg_file}: " + " | ".join(problems))


def load_safetensors(file: str | Path) -> dict[str, torch.Tensor]:
    """Read a safetensors file; anything else (a pickle, say) is refused, never executed."""
    file = Path(file)
    if not file.is_file():
        raise FileNotFoundError(f"weights file {file} not found")
    read_safetensors_header(file)
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"{file} is not a safetensors file ({err}); pickled checkpoints are "
                         "refused because loading them can execute code") from None


def saved_parts(cfg_file: Path, meta: dict[str, Any], *, strict: bool = True
                ) -> tuple[type[nn.Module], Any, dict[str, Tensor]]:
    """``(model class, config, weights)`` of a ``save_pretrained`` folder from its parsed
    ``config.json`` (``meta``): the config checked against the safetensors header on
    ``meta`` before the weights are read; nothing is built, so a caller may change the
    config first (a fine-tune's ``overrides``) and build the model once."""
    if not isinstance(meta.get("config"), dict):
        raise ValueError(f"{cfg_file}: expected an object with 'model_type' and 'config'")
    model_cls = model_class(meta.get("model_type"), cfg_file)
    weights = cfg_file.parent / WEIGHTS_NAME
    if not weights.is_file():
        raise FileNotFoundError(f"weights file {weights} not found")
    check_against_header(model_cls, meta["config"], cfg_file, weights, strict=strict)
    config = config_from_dict(model_cls.config_class, meta["config"])
    return model_cls, config, load_safetensors(weights)


def load_state_dict_checked(model: nn.Module, state: dict[str, torch.Tensor],
                            strict: bool = True, assign: bool = False) -> None:
    """``load_state_dict`` with an error that lists every missing, unexpected or
    mis-shaped key at once (``assign``: the tensors become the parameters, no copy)."""
    own = model.state_dict()
    shape_errors = [f"{k}: expected {tuple(own[k].shape)}, got {tuple(v.shape)}"
                    for k, v in state.items() if k in own and own[k].shape != v.shape]
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    # tied weights are stored once by safetensors' save_model
    missing = [k for k in missing if not is_tied_alias(model, k, state)]
    problems = []
    if shape_errors:
        problems.append("mis-shaped: " + name_list(shape_errors, sep="; "))
    if strict and missing:
        problems.append("missing: " + name_list(missing))
    if strict and unexpected:
        problems.append("unexpected: " + name_list(unexpected))
    if problems:
        raise ValueError(f"state dict does not fit {type(model).__name__}: " + " | ".join(problems))
    model.load_state_dict(state, strict=False, assign=assign)


def is_tied_alias(model: nn.Module, key: str, state: Mapping[str, torch.Tensor]) -> bool:
    """Whether ``model``'s parameter ``key`` is the same tensor as another parameter whose
    name is in ``state`` (tied weights, stored once)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    if key not in params:
        return False
    return any(params[key] is p and k in state for k, p in params.items() if k != key)


def retie(model: nn.Module, groups: Iterable[list[str]], given: Container[str]) -> None:
    """Tie weights again after ``load_state_dict(..., assign=True)``, which gives every name
    its own tensor: each group of parameter names that shared one parameter (from
    ``named_parameters(remove_duplicate=False)``) points at the parameter of its first name
    in ``given`` (a group with none given, or of one name, is left as it is)."""
    for names in groups:
        present = [n for n in names if n in given]
        if len(names) > 1 and present:
            param = model.get_parameter(present[0])
            for name in names:
                owner, _, attr = name.rpartition(".")
                setattr(model.get_submodule(owner), attr, param)


__all__ = [
    "CONFIG_NAME",
    "FORMAT_VERSION",
    "WEIGHTS_NAME",
    "PretrainedMixin",
    "build_model",
    "check_against_header",
    "check_depth",
    "config_from_dict",
    "config_int_fields",
    "config_to_dict",
    "fields_hint",
    "is_tied_alias",
    "load_safetensors",
    "load_state_dict_checked",
    "meta_build",
    "name_list",
    "read_meta",
    "read_safetensors_header",
    "retie",
    "saved_parts",
]
