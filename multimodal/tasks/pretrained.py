"""``pretrained: PATH`` for every task: the model (architecture and weights) from a folder or
a checkpoint, the YAML's model keys as overrides, one line saying what was loaded.

PATH is one of

* a Hugging Face layout folder (``config.json`` + safetensors: anything
  :func:`multimodal.convert.from_hf_folder` reads),
* a folder written by ``save_pretrained`` (ours: ``config.json`` with a nested ``config``),
* a Lightning ``.ckpt`` of one of our tasks (its model; class names when it has them),
* a CTranslate2 Whisper folder (faster-whisper's ``model.bin`` layout: the audio
  classifier takes its encoder),
* a llama.cpp ``.gguf`` file of the Llama family (dequantised: ``mm.from_hf`` reads it).

A task takes the *part* of that model it can train: an image classifier takes a ViT, or
the vision tower of a CLIP / SigLIP folder or of a captioner; a text classifier a
TextEncoder or CLIP's text tower; an audio classifier an AudioClassifier. A folder with no
such part is an error naming what it holds and what the task needs.

``overrides`` (a dict of config fields: ``num_classes``, ``drop_path``, ``dropout`` ...)
change the part's config *before* its one model is built (nanoGPT's ``from_pretrained``):
every weight whose name and shape still fit is loaded, the others (a head of another class
count) keep their fresh initialisation. Weights outside the head that would not fit are an
error, raised on ``meta`` before anything is allocated: an override that changes the
architecture (``dim``, ``depth``) cannot start from PATH.

PATH is read once per fine-tune: :func:`pretrained_source` resolves it, reads what is there
(a checkpoint's one ``torch.load``, a folder's ``config.json``) into a
:class:`PretrainedSource`, and keeps it for the process (keyed by the path as given and
the files' modification times, the last :data:`SOURCE_CACHE_SIZE`), so the CLI's
data-follows-model step (:func:`data_settings`) and the task's model
(:meth:`PretrainedSource.model_for`) share that one read.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from multimodal.checkpoints import (
    checkpoint_parts,
    checkpoint_tokenizer,
    datamodule_arguments,
    model_from_checkpoint,
    read_checkpoint,
)
from multimodal.files import CONFIG_NAME, PathKind
from multimodal.loading import Loaded, load, load_located, locate, select_part
from multimodal.moved import old_names
from multimodal.tasks.presets import preset_model, with_fields
from multimodal.weights import build_model, is_tied_alias, meta_build, retie, saved_parts

__all__ = ["PretrainedSource", "data_settings", "head_names",
           "pretrained_source", "task_model"]

# Top-level modules that make a model's head: re-initialised when their shape changes,
# trained by a linear probe, given ``head_lr``.
HEAD_MODULES = ("head", "head_dist", "head_norm", "attn_pool", "mlm", "visual_projection",
                "text_projection", "logit_scale", "logit_bias")


def _load_pretrained(path: str | Path) -> Loaded:
    """What the deprecated ``load_pretrained`` gives: :func:`multimodal.loading.load` of
    PATH, the model in train mode."""
    source = load(path)
    source.model.train()
    return source


__getattr__ = old_names(__name__, {
    "load_pretrained": (lambda: _load_pretrained,
                        "multimodal.load(path) (its .model, in eval mode: .train() it)")})


def head_names(model: nn.Module) -> list[str]:
    """The names of ``model``'s parameters that belong to its head (:data:`HEAD_MODULES`)."""
    return [n for n, _ in model.named_parameters() if n.split(".", 1)[0] in HEAD_MODULES]


SOURCE_CACHE_SIZE = 2
"""How many :class:`PretrainedSource` reads the process keeps (:func:`pretrained_source`)."""

_SOURCES: OrderedDict[tuple[str, str], PretrainedSource] = OrderedDict()


def _stamp(path: Path) -> tuple[int, ...]:
    """When and how big the files behind ``path`` are: a source read before they changed is
    read again."""
    files = [path] if path.is_file() else [path, path / CONFIG_NAME,
                                           path / "model.safetensors"]
    out: list[int] = []
    for file in files:
        try:
            st = file.stat()
        except OSError:
            out += [0, 0]
            continue
        out += [st.st_mtime_ns, st.st_size]
    return tuple(out)


@dataclass(eq=False)
class PretrainedSource:
    """A pretrained PATH read once (module docstring): the resolved ``path``, its ``kind``
    (:data:`multimodal.files.PathKind`), a checkpoint's dict (its one ``torch.load``) or a
    folder's parsed ``config.json`` (``meta``). What the CLI asks of it (the data settings,
    whether the model has the task's part) and what the task takes (the model with its
    overrides, the tokenizer, class names, pooling) all come from this one read.

    The weights are held until :meth:`model_for` has built the model, then released (a
    second model from the same source reads them again)."""

    path: Path
    kind: PathKind
    checkpoint: dict[str, Any] | None = None
    meta: dict[str, Any] | None = None
    stamp: tuple[int, ...] = ()
    _loaded: Loaded | None = field(default=None, repr=False)
    _tokenizer: Any = field(default=None, repr=False)
    _tokenizer_read: bool = field(default=False, repr=False)

    @classmethod
    def read(cls, path: str | Path) -> PretrainedSource:
        """PATH resolved (an installed model's name: its folder) and read: a checkpoint's
        dict, a folder's ``config.json``. ``FileNotFoundError`` / ``ValueError`` naming the
        path and the problem: missing, a file that is not a checkpoint, a folder without a
        model."""
        resolved, kind, meta = locate(path)
        ckpt = read_checkpoint(resolved) if kind == "checkpoint" else None
        return cls(resolved, kind, ckpt, meta, _stamp(resolved))

    # -- what comes with the model ------------------------------------------------------
    @property
    def data_arguments(self) -> dict[str, Any]:
        """A checkpoint's data module arguments (empty for a folder)."""
        return datamodule_arguments(self.checkpoint) if self.checkpoint is not None else {}

    @property
    def class_names(self) -> list[str] | None:
        names = (self.checkpoint or {}).get("class_names")
        return [str(n) for n in names] if isinstance(names, (list, tuple)) else None

    @property
    def pooling(self) -> Any:
        """A sentence-transformers folder's pooling (None for other paths)."""
        if self.kind not in ("hf", "save_pretrained"):
            return None
        from multimodal.convert.hf_pooling import read_folder_pooling

        return read_folder_pooling(self.path)

    @property
    def tokenizer(self) -> Any:
        """The tokenizer that came with PATH (a folder's ``tokenizer.json``, a GGUF file's
        metadata, the tokenizer a checkpoint carries), read on first use; None when none."""
        if not self._tokenizer_read:
            self._tokenizer = self._read_tokenizer()
            self._tokenizer_read = True
        return self._tokenizer

    def _read_tokenizer(self) -> Any:
        if self.checkpoint is not None:
            return checkpoint_tokenizer(self.checkpoint)
        if self.kind in ("gguf", "ctranslate2"):
            return self._converted().tokenizer
        from multimodal.tokenizers.io import TOKENIZER_NAME, read_tokenizer

        file = self.path / TOKENIZER_NAME
        return read_tokenizer(file) if file.is_file() else None

    def data_settings(self) -> dict[str, Any]:
        """The data settings PATH implies (:func:`data_settings`)."""
        from multimodal.convert.hf_preprocess import AUDIO_EXTRACTORS, read_preprocessor_config
        from multimodal.tokenizers.io import TOKENIZER_NAME

        if self.checkpoint is not None:
            return {k: v for k, v in self.data_arguments.items()
                    if k in PREPROCESSING_KEYS and v is not None}
        out: dict[str, Any] = {}
        if not self.path.is_dir():
            return out
        pre = read_preprocessor_config(self.path)
        if pre is not None:
            if pre.get("feature_extractor_type") in AUDIO_EXTRACTORS:
                out["features"] = False  # waveforms: the model's front end makes its features
            else:
                out.update(_image_settings(pre))
        elif self.kind == "save_pretrained":
            out.update(_config_image_settings(self.meta or {}))  # ours: its config.json's size
        if (self.path / TOKENIZER_NAME).is_file():
            out["tokenizer"] = str(self.path)
        return out

    # -- the model --------------------------------------------------------------------
    def _converted(self) -> Loaded:
        """A Hugging Face / CTranslate2 / GGUF path through its converter
        (:func:`multimodal.loading.load`: the folder's tensors become the parameters, one
        copy), kept until :meth:`model_for` has built the task's model."""
        if self._loaded is None:  # the tokenizer of a folder: read by :attr:`tokenizer`
            self._loaded = load_located((self.path, self.kind, self.meta),
                                        tokenizer=self.kind in ("gguf", "ctranslate2"))
        return self._loaded

    def _whole(self) -> tuple[type[nn.Module], Any, dict[str, torch.Tensor]]:
        """``(model class, config, weights)`` of the whole model at PATH, built for nothing
        where the path stores them apart (a checkpoint, a ``save_pretrained`` folder); a
        converted folder or file gives its converted model's."""
        if self.kind == "checkpoint":
            if self.checkpoint is None or "state_dict" not in self.checkpoint:
                self.checkpoint = read_checkpoint(self.path)  # released by a model before
            model_cls, cfg, state, lora = checkpoint_parts(self.checkpoint, self.path)
            if lora is not None:  # adapters merged into the base weights: LoRA's own build
                model = model_from_checkpoint(self.checkpoint, self.path)
                return type(model), model.config, model.state_dict()
            from multimodal.weights import config_from_dict

            return model_cls, config_from_dict(model_cls.config_class, cfg), state
        if self.kind == "save_pretrained":
            return saved_parts(self.path / CONFIG_NAME, self.meta or {})
        model = self._converted().model
        return type(model), model.config, model.state_dict()

    def _release(self) -> None:
        if self.kind in ("gguf", "ctranslate2") and not self._tokenizer_read:
            self.tokenizer  # noqa: B018  (read before the converted model goes)
        self._loaded = None
        if self.checkpoint is not None:
            self.checkpoint = {k: v for k, v in self.checkpoint.items() if k != "state_dict"}

    def check_part(self, modality: str | None, accept: tuple[type, ...], task: str) -> None:
        """Whether PATH's model has a part ``task`` can train (a ValueError naming what it
        holds and what the task needs, :func:`~multimodal.loading.select_part`), decided on a
        model built on ``meta`` (nothing allocated, no weights read). A path whose model
        cannot be described passes: the task's own load says why."""
        self.part_on_meta(modality, accept, task)

    def part_on_meta(self, modality: str | None, accept: tuple[type, ...],
                     task: str) -> nn.Module | None:
        """The part of PATH's model ``task`` trains, built on ``meta`` (a converted path: of
        its converted model, kept for :meth:`model_for`); None where the model cannot be
        described (the task's own load says why); a ValueError where it has no such part."""
        try:
            whole = self._shadow()
        except (FileNotFoundError, ValueError, OSError):
            return None
        return select_part(whole, modality, accept, self.path, task)

    def _shadow(self, blueprint: tuple[type[nn.Module], Any] | None = None) -> nn.Module:
        """The whole model on ``meta`` (a converted path: its converted model)."""
        if self.kind not in ("checkpoint", "save_pretrained"):
            return self._converted().model
        model_cls, config = blueprint or self._blueprint()
        with meta_build():
            return build_model(model_cls, config)

    def _blueprint(self) -> tuple[type[nn.Module], Any]:
        """``(model class, config)`` of a checkpoint or ``save_pretrained`` folder, no
        weights read beyond the checkpoint's one load."""
        from multimodal.registry import model_class
        from multimodal.weights import config_from_dict

        if self.kind == "checkpoint":
            if self.checkpoint is None or "state_dict" not in self.checkpoint:
                self.checkpoint = read_checkpoint(self.path)
            about = self.checkpoint.get("multimodal_model") \
                or self.checkpoint.get("hyper_parameters") or {}
            model_cls = model_class(about.get("model_type"), self.path)
            return model_cls, config_from_dict(model_cls.config_class,
                                               about.get("model_config") or {})
        meta = self.meta or {}
        model_cls = model_class(meta.get("model_type"), self.path / CONFIG_NAME)
        return model_cls, config_from_dict(model_cls.config_class, meta.get("config") or {})

    def model_for(self, task: str, accept: tuple[type, ...], modality: str | None = None,
                  overrides: dict[str, Any] | None = None) -> nn.Module:
        """The part of PATH's model ``task`` trains, built once with ``overrides`` (and the
        source's pooling, :func:`source_pooling`) in its config, every weight that still
        fits loaded, in train mode; logs one line: what was loaded, what is new, what was
        left out. A weight outside the head that would no longer fit is a ValueError raised
        before the model is built."""
        where = f"pretrained {self.path}"
        model_cls, config, state = self._whole()
        whole = self._shadow((model_cls, config))
        part = select_part(whole, modality, accept, self.path, task)
        prefix = "" if part is whole else \
            next(name for name, m in whole.named_modules() if m is part) + "."
        pooling = {k: v for k, v in source_pooling(self, part, whole).items()
                   if k not in (overrides or {}) and getattr(part.config, k) != v}
        changes = {**pooling, **(overrides or {})}
        part_cls = type(part)
        part_config = part.config
        if changes:
            try:
                part_config = with_fields(part_config, changes)
            except ValueError as err:
                raise ValueError(f"{where}: {err}") from err
        own_state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        with meta_build():  # the planned model's shapes, nothing allocated
            planned_model = part_cls(part_config)
        planned = planned_model.state_dict()
        fits = {k: v for k, v in own_state.items()
                if k in planned and tuple(planned[k].shape) == tuple(v.shape)}
        tied = {k for k in planned if k not in fits and is_tied_alias(planned_model, k, fits)}
        heads = {k for k in planned if k.split(".", 1)[0] in HEAD_MODULES}
        broken = [k for k in planned if k not in fits and k not in heads and k not in tied]
        if broken:
            names = f"{', '.join(broken[:6])}{' ...' if len(broken) > 6 else ''}"
            raise ValueError(f"{where}: the overrides {changes} change the architecture: "
                             f"{names} no longer fit the pretrained weights (only head fields "
                             f"and regularisation such as num_classes, drop_path, dropout can "
                             f"be overridden)" if changes else
                             f"{where}: {names} missing from its weights")
        model = _build_loaded(part_cls, part_config, fits)  # the one model
        model.train()
        self._release()
        new = [k for k in planned if k not in fits and k not in tied]
        left = [k for k in state if not (k.startswith(prefix) and k[len(prefix):] in fits)]
        loaded = [k for k in planned if k in fits]
        pooled = f"; pooling: {pooling}" if pooling else ""
        rank_zero_info(f"pretrained: {part_cls.__name__} from {self.path} ({self.kind}): "
                       f"loaded {len(loaded)} tensors; new: {_short(new)}; left out: "
                       f"{_short(left)}{pooled}")
        return model


def _build_loaded(model_cls: type[nn.Module], config: Any,
                  fits: dict[str, torch.Tensor]) -> nn.Module:
    """``model_cls(config)`` holding ``fits``: built with its parameters on ``meta`` (no
    weight drawn only to be replaced), ``fits`` assigned as its parameters (cast to their
    dtype; parameters shared by several names stay shared), then each parameter ``fits``
    does not give (a new head) allocated and drawn as the model's own ``init_weights``
    draws it (a Linear ~ truncated N(0, 0.02^2), zero bias; a LayerNorm the identity). A
    new parameter of another kind of module is built the plain way: the whole model drawn,
    then ``fits`` copied in."""
    from multimodal.convert.common import meta_parameters
    from multimodal.nn.init import init_weights

    with meta_parameters():
        model = model_cls(config)
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    new = [group for group in names.values() if not any(n in fits for n in group)]
    owners = {model.get_submodule(n.rpartition(".")[0]) for group in new for n in group}
    if any(not isinstance(m, (nn.Linear, nn.LayerNorm)) for m in owners):
        model = model_cls(config)
        model.load_state_dict(fits, strict=False)
        return model
    own = model.state_dict()
    state = {k: v.to(own[k].dtype) if v.dtype != own[k].dtype else v for k, v in fits.items()}
    group_of = {n: i for i, group in enumerate(names.values()) for n in group}
    held: dict[int, int | None] = {}  # storage -> the tie group that holds it
    for key, tensor in state.items():  # one tensor given for two untied weights: two copies
        where = tensor.untyped_storage().data_ptr() if tensor.numel() else None
        if where is None:
            continue
        if where in held and held[where] != group_of.get(key):
            state[key] = tensor.clone()
        else:
            held.setdefault(where, group_of.get(key))
    model.load_state_dict(state, strict=False, assign=True)
    retie(model, names.values(), state)  # tied weights: one parameter again
    device = next((t.device for t in state.values()), torch.device("cpu"))
    for module in owners:
        module.to_empty(device=device, recurse=False)
        init_weights(module)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"{model_cls.__name__} built without values for {', '.join(left)}")
    return model


def pretrained_source(path: str | Path) -> PretrainedSource:
    """PATH read once for the process (:class:`PretrainedSource`): the same path asked for
    again (the CLI's data settings, then the task's model) answers the same read while the
    files are unchanged; the last :data:`SOURCE_CACHE_SIZE` paths are kept."""
    key = (os.getcwd(), os.fspath(path))
    source = _SOURCES.get(key)
    if source is not None and source.stamp == _stamp(source.path):
        _SOURCES.move_to_end(key)
        return source
    source = PretrainedSource.read(path)
    _SOURCES[key] = source
    while len(_SOURCES) > SOURCE_CACHE_SIZE:
        _SOURCES.popitem(last=False)
    return source


def clear_sources() -> None:
    """Forget every PATH :func:`pretrained_source` read."""
    _SOURCES.clear()


def _short(names: list[str]) -> str:
    if not names:
        return "nothing"
    tops = sorted({n.rsplit(".", 1)[0] if n.count(".") <= 1 else n.split(".", 1)[0]
                   for n in names})
    return ", ".join(tops[:8]) + (" ..." if len(tops) > 8 else "")


def task_model(model: nn.Module | None, pretrained: str | Path | None,
               overrides: dict[str, Any] | None, *, task: str, accept: tuple[type, ...],
               modality: str | None = None, preset: str | None = None,
               data_sizes: dict[str, Any] | None = None,
               preset_defaults: dict[str, Any] | None = None
               ) -> tuple[nn.Module, PretrainedSource | None]:
    """The model a task trains: ``model`` as given, the named ``preset``
    (:func:`multimodal.tasks.presets.preset_model`, new weights) with ``overrides`` changing
    fields of its config and ``data_sizes`` (the data module's ``model_sizes``) setting the
    sizes the data fixes, or the part of PATH's model (``pretrained``) the task can train,
    with ``overrides``. Exactly one of the three. ``data_sizes`` applies to a preset only: a
    given model is checked against the data at setup, and with ``pretrained`` the data
    follows the model. With ``pretrained``, PATH is read once (:func:`pretrained_source`)
    and the model built once, ``overrides`` in its config
    (:meth:`PretrainedSource.model_for`, which logs what was loaded, what is new, what was
    left out). ``preset_defaults``: config fields the task sets in a preset's config
    unless ``overrides`` does (:func:`~multimodal.tasks.presets.preset_config`)."""
    if preset is not None:
        if model is not None or pretrained is not None:
            raise ValueError(f"{task}: give one of model, preset or pretrained (preset "
                             f"{preset!r} names the architecture; put changed fields in "
                             "overrides)")
        model = preset_model(preset, overrides, data_sizes, preset_defaults)
        if not isinstance(model, accept):
            wanted = " or ".join(c.__name__ for c in accept)
            raise ValueError(f"{task}: preset {preset!r} builds a {type(model).__name__}, "
                             f"not a {wanted}")
        return model, None
    if pretrained is None:
        if model is None:
            raise ValueError(f"{task} needs a model, preset: NAME or pretrained: PATH")
        if overrides:
            raise ValueError(f"{task}: overrides apply to a preset or pretrained model; set "
                             "the fields in the model's config instead")
        if not isinstance(model, accept):
            wanted = " or ".join(c.__name__ for c in accept)
            raise ValueError(f"{task}: model must be a {wanted}, got {type(model).__name__}")
        return model, None
    if model is not None:
        raise ValueError(f"{task}: give model or pretrained, not both (the architecture "
                         "comes from pretrained; put changed fields in overrides; on the "
                         "command line, --model.init_args.model null drops a config's model)")
    source = pretrained_source(pretrained)
    return source.model_for(task, accept, modality, overrides), source


# CLIP's text pooling (CLIPConfig.text_pool) -> TextEncoderConfig.pool of its text tower:
# the end-of-text token ends every real text, so "eot" is the last real token
_CLIP_TEXT_POOL = {"cls": "cls", "mean": "mean", "eot": "lasttoken"}


def source_pooling(source: Any, part: nn.Module, whole: nn.Module | None = None
                   ) -> dict[str, Any]:
    """The config fields (``pool``, ``normalize``) that make ``part`` pool as its source
    does, so that the task's head sits on the embedding the folder gives: a
    sentence-transformers folder's ``1_Pooling/config.json`` mode and the ``Normalize`` of
    its ``modules.json`` (all-MiniLM-L6-v2: the mean of the real tokens, unit length), or a
    CLIP text tower's ``text_pool``. Empty when ``part``'s config has no such fields (a ViT
    or an audio model pools as its own config says) or the source declares nothing.
    ``source``: a :class:`PretrainedSource` or a :class:`~multimodal.loading.Loaded`;
    ``whole``: the model ``part`` belongs to (the source's model when not given)."""
    fields = getattr(type(part.config), "__dataclass_fields__", {})
    if "pool" not in fields or "normalize" not in fields:
        return {}
    whole = source.model if whole is None else whole
    if part is getattr(whole, "text_model", None):
        mode = _CLIP_TEXT_POOL.get(getattr(whole.config, "text_pool", None))
        return {"pool": mode, "normalize": False} if mode else {}
    declared = source.pooling  # read by load() from the folder
    if declared is None:
        return {}
    return {"pool": declared.mode, "normalize": declared.normalize}


def folder_tokenizer(source: PretrainedSource | Loaded | None) -> Any:
    """The tokenizer that came with PATH (a folder's ``tokenizer.json``, a GGUF file's
    metadata, the tokenizer a checkpoint carries); None when there is none."""
    return None if source is None else source.tokenizer


def check_vocab(tokenizer: Any, vocab_size: int, where: str) -> None:
    """A tokenizer with more ids than the model's embedding has rows is an error."""
    size = getattr(tokenizer, "vocab_size", None)
    if isinstance(size, int) and size > vocab_size:
        raise ValueError(f"{where}: the tokenizer has {size} tokens but the model's embedding "
                         f"has {vocab_size} rows (vocab_size): they do not belong together")


# ======================================================================================
# the data follows the model: preprocessing settings from PATH
# ======================================================================================

PREPROCESSING_KEYS = ("image_size", "resize", "interpolation", "in_channels", "mean", "std",
                      "features", "n_mels", "tokenizer", "max_length")


_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


def _side(size: Any) -> tuple[str, int] | None:
    if isinstance(size, int):
        return "square", size
    if isinstance(size, dict):
        if isinstance(size.get("shortest_edge"), int):
            return "shortest", size["shortest_edge"]
        if isinstance(size.get("height"), int):
            return "square", size["height"]
    return None


def _image_settings(pre: dict[str, Any]) -> dict[str, Any]:
    """An image processor's settings as image data module arguments: ``image_size`` (the
    crop, or the resized square), ``resize`` (the shorter side before a centre crop),
    ``interpolation``, ``mean`` / ``std``."""
    out: dict[str, Any] = {}
    resized = _side(pre.get("size")) if pre.get("do_resize", True) else None
    crop = _side(pre.get("crop_size")) if pre.get("do_center_crop") else None
    if crop is not None:
        out["image_size"] = crop[1]
        if resized is not None and resized[0] == "shortest":
            out["resize"] = resized[1]
    elif resized is not None:
        out["image_size"] = resized[1]
    if pre.get("resample") in _RESAMPLE:
        out["interpolation"] = _RESAMPLE[pre["resample"]]
    if pre.get("do_normalize", True) and pre.get("image_mean") is not None:
        out["mean"] = [float(v) for v in pre["image_mean"]]
        out["std"] = [float(v) for v in pre["image_std"]]
    if out:
        out["in_channels"] = pre.get("num_channels", 3)  # 1: a grey model of ours
    return out


def _config_image_settings(meta: dict[str, Any]) -> dict[str, Any]:
    """``image_size`` / ``in_channels`` from a ``save_pretrained`` folder's ``config.json``
    (a ViT's, or the image tower of a CLIP / captioner): what the data needs when the folder
    has no ``preprocessor_config.json``. The normalisation is then the data module's own
    (measured on the training images). ``meta``: the folder's parsed ``config.json``."""
    config = meta.get("config")
    if not isinstance(config, dict):
        return {}
    for part in (config, config.get("vision"), config.get("encoder")):
        if isinstance(part, dict) and isinstance(part.get("image_size"), int):
            out: dict[str, Any] = {"image_size": part["image_size"]}
            if part.get("in_channels") in (1, 3, 4):
                out["in_channels"] = part["in_channels"]
            return out
    return {}




def data_settings(path: str | Path) -> dict[str, Any]:
    """The data settings PATH implies (the keys of :data:`PREPROCESSING_KEYS` a data module
    may take): from a folder's ``preprocessor_config.json`` (images: size after resize /
    crop, mean, std; audio: waveforms for the model's own front end, whose sampling rate and
    filter bank the folder set) and ``tokenizer.json`` (the folder itself); from one of our
    checkpoints, the non-empty preprocessing arguments its data module was trained with.
    Empty where PATH holds no model (the task's load says why). Read through
    :func:`pretrained_source`: the task's model comes from the same read."""
    try:
        source = pretrained_source(path)
    except (FileNotFoundError, ValueError, OSError):
        return {}
    return source.data_settings()
