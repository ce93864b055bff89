"""A pretrained model as a frozen feature extractor: :class:`Encoder` (one embedding per
input, every modality; token features on request) and :func:`load_encoder`, which picks the
part of :func:`multimodal.loading.load`'s whole model that encodes (a CLIP as itself, a
Whisper's encoder) with the tokenizer, preprocessing and pooling that came with it.

>>> enc = multimodal.load_encoder("all-MiniLM-L6-v2")
>>> enc.encode(["a sentence", "another"]).shape
torch.Size([2, 384])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from multimodal.convert import convert
from multimodal.convert.hf_pooling import FolderPooling, write_folder_pooling
from multimodal.convert.hf_preprocess import ImagePreprocessor
from multimodal.files import IMAGE_EXTENSIONS
from multimodal.loading import Loaded, load, model_parts
from multimodal.models.api import Model
from multimodal.nn.pool import pool_tokens
from multimodal.tokenizers.io import TOKENIZER_NAME

__all__ = ["Encoder", "TokenFeatures", "load_encoder"]


class TokenFeatures(NamedTuple):
    """Token features ``(N, L, D)`` of N inputs, right-padded to the longest, and their
    ``attention_mask`` ``(N, L)`` (1 = a real token, 0 = padding)."""

    features: torch.Tensor
    attention_mask: torch.Tensor


class Encoder(nn.Module):
    """A pretrained backbone (and its tokenizer / preprocessor / pooling) as a frozen
    feature extractor: one embedding per input, for every modality.

    ``encoder.encode(inputs)`` -> ``(N, D)``, one row per input, whatever the input is
    batched with:

    * texts (a list of strings) through the tokenizer ([CLS] ... [SEP] for a bidirectional
      encoder of ours; a Hugging Face ``tokenizer.json`` adds its own special tokens);
    * images: paths / PIL images / ``uint8`` tensors ``(C, H, W)`` through the image
      preprocessor (a folder's ``preprocessor_config.json``, or the image size and
      normalisation a task checkpoint recorded), or float pixel tensors ``(B, C, H, W)`` /
      a list of ``(C, H, W)`` of any sizes (each size is run on its own);
    * audio: a waveform ``(T,)``, a batch ``(B, T)`` or a list of clips of any lengths at
      ``sample_rate`` (default the model's) through the model's front end; each clip is
      pooled over its own frames only, never over the padding of a longer clip;
    * a dual encoder (CLIP, SigLIP; modality ``"image+text"``): strings are texts, image
      tensors / PIL images / ``Path`` objects are images; ``modality="image"`` reads strings
      as image paths. The embeddings are ``encode_image`` / ``encode_text`` with
      ``normalize=False`` (transformers' ``get_image_features`` / ``get_text_features``).

    The embedding is the folder's pooling when it declares one (``pooling``: a
    sentence-transformers ``1_Pooling/config.json``, mean / cls / max / mean_sqrt_len /
    lasttoken, then unit length when ``modules.json`` lists ``Normalize``), else the
    model's own ``pool`` (ViT: class token or mean; TextEncoder: [CLS], through its pooler
    if it has one; TextDecoder: the last real token; AudioClassifier: class token or the
    mean of the clip's own tokens). ``encode(inputs, output="tokens")`` gives the token
    features instead, as :class:`TokenFeatures` ``(features (N, L, D), attention_mask
    (N, L))``, padded to the longest input (a dual encoder: its towers' tokens).

    ``encoder(model_inputs)`` is the backbone's forward on prepared inputs: images
    ``(B, C, H, W)`` -> token features; ``(input_ids, attention_mask)`` -> hidden states;
    audio features ``(B, frames, n_mels)`` (``lengths=``) -> tokens; a dual encoder:
    embeddings of images or token ids.

    With ``freeze`` (the default) no parameter needs gradients and the backbone stays in
    eval mode even when a model holding the encoder is trained. ``compile=True``: the
    backbone's verbs compiled with ``torch.compile`` (:func:`multimodal.optimize.
    compile_encoder`; one warning and eager where compiling is unavailable);
    ``quantize="int8" | "int4"``: its Linears weight-only quantised, packed for PyTorch's
    CPU kernels (:mod:`multimodal.nn.quantized`; a GGUF file's blocks are repacked
    without a float copy); ``"dynamic-int8"``: dynamically quantised
    (:func:`multimodal.optimize.quantize_int8`); a frozen CPU encoder only; check
    :func:`~multimodal.optimize.output_cosine` on your data first, docs/speed.md).
    """

    MODALITIES = ("image", "text", "audio", "image+text")

    def __init__(self, backbone: nn.Module, tokenizer: Any = None, freeze: bool = True,
                 preprocessor: Any = None, pooling: FolderPooling | str | None = None, *,
                 compile: bool = False, quantize: str | None = None) -> None:
        super().__init__()
        modality = getattr(backbone, "modality", None)
        if not isinstance(backbone, Model) or modality not in self.MODALITIES:
            raise ValueError(f"an Encoder wraps one of our image, text, audio or image+text "
                             f"models (ViT, TextEncoder, TextDecoder, AudioClassifier, CLIP, "
                             f"...), got "
                             f"{type(backbone).__name__}"
                             + (f" (modality {modality!r})" if modality else ""))
        if isinstance(pooling, str):
            pooling = FolderPooling(pooling)
        if pooling is not None and modality == "image+text":
            raise ValueError("a dual encoder (CLIP, SigLIP) pools with its own towers; "
                             "pooling= is for image, text and audio encoders")
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.preprocessor = preprocessor
        self.pooling: FolderPooling | None = pooling
        self.modality = modality
        self.frozen = freeze
        if freeze:
            self.backbone.requires_grad_(False)
        self.eval()
        if compile or quantize:
            # every encode() reaches the model only through self.backbone's verbs
            # (forward_features, pool, encode_image / encode_text): optimise those
            self.backbone = _optimized(self.backbone, compile, quantize, freeze)

    def train(self, mode: bool = True) -> Encoder:
        """A frozen encoder stays in eval mode (no dropout) inside a model being trained."""
        super().train(mode)
        if self.frozen:
            self.backbone.eval()
        return self

    @property
    def dim(self) -> int:
        """Width of :meth:`encode`'s embeddings."""
        return int(self.backbone.num_features)

    @property
    def device(self) -> torch.device:
        first = next(self.backbone.parameters(), None)
        return first.device if first is not None else torch.device("cpu")

    def forward(self, inputs: torch.Tensor, attention_mask: torch.Tensor | None = None,
                **kwargs: Any) -> torch.Tensor:
        if self.modality == "image+text":  # pooled embeddings of images or of token ids
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
        """Token features ``(B, L, D)`` (``attention_mask`` 1 = real token) -> ``(B, D)``:
        the folder's pooling, else the model's (a dual encoder's features are already
        pooled and come back unchanged)."""
        if self.modality == "image+text":
            return features
        if self.pooling is not None:
            return pool_tokens(features, attention_mask, self.pooling.mode)
        return self.backbone.pool(features, attention_mask=attention_mask)

    def preprocess(self, inputs: Any, sample_rate: int | None = None) -> torch.Tensor:
        """Raw inputs -> model inputs. Images: paths / PIL images / uint8 tensors through
        ``self.preprocessor`` -> ``(B, C, H, W)``. Audio: a waveform ``(T,)`` / ``(B, T)`` /
        list of clips at ``sample_rate`` (default the model's) through the model's front end
        -> normalised features ``(B, frames, n_mels)``, padded: their lengths come from
        ``backbone.features_from_waveform``, which :meth:`encode` uses."""
        if self.modality == "audio":
            return self.backbone.features_from_waveform(inputs, sample_rate=sample_rate)[0]
        if self.modality in ("image", "image+text"):
            return self._preprocessor()(inputs)
        raise ValueError("text is tokenised by encode(texts)")

    def _preprocessor(self) -> Any:
        if self.preprocessor is None:
            raise ValueError("this Encoder has no image preprocessor: pass pixel tensors, or "
                             "load_encoder(folder) with a preprocessor_config.json, or "
                             "Encoder(..., preprocessor=ImagePreprocessor(...))")
        return self.preprocessor

    # -- encode --------------------------------------------------------------------------
    def encode(self, inputs: Any, max_length: int | None = None,
               sample_rate: int | None = None, *, output: str = "embedding",
               modality: str | None = None, batch_size: int = 32) -> Any:
        """One embedding per input ``(N, D)`` (see the class docstring), computed
        ``batch_size`` inputs at a time; ``output="tokens"``: :class:`TokenFeatures`.
        ``max_length`` caps the tokens per text (default: the folder's
        ``max_seq_length``, else the model's context); ``sample_rate`` is the rate of
        waveforms (default the model's)."""
        if output not in ("embedding", "tokens"):
            raise ValueError(f"output must be 'embedding' or 'tokens', got {output!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        kind = self._input_kind(inputs, modality)
        items = self._as_items(kind, inputs)
        if not items:
            raise ValueError("encode() got no inputs")
        rows: list[Any] = [None] * len(items)
        context = torch.no_grad() if self.frozen else torch.enable_grad()
        with context:
            for start in range(0, len(items), batch_size):
                chunk = items[start:start + batch_size]
                for index, prepared in self._prepare(kind, chunk, max_length, sample_rate):
                    got = self._tokens(kind, prepared) if output == "tokens" \
                        else self._embeddings(kind, prepared)
                    for j, i in enumerate(index):
                        rows[start + i] = (got[0][j], got[1][j]) if output == "tokens" \
                            else got[j]
        if output == "embedding":
            return torch.stack(rows)
        return _pad_tokens(rows)

    def _input_kind(self, inputs: Any, modality: str | None) -> str:
        if self.modality != "image+text":
            if modality is not None and modality != self.modality:
                raise ValueError(f"this Encoder reads {self.modality}, not {modality!r}")
            return self.modality
        if modality is not None:
            if modality not in ("image", "text"):
                raise ValueError(f"modality must be 'image' or 'text' for a dual encoder, "
                                 f"got {modality!r}")
            return modality
        seq = [inputs] if isinstance(inputs, str) or not isinstance(inputs, (list, tuple)) \
            else list(inputs)
        if seq and all(isinstance(x, str) for x in seq):
            files = [x for x in seq if x.lower().endswith(IMAGE_EXTENSIONS) and Path(x).is_file()]
            if files:
                raise ValueError(f"{files[0]!r} is both a text and an image file: pass "
                                 "modality='image' or modality='text'")
            return "text"
        return "image"

    def _as_items(self, kind: str, inputs: Any) -> list[Any]:
        """The inputs as a list of single items (a batched tensor is split into rows)."""
        if type(inputs).__module__ == "numpy" and hasattr(inputs, "shape"):
            inputs = torch.as_tensor(inputs)  # a numpy waveform / batch / image
        if isinstance(inputs, torch.Tensor):
            if kind == "audio":
                return [inputs] if inputs.dim() == 1 else list(inputs)
            if kind == "image":
                if inputs.dim() == 4:
                    return list(inputs)
                return [inputs]
            raise ValueError("texts are strings; pass token ids to encoder(ids, mask)")
        if isinstance(inputs, (str, Path)) or not isinstance(inputs, (list, tuple)):
            return [inputs]
        return list(inputs)

    def _prepare(self, kind: str, chunk: list[Any], max_length: int | None,
                 sample_rate: int | None) -> list[tuple[list[int], Any]]:
        """Model inputs for a chunk, as ``(indices into chunk, inputs)`` groups: one group,
        or one per image size."""
        device = self.device
        if kind == "text":
            return [(list(range(len(chunk))), self._tokenize(chunk, max_length, device))]
        if kind == "audio":
            features, lengths = self.backbone.features_from_waveform(
                chunk, sample_rate=sample_rate)
            return [(list(range(len(chunk))), (features.to(device), lengths.to(device)))]
        pixels = [x if isinstance(x, torch.Tensor) and x.is_floating_point()
                  else self._preprocessor()([x])[0] for x in chunk]
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, x in enumerate(pixels):
            if x.dim() != 3:
                raise ValueError(f"image {i} must be (C, H, W) pixels, got shape "
                                 f"{tuple(x.shape)}")
            groups.setdefault(tuple(x.shape), []).append(i)
        return [(index, torch.stack([pixels[i] for i in index]).to(device))
                for index in groups.values()]

    def _tokenize(self, texts: list[Any], max_length: int | None,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise ValueError(f"text {i} is a {type(text).__name__}, not a string")
        if self.tokenizer is None:
            raise ValueError("this Encoder has no tokenizer: pass token ids to forward, or "
                             "load_encoder(model, tokenizer=...)")
        if self.modality == "image+text":
            cfg = self.backbone.config
            pool = cfg.text_pool
            # "last" pooling (SigLIP) reads the last column: pad to the full context
            batch = self.tokenizer.encode_batch(
                texts, max_length=max_length or cfg.text.max_len, add_cls=pool == "cls",
                add_eos=pool in ("eot", "mean"),
                padding="max_length" if pool == "last" else True)
            if pool == "last":  # SigLIP was trained attending to the padding: no mask
                batch["attention_mask"] = torch.ones_like(batch["attention_mask"])
        else:
            bidirectional = not self.backbone.config.backbone.causal  # BERT: [CLS] .. [SEP]
            limit = self.backbone.config.max_len
            if self.pooling is not None and self.pooling.max_length is not None:
                limit = min(limit, self.pooling.max_length)
            batch = self.tokenizer.encode_batch(texts, max_length=max_length or limit,
                                                add_cls=bidirectional, add_sep=bidirectional)
        return batch["input_ids"].to(device), batch["attention_mask"].to(device)

    def _tokens(self, kind: str, prepared: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Token features (B, L, D) and attention mask (B, L) of prepared inputs."""
        model = self.backbone
        if kind == "text":
            ids, mask = prepared
            tower = model.text_model if self.modality == "image+text" else model
            out = tower.forward_features(ids, mask)
            return (out[0] if isinstance(out, tuple) else out), mask
        if kind == "audio":
            features, lengths = prepared
            tokens, mask = model.forward_features(features, lengths, return_attention_mask=True)
            return tokens, mask.long()
        tower = model.vision_model if self.modality == "image+text" else model
        tokens = tower.forward_features(prepared)
        return tokens, tokens.new_ones(tokens.shape[:2], dtype=torch.long)

    def _embeddings(self, kind: str, prepared: Any) -> torch.Tensor:
        """One embedding per input (B, D) of prepared inputs."""
        if self.modality == "image+text":
            if kind == "text":
                return self.backbone.encode_text(*prepared, normalize=False)
            return self.backbone.encode_image(prepared, normalize=False)
        pooled = self.pool(*self._tokens(kind, prepared))
        if self.pooling is not None and self.pooling.normalize:
            pooled = F.normalize(pooled, dim=-1)
        return pooled

    def save_pretrained(self, path: str | Path) -> Path:
        """The backbone as by ``save_pretrained``, plus ``tokenizer.json`` when there is one,
        the image preprocessing (``preprocessor_config.json``: size and normalisation, which
        :func:`load_encoder` and ``pretrained:`` read back) and the pooling
        (sentence-transformers layout) when set."""
        path = self.backbone.save_pretrained(path)
        if self.tokenizer is not None:
            self.tokenizer.save(path / TOKENIZER_NAME)
        if isinstance(self.preprocessor, ImagePreprocessor):
            self.preprocessor.save(path)
        if self.pooling is not None:
            write_folder_pooling(path, self.pooling, self.dim)
        return path


def _pad_tokens(rows: list[tuple[torch.Tensor, torch.Tensor]]) -> TokenFeatures:
    """Per-input ``(L_i, D)`` features and ``(L_i,)`` masks -> right-padded
    :class:`TokenFeatures`."""
    longest = max(f.shape[0] for f, _ in rows)
    features = rows[0][0].new_zeros(len(rows), longest, rows[0][0].shape[-1])
    mask = torch.zeros(len(rows), longest, dtype=torch.long, device=features.device)
    for i, (f, m) in enumerate(rows):
        features[i, :f.shape[0]] = f
        mask[i, :m.shape[0]] = m
    return TokenFeatures(features, mask)


def _optimized(backbone: nn.Module, compile: bool, quantize: str | None,
                freeze: bool) -> nn.Module:
    """``backbone`` through :func:`multimodal.optimize.optimize_encoder` for an Encoder."""
    import warnings

    from multimodal.optimize import compile_encoder, optimize_encoder

    if quantize is not None and not freeze:
        raise ValueError(f"quantize={quantize!r} makes an inference-only encoder: use it "
                         "with freeze=True")
    backbone = optimize_encoder(backbone, quantize=quantize)
    if compile:
        try:
            backbone = compile_encoder(backbone)
        except RuntimeError as err:
            warnings.warn(f"Encoder(compile=True): {err}; running eagerly", RuntimeWarning,
                          stacklevel=3)
    return backbone


def load_encoder(source: str | Path | Loaded | nn.Module, tokenizer: Any = None,
                 freeze: bool = True, *, pooling: FolderPooling | str | None = None,
                 compile: bool = False, quantize: str | None = None) -> Encoder:
    """A backbone ready as a feature extractor, with its tokenizer, preprocessing and
    pooling.

    ``source`` is any model path :func:`multimodal.load` reads (a ``save_pretrained``
    folder, a Hugging Face folder converted without transformers, a CTranslate2 Whisper
    directory, a Llama-family GGUF file, a Lightning ``.ckpt`` of one of our tasks, an
    installed model's name) or what it returned (:class:`~multimodal.loading.Loaded`); its
    tokenizer, image preprocessing (``preprocessor_config.json``, or the image size and
    normalisation a checkpoint's data module recorded; an audio model's front end is set
    from the folder) and pooling (a sentence-transformers ``modules.json`` /
    ``1_Pooling``) come along. Or one of our models, or a torchvision / timm /
    transformers model (converted with :func:`multimodal.convert.convert`). The encoding
    part of a whole model is taken (a Whisper's encoder); classification heads are kept
    but unused. ``tokenizer`` and ``pooling`` (a mode name or a :class:`FolderPooling`)
    override what came with it.
    """
    preprocessor = folder_pooling = None
    if isinstance(source, (str, Path)):
        source = load(source, tokenizer=tokenizer is None, quantize=quantize)
    if isinstance(source, Loaded):
        model = source.model
        tokenizer = tokenizer if tokenizer is not None else source.tokenizer
        preprocessor = source.preprocessor
        folder_pooling = source.pooling
    elif isinstance(source, Model):
        model = source
    elif isinstance(source, nn.Module):
        model = convert(source)
    else:
        raise ValueError(f"load_encoder expects a folder, a .ckpt file or a model (or what "
                         f"multimodal.load returned), got {type(source).__name__}")
    return Encoder(_encoding_part(model), tokenizer, freeze=freeze, preprocessor=preprocessor,
                   pooling=pooling if pooling is not None else folder_pooling,
                   compile=compile, quantize=quantize)


def _encoding_part(model: nn.Module) -> nn.Module:
    """``model`` when an :class:`Encoder` reads its modality, else its one single-modality
    part (a Whisper's audio encoder); anything else is left for Encoder to refuse."""
    if getattr(model, "modality", None) in Encoder.MODALITIES:
        return model
    parts = list(model_parts(model).values())
    return parts[0] if len(parts) == 1 else model
