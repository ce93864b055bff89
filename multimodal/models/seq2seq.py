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

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from multimodal.generation import generate
from multimodal.models.text import TextDecoder, TextDecoderConfig, TextEncoder, TextEncoderConfig
from multimodal.registry import register_model
from multimodal.tokenizers.text import BOS_ID, EOS_ID, PAD_ID
from multimodal.weights import PretrainedMixin


@dataclass
class Seq2SeqConfig:
    source_vocab_size: int = 8000
    target_vocab_size: int = 8000
    max_source_len: int = 128
    max_target_len: int = 64
    dim: int = 128
    encoder_depth: int = 3
    decoder_depth: int = 3
    heads: int = 4
    mlp_dim: int | None = None
    dropout: float = 0.0
    share_embeddings: bool = False  # one token table for both sides (same vocabulary)

    def encoder_config(self) -> TextEncoderConfig:
        return TextEncoderConfig(
            vocab_size=self.source_vocab_size, max_len=self.max_source_len, dim=self.dim,
            depth=self.encoder_depth, heads=self.heads, mlp_dim=self.mlp_dim, norm="pre",
            dropout=self.dropout, num_classes=0, mlm_head=False,
        )

    def decoder_config(self) -> TextDecoderConfig:
        return TextDecoderConfig(
            vocab_size=self.target_vocab_size, max_len=self.max_target_len, dim=self.dim,
            depth=self.decoder_depth, heads=self.heads, mlp_dim=self.mlp_dim,
            dropout=self.dropout, cross_attention=True, memory_dim=self.dim,
        )


@register_model
class Seq2Seq(PretrainedMixin, nn.Module):
    """``forward(source_ids, target_ids) -> (B, T, target_vocab)`` next-token logits of the
    target (teacher forcing); ``generate(source_ids) -> [BOS] + generated ids``.

    ``source_mask`` (B, S) is 1 at source tokens and 0 at (right) padding.
    """

    config_class = Seq2SeqConfig

    def __init__(self, config: Seq2SeqConfig) -> None:
        super().__init__()
        if config.share_embeddings and config.source_vocab_size != config.target_vocab_size:
            raise ValueError("share_embeddings needs source_vocab_size == target_vocab_size, "
                             f"got {config.source_vocab_size} and {config.target_vocab_size}")
        self.config = config
        self.encoder = TextEncoder(config.encoder_config())
        self.decoder = TextDecoder(config.decoder_config())
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
        memory, pad = self.encode(source_ids, source_mask)
        return self.decoder(target_ids, memory=memory, memory_padding_mask=pad)

    @torch.no_grad()
    def generate(self, source_ids: Tensor, source_mask: Tensor | None = None,
                 max_new_tokens: int | None = None, *, bos_token_id: int = BOS_ID,
                 eos_token_id: int | None = EOS_ID, pad_token_id: int = PAD_ID,
                 **kwargs: Any) -> Tensor:
        """Decode a target for each source, starting from ``[BOS]``; returns
        (B, 1 + generated) ids, ``[PAD]`` after ``[EOS]``. Other keyword arguments
        (``num_beams``, ``do_sample``, ``top_p`` ...) go to
        :func:`multimodal.generation.generate`."""
        was_training = self.training
        self.eval()
        try:
            memory, pad = self.encode(source_ids, source_mask)
            start = source_ids.new_full((source_ids.shape[0], 1), bos_token_id)
            steps = max_new_tokens if max_new_tokens is not None \
                else self.config.max_target_len - 1
            return generate(self.decoder, start, steps, eos_token_id=eos_token_id,
                            pad_token_id=pad_token_id, memory=memory,
                            memory_padding_mask=pad, **kwargs)
        finally:
            self.train(was_training)
