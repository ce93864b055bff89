"""What every converter shares: reading a foreign state dict key by key, writing ours,
config look-ups, and the registry of transformers architectures that the ``hf_*`` modules
fill (so a new converter is one new module, not an edit of a dispatch table)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from multimodal.weights import load_state_dict_checked

SUPPORTED = {
    "torchvision": "torchvision.models.VisionTransformer (vit_b_16, vit_b_32, vit_l_16, "
                   "vit_l_32, vit_h_14 or any custom size)",
    "timm": "timm VisionTransformer (vit_* models with a class token or global average "
            "pooling without fc_norm; layer scale, register tokens, qk_norm, distilled DeiT: "
            "vit_small_patch14_dinov2, vit_small_patch14_reg4_dinov2, deit_*_distilled_*)",
    "transformers": "ViTModel, ViTForImageClassification, GPT2Model, GPT2LMHeadModel, "
                    "BertModel, BertForMaskedLM, BertForSequenceClassification, "
                    "LlamaForCausalLM, LlamaModel, Dinov2Model, Dinov2WithRegistersModel, "
                    "DeiTModel, DeiTForImageClassificationWithTeacher, CLIPModel (-> CLIP); "
                    "or a Hugging Face "
                    "layout folder of one of them (from_hf_folder)",
}


# transformers' activation names -> ours
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                   "gelu_fast": "gelu_tanh", "relu": "relu", "silu": "silu", "swish": "silu",
                   "quick_gelu": "quick_gelu"}


# ======================================================================================
# the registry of transformers architectures
# ======================================================================================

#: architecture class name (``type(model).__name__``, ``config.json``'s ``architectures``)
#: -> the function that converts a model of it (reading ``model.config`` and
#: ``model.state_dict()`` only, so live models and folders go through the same code)
HF_CONVERTERS: dict[str, Callable[[Any], nn.Module]] = {}
#: tied output weights that ``save_pretrained`` stores once: (omitted key, the key it equals)
HF_TIED: dict[str, tuple[str, str]] = {}


@dataclass(frozen=True)
class HFModelType:
    """What a folder needs per ``config.json`` ``model_type`` beyond its converter.

    ``base_class``: the class converted when ``config.json`` names no supported
    architecture; ``prefix``: what a task model puts before its base model's keys;
    ``defaults``: config values older writers may leave out (transformers' own class
    defaults) for the keys the converters read; anything else absent is an error."""

    base_class: str
    prefix: str = ""
    defaults: Mapping[str, Any] = field(default_factory=dict)


HF_MODEL_TYPES: dict[str, HFModelType] = {}


def register_hf(converter: Callable[[Any], nn.Module], *architectures: str,
                tied: Mapping[str, tuple[str, str]] | None = None) -> None:
    """Make ``converter`` the one for each of ``architectures``."""
    for arch in architectures:
        if arch in HF_CONVERTERS:
            raise ValueError(f"two converters for {arch}")
        HF_CONVERTERS[arch] = converter
    HF_TIED.update(tied or {})


def register_hf_model_type(model_type: str, base_class: str, prefix: str = "",
                           **defaults: Any) -> None:
    HF_MODEL_TYPES[model_type] = HFModelType(base_class, prefix, defaults)


# ======================================================================================
# reading a foreign state dict, writing ours
# ======================================================================================


class StateReader:
    """Hands out the tensors of a foreign state dict by name and remembers which were
    used, so that absent keys and keys nothing reads can be reported together."""

    def __init__(self, state: Mapping[str, Tensor], source: str, prefix: str = "") -> None:
        self.state = dict(state)
        self.source = source
        self.prefix = prefix
        self.used: set[str] = set()
        self.missing: list[str] = []

    def take(self, *names: str) -> Tensor:
        """The first of ``names`` (alternative spellings) present, after the prefix."""
        for name in names:
            key = self.prefix + name
            if key in self.state:
                self.used.add(key)
                return self.state[key]
        self.missing.append(self.prefix + names[0])
        return torch.empty(0)

    def skip(self, *names: str) -> None:
        """Mark keys as deliberately not converted (they need not exist)."""
        self.used.update(self.prefix + n for n in names)

    def finish(self, ignore: Iterable[str] = ()) -> None:
        ignore = tuple(ignore)
        unused = [k for k in self.state if k not in self.used and not any(
            part in k for part in ignore)]
        problems = []
        if self.missing:
            problems.append("missing: " + ", ".join(self.missing))
        if unused:
            problems.append("not converted (a feature this package does not implement?): "
                            + ", ".join(unused))
        if problems:
            raise ValueError(f"cannot convert this {self.source} state dict: "
                             + " | ".join(problems))


_ASSIGNING: ContextVar[bool] = ContextVar("assigning", default=False)
_ON_META: ContextVar[bool] = ContextVar("parameters_on_meta", default=False)


def _to_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> nn.Parameter | None:
    """torch's global parameter-registration hook, active only in this context (thread /
    task) while :func:`meta_parameters` is entered: the new parameter moves to ``meta``."""
    if param is None or param.is_meta or not _ON_META.get() or _ASSIGNING.get():
        return None  # keep the parameter as given
    return nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)


@contextmanager
def meta_parameters() -> Iterator[None]:
    """Models built inside get their parameters on the ``meta`` device (their memory freed
    at once); buffers stay real (mel filter banks, masks). :func:`load_converted`
    then *assigns* the converted tensors as the parameters instead of copying into them, so
    a folder's weights are held once, not once read and once in the model.

    Uses torch's ``register_module_parameter_registration_hook`` (no patched methods); the
    hook acts only in the context that entered this manager, so models built meanwhile by
    other threads are untouched."""
    handle = torch.nn.modules.module.register_module_parameter_registration_hook(_to_meta)
    token = _ON_META.set(True)
    try:
        yield
    finally:
        _ON_META.reset(token)
        handle.remove()


def load_converted(model: nn.Module, state: dict[str, Tensor]) -> nn.Module:
    """Load ``state`` into ``model`` (checked: missing, unexpected, mis-shaped keys listed).
    A model built under :func:`meta_parameters` takes the tensors themselves (cast to the
    parameter's dtype where they differ); parameters shared by several names stay shared."""
    if not any(p.is_meta for p in model.parameters()):
        load_state_dict_checked(model, state)
        return model.eval()
    own = model.state_dict()
    state = {k: v.to(own[k].dtype) if k in own and v.dtype != own[k].dtype else v
             for k, v in state.items()}
    shared: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        shared.setdefault(id(p), []).append(name)
    token = _ASSIGNING.set(True)  # the assigned parameters must stay real
    try:
        load_state_dict_checked(model, state, assign=True)
        for names in shared.values():
            given = [n for n in names if n in state]
            if len(names) > 1 and given:
                param = model.get_parameter(given[0])
                for name in names:
                    owner, _, attr = name.rpartition(".")
                    setattr(model.get_submodule(owner), attr, param)
    finally:
        _ASSIGNING.reset(token)
    still = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if still:
        raise RuntimeError(f"converted {type(model).__name__} left without values: "
                           + ", ".join(still))
    return model.eval()


def put_linear(out: dict[str, Tensor], ours: str, weight: Tensor, bias: Tensor | None) -> None:
    out[f"{ours}.weight"] = weight
    if bias is not None:
        out[f"{ours}.bias"] = bias


def put_norm(out: dict[str, Tensor], ours: str, src: StateReader, theirs: str) -> None:
    out[f"{ours}.weight"] = src.take(f"{theirs}.weight")
    out[f"{ours}.bias"] = src.take(f"{theirs}.bias")


def activation_of(module: nn.Module) -> str:
    name = type(module).__name__  # torch's and timm's classes of the same name
    if name == "GELU":
        return "gelu_tanh" if getattr(module, "approximate", "none") == "tanh" else "gelu"
    if name == "GELUTanh":
        return "gelu_tanh"
    if name == "ReLU":
        return "relu"
    if name == "QuickGELU":
        return "quick_gelu"
    if name in ("SiLU", "Swish"):
        return "silu"
    raise ValueError(f"unsupported MLP activation {type(module).__name__}; "
                     "supported: GELU (exact or tanh), ReLU, QuickGELU, SiLU")


def hf_activation(cfg: Any, attr: str) -> str:
    act = getattr(cfg, attr)
    if act not in HF_ACTIVATIONS:
        raise ValueError(f"unsupported activation {attr}={act!r}; "
                         f"supported: {sorted(HF_ACTIVATIONS)}")
    return HF_ACTIVATIONS[act]


MISSING = object()


def cfg_get(cfg: Any, name: str, default: Any = MISSING) -> Any:
    value = getattr(cfg, name, default)
    if value is MISSING:
        raise ValueError(f"config has no {name!r} (needed to convert "
                         f"{getattr(cfg, 'model_type', 'this model')})")
    return value


def rope_theta(cfg: Any) -> float:
    params = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if isinstance(params, dict) and params.get("rope_type", params.get("type", "default")) \
            not in ("default", None):
        raise ValueError(f"rope scaling {params!r} is not supported (only the default rope)")
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    return float(theta if theta is not None else getattr(cfg, "rope_theta", 10000.0))


def qkv_from_separate(out: dict[str, Tensor], ours: str, src: StateReader, layer: str,
                      bias: bool) -> None:
    """Separate q/k/v (transformers >= 5: ``attention.{q,k,v,o}_proj``; before:
    ``attention.attention.{query,key,value}`` and ``attention.output.dense``) -> fused."""
    names = (("q", "query"), ("k", "key"), ("v", "value"))
    a = f"{layer}.attention"
    put_linear(out, f"{ours}.qkv",
               torch.cat([src.take(f"{a}.{p}_proj.weight", f"{a}.attention.{n}.weight")
                       for p, n in names]),
               torch.cat([src.take(f"{a}.{p}_proj.bias", f"{a}.attention.{n}.bias")
                       for p, n in names]) if bias else None)
    put_linear(out, f"{ours}.proj", src.take(f"{a}.o_proj.weight", f"{a}.output.dense.weight"),
               src.take(f"{a}.o_proj.bias", f"{a}.output.dense.bias"))


class HFConfig:
    """config.json as attributes, with ``HF_MODEL_TYPES[model_type].defaults`` for the
    keys older files omit."""

    def __init__(self, data: dict[str, Any], file: Path) -> None:
        self._data, self._file = data, file
        known = HF_MODEL_TYPES.get(data.get("model_type", ""))
        self._defaults = known.defaults if known else {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name == "num_labels" and "id2label" in self._data:
            return len(self._data["id2label"])
        if name in self._data:
            return self._data[name]
        if name in self._defaults:
            return self._defaults[name]
        raise AttributeError(f"{self._file} has no {name!r}")


def sub_config(cfg: Any, name: str) -> Any:
    sub = cfg_get(cfg, name)
    return HFConfig(sub, Path(f"config.json:{name}")) if isinstance(sub, dict) else sub
