"""Text models on the shared backbone: a GPT-style decoder and a BERT-style encoder."""

from __future__ import annotations

import warnings
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from multimodal.generation import generate
from multimodal.models.api import ClassifierHeadMixin, with_attention_maps
from multimodal.models.backbone import model_config
from multimodal.nn.block import Transformer
from multimodal.nn.cache import KVCache
from multimodal.nn.init import init_weights
from multimodal.nn.layers import ACTIVATIONS
from multimodal.nn.pool import TOKEN_POOLING, last_token, pool_tokens
from multimodal.nn.position import LearnedPositions, SinusoidalPositions
from multimodal.registry import register_model, register_preset
from multimodal.weights import PretrainedMixin


@model_config(dim=256, depth=6, heads=8, norm_eps=1e-5, activation="gelu_tanh",
              fixed={"causal": True, "norm": "pre"})
class TextDecoderConfig:
    """A GPT-style decoder; ``backbone`` is causal and pre-norm. Sparse self-attention for
    long contexts: ``attention_pattern`` "sliding" / "strided" (see multimodal.nn.masks)."""

    vocab_size: int = 8000
    max_len: int = 256
    # "none": no added positions, for a backbone with rope="1d" (Llama)
    pos_embed: Literal["learned", "sinusoidal", "none"] = "learned"
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        if self.pos_embed not in ("learned", "sinusoidal", "none"):
            raise ValueError(f"pos_embed must be 'learned', 'sinusoidal' or 'none', "
                             f"got {self.pos_embed!r}")


def check_token_ids(input_ids: Tensor, vocab_size: int, name: str = "input_ids",
                    values: bool = True) -> None:
    """dtype and shape always; the values (one host sync) only with ``values``."""
    if not isinstance(input_ids, Tensor) or input_ids.dtype not in (torch.long, torch.int32):
        got = input_ids.dtype if isinstance(input_ids, Tensor) else type(input_ids).__name__
        raise ValueError(f"{name} must be an integer tensor (batch, tokens), got {got}")
    if input_ids.dim() != 2:
        raise ValueError(f"{name} must be (batch, tokens), got shape {tuple(input_ids.shape)}")
    if values and input_ids.numel() and (int(input_ids.min()) < 0
                                         or int(input_ids.max()) >= vocab_size):
        raise ValueError(f"{name} holds ids outside the vocabulary [0, {vocab_size}): "
                         f"min {int(input_ids.min())}, max {int(input_ids.max())}")


def embed_tokens(embedding: nn.Embedding, input_ids: Tensor) -> Tensor:
    """``embedding(input_ids)``; an id outside the table (caught by the embedding's own
    bound check, so no host sync here) raises a ValueError that names the vocabulary."""
    try:
        return embedding(input_ids)
    except IndexError as err:
        raise ValueError(f"input_ids holds ids outside the vocabulary "
                         f"[0, {embedding.num_embeddings}): {err}") from err


def _positions(kind: str, max_len: int, dim: int) -> nn.Module | None:
    if kind == "learned":
        return LearnedPositions(max_len, dim)
    if kind == "none":
        return None
    return SinusoidalPositions(max_len, dim)


class NextTokenHead:
    """The head verbs of a next-token decoder, for a class with ``forward_features``
    (features, or ``(features, attention)``) and an ``lm_head``: ``pool`` = the last real
    token's features ``(B, dim)``, ``forward_head`` = logits ``(B, N, vocab)``, ``forward``
    = both in one call (attention passed through when ``forward_features`` returns it)."""

    #: ``forward`` is ``forward_head(forward_features(...))`` row by row: a decoding loop
    #: may run the head on the one position whose logits it uses
    logits_per_position: ClassVar[bool] = True

    def pool(self, features: Tensor, *, attention_mask: Tensor | None = None) -> Tensor:
        """The last real token's features ``(B, dim)`` (the last one when no mask)."""
        return last_token(features, attention_mask)

    def forward_head(self, features: Tensor, pre_logits: bool = False, *,
                     attention_mask: Tensor | None = None) -> Tensor:
        """Next-token logits ``(B, N, vocab)`` (``pre_logits``: :meth:`pool`)."""
        if pre_logits:
            return self.pool(features, attention_mask=attention_mask)
        return self.lm_head(features)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                **kwargs: Any) -> Any:
        out = self.forward_features(input_ids, attention_mask, **kwargs)
        if isinstance(out, tuple):
            return self.forward_head(out[0]), out[1]
        return self.forward_head(out)


def position_ids_from_mask(attention_mask: Tensor, past: int = 0) -> Tensor:
    """Positions that skip left padding: ``cumsum(mask) - 1`` (0 at pads), sliced after
    ``past`` cached tokens."""
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.clamp(min=0)[:, past:]


@register_model
class TextDecoder(NextTokenHead, PretrainedMixin, nn.Module):
    """GPT-style language model: token + position embeddings, causal backbone, LM head
    tied to the token embedding. ``forward`` returns next-token logits (B, N, vocab).

    ``attention_mask`` (B, past + N) is 1 at real tokens, 0 at padding (left padding for
    batched prompts of different lengths). With a :class:`KVCache` the new tokens follow
    the cached ones. ``memory`` is the encoder output when ``cross_attention`` is on.
    """

    config_class = TextDecoderConfig
    modality = "text"

    def __init__(self, config: TextDecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_embed = nn.Embedding(config.vocab_size, config.dim)
        self.pos_embed = _positions(config.pos_embed, config.max_len, config.dim)
        self.drop = nn.Dropout(config.dropout)
        self.transformer = Transformer(config.backbone)
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        self.apply(init_weights)
        nn.init.normal_(self.tok_embed.weight, std=0.02)
        if config.tie_embeddings:
            self.lm_head.weight = self.tok_embed.weight

    @property
    def max_len(self) -> int:
        return self.config.max_len

    @property
    def num_features(self) -> int:
        return self.config.dim

    def example_inputs(self, batch_size: int = 2) -> tuple[Tensor, ...]:
        """Random token ids ``(B, min(8, max_len))``."""
        return (torch.randint(0, self.config.vocab_size, (batch_size, min(8, self.max_len))),)

    def make_cache(self, max_len: int | None = None) -> KVCache:
        return self.transformer.make_cache(max_len or self.config.max_len)

    def forward_features(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        *,
        memory: Tensor | None = None,
        memory_padding_mask: Tensor | None = None,
        cache: KVCache | None = None,
        position_ids: Tensor | None = None,
        return_attention: bool = False,
    ) -> Any:
        past = cache.length if cache is not None else 0
        # values once per sequence (full forward / prefill), not on every cached step
        check_token_ids(input_ids, self.config.vocab_size, values=past == 0)
        if attention_mask is not None:
            if attention_mask.shape != (input_ids.shape[0], past + input_ids.shape[1]):
                raise ValueError(
                    f"attention_mask must be (batch, cached + new tokens) = "
                    f"{(input_ids.shape[0], past + input_ids.shape[1])}, "
                    f"got {tuple(attention_mask.shape)}"
                )
            if position_ids is None and not bool(attention_mask.all()):
                position_ids = position_ids_from_mask(attention_mask, past)
        x = embed_tokens(self.tok_embed, input_ids)
        if self.pos_embed is not None:
            x = self.pos_embed(x, offset=past, positions=position_ids)
        padding = None if attention_mask is None or bool(attention_mask.all()) \
            else ~attention_mask.bool()
        rotary = self.config.backbone.rope != "none"
        out = self.transformer(
            self.drop(x), memory, key_padding_mask=padding,
            memory_padding_mask=memory_padding_mask, cache=cache,
            return_attention=return_attention,
            positions=position_ids if rotary else None,
        )
        return with_attention_maps(out, return_attention)

    @torch.no_grad()
    def generate(self, input_ids: Tensor, max_new_tokens: int | None = 20, *,
                 do_sample: bool = False, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, num_beams: int = 1,
                 generator: torch.Generator | None = None, use_cache: bool = True,
                 compile: bool = False, **kwargs: Any) -> Tensor:
        """Continue ``input_ids`` (B, N) by ``max_new_tokens`` (None: up to ``max_len``
        tokens in all); see :func:`multimodal.generation.generate` for the strategies and
        the other keywords (``length_penalty``, ``eos_token_id``, ``attention_mask`` ...)."""
        if max_new_tokens is None:
            max_new_tokens = max(self.max_len - input_ids.shape[-1], 0)
        return generate(self, input_ids, max_new_tokens, do_sample=do_sample,
                        temperature=temperature, top_k=top_k, top_p=top_p,
                        num_beams=num_beams, generator=generator, use_cache=use_cache,
                        compile=compile, **kwargs)


@model_config(dim=256, depth=6, heads=8, norm_eps=1e-6, activation="gelu")
class TextEncoderConfig:
    """A BERT-style encoder (BERT itself: ``norm="post"``, ``embed_norm=True``,
    ``type_vocab_size=2``, ``pooler=True``)."""

    vocab_size: int = 8000
    max_len: int = 256
    # "none": no added positions, for a backbone with rope="1d"
    pos_embed: Literal["learned", "sinusoidal", "none"] = "learned"
    type_vocab_size: int = 0  # BERT's segment embeddings (2); 0 = none
    embed_norm: bool = False  # LayerNorm on the summed embeddings (BERT: True)
    num_classes: int = 0  # > 0: a classification head on the [CLS] token
    mlm_head: bool = True  # BERT's masked-LM head (dense, act, norm, tied decoder)
    pooler: bool = False  # BERT's tanh pooler on [CLS] before the classifier
    # the one embedding per text (pool; the head reads it): "cls" ([CLS], through the pooler
    # when there is one) or a sentence-transformers mode of multimodal.nn.pool.pool_tokens
    # ("mean" for all-MiniLM-L6-v2); normalize: then to unit length (their Normalize module)
    pool: Literal["cls", "mean", "max", "mean_sqrt_len", "lasttoken"] = "cls"
    normalize: bool = False

    def __post_init__(self) -> None:
        if self.pos_embed not in ("learned", "sinusoidal", "none"):
            raise ValueError(f"pos_embed must be 'learned', 'sinusoidal' or 'none', "
                             f"got {self.pos_embed!r}")
        if self.pool not in TOKEN_POOLING:
            raise ValueError(f"pool must be one of {TOKEN_POOLING}, got {self.pool!r}")


class MaskedLMHead(nn.Module):
    """BERT's MLM head: ``decoder(LN(act(dense(h))))`` with the decoder tied to the
    token embedding (plus its own bias)."""

    def __init__(self, dim: int, vocab_size: int, act: nn.Module, eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(dim, dim)
        self.act = act
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.decoder = nn.Linear(dim, vocab_size)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.decoder(self.norm(self.act(self.dense(hidden))))


@register_model
class TextEncoder(ClassifierHeadMixin, PretrainedMixin, nn.Module):
    """BERT-style bidirectional encoder. ``forward`` returns hidden states (B, N, dim);
    ``mlm_logits`` the masked-LM logits; ``classify`` the [CLS] classification logits."""

    _EMPTY_HEAD = "none"
    config_class = TextEncoderConfig
    modality = "text"

    def __init__(self, config: TextEncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_embed = nn.Embedding(config.vocab_size, config.dim)
        self.pos_embed = _positions(config.pos_embed, config.max_len, config.dim)
        self.type_embed = nn.Embedding(config.type_vocab_size, config.dim) \
            if config.type_vocab_size else None
        self.embed_norm = nn.LayerNorm(config.dim, eps=config.norm_eps) if config.embed_norm \
            else nn.Identity()
        self.drop = nn.Dropout(config.dropout)
        self.transformer = Transformer(config.backbone)
        act = ACTIVATIONS[config.activation]()
        self.mlm = MaskedLMHead(config.dim, config.vocab_size, act, config.norm_eps) \
            if config.mlm_head else None
        self.pooler = nn.Sequential(nn.Linear(config.dim, config.dim), nn.Tanh()) \
            if config.pooler else None
        self.head = nn.Linear(config.dim, config.num_classes) if config.num_classes else None
        self.apply(init_weights)
        nn.init.normal_(self.tok_embed.weight, std=0.02)
        if self.mlm is not None:
            self.mlm.decoder.weight = self.tok_embed.weight

    @property
    def num_features(self) -> int:
        return self.config.dim

    def example_inputs(self, batch_size: int = 2) -> tuple[Tensor, ...]:
        """Random token ids ``(B, min(8, max_len))``."""
        return (torch.randint(0, self.config.vocab_size,
                              (batch_size, min(8, self.config.max_len))),)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        return_attention: bool = False,
    ) -> Any:
        """Hidden states ``(B, N, dim)``: the same as :meth:`forward_features` (as
        ``BertModel``); the heads are :meth:`forward_head`, :meth:`mlm_logits`,
        :meth:`classify`."""
        return self.forward_features(input_ids, attention_mask, token_type_ids,
                                     return_attention)

    def forward_features(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        return_attention: bool = False,
    ) -> Any:
        """Hidden states ``(B, N, dim)`` after the final norm (with ``return_attention``
        ``(hidden, AttentionMaps)``)."""
        check_token_ids(input_ids, self.config.vocab_size)
        if attention_mask is not None and attention_mask.shape != input_ids.shape:
            raise ValueError(f"attention_mask must match input_ids {tuple(input_ids.shape)}, "
                             f"got {tuple(attention_mask.shape)}")
        x = self.tok_embed(input_ids)
        if self.pos_embed is not None:
            x = self.pos_embed(x)
        if self.type_embed is not None:
            types = token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids)
            x = x + self.type_embed(types)
        x = self.drop(self.embed_norm(x))
        padding = None if attention_mask is None or bool(attention_mask.all()) \
            else ~attention_mask.bool()
        out = self.transformer(x, key_padding_mask=padding, return_attention=return_attention)
        return with_attention_maps(out, return_attention)

    def mlm_logits(self, hidden: Tensor) -> Tensor:
        if self.mlm is None:
            raise ValueError("this TextEncoder was built with mlm_head=False")
        return self.mlm(hidden)

    def pool(self, features: Tensor, *, attention_mask: Tensor | None = None) -> Tensor:
        """One embedding per text ``(B, dim)`` by ``config.pool``: the ``[CLS]`` (first)
        token, through BERT's tanh pooler when the model has one, or a sentence-transformers
        mode over the real tokens (``attention_mask`` 1 = token;
        :func:`multimodal.nn.pool.pool_tokens`); with ``config.normalize``
        ``v / max(||v||, 1e-12)``."""
        if self.config.pool == "cls":
            cls = features[:, 0]
            pooled = self.pooler(cls) if self.pooler is not None else cls
        else:
            pooled = pool_tokens(features, attention_mask, self.config.pool)
        return nn.functional.normalize(pooled, dim=-1) if self.config.normalize else pooled

    def pooled(self, features: Tensor, *, attention_mask: Tensor | None = None) -> Tensor:
        """Deprecated (removed in 0.2): the name :meth:`pool` had before the common API."""
        warnings.warn("TextEncoder.pooled is deprecated and will be removed in 0.2: use "
                      "TextEncoder.pool", DeprecationWarning, stacklevel=2)
        return self.pool(features, attention_mask=attention_mask)

    def forward_head(self, features: Tensor, pre_logits: bool = False, *,
                     attention_mask: Tensor | None = None) -> Tensor:
        """The classification logits ``(B, num_classes)`` when the model has a classifier,
        else the masked-LM logits ``(B, N, vocab)``, else (no head) the pooled features;
        ``pre_logits``: :meth:`pool`."""
        if pre_logits or (self.head is None and self.mlm is None):
            return self.pool(features, attention_mask=attention_mask)
        return self.classify(features, attention_mask) if self.head is not None \
            else self.mlm_logits(features)

    def classify(self, hidden: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Class logits ``head(pool(hidden))`` (``attention_mask``: the padding, for the
        pooling modes other than ``"cls"``)."""
        if self.head is None:
            raise ValueError("this TextEncoder has no classification head (num_classes=0)")
        return self.head(self.pool(hidden, attention_mask=attention_mask))


@register_preset("gpt_tiny")
def gpt_tiny(**overrides: Any) -> TextDecoder:
    """Width 128, 4 blocks, 4 heads: the model of configs/gpt_corpus.yaml and
    gpt_textfiles.yaml (their data set ``vocab_size`` and ``max_len``)."""
    return TextDecoder(TextDecoderConfig(**{"dim": 128, "depth": 4, "heads": 4, **overrides}))


@register_preset("bert_tiny")
def bert_tiny(**overrides: Any) -> TextEncoder:
    """Width 128, 4 blocks, 4 heads: the encoder of configs/bert_mlm.yaml and
    bert_source_cls.yaml (their data set ``vocab_size`` and ``max_len``)."""
    return TextEncoder(TextEncoderConfig(**{"dim": 128, "depth": 4, "heads": 4, **overrides}))
