"""Everything that knows every model: loading by ``model_type``, Lightning checkpoints,
encoders as feature extractors, presets by name.

This module sits above the models (it imports them all, so every class and preset is
registered). The weight format itself (``config.json`` + ``model.safetensors``,
``PretrainedMixin``, safe loading) is :mod:`multimodal.weights`, below the models; its
names are re-exported here for code written against the old single module.

>>> model.save_pretrained("out/vit")
>>> same = multimodal.from_pretrained("out/vit")
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import torch
from torch import nn

import multimodal.models  # noqa: F401  (registers every model class and preset)
from multimodal.convert import convert, from_hf_folder
from multimodal.convert.ctranslate2 import is_ctranslate2_dir
from multimodal.convert.hf_preprocess import (
    PREPROCESSOR_NAME,
    ImagePreprocessor,
    apply_audio_preprocessor,
    read_preprocessor_config,
)
from multimodal.models.api import Model
from multimodal.registry import PRESETS
from multimodal.tokenizers.hf_json import HFTokenizer, is_hf_tokenizer_file
from multimodal.tokenizers.text import load_tokenizer
from multimodal.weights import (
    CONFIG_NAME,
    FORMAT_VERSION,
    MODEL_CLASSES,
    WEIGHTS_NAME,
    PretrainedMixin,
    build_model,
    config_from_dict,
    config_to_dict,
    load_safetensors,
    load_state_dict_checked,
    read_meta,
)


def _model_class(kind: Any, where: str | Path) -> type[nn.Module]:
    if kind not in MODEL_CLASSES:
        raise ValueError(f"{where}: unknown model_type {kind!r}; "
                         f"known: {', '.join(sorted(MODEL_CLASSES))}")
    return MODEL_CLASSES[kind]


def read_config(path: str | Path) -> tuple[type[nn.Module], Any]:
    """``(model class, config)`` of a folder written by ``save_pretrained``."""
    cfg_file, meta = read_meta(path)
    model_cls = _model_class(meta.get("model_type"), cfg_file)
    return model_cls, config_from_dict(model_cls.config_class, meta["config"])


def from_pretrained(path: str | Path, *, strict: bool = True) -> nn.Module:
    """Rebuild any model written by ``save_pretrained`` (safetensors + JSON config), or
    the model of a Lightning ``.ckpt`` of one of our tasks (see :func:`load_checkpoint`)."""
    if Path(path).suffix == ".ckpt" and Path(path).is_file():
        return load_checkpoint(path)
    model_cls, config = read_config(path)
    model = model_cls(config)
    load_state_dict_checked(model, load_safetensors(Path(path) / WEIGHTS_NAME), strict=strict)
    return model.eval()


def list_presets() -> list[str]:
    """Names accepted by :func:`create_model`."""
    return sorted(PRESETS)


def create_model(name: str, **overrides: Any) -> nn.Module:
    """Build the preset ``name``; keyword arguments override its config fields."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; available: {', '.join(sorted(PRESETS))}")
    return PRESETS[name](**overrides)


# ======================================================================================
# Lightning checkpoints
# ======================================================================================

CHECKPOINT_HINT = ("expected a Lightning .ckpt of one of multimodal's tasks, which record "
                   "'model_type' (the class name) and 'model_config' (its config as a dict) "
                   "under checkpoint['multimodal_model']")


def datamodule_arguments(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The data module's init arguments that Lightning saved in a loaded checkpoint dict,
    without LightningCLI's private keys (``_class_path``, ...): ``DataModule(**args)``
    rebuilds the run's data."""
    saved = checkpoint.get("datamodule_hyper_parameters") or {}
    return {k: v for k, v in saved.items() if not k.startswith("_")}


def load_checkpoint(path: str | Path) -> nn.Module:
    """Rebuild the model of a Lightning checkpoint written by one of our tasks:
    :func:`model_from_checkpoint` of :func:`read_checkpoint`."""
    return model_from_checkpoint(read_checkpoint(path), path)


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """A checkpoint file as its dict, read with ``torch.load(weights_only=True)``: tensors
    and plain Python values only, so a checkpoint that would run code when unpickled is
    refused. Read once where both the model and other entries (tokenizer, data arguments)
    are wanted."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} not found")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(f"{path} was refused: it holds objects other than tensors and plain "
                         f"Python values, and unpickling them could execute code ({err})"
                         ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as err:
        raise ValueError(f"{path} is not a readable checkpoint ({err}); "
                         f"{CHECKPOINT_HINT}") from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("state_dict"), dict):
        raise ValueError(f"{path} has no 'state_dict'; {CHECKPOINT_HINT}")
    return ckpt


def model_from_checkpoint(ckpt: dict[str, Any], path: str | Path = "checkpoint") -> nn.Module:
    """The model of a checkpoint dict of :func:`read_checkpoint` (``path`` names it in
    errors), in eval mode. It is built from ``ckpt["multimodal_model"]`` (``model_type``,
    ``model_config``: :class:`multimodal.tasks.base.ModelTask` writes it; older checkpoints
    kept them in ``hyper_parameters``) and its weights are found in ``state_dict`` under the
    task's prefix (``model.``)."""
    about = ckpt.get("multimodal_model") or ckpt.get("hyper_parameters") or {}
    kind, cfg = about.get("model_type"), about.get("model_config")
    if not isinstance(kind, str) or not isinstance(cfg, dict):
        raise ValueError(f"{path}: no model_type/model_config recorded "
                         f"(top-level keys {sorted(ckpt)}); {CHECKPOINT_HINT}")
    model = build_model(_model_class(kind, Path(path)), cfg)
    load_state_dict_checked(model, _submodule_state(ckpt["state_dict"], model))
    return model.eval()


def _submodule_state(state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """The entries of a task's ``state_dict`` that belong to ``model``: the prefix
    (``"model."``, or ``""`` for a bare model) under which most of its keys appear."""
    own = set(model.state_dict())
    counts: dict[str, int] = {}
    for key in state:
        cuts = [0] + [i + 1 for i, ch in enumerate(key) if ch == "."]
        for cut in cuts:
            if key[cut:] in own:
                counts[key[:cut]] = counts.get(key[:cut], 0) + 1
    if not counts:
        return dict(state)  # nothing fits: let load_state_dict_checked list the keys
    best = max(counts, key=lambda p: (counts[p], p == "model."))
    return {k[len(best):]: v for k, v in state.items() if k.startswith(best)}


# ======================================================================================
# encoders as feature extractors
# ======================================================================================

TOKENIZER_NAME = "tokenizer.json"


class Encoder(nn.Module):
    """A pretrained backbone (and its tokenizer / preprocessor) as a frozen feature extractor.

    Any model of the package that reads one modality, images, text or audio
    (``model.modality``), through the common model API (docs/models.md): ``encoder(images)``
    -> token features (B, tokens, dim) after the final norm; ``encoder(input_ids,
    attention_mask)`` -> hidden states (B, L, dim); ``encoder(features)`` (audio: normalised
    log-mel / fbank frames (B, frames, n_mels)) -> tokens. Raw inputs:
    ``encoder.preprocess(x)`` turns PNG paths / PIL images (with an ``ImagePreprocessor``,
    e.g. from a folder's ``preprocessor_config.json``) or waveforms (the audio model's own
    front end) into what ``encoder(...)`` takes; ``encoder.encode(x)`` does both.
    ``encoder.pool(features, attention_mask)`` -> one vector per input,
    the model's ``pool`` (ViT: class token or mean; TextEncoder: [CLS], through its pooler
    if it has one; TextDecoder: the last real token). ``encoder.encode(texts)`` tokenises
    with the tokenizer first ([CLS] ... [SEP] for a bidirectional encoder; a Hugging Face
    ``tokenizer.json`` adds its own special tokens).
    An image-text model (CLIP, SigLIP) gives its embeddings before normalisation
    (``encode_image`` / ``encode_text`` with ``normalize=False``, transformers'
    ``get_image_features`` / ``get_text_features``): ``encoder(images)`` (B, embed_dim),
    ``encoder(input_ids, attention_mask)`` and ``encoder.encode(texts)`` likewise; ``pool``
    returns them unchanged.
    With ``freeze`` (the default) no parameter needs gradients and the backbone stays in
    eval mode even when a model holding the encoder is trained.
    """

    MODALITIES = ("image", "text", "audio", "image-text")

    def __init__(self, backbone: nn.Module, tokenizer: Any = None, freeze: bool = True,
                 preprocessor: Any = None) -> None:
        super().__init__()
        modality = getattr(backbone, "modality", None)
        if not isinstance(backbone, Model) or modality not in self.MODALITIES:
            raise ValueError(f"an Encoder wraps one of our image, text, audio or image-text "
                             f"models (ViT, TextEncoder, TextDecoder, AudioClassifier, CLIP, "
                             f"...), got "
                             f"{type(backbone).__name__}"
                             + (f" (modality {modality!r})" if modality else ""))
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.preprocessor = preprocessor
        self.modality = modality
        self.frozen = freeze
        if freeze:
            self.backbone.requires_grad_(False)
        self.eval()

    def train(self, mode: bool = True) -> Encoder:
        """A frozen encoder stays in eval mode (no dropout) inside a model being trained."""
        super().train(mode)
        if self.frozen:
            self.backbone.eval()
        return self

    @property
    def dim(self) -> int:
        return int(self.backbone.num_features)

    def forward(self, inputs: torch.Tensor, attention_mask: torch.Tensor | None = None,
                **kwargs: Any) -> torch.Tensor:
        if self.modality == "image-text":  # pooled embeddings of images or of token ids
            if inputs.is_floating_point():
                if attention_mask is not None:
                    raise ValueError("attention_mask is for text; images take none")
                return self.backbone.encode_image(inputs, normalize=False)
            return self.backbone.encode_text(inputs, attention_mask, normalize=False)
        if self.modality in ("image", "audio"):
            if attention_mask is not None:
                raise ValueError(f"attention_mask is for text; {self.modality} takes none")
            return self.backbone.forward_features(inputs, **kwargs)
        return self.backbone.forward_features(inputs, attention_mask, **kwargs)

    def pool(self, features: torch.Tensor,
             attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.modality == "image-text":
            return features  # already one embedding per input
        if self.modality in ("image", "audio"):
            return self.backbone.pool(features)
        return self.backbone.pool(features, attention_mask)

    def preprocess(self, inputs: Any, sample_rate: int | None = None) -> torch.Tensor:
        """Raw inputs -> model inputs. Images: paths / PIL images / uint8 tensors through
        ``self.preprocessor`` -> ``(B, 3, H, W)``. Audio: a waveform ``(T,)`` / ``(B, T)`` /
        list of clips at ``sample_rate`` (default the model's) through the model's front end
        -> normalised features ``(B, frames, n_mels)``."""
        if self.modality == "audio":
            return self.backbone.features_from_waveform(inputs, sample_rate=sample_rate)[0]
        if self.modality in ("image", "image-text"):
            if self.preprocessor is None:
                raise ValueError("this Encoder has no image preprocessor: pass pixel tensors "
                                 "to forward, or load_encoder(folder) with a "
                                 "preprocessor_config.json, or Encoder(..., preprocessor=)")
            return self.preprocessor(inputs)
        raise ValueError("text is tokenised by encode(texts)")

    def encode(self, inputs: Any, max_length: int | None = None,
               sample_rate: int | None = None) -> Any:
        """Raw inputs -> features. Text (and an image-text model's texts):
        ``(features, attention_mask)`` of the tokenised strings; images and audio:
        ``self(self.preprocess(inputs))`` (an image-text model's images:
        ``encoder(encoder.preprocess(images))``)."""
        if self.modality in ("image", "audio"):
            with torch.no_grad() if self.frozen else torch.enable_grad():
                return self(self.preprocess(inputs, sample_rate=sample_rate))
        texts = inputs
        if self.tokenizer is None:
            raise ValueError("this Encoder has no tokenizer: pass token ids to forward, or "
                             "load_encoder(model, tokenizer=...)")
        if self.modality == "image-text":
            text = self.backbone.config.text
            pool = self.backbone.config.text_pool
            # "last" pooling (SigLIP) reads the last column: pad to the full context
            batch = self.tokenizer.encode_batch(
                texts, max_length=max_length or text.max_len, add_cls=pool == "cls",
                add_eos=pool == "eot", padding="max_length" if pool == "last" else True)
            mask = batch["attention_mask"]
            return self(batch["input_ids"], mask), mask
        if self.modality != "text":
            raise ValueError(f"encode() is for text; this Encoder reads {self.modality}s")
        bidirectional = not self.backbone.config.backbone.causal  # BERT-style: [CLS] .. [SEP]
        max_length = max_length or self.backbone.config.max_len
        batch = self.tokenizer.encode_batch(texts, max_length=max_length,
                                            add_cls=bidirectional, add_sep=bidirectional)
        mask = batch["attention_mask"]
        return self(batch["input_ids"], mask), mask

    def save_pretrained(self, path: str | Path) -> Path:
        """The backbone as by ``save_pretrained`` plus ``tokenizer.json`` when there is one."""
        path = self.backbone.save_pretrained(path)
        if self.tokenizer is not None:
            self.tokenizer.save(path / TOKENIZER_NAME)
        return path


def _load_any_tokenizer(path: Path) -> Any:
    return HFTokenizer.from_file(path) if is_hf_tokenizer_file(path) else load_tokenizer(path)


def load_encoder(source: str | Path | nn.Module, tokenizer: Any = None,
                 freeze: bool = True) -> Encoder:
    """A backbone ready as a feature extractor, with its tokenizer.

    ``source`` is a folder written by ``save_pretrained`` or a folder in the Hugging Face
    layout (``config.json`` + safetensors, converted without transformers by
    :func:`multimodal.convert.from_hf_folder`; its ``preprocessor_config.json``, when
    present, gives images their preprocessing and checks and sets an audio model's
    front end); a folder's ``tokenizer.json`` is loaded when present (a Hugging Face one
    through the ``tokenizers`` library: :class:`~multimodal.tokenizers.hf_json.HFTokenizer`);
    or a Lightning ``.ckpt`` of one of our tasks, one of our models,
    or a torchvision / timm / transformers model (converted with
    :func:`multimodal.convert.convert`). Classification heads are kept but unused.
    """

    preprocessor = None
    if isinstance(source, (str, Path)):
        path = Path(source)
        if path.is_file() and path.suffix == ".ckpt":
            model = load_checkpoint(path)
        else:
            if _is_hf_folder(path) or is_ctranslate2_dir(path):
                model, preprocessor = _load_hf_folder(path)
            else:
                model = from_pretrained(path)
            if tokenizer is None and (path / TOKENIZER_NAME).is_file():
                tokenizer = _load_any_tokenizer(path / TOKENIZER_NAME)
    elif isinstance(source, Model):
        model = source
    elif isinstance(source, nn.Module):
        model = convert(source)
    else:
        raise ValueError(f"load_encoder expects a folder, a .ckpt file or a model, "
                         f"got {type(source).__name__}")
    return Encoder(model, tokenizer, freeze=freeze, preprocessor=preprocessor)


def _is_hf_folder(path: Path) -> bool:
    """A Hugging Face layout folder: its ``config.json`` names a ``model_type`` but holds no
    nested ``config`` (ours does)."""
    try:
        meta = json.loads((path / CONFIG_NAME).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return isinstance(meta, dict) and "model_type" in meta \
        and not isinstance(meta.get("config"), dict)


def _load_hf_folder(path: Path) -> tuple[nn.Module, Any]:
    """Model of a Hugging Face folder and, from its ``preprocessor_config.json`` (when
    present), the image preprocessor (images) or the front end's settings (audio, applied
    to the model)."""
    model = from_hf_folder(path)
    if getattr(model, "modality", None) == "audio-text":  # a whole Whisper: its encoder
        model = model.encoder
    pre = read_preprocessor_config(path)
    if pre is None:
        return model, None
    file = str(path / PREPROCESSOR_NAME)
    modality = getattr(model, "modality", None)
    if modality == "audio":
        apply_audio_preprocessor(model, pre, file)
        return model, None
    if modality == "image":
        if "feature_extractor_type" in pre and "image_processor_type" not in pre \
                and "image_mean" not in pre:
            raise ValueError(f"{file} describes {pre['feature_extractor_type']}, not an image "
                             "processor")
        try:
            return model, ImagePreprocessor.from_dict(pre)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{file}: {err}") from None
    return model, None


__all__ = [  # the weight-format names are re-exported for code that imported them from here
    "CHECKPOINT_HINT", "CONFIG_NAME", "FORMAT_VERSION", "MODEL_CLASSES", "TOKENIZER_NAME",
    "WEIGHTS_NAME", "Encoder", "PretrainedMixin", "config_from_dict", "config_to_dict",
    "create_model", "datamodule_arguments", "from_pretrained", "list_presets", "load_checkpoint",
    "load_encoder", "load_safetensors", "load_state_dict_checked", "model_from_checkpoint",
    "read_checkpoint", "read_config",
]
