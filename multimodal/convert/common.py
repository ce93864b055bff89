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

from multimodal.weights import (
    config_int_fields,
    fields_hint,
    load_state_dict_checked,
    meta_build,
    name_list,
    retie,
)

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
            problems.append("missing: " + name_list(self.missing))
        if unused:
            problems.append("not converted (a feature this package does not implement?): "
                            + name_list(unused))
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


# ======================================================================================
# the dry run: a converter run on the shapes of a file's header, before anything is read
# ======================================================================================


@dataclass
class DryRun:
    """What a dry run reports against: the config file and its integer fields (nested
    sub-configs as ``text_config.hidden_size``)."""

    config_file: Path
    fields: dict[str, int]


_DRY_RUN: ContextVar[DryRun | None] = ContextVar("dry_run", default=None)


class Traced(Tensor):
    """A ``meta`` tensor standing for a file's tensor(s): ``sources`` holds
    ``(file, name in the file, shape)`` of every tensor it was computed from, carried
    through transposes, casts and concatenations, so a shape error names the file's
    tensors rather than ours. Comparisons of values (``torch.equal``) answer True: a dry
    run has no values; the real run checks them."""

    sources: tuple[tuple[str, str, tuple[int, ...]], ...] = ()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        if func is torch.equal:
            return True
        flat = [*args, *kwargs.values()]
        flat += [t for a in flat if isinstance(a, (list, tuple)) for t in a]
        sources = tuple(s for a in flat if isinstance(a, Traced) for s in a.sources)
        if func is torch.cat:
            _check_fusable(args[0], kwargs.get("dim", args[1] if len(args) > 1 else 0))
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        if isinstance(out, Tensor) and not isinstance(out, Traced):
            out = out.as_subclass(Traced)
        if isinstance(out, Traced) and not out.sources:
            out.sources = sources
        return out


def traced(file: str, name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> Traced:
    """The meta stand-in of tensor ``name`` of ``file``."""
    t = torch.empty(shape, dtype=dtype, device="meta").as_subclass(Traced)
    t.sources = ((file, name, shape),)
    return t


def _odd_one(parts: list[tuple[str, str, tuple[int, ...]]]) -> tuple[str, str, tuple] | None:
    """The one part whose shape differs from all the others (which agree), if there is one."""
    shapes = [p[2] for p in parts]
    odd = [p for p in parts if shapes.count(p[2]) == 1]
    return odd[0] if len(odd) == 1 and len(set(shapes)) == 2 and len(parts) > 2 else None


def _describe(parts: tuple[tuple[str, str, tuple[int, ...]], ...]) -> str:
    return ", ".join(f"{name} {tuple(shape)}" for _, name, shape in parts)


def _check_fusable(tensors: Any, dim: int) -> None:
    """Before q, k, v (or any parts) are concatenated: every dimension but ``dim`` agrees,
    else the error names the part that differs, in the file's names."""
    parts = [t for t in tensors if isinstance(t, Tensor) and t.numel()]
    if len(parts) < 2:
        return
    rest = [(t.dim(), *(d for i, d in enumerate(t.shape) if i != dim % max(t.dim(), 1)))
            for t in parts]
    if len(set(rest)) == 1:
        return
    sources = [s for t in parts for s in getattr(t, "sources", ())]
    file = sources[0][0] if sources else "the weights"
    odd = _odd_one(sources)
    if odd is not None:
        others = [s for s in sources if s is not odd]
        raise ValueError(f"{file}: {odd[1]} has shape {tuple(odd[2])}, unlike "
                         f"{_describe(tuple(others))} that it is fused with"
                         + _fields_hint(others[0][2], odd[2]))
    raise ValueError(f"{file}: cannot fuse tensors of different shapes: "
                     f"{_describe(tuple(sources))}")


def _fields_hint(expected: Any, got: Any) -> str:
    dry = _DRY_RUN.get()
    return "" if dry is None else fields_hint(dry.config_file.name, dry.fields, expected, got)


@contextmanager
def dry_run(config_file: Path, config: Mapping[str, Any]) -> Iterator[None]:
    """Inside, models are built on the ``meta`` device (nothing allocated, whatever the
    config declares: :func:`multimodal.weights.meta_build`) and :func:`load_converted`
    checks shapes and dtypes against the :class:`Traced` tensors of the file instead of
    loading them."""
    token = _DRY_RUN.set(DryRun(Path(config_file), config_int_fields(config)))
    try:
        with meta_build():
            yield
    finally:
        _DRY_RUN.reset(token)


def _check_dry(model: nn.Module, state: Mapping[str, Tensor], dry: DryRun) -> None:
    """Shapes and dtypes of the converted file tensors against the model's, reported in
    the file's names; then the usual missing / unexpected check."""
    own = model.state_dict()
    problems = []
    for key, value in state.items():
        if key not in own:
            continue
        sources = getattr(value, "sources", ())
        names = _describe(sources) if sources else key
        file = sources[0][0] if sources else "the weights"
        if tuple(own[key].shape) != tuple(value.shape):
            odd = _odd_one(list(sources))
            which = f"; {odd[1]} is the one that differs" if odd else ""
            got, need = tuple(value.shape), tuple(own[key].shape)
            what = (f"{sources[0][1]} is {got}" if len(sources) == 1 and sources[0][2] == got
                    else f"{names} give {got}")
            problems.append(f"{file}: {what} but the config needs {need}"
                            f"{_fields_hint(need, got)} (our {key}: expected {need}, got {got})"
                            f"{which}")
        elif own[key].is_floating_point() and not (value.is_floating_point() or
                                                    value.numel() == 0):
            problems.append(f"{file}: {names} is stored as {value.dtype}, not a floating-point "
                            f"type (needed for our {key})")
    if problems:
        raise ValueError("the weights do not fit the config: " + name_list(problems, 8, sep="; "))
    meta_state = {k: torch.empty(v.shape, dtype=own[k].dtype if k in own else v.dtype,
                                 device="meta") for k, v in state.items()}
    load_state_dict_checked(model, meta_state, assign=True)


def build(model_cls: Callable[..., nn.Module], *args: Any, **kwargs: Any) -> nn.Module:
    """``model_cls(*args, **kwargs)``; inside :func:`meta_parameters` (a folder's
    conversion) built under ``torch.device("meta")``, so no parameter is ever allocated on
    the CPU (the registration hook alone would move each one to ``meta`` only after torch
    created it). Buffers computed from the config (filter banks, position tables) stay real:
    the modules that hold them compute them off ``meta`` (``nn.init.off_meta``)."""
    if not _ON_META.get() or _DRY_RUN.get() is not None:
        return model_cls(*args, **kwargs)
    with torch.device("meta"):
        return model_cls(*args, **kwargs)


def load_converted(model: nn.Module, state: dict[str, Tensor]) -> nn.Module:
    """Load ``state`` into ``model`` (checked: missing, unexpected, mis-shaped keys listed).
    A model built under :func:`meta_parameters` takes the tensors themselves (cast to the
    parameter's dtype where they differ); parameters shared by several names stay shared.
    In a :func:`dry_run` only the checks run, in the file's names."""
    dry = _DRY_RUN.get()
    if dry is not None:
        _check_dry(model, state, dry)
        return model
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
        retie(model, shared.values(), state)
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
