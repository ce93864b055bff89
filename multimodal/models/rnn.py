"""Recurrent encoder-decoder (GRU or LSTM), without attention or with additive / multiplicative
attention: the baselines the transformer replaced.

Encoder: token embeddings -> a ``num_layers`` GRU/LSTM over the (right-padded) source, run
packed so that padding never enters a state. Its outputs are the encoder states
``h_1..h_S``; its final state (per layer) starts the decoder.

Decoder, at step ``t`` with previous target token ``y_{t-1}``:

    s_t = RNN(embed(y_{t-1}), s_{t-1})                      (s_0 = the encoder's final state)
    c_t = h_S (the last encoder state)                      attention="none": the bottleneck
    c_t = sum_i a_ti h_i,  a_t = softmax_i score(s_t, h_i)  attention="additive" | "multiplicative"
    o_t = tanh(W_o [s_t; c_t]),   logits_t = W_out o_t

with ``score(s, h) = vᵀ tanh(W s + U h)`` (Bahdanau) or ``sᵀ W h`` (Luong), padded source
positions masked (:mod:`multimodal.nn.alignment`). This is Luong et al.'s "global
attention" decoder; only the way ``c_t`` is found differs between the three variants.

Decoding goes through :func:`multimodal.generation.generate` like every decoder of the
package: the decoder's ``make_cache`` returns a :class:`RecurrentState` (the hidden state
and the projected encoder keys) which plays the role of the transformer's KV cache, so
greedy, sampling and beam search (which reorders the state by beam) all work; with
``use_cache=False`` the decoder re-reads the whole prefix every step.

Limits: sources of at most ``max_source_len`` tokens and targets of at most
``max_target_len`` tokens (``[BOS]`` included); longer inputs are an error, not truncated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from multimodal.models.api import AttentionMaps, DecoderHeadMixin
from multimodal.models.text import NextTokenHead, check_token_ids
from multimodal.nn.alignment import AdditiveScore, MultiplicativeScore, attend
from multimodal.registry import register_config_preset, register_model
from multimodal.tokenizers.text import BOS_ID
from multimodal.weights import PretrainedMixin

CELLS = ("gru", "lstm")
ATTENTIONS = ("none", "additive", "multiplicative")


@dataclass
class RNNSeq2SeqConfig:
    """Sizes and switches of :class:`RNNSeq2Seq`.

    ``cell``: ``"gru"`` or ``"lstm"``; ``attention``: ``"none"`` (the last encoder state is
    the context), ``"additive"`` (Bahdanau) or ``"multiplicative"`` (Luong);
    ``attention_dim``: width of ``W s + U h`` in the additive score (default
    ``hidden_dim``).
    """

    source_vocab_size: int = 8000
    target_vocab_size: int = 8000
    max_source_len: int = 128
    max_target_len: int = 64
    embed_dim: int = 64
    hidden_dim: int = 128
    num_layers: int = 1
    cell: Literal["gru", "lstm"] = "gru"
    attention: Literal["none", "additive", "multiplicative"] = "none"
    attention_dim: int | None = None
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.cell not in CELLS:
            raise ValueError(f"cell must be one of {CELLS}, got {self.cell!r}")
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {self.attention!r}")
        for name in ("source_vocab_size", "target_vocab_size", "max_source_len",
                     "max_target_len", "embed_dim", "hidden_dim", "num_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.attention_dim is not None and self.attention_dim < 1:
            raise ValueError(f"attention_dim must be >= 1 (or None), got {self.attention_dim}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


def _rnn(cell: str, input_dim: int, hidden_dim: int, num_layers: int, dropout: float
         ) -> nn.RNNBase:
    rnn_cls = nn.GRU if cell == "gru" else nn.LSTM
    return rnn_cls(input_dim, hidden_dim, num_layers, batch_first=True,
                   dropout=dropout if num_layers > 1 else 0.0)


class RecurrentState:
    """The decoder's recurrent state between calls: what the KV cache is to a transformer.

    ``hidden``: the RNN state, a tuple of (num_layers, B, hidden) tensors (one for a GRU,
    ``(h, c)`` for an LSTM); ``keys``: the encoder states projected for the score (computed
    on the first call); ``length``: target tokens read so far.
    """

    def __init__(self, max_len: int) -> None:
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        self.max_len = max_len
        self.length = 0
        self.hidden: tuple[Tensor, ...] | None = None
        self.keys: Tensor | None = None

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search follows each surviving beam's parent)."""
        if self.hidden is not None:
            self.hidden = tuple(h.index_select(1, index) for h in self.hidden)
        if self.keys is not None:
            self.keys = self.keys.index_select(0, index)


class RNNEncoder(nn.Module):
    """Embeddings and a packed GRU/LSTM: ``(source_ids, lengths) -> (states (B, S, H),
    final state (B, k, num_layers, H))`` with k = 1 (GRU) or 2 (LSTM: h then c); states
    at padded positions are 0."""

    def __init__(self, config: RNNSeq2SeqConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(config.source_vocab_size, config.embed_dim)
        self.dropout = nn.Dropout(config.dropout)
        self.rnn = _rnn(config.cell, config.embed_dim, config.hidden_dim, config.num_layers,
                        config.dropout)

    def forward(self, source_ids: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        x = self.dropout(self.embed(source_ids))
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, state = self.rnn(packed)
        states, _ = pad_packed_sequence(out, batch_first=True, total_length=source_ids.shape[1])
        parts = state if isinstance(state, tuple) else (state,)
        return states, torch.stack(parts, dim=0).permute(2, 0, 1, 3)  # (B, k, L, H)


class RNNDecoder(NextTokenHead, nn.Module):
    """``decoder(target_ids, cache=..., memory=..., memory_padding_mask=...,
    encoder_state=...) -> logits (B, T, V)``: the step interface of
    :func:`multimodal.generation.generate` (``make_cache``, ``max_len``), with the
    recurrent state as the cache. ``encoder_state`` (B, k, num_layers, H) starts the
    recurrence; ``memory`` (B, S, H) are the encoder states attended over
    (``memory_padding_mask`` True at padding)."""

    def __init__(self, config: RNNSeq2SeqConfig) -> None:
        super().__init__()
        h = config.hidden_dim
        self.config = config
        self.max_len = config.max_target_len
        self.embed = nn.Embedding(config.target_vocab_size, config.embed_dim)
        self.dropout = nn.Dropout(config.dropout)
        self.rnn = _rnn(config.cell, config.embed_dim, h, config.num_layers, config.dropout)
        self.score: AdditiveScore | MultiplicativeScore | None = None
        if config.attention == "additive":
            self.score = AdditiveScore(h, h, config.attention_dim or h)
        elif config.attention == "multiplicative":
            self.score = MultiplicativeScore(h, h)
        self.combine = nn.Linear(2 * h, h)
        self.lm_head = nn.Linear(h, config.target_vocab_size)

    def make_cache(self, max_len: int | None = None) -> RecurrentState:
        return RecurrentState(max_len or self.max_len)

    @property
    def num_features(self) -> int:
        return self.config.hidden_dim

    def forward_features(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                         cache: RecurrentState | None = None, *, encoder_state: Tensor,
                         memory: Tensor | None = None, memory_padding_mask: Tensor | None = None,
                         return_attention: bool = False) -> Tensor | tuple[Tensor, AttentionMaps]:
        """``o_t = tanh(W_o [s_t; c_t])`` (B, T, hidden_dim), with ``return_attention``
        also the :class:`~multimodal.models.api.AttentionMaps`: no self-attention, and the
        one-head attention over the encoder states as one layer of cross-attention
        ``(B, 1, T, S)`` (none without attention)."""
        check_token_ids(input_ids, self.config.target_vocab_size, "target_ids")
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("the RNN decoder reads unpadded prefixes only (every row starts "
                             "with [BOS]); attention_mask must be all ones")
        past = cache.length if cache is not None else 0
        limit = cache.max_len if cache is not None else self.max_len
        if past + input_ids.shape[1] > limit:
            raise ValueError(f"target of {past} + {input_ids.shape[1]} tokens exceeds "
                             f"max_target_len {limit}")
        if self.score is not None and memory is None:
            raise ValueError(f"attention={self.config.attention!r} needs memory= (the encoder "
                             "states)")
        if cache is not None and cache.hidden is not None:
            hidden, keys = cache.hidden, cache.keys
        else:
            hidden = tuple(encoder_state.permute(1, 2, 0, 3).contiguous().unbind(0))
            keys = self.score.keys(memory) if self.score is not None else None
        out, new_hidden = self.rnn(self.dropout(self.embed(input_ids)),
                                   hidden if len(hidden) == 2 else hidden[0])
        weights = None
        if self.score is not None:
            assert keys is not None and memory is not None
            context, weights = attend(self.score.scores(out, keys), memory, memory_padding_mask)
        else:  # the bottleneck: the top layer's final encoder state, at every step
            context = encoder_state[:, 0, -1, None, :].expand_as(out)
        features = self.dropout(torch.tanh(self.combine(torch.cat([out, context], dim=-1))))
        if cache is not None:
            cache.hidden = new_hidden if isinstance(new_hidden, tuple) else (new_hidden,)
            cache.keys = keys
            cache.length = past + input_ids.shape[1]
        if not return_attention:
            return features
        return features, AttentionMaps([], [] if weights is None else [weights[:, None]])


@register_model
class RNNSeq2Seq(DecoderHeadMixin, PretrainedMixin, nn.Module):
    """``forward(source_ids, target_ids, source_mask) -> (B, T, target_vocab)`` next-token
    logits (teacher forcing), with ``return_attention=True`` also the attention weights
    (B, T, S) (None without attention); ``generate(source_ids, source_mask) -> [BOS] +
    generated ids``. ``source_mask`` (B, S) is 1 at tokens and 0 at right padding; the
    interface is :class:`~multimodal.models.seq2seq.Seq2Seq`'s, so the seq2seq task trains
    either."""

    config_class = RNNSeq2SeqConfig
    modality = "text-text"

    def __init__(self, config: RNNSeq2SeqConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = RNNEncoder(config)
        self.decoder = RNNDecoder(config)

    def encode(self, source_ids: Tensor, source_mask: Tensor | None = None
               ) -> tuple[Tensor, Tensor | None, Tensor]:
        """Encoder states (B, S, H), their padding mask (True = pad, or None) and the
        final state (B, k, num_layers, H)."""
        check_token_ids(source_ids, self.config.source_vocab_size, "source_ids")
        batch, length = source_ids.shape
        if batch == 0 or length == 0:
            raise ValueError(f"source_ids is empty (shape {tuple(source_ids.shape)}): give at "
                             "least one token per source")
        if length > self.config.max_source_len:
            raise ValueError(f"source of {length} tokens exceeds max_source_len "
                             f"{self.config.max_source_len}")
        if source_mask is None:
            lengths = torch.full((batch,), length, dtype=torch.long)
        else:
            if source_mask.shape != source_ids.shape:
                raise ValueError(f"source_mask must match source_ids {tuple(source_ids.shape)},"
                                 f" got {tuple(source_mask.shape)}")
            mask = source_mask.bool()
            lengths = mask.sum(dim=1)
            if bool((lengths == 0).any()):
                rows = (lengths == 0).nonzero().flatten().tolist()
                raise ValueError(f"source rows {rows} are empty (source_mask all 0)")
            positions = torch.arange(length, device=mask.device)
            if not torch.equal(mask, positions[None, :] < lengths[:, None]):
                raise ValueError("source_mask must be right-padded: ones, then zeros")
        memory, state = self.encoder(source_ids, lengths)
        pad = None
        if bool((lengths < length).any()):
            positions = torch.arange(length, device=source_ids.device)
            pad = positions[None, :] >= lengths.to(source_ids.device)[:, None]
        return memory, pad, state

    def forward(self, source_ids: Tensor, target_ids: Tensor,
                source_mask: Tensor | None = None, return_attention: bool = False
                ) -> Tensor | tuple[Tensor, AttentionMaps]:
        out = self.forward_features(source_ids, target_ids, source_mask, return_attention)
        if isinstance(out, tuple):
            return self.forward_head(out[0]), out[1]
        return self.forward_head(out)

    def forward_features(self, source_ids: Tensor, target_ids: Tensor,
                         source_mask: Tensor | None = None, return_attention: bool = False
                         ) -> Tensor | tuple[Tensor, AttentionMaps]:
        """The decoder's features ``o_t`` (B, T, hidden_dim) (module docstring), with
        ``return_attention`` also the :class:`~multimodal.models.api.AttentionMaps`
        (``cross_attn[0][:, 0]``: the attention weights (B, T, S))."""
        if target_ids.dim() == 2 and target_ids.shape[1] == 0:
            raise ValueError("target_ids is empty: give at least [BOS]")
        if target_ids.dim() == 2 and source_ids.dim() == 2 \
                and target_ids.shape[0] != source_ids.shape[0]:
            raise ValueError(f"target_ids has {target_ids.shape[0]} rows but source_ids has "
                             f"{source_ids.shape[0]}: one target per source")
        memory, pad, state = self.encode(source_ids, source_mask)
        return self.decoder.forward_features(target_ids, memory=memory,
                                             memory_padding_mask=pad, encoder_state=state,
                                             return_attention=return_attention)

    def example_inputs(self, batch_size: int = 2) -> tuple[Tensor, ...]:
        """Random source ids and target ids starting with ``[BOS]``."""
        cfg = self.config
        source = torch.randint(0, cfg.source_vocab_size, (batch_size, min(8, cfg.max_source_len)))
        target = torch.randint(0, cfg.target_vocab_size, (batch_size, min(8, cfg.max_target_len)))
        target[:, 0] = BOS_ID
        return source, target

    def decoding_inputs(self, source_ids: Tensor,
                        source_mask: Tensor | None = None) -> dict[str, Any]:
        """The encoder's states and padding (attended over) and its final state (the
        decoder's initial state)."""
        memory, pad, state = self.encode(source_ids, source_mask)
        return {"memory": memory, "memory_padding_mask": pad, "encoder_state": state}


__all__ = ["RNNDecoder", "RNNEncoder", "RNNSeq2Seq", "RNNSeq2SeqConfig", "RecurrentState"]


# configs/rnn_numbers.yaml: a one-layer GRU encoder-decoder with additive (Bahdanau)
# attention, number words -> digits (rnn_numbers_bottleneck.yaml: no attention, wider).
register_config_preset("rnn_numbers", RNNSeq2Seq, RNNSeq2SeqConfig, source_vocab_size=39,
                       target_vocab_size=17, max_source_len=24, max_target_len=12, embed_dim=64,
                       hidden_dim=136, num_layers=1, cell="gru", attention="additive")
