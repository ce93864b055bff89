"""CLIP (Radford et al., 2021): an image tower and a text tower mapped to one space.

The image tower is our :class:`~multimodal.models.vit.ViT` (no head, any stem), the text
tower our :class:`~multimodal.models.text.TextEncoder` (no MLM head). Each tower's pooled
feature goes through a bias-free linear projection to ``embed_dim`` and is L2-normalised::

    I = normalize(W_v · pool(ViT(image)))      T = normalize(W_t · pool(TextEncoder(ids)))
    logits_per_image = s · I Tᵀ,   s = exp(logit_scale),  logit_scale <= log(100)

``logit_scale`` is learnable, initialised to log(1/0.07). With ``loss="sigmoid"`` (SigLIP,
Zhai et al., 2023) the model also learns a bias ``b`` and pairs are scored with
``s · I Tᵀ + b``. The losses themselves live in :mod:`multimodal.tasks.contrastive`.

Text pooling: ``text_pool="cls"`` reads position 0 (the tokenizer puts ``[CLS]`` there),
``"last"`` the last column whatever the mask says (SigLIP, trained on texts padded to the
full context, pools there even when it is padding), ``"eot"`` reads the end-of-text token
of each row, ``"mean"`` averages the hidden states of the real tokens
(``attention_mask == 1``; a bag of contextualised words, which composes attributes
additively). Where the end of text is: with
``eot_token_id=None`` (models trained here) the last real token (``[EOS]``; the last
position with ``attention_mask == 1``, or the last column without a mask); with
``eot_token_id=k`` (imported CLIPs) the *first* position whose id is ``k``, the rule of
transformers' ``CLIPTextTransformer`` (a row without ``k`` falls back to its last real
token). transformers' legacy rule for configs with ``eos_token_id == 2`` (the original
OpenAI vocabulary), ``argmax`` of the ids, finds the first ``<|endoftext|>`` because that is
the largest id of the vocabulary: the converter sets ``eot_token_id = vocab_size - 1`` for it.
A causal text tower (``text.causal=True``) needs ``"eot"``: only the last token has seen the
whole text.

Texts longer than the text tower's context ``text.max_len`` are truncated to their first
``max_len`` tokens, with a warning the first time; with ``"eot"`` pooling the last kept
token then stands for the end of text.

The package's model API (docs/models.md): ``forward_features(images, input_ids)`` is the
pair of unit embeddings stacked as two tokens ``(B, 2, embed_dim)`` (row 0 the image, row 1
the text); ``pool`` reads the image embedding; ``forward_head`` / ``model(images,
input_ids)`` give ``logits_per_image`` (B, B) of the batch, as transformers' ``CLIPModel``.

SigLIP's layout is reached by switches: ``image_projection=False`` (the image tower's
pooled feature, e.g. its attention-pooling head ``vision.pool="map"``, is the embedding:
``visual_projection`` is the identity and ``embed_dim`` must equal ``vision.dim``) and
``text_projection_bias=True`` (the text head ``W_t h + b``).

Parameter layout (for converters): ``vision_model`` (ViT), ``text_model`` (TextEncoder),
``visual_projection`` / ``text_projection`` (``nn.Linear``, without bias unless
``text_projection_bias``; the visual one an ``nn.Identity`` without ``image_projection``),
``logit_scale`` (scalar), ``logit_bias`` (scalar, sigmoid loss only).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from multimodal.models.text import TextEncoder, TextEncoderConfig, check_token_ids
from multimodal.models.vit import ViT, ViTConfig
from multimodal.nn.pool import mean_pool
from multimodal.registry import register_model, register_preset
from multimodal.weights import PretrainedMixin

__all__ = ["CLIP", "CLIPConfig", "tokenize_texts"]

DEFAULT_TEMPLATES = ("a photo of a {}.",)


def _default_vision() -> ViTConfig:
    return ViTConfig(image_size=32, patch_size=4, in_channels=3, num_classes=0, dim=128,
                     depth=3, heads=4, mlp_dim=256, pool="mean", class_token=False)


def _default_text() -> TextEncoderConfig:
    return TextEncoderConfig(vocab_size=64, max_len=32, dim=128, depth=2, heads=4,
                             mlp_dim=256, mlm_head=False)


@dataclass
class CLIPConfig:
    """Two tower configs, the shared width and the temperature.

    ``vision.num_classes`` is set to 0 and ``text.mlm_head`` / ``text.num_classes`` to off:
    the towers only give features. ``loss`` picks how pairs are scored in training:
    ``"softmax"`` (CLIP's InfoNCE) or ``"sigmoid"`` (SigLIP, with a learnable bias).
    """

    vision: ViTConfig = field(default_factory=_default_vision)
    text: TextEncoderConfig = field(default_factory=_default_text)
    embed_dim: int = 128
    text_pool: Literal["cls", "eot", "last", "mean"] = "eot"
    eot_token_id: int | None = None  # "eot" pooling at the first such id (None: last token)
    loss: Literal["softmax", "sigmoid"] = "softmax"
    logit_scale_init: float = math.log(1 / 0.07)
    logit_scale_max: float = math.log(100.0)
    logit_bias_init: float = -10.0  # SigLIP's b at the start (sigmoid loss only)
    image_projection: bool = True  # False: the pooled image feature is the embedding
    text_projection_bias: bool = False  # SigLIP's text head has a bias

    def __post_init__(self) -> None:
        if isinstance(self.vision, dict):
            self.vision = ViTConfig(**self.vision)
        if isinstance(self.text, dict):
            self.text = TextEncoderConfig(**self.text)
        self.vision = dataclasses.replace(self.vision, num_classes=0)
        self.text = dataclasses.replace(self.text, mlm_head=False, num_classes=0, pooler=False)
        if self.text_pool not in ("cls", "eot", "last", "mean"):
            raise ValueError(f"text_pool must be 'cls', 'eot', 'last' or 'mean', "
                             f"got {self.text_pool!r}")
        if self.loss not in ("softmax", "sigmoid"):
            raise ValueError(f"loss must be 'softmax' or 'sigmoid', got {self.loss!r}")
        if self.text.causal and self.text_pool == "cls":
            raise ValueError("a causal text tower cannot pool at [CLS] (position 0 sees only "
                             "itself): use text_pool='eot'")
        if self.embed_dim < 1:
            raise ValueError(f"embed_dim must be >= 1, got {self.embed_dim}")
        if not self.image_projection and self.embed_dim != self.vision.dim:
            raise ValueError(f"image_projection=False uses the image tower's features as "
                             f"embeddings: embed_dim ({self.embed_dim}) must equal vision.dim "
                             f"({self.vision.dim})")
        if self.logit_scale_init > self.logit_scale_max:
            raise ValueError(f"logit_scale_init ({self.logit_scale_init}) is above "
                             f"logit_scale_max ({self.logit_scale_max})")


def tokenize_texts(tokenizer: Any, texts: Sequence[str], text_pool: str = "eot"
                   ) -> dict[str, Tensor]:
    """Right-padded ``input_ids`` / ``attention_mask`` for the text tower:
    ``[CLS] tokens`` for ``"cls"`` pooling, ``tokens [EOS]`` for ``"eot"`` and ``"mean"``,
    the bare tokens for ``"last"`` (SigLIP)."""
    seqs = tokenizer.encode_many(list(texts), add_cls=text_pool == "cls",
                                 add_eos=text_pool in ("eot", "mean"))
    return tokenizer.pad(seqs)


@register_model
class CLIP(PretrainedMixin, nn.Module):
    """Images (B, C, H, W) and token ids (B, T) -> L2-normalised features in one space.

    ``encode_image`` / ``encode_text`` give (B, embed_dim) unit vectors;
    ``similarity(images, input_ids)`` the (N_images, N_texts) scaled cosines
    ``exp(logit_scale) · I Tᵀ``; ``zero_shot`` class probabilities from prompts;
    ``forward_features(images, input_ids)`` the paired features (B, 2, embed_dim) of one
    training batch and ``model(images, input_ids)`` their ``logits_per_image`` (B, B).
    """

    config_class = CLIPConfig
    modality = "image+text"  # reads both (two towers); the Captioner is image in, text out

    def __init__(self, config: CLIPConfig) -> None:
        super().__init__()
        self.config = config
        self.vision_model = ViT(config.vision)
        self.text_model = TextEncoder(config.text)
        self.visual_projection: nn.Module = nn.Identity()
        if config.image_projection:
            self.visual_projection = nn.Linear(config.vision.dim, config.embed_dim, bias=False)
            nn.init.normal_(self.visual_projection.weight, std=config.vision.dim ** -0.5)
        self.text_projection = nn.Linear(config.text.dim, config.embed_dim,
                                         bias=config.text_projection_bias)
        nn.init.normal_(self.text_projection.weight, std=config.text.dim ** -0.5)
        if self.text_projection.bias is not None:
            nn.init.zeros_(self.text_projection.bias)
        self.logit_scale = nn.Parameter(torch.tensor(float(config.logit_scale_init)))
        if config.loss == "sigmoid":
            self.logit_bias = nn.Parameter(torch.tensor(float(config.logit_bias_init)))
        else:
            self.register_parameter("logit_bias", None)
        self._warned_truncation = False

    # -- temperature ---------------------------------------------------------------------
    def scale(self) -> Tensor:
        """``s = exp(min(logit_scale, logit_scale_max))``; the clamp stops the gradient
        above the cap, as in CLIP."""
        return self.logit_scale.clamp(max=self.config.logit_scale_max).exp()

    @torch.no_grad()
    def clamp_logit_scale(self) -> None:
        """Clamp the stored ``logit_scale`` in place (call after an optimizer step)."""
        self.logit_scale.clamp_(max=self.config.logit_scale_max)

    # -- towers ----------------------------------------------------------------------------
    def image_features(self, images: Tensor) -> Tensor:
        """Pooled image tower output (B, vision.dim), before the projection."""
        if isinstance(images, Tensor) and images.dim() == 4 and images.shape[0] == 0:
            raise ValueError(f"empty batch: images has shape {tuple(images.shape)}")
        vit = self.vision_model
        return vit.forward_head(vit.forward_features(images), pre_logits=True)

    def encode_image(self, images: Tensor, normalize: bool = True) -> Tensor:
        """Image embeddings (B, embed_dim), unit length unless ``normalize=False``."""
        x = self.visual_projection(self.image_features(images))
        return F.normalize(x, dim=-1) if normalize else x

    def _truncate(self, input_ids: Tensor, attention_mask: Tensor | None
                  ) -> tuple[Tensor, Tensor | None]:
        limit = self.config.text.max_len
        if input_ids.shape[1] <= limit:
            return input_ids, attention_mask
        if not self._warned_truncation:
            warnings.warn(f"texts of {input_ids.shape[1]} tokens are longer than the text "
                          f"tower's context of {limit}; keeping the first {limit} tokens "
                          "(this warning is shown once)", stacklevel=3)
            self._warned_truncation = True
        input_ids = input_ids[:, :limit]
        return input_ids, None if attention_mask is None else attention_mask[:, :limit]

    def text_features(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Pooled text tower output (B, text.dim), before the projection."""
        check_token_ids(input_ids, self.config.text.vocab_size)
        if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
            raise ValueError(f"empty batch of texts: input_ids has shape "
                             f"{tuple(input_ids.shape)}")
        if attention_mask is not None and attention_mask.shape != input_ids.shape:
            raise ValueError(f"attention_mask must match input_ids {tuple(input_ids.shape)}, "
                             f"got {tuple(attention_mask.shape)}")
        input_ids, attention_mask = self._truncate(input_ids, attention_mask)
        hidden = self.text_model(input_ids, attention_mask)
        if self.config.text_pool == "cls":
            return hidden[:, 0]
        if self.config.text_pool == "last":
            return hidden[:, -1]
        if self.config.text_pool == "mean":
            return mean_pool(hidden, attention_mask)
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        if attention_mask is None:
            last = torch.full_like(rows, hidden.shape[1] - 1)
        else:
            lengths = attention_mask.long().sum(dim=1)
            if bool((lengths == 0).any()):
                raise ValueError("a text has no tokens (an all-zero attention_mask row)")
            last = lengths - 1
        eot = self.config.eot_token_id
        if eot is not None:  # the first eot id of each row (transformers' CLIP rule)
            is_eot = input_ids == eot
            last = torch.where(is_eot.any(dim=1), is_eot.int().argmax(dim=1), last)
        return hidden[rows, last]

    def encode_text(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                    normalize: bool = True) -> Tensor:
        """Text embeddings (B, embed_dim), unit length unless ``normalize=False``.
        ``attention_mask`` (B, T) is 1 at tokens and 0 at (right) padding."""
        x = self.text_projection(self.text_features(input_ids, attention_mask))
        return F.normalize(x, dim=-1) if normalize else x

    # -- pairs (the model API) ---------------------------------------------------------------
    @property
    def num_features(self) -> int:
        return self.config.embed_dim

    def example_inputs(self, batch_size: int = 2) -> tuple[Tensor, ...]:
        """Random images and token ids of the towers' example inputs."""
        (images,) = self.vision_model.example_inputs(batch_size)
        (ids,) = self.text_model.example_inputs(batch_size)
        return images, ids

    def forward_features(self, images: Tensor, input_ids: Tensor,
                         attention_mask: Tensor | None = None) -> Tensor:
        """Unit embeddings of B matching image-text pairs, stacked (B, 2, embed_dim):
        ``[:, 0]`` the images', ``[:, 1]`` the texts'."""
        n_img = images.shape[0] if isinstance(images, Tensor) and images.dim() > 0 else None
        if isinstance(input_ids, Tensor) and input_ids.dim() == 2 and n_img is not None \
                and input_ids.shape[0] != n_img:
            raise ValueError(f"{n_img} images but {input_ids.shape[0]} texts: a batch of pairs "
                             "matches image i with text i (similarity() scores any numbers)")
        return torch.stack([self.encode_image(images),
                            self.encode_text(input_ids, attention_mask)], dim=1)

    def pool(self, features: Tensor, *, attention_mask: Tensor | None = None) -> Tensor:
        """The image embeddings (B, embed_dim) of :meth:`forward_features` (the text mask
        was applied by ``forward_features``; ``attention_mask`` is accepted for the common
        API)."""
        return features[:, 0]

    def forward_head(self, features: Tensor, pre_logits: bool = False, *,
                     attention_mask: Tensor | None = None) -> Tensor:
        """``logits_per_image`` (B, B) = ``exp(logit_scale) · I Tᵀ`` (+ bias with the sigmoid
        loss) of paired features; ``pre_logits``: :meth:`pool`."""
        if pre_logits:
            return self.pool(features, attention_mask=attention_mask)
        logits = self.scale() * features[:, 0] @ features[:, 1].T
        return logits + self.logit_bias if self.logit_bias is not None else logits

    def forward(self, images: Tensor, input_ids: Tensor,
                attention_mask: Tensor | None = None) -> Tensor:
        """``logits_per_image`` (B, B) of a batch of pairs (transpose: per text)."""
        return self.forward_head(self.forward_features(images, input_ids, attention_mask))

    def similarity(self, images: Tensor, input_ids: Tensor,
                   attention_mask: Tensor | None = None) -> Tensor:
        """``logits_per_image`` (N_images, N_texts) = ``exp(logit_scale) · I Tᵀ`` (plus the
        bias with the sigmoid loss). Any numbers of images and texts; the transpose is
        ``logits_per_text``."""
        logits = self.scale() * self.encode_image(images) @ \
            self.encode_text(input_ids, attention_mask).T
        return logits + self.logit_bias if self.logit_bias is not None else logits

    # -- zero-shot --------------------------------------------------------------------------
    def check_tokenizer(self, tokenizer: Any) -> None:
        """A tokenizer whose ids do not fit the text tower's vocabulary is an error."""
        size = getattr(tokenizer, "vocab_size", None)
        if not isinstance(size, int):
            raise ValueError(f"tokenizer must be one of multimodal's text tokenizers (with "
                             f"vocab_size), got {type(tokenizer).__name__}")
        if size > self.config.text.vocab_size:
            raise ValueError(f"the tokenizer has {size} tokens but the text tower's vocabulary "
                             f"holds {self.config.text.vocab_size} (text.vocab_size): they "
                             "were not trained together")

    def _check_prompts(self, class_names: Sequence[str], templates: Sequence[str],
                       tokenizer: Any) -> None:
        if isinstance(class_names, str) or len(class_names) == 0:
            raise ValueError("class_names must be a non-empty list of class names")
        if isinstance(templates, str) or len(templates) == 0:
            raise ValueError("templates must be a non-empty list of strings with one '{}'")
        for t in templates:
            if not isinstance(t, str) or "{}" not in t:
                raise ValueError(f"template {t!r} has no '{{}}' where the class name goes")
            try:
                t.format("x")
            except (IndexError, KeyError, ValueError) as err:
                raise ValueError(f"template {t!r} must hold exactly one '{{}}' (the class name) "
                                 f"and no other braces: {err!r}") from err
        self.check_tokenizer(tokenizer)

    @torch.no_grad()
    def prompt_embeddings(self, class_names: Sequence[str], templates: Sequence[str],
                          tokenizer: Any) -> Tensor:
        """Unit embeddings (C, T, embed_dim) of ``template.format(name)`` for every class
        and template."""
        self._check_prompts(class_names, templates, tokenizer)
        device = self.logit_scale.device
        texts = [t.format(name) for name in class_names for t in templates]
        batch = tokenize_texts(tokenizer, texts, self.config.text_pool)
        emb = self.encode_text(batch["input_ids"].to(device), batch["attention_mask"].to(device))
        return emb.view(len(class_names), len(templates), -1)

    @torch.no_grad()
    def class_embeddings(self, class_names: Sequence[str], templates: Sequence[str],
                         tokenizer: Any) -> Tensor:
        """One unit vector per class (C, embed_dim): the mean of the normalised embeddings
        of ``template.format(name)`` over the templates, renormalised (CLIP's prompt
        ensembling)."""
        return F.normalize(self.prompt_embeddings(class_names, templates, tokenizer).mean(1),
                           dim=-1)

    @torch.no_grad()
    def zero_shot(self, images: Tensor, class_names: Sequence[str],
                  templates: Sequence[str] = DEFAULT_TEMPLATES, *, tokenizer: Any,
                  ensemble: Literal["mean", "sum"] = "mean") -> Tensor:
        """Class probabilities (B, C) from the scaled cosines ``s · I Pᵀ`` (softmax for both
        losses: it ranks classes as the scaled cosines do).

        ``ensemble="mean"`` (CLIP's prompt ensembling, for templates that are paraphrases):
        ``softmax(s · I Cᵀ)`` over the class embeddings of :meth:`class_embeddings`.
        ``ensemble="sum"`` (for templates that describe different images of the class, e.g.
        "a small {}" / "a large {}"): a softmax over all C·T prompts, summed over each
        class's T prompts, ``p(c) = Σ_t exp(s·I·P_ct) / Σ_c' Σ_t exp(s·I·P_c't)``, the
        probability that the image matches any of the class's prompts.
        """
        if ensemble not in ("mean", "sum"):
            raise ValueError(f"ensemble must be 'mean' or 'sum', got {ensemble!r}")
        image = self.encode_image(images)
        if ensemble == "mean":
            classes = self.class_embeddings(class_names, templates, tokenizer)
            return (self.scale() * image @ classes.T).softmax(dim=-1)
        prompts = self.prompt_embeddings(class_names, templates, tokenizer)
        logits = self.scale() * torch.einsum("bd,ctd->bct", image, prompts)
        return logits.flatten(1).softmax(dim=-1).view_as(logits).sum(dim=-1)


@register_preset("clip_scenes")
def clip_scenes(**overrides: Any) -> CLIP:
    """Small CLIP for 32x32 procedural scenes (conv stem, word-level captions, width 96):
    the model of configs/clip_scenes.yaml."""
    defaults = {
        "vision": dataclasses.replace(_default_vision(), stem="conv", dim=96, mlp_dim=192),
        "text": dataclasses.replace(_default_text(), vocab_size=32, max_len=24, dim=96,
                                    mlp_dim=192),
        "embed_dim": 96}
    return CLIP(CLIPConfig(**{**defaults, **overrides}))


@register_preset("clip_emoji")
def clip_emoji(**overrides: Any) -> CLIP:
    """Small CLIP for 32x32 emoji and their names (conv stem, a 1000-piece WordPiece
    vocabulary, width 96, dropout 0.1): the model of configs/clip_emoji.yaml."""
    defaults = {
        "vision": dataclasses.replace(_default_vision(), stem="conv", dim=96, mlp_dim=192,
                                      dropout=0.1),
        "text": dataclasses.replace(_default_text(), vocab_size=1000, max_len=32, dim=96,
                                    mlp_dim=192, dropout=0.1),
        "embed_dim": 96}
    return CLIP(CLIPConfig(**{**defaults, **overrides}))
