"""Encoder-decoder transformer (sequence to sequence) on the shared backbone.

The encoder is a :class:`~multimodal.models.text.TextEncoder` (bidirectional, no heads);
the decoder a :class:`~multimodal.models.text.TextDecoder` with ``cross_attention=True``:
each decoder block attends causally to the target so far, then from the target (queries)
to the encoder output (keys and values). Decoding reuses the package's one loop,
:func:`multimodal.generation.generate`, with ``memory=`` / ``memory_padding_mask=`` in its
model kwargs (greedy, sampling, beam search, KV cache with the cross keys/values computed
once).
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import InitVar, dataclass, field
from typing import Any

from torch import Tensor, nn

from multimodal.models.api import DecoderHeadMixin
from multimodal.models.text import TextDecoder, TextDecoderConfig, TextEncoder, TextEncoderConfig
from multimodal.registry import register_config_preset, register_model
from multimodal.tokenizers.text import BOS_ID
from multimodal.weights import PretrainedMixin


def _default_encoder() -> TextEncoderConfig:
    return TextEncoderConfig(vocab_size=8000, max_len=128, dim=128, depth=3, heads=4,
                             num_classes=0, mlm_head=False)


def _default_decoder() -> TextDecoderConfig:
    return TextDecoderConfig(vocab_size=8000, max_len=64, dim=128, depth=3, heads=4)


# the flat keywords of the config before it nested its two sides: keyword -> the
# (side, field) pairs it sets
# (in the order the init-only fields are declared below)
_BOTH = lambda name: (("encoder", name), ("decoder", name))
_FLAT: dict[str, tuple[tuple[str, str], ...]] = {
    "source_vocab_size": (("encoder", "vocab_size"),),
    "target_vocab_size": (("decoder", "vocab_size"),),
    "max_source_len": (("encoder", "max_len"),),
    "max_target_len": (("decoder", "max_len"),),
    "dim": _BOTH("dim"),
    "encoder_depth": (("encoder", "depth"),),
    "decoder_depth": (("decoder", "depth"),),
    "heads": _BOTH("heads"),
    "mlp_dim": _BOTH("mlp_dim"),
    "dropout": _BOTH("dropout"),
}


@dataclass
class Seq2SeqConfig:
    """A :class:`TextEncoderConfig` (no heads) and a cross-attending
    :class:`TextDecoderConfig`, each with its own ``backbone``.

    The flat keywords ``source_vocab_size``, ``target_vocab_size``, ``max_source_len``,
    ``max_target_len``, ``encoder_depth``, ``decoder_depth`` and (both sides) ``dim``,
    ``heads``, ``mlp_dim``, ``dropout`` are accepted too and fill in the two sides; they are
    readable as properties (``dim`` / ``heads`` / ... : the encoder's).
    ``decoder.cross_attention`` is always True and ``decoder.memory_dim`` the encoder width.
    """

    encoder: TextEncoderConfig = field(default_factory=_default_encoder)
    decoder: TextDecoderConfig = field(default_factory=_default_decoder)
    share_embeddings: bool = False  # one token table for both sides (same vocabulary)
    source_vocab_size: InitVar[int | None] = None
    target_vocab_size: InitVar[int | None] = None
    max_source_len: InitVar[int | None] = None
    max_target_len: InitVar[int | None] = None
    dim: InitVar[int | None] = None
    encoder_depth: InitVar[int | None] = None
    decoder_depth: InitVar[int | None] = None
    heads: InitVar[int | None] = None
    mlp_dim: InitVar[int | None] = None
    dropout: InitVar[float | None] = None

    def __post_init__(self, *flat: Any) -> None:
        if isinstance(self.encoder, dict):
            self.encoder = TextEncoderConfig(**self.encoder)
        if isinstance(self.decoder, dict):
            self.decoder = TextDecoderConfig(**self.decoder)
        sides: dict[str, dict[str, Any]] = {"encoder": {}, "decoder": {}}
        for name, value in zip(_FLAT, flat, strict=True):
            if value is not None:
                for side, key in _FLAT[name]:
                    sides[side][key] = value
        enc = dataclasses.replace(self.encoder, **sides["encoder"], num_classes=0,
                                  mlm_head=False)
        self.encoder = enc
        self.decoder = dataclasses.replace(self.decoder, **sides["decoder"],
                                           cross_attention=True, memory_dim=enc.dim)


def _read(side: str, key: str) -> property:
    return property(lambda self: getattr(getattr(self, side), key),
                    doc=f"``{side}.{key}``")


if list(inspect.signature(Seq2SeqConfig).parameters)[3:] != list(_FLAT):
    raise TypeError("Seq2SeqConfig's init-only fields must be declared in _FLAT's order")
for _name, ((_side, _key), *_) in _FLAT.items():
    setattr(Seq2SeqConfig, _name, _read(_side, _key))


@register_model
class Seq2Seq(DecoderHeadMixin, PretrainedMixin, nn.Module):
    """``forward(source_ids, target_ids) -> (B, T, target_vocab)`` next-token logits of the
    target (teacher forcing); ``generate(source_ids) -> [BOS] + generated ids``.

    ``source_mask`` (B, S) is 1 at source tokens and 0 at (right) padding.
    """

    config_class = Seq2SeqConfig
    modality = "text-text"

    def __init__(self, config: Seq2SeqConfig) -> None:
        super().__init__()
        if config.share_embeddings and config.source_vocab_size != config.target_vocab_size:
            raise ValueError("share_embeddings needs source_vocab_size == target_vocab_size, "
                             f"got {config.source_vocab_size} and {config.target_vocab_size}")
        self.config = config
        self.encoder = TextEncoder(config.encoder)
        self.decoder = TextDecoder(config.decoder)
        if config.share_embeddings:
            self.decoder.tok_embed.weight = self.encoder.tok_embed.weight
            self.decoder.lm_head.weight = self.encoder.tok_embed.weight

    def encode(self, source_ids: Tensor,
               source_mask: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Encoder output (B, S, dim) and the memory padding mask (True = pad) or None."""
        memory = self.encoder(source_ids, attention_mask=source_mask)
        pad = None if source_mask is None or bool(source_mask.all()) else ~source_mask.bool()
        return memory, pad

    def forward(self, source_ids: Tensor, target_ids: Tensor,
                source_mask: Tensor | None = None) -> Tensor:
        return self.forward_head(self.forward_features(source_ids, target_ids, source_mask))

    def forward_features(self, source_ids: Tensor, target_ids: Tensor,
                         source_mask: Tensor | None = None, *,
                         return_attention: bool = False) -> Any:
        """The decoder's hidden states (B, T, decoder.dim) after its final norm; with
        ``return_attention`` ``(hidden, AttentionMaps)``: the decoder's self-attention and
        its cross-attention over the source tokens, per layer."""
        memory, pad = self.encode(source_ids, source_mask)
        return self.decoder.forward_features(target_ids, memory=memory,
                                             memory_padding_mask=pad,
                                             return_attention=return_attention)

    def example_inputs(self, batch_size: int = 2) -> tuple[Tensor, ...]:
        """Random source ids and target ids starting with ``[BOS]``."""
        (source,) = self.encoder.example_inputs(batch_size)
        (target,) = self.decoder.example_inputs(batch_size)
        target[:, 0] = BOS_ID
        return source, target

    def decoding_inputs(self, source_ids: Tensor,
                        source_mask: Tensor | None = None) -> dict[str, Any]:
        """The encoder's states and padding, for the decoder's cross-attention."""
        memory, pad = self.encode(source_ids, source_mask)
        return {"memory": memory, "memory_padding_mask": pad}


# configs/seq2seq_numbers.yaml (and seq2seq_pairs.yaml, whose data set the vocabularies and
# lengths): width 64, two encoder and two decoder blocks, 4 heads; number words -> digits.
register_config_preset("seq2seq_numbers", Seq2Seq, Seq2SeqConfig, source_vocab_size=39,
                       target_vocab_size=17, max_source_len=24, max_target_len=12, dim=64,
                       encoder_depth=2, decoder_depth=2, heads=4, mlp_dim=256)
