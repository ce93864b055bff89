"""The one model API (docs/models.md): the verbs every model of the package has.

timm's idea, extended to text, audio and encoder-decoders:

``forward_features(*inputs)``
    the last hidden states ``(B, N, num_features)``, after the final norm
    (encoder-decoders: the decoder's; ViT / audio: prefix tokens included).
``pool(features, *, attention_mask=None)``
    one vector per input ``(B, num_features)``: class token or mean (ViT, audio), ``[CLS]``
    through the pooler if any (TextEncoder), the last real token (decoders).
    ``attention_mask`` ``(B, N)`` is 1 (True) at real tokens, 0 at padding, for every model
    (audio included); None: every token counts. Models whose inputs never pad (images)
    accept it and, where their pooling reads one token that is always real, ignore it.
``forward_head(features, pre_logits=False, *, attention_mask=None)``
    the head's output: class logits (ViT, AudioClassifier, a TextEncoder with
    ``num_classes``), next-token logits ``(B, N, vocab)`` (decoders), masked-LM logits (a
    TextEncoder with only its MLM head); ``pre_logits=True`` gives
    ``pool(features, attention_mask=attention_mask)``; a model without a head returns the
    pooled features.
``return_attention=True``
    (a keyword of ``forward`` / ``forward_features`` where a model has it) returns
    ``(output, AttentionMaps)``: :class:`AttentionMaps` holds ``self_attn`` and
    ``cross_attn``, each a list of per-layer tensors ``(B, heads, queries, keys)`` in layer
    order (``cross_attn`` empty for a model without cross-attention).
``model(*inputs)``
    ``forward_head(forward_features(*inputs))`` — except the TextEncoder, whose call returns
    ``forward_features`` (hidden states, as ``BertModel`` does).
``generate(inputs, max_new_tokens, *, do_sample=False, temperature=1.0, top_k=None,
top_p=None, num_beams=1, generator=None, use_cache=True, compile=False, ...)``
    where the model decodes (TextDecoder, ImageGPT, Captioner, Seq2Seq, RNNSeq2Seq,
    Whisper, the codec LM): the names and defaults of
    :func:`multimodal.generation.generate` (:data:`GENERATE_DEFAULTS`), greedy unless
    ``do_sample=True`` — except ImageGPT, which samples unless ``do_sample=False`` (greedy
    pixels from an unconditional model are copies of one image); ``max_new_tokens=None``
    is as many as the model's context (or image) has room for, the default everywhere but
    the TextDecoder's (20).
``example_inputs(batch_size)``
    a tuple of valid random inputs, ``model(*model.example_inputs())`` runs.
``config`` / ``config_class`` / ``num_features`` / ``modality`` / ``num_params()`` /
``save_pretrained(path)`` / ``from_pretrained(path)``.

:class:`Model` states the contract as a ``typing.Protocol``; ``tests/models/test_api.py`` runs
it over every registered model class and preset.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import Tensor

from multimodal.generation import generate
from multimodal.tokenizers.text import BOS_ID, EOS_ID, PAD_ID

__all__ = ["GENERATE_DEFAULTS", "MODALITIES", "AttentionMaps", "ClassifierHeadMixin",
           "DecoderHeadMixin", "Model", "linear_head", "with_attention_maps"]

# what a model reads: one modality, the two of an encoder-decoder ("source-target": image
# in, text out for the Captioner; audio in, text out for Whisper), or two read side by side
# by a dual encoder ("image+text": CLIP / SigLIP, one embedding space for both)
MODALITIES = ("image", "text", "audio", "image+text", "image-text", "text-text", "text-audio",
              "audio-text")


# The decoding arguments every model's ``generate`` takes as keywords, with these defaults
# (those of :func:`multimodal.generation.generate`, and transformers': greedy unless
# do_sample=True). ``max_new_tokens`` comes second, after the model's inputs; its default is
# the room the model has left (the rest of the image, of the target context), except the
# TextDecoder's open-ended continuation: 20 tokens, as transformers' default length.
GENERATE_DEFAULTS: dict[str, Any] = {
    "do_sample": False, "temperature": 1.0, "top_k": None, "top_p": None, "num_beams": 1,
    "generator": None, "use_cache": True, "compile": False,
}


@dataclass(frozen=True)
class AttentionMaps:
    """What ``return_attention=True`` returns beside a model's output, for every model:
    the attention weights of each layer, in layer order, each ``(B, heads, queries, keys)``
    (rows sum to 1 over the keys; masked keys weigh 0). ``self_attn``: self-attention
    (encoder-decoders: the decoder's); ``cross_attn``: cross-attention over the encoder's
    output (empty without cross-attention). Indexing, ``len`` and iteration go over the
    self-attention layers (``maps[0]`` is the first layer's), as the list ViT and the audio
    encoder returned before."""

    self_attn: list[Tensor]
    cross_attn: list[Tensor] = field(default_factory=list)

    # a sequence of the self-attention layers, as ``vit(x, return_attention=True)`` has
    # always returned: ``maps[i]`` is layer i's ``(B, heads, N, N)``
    def __getitem__(self, layer: int) -> Tensor:
        return self.self_attn[layer]

    def __len__(self) -> int:
        return len(self.self_attn)

    def __iter__(self) -> Iterator[Tensor]:
        return iter(self.self_attn)

    @classmethod
    def from_layers(cls, maps: dict[str, list[Tensor]]) -> AttentionMaps:
        """From :class:`~multimodal.nn.block.Transformer`'s ``{"self": [...], "cross":
        [...]}``."""
        return cls(list(maps.get("self", [])), list(maps.get("cross", [])))


def with_attention_maps(out: Any, return_attention: bool) -> Any:
    """A :class:`~multimodal.nn.block.Transformer`'s output as a model returns it:
    ``hidden`` unchanged, ``(hidden, {"self": ..., "cross": ...})`` as
    ``(hidden, AttentionMaps)``."""
    if not return_attention:
        return out
    hidden, maps = out
    return hidden, AttentionMaps.from_layers(maps)


@runtime_checkable
class Model(Protocol):
    """The verbs every model of the package has (module docstring)."""

    config: Any
    config_class: ClassVar[type]
    modality: ClassVar[str]

    @property
    def num_features(self) -> int: ...

    def forward_features(self, *inputs: Any, **kwargs: Any) -> Any: ...

    def pool(self, features: Tensor, *, attention_mask: Tensor | None = None) -> Tensor: ...

    def forward_head(self, features: Tensor, pre_logits: bool = False, *,
                     attention_mask: Tensor | None = None) -> Tensor: ...

    def example_inputs(self, batch_size: int = 2) -> tuple[Tensor, ...]: ...

    def num_params(self, trainable_only: bool = False) -> int: ...

    def save_pretrained(self, path: str | Path) -> Path: ...


def linear_head(dim: int, num_classes: int, generator: torch.Generator | None = None,
                *, empty: Any = None) -> Any:
    """A fresh classifier ``Linear(dim, num_classes)``: weights ~ truncated N(0, 0.02^2)
    (as every model's ``init_weights``), zero bias; ``empty`` (``nn.Identity()`` or None)
    when ``num_classes == 0``. ``generator`` makes the draw reproducible (every rank of a
    distributed run draws the same head)."""
    if num_classes < 0:
        raise ValueError(f"num_classes must be >= 0 (0: no head), got {num_classes}")
    if num_classes == 0:
        return empty
    head = torch.nn.Linear(dim, num_classes)
    with torch.no_grad():
        draw = torch.randn(num_classes, dim, generator=generator)
        head.weight.copy_(draw.clamp_(-2.0, 2.0) * 0.02)  # N(0, 1) truncated at +-2 std
        head.bias.zero_()
    return head


class ClassifierHeadMixin:
    """timm's ``reset_classifier``: a new head of ``num_classes`` outputs (0: none, the
    model then returns pooled features), ``config.num_classes`` updated to match, so the
    model saves and reloads with its new shape. The head sits at ``self.head`` (and DeiT's
    ``self.head_dist``); its input width is ``num_features``."""

    config: Any
    _EMPTY_HEAD: ClassVar[str] = "identity"  # what num_classes=0 leaves: "identity" / "none"

    def reset_classifier(self, num_classes: int,
                         generator: torch.Generator | None = None) -> None:
        dim = self.num_features  # type: ignore[attr-defined]
        empty = torch.nn.Identity() if self._EMPTY_HEAD == "identity" else None
        ref = next(iter(self.parameters()))  # type: ignore[attr-defined]
        head = linear_head(dim, num_classes, generator, empty=empty)
        self.head = head.to(ref.device) if head is not None else None
        if getattr(self.config, "distill_token", False) and hasattr(self, "head_dist"):
            dist = linear_head(dim, num_classes, generator)
            self.head_dist = dist.to(ref.device) if dist is not None else None
        self.config.num_classes = int(num_classes)


class DecoderHeadMixin:
    """``pool`` / ``forward_head`` / ``num_features`` / ``generate`` of an encoder-decoder,
    whose features are those of its decoder at ``self.decoder``: the last real target
    token, next-token logits (B, T, vocab). A model supplies :meth:`decoding_inputs`."""

    decoder: Any

    @property
    def num_features(self) -> int:
        return self.decoder.num_features

    def pool(self, features: Tensor, *, attention_mask: Tensor | None = None) -> Tensor:
        """The last real target token's features (B, decoder.dim)."""
        return self.decoder.pool(features, attention_mask=attention_mask)

    def forward_head(self, features: Tensor, pre_logits: bool = False, *,
                     attention_mask: Tensor | None = None) -> Tensor:
        """Next-token logits (B, T, vocab) (``pre_logits``: :meth:`pool`)."""
        return self.decoder.forward_head(features, pre_logits, attention_mask=attention_mask)

    def decoding_inputs(self, source_ids: Tensor,
                        source_mask: Tensor | None = None) -> dict[str, Any]:
        """What the decoder needs from the source at every step (``memory``,
        ``memory_padding_mask``, ...), passed to the decoder through ``generate``."""
        raise NotImplementedError

    @torch.no_grad()
    def generate(self, source_ids: Tensor, source_mask: Tensor | None = None,
                 max_new_tokens: int | None = None, *, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, num_beams: int = 1,
                 generator: torch.Generator | None = None, use_cache: bool = True,
                 compile: bool = False, bos_token_id: int = BOS_ID,
                 eos_token_id: int | None = EOS_ID, pad_token_id: int = PAD_ID,
                 **kwargs: Any) -> Tensor:
        """Decode a target for each source, starting from ``[BOS]``; returns
        (B, 1 + generated) ids, ``[PAD]`` after ``[EOS]``; at most ``max_target_len - 1``
        new tokens by default. The decoding arguments are :data:`GENERATE_DEFAULTS`'; other
        keyword arguments (``length_penalty``, ``static_cache`` ...) go to
        :func:`multimodal.generation.generate`."""
        was_training = self.training  # type: ignore[attr-defined]
        self.eval()  # type: ignore[attr-defined]
        try:
            source = self.decoding_inputs(source_ids, source_mask)
            start = source_ids.new_full((source_ids.shape[0], 1), bos_token_id)
            steps = max_new_tokens if max_new_tokens is not None \
                else self.config.max_target_len - 1  # type: ignore[attr-defined]
            return generate(self.decoder, start, steps, do_sample=do_sample,
                            temperature=temperature, top_k=top_k, top_p=top_p,
                            num_beams=num_beams, generator=generator, use_cache=use_cache,
                            compile=compile, eos_token_id=eos_token_id,
                            pad_token_id=pad_token_id, **source, **kwargs)
        finally:
            self.train(was_training)  # type: ignore[attr-defined]
