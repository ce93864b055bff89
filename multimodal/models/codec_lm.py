"""Codec language models for text-to-speech (VALL-E, Wang et al. 2023) on the shared backbone.

Speech is a ``(Q, T)`` grid of codec tokens (:class:`~multimodal.tokenizers.codec.MelRVQCodec`:
``Q`` codebooks of ``K`` entries, one column per frame). Two models write it from phonemes and
an acoustic prompt (codec tokens of another utterance of the wanted voice):

**AR** (:class:`CodecAR`, a causal decoder) writes codebook 1 of the new speech token by token.
One row of its input is a flat id stream (``P`` phonemes, ``Tp`` prompt frames, ``T`` frames)::

    ids        p_1 .. p_P | SEP | a_1 .. a_Tp | BOS | c_1 .. c_T | EOS
    position   0  .. P-1  |  0  | 1  .. Tp   | Tp+1| ...        (audio restarts at 0)
    predicts                                    c_1 | c_2 .. EOS |

``a`` = the prompt's codebook-1 tokens, ``c`` = the target's. The code-side ids are the codec's
``0..K-1``, then ``EOS = K`` (end of speech), ``SEP = K + 1`` (phonemes -> prompt), ``BOS =
K + 2`` (prompt -> target); phoneme ``i`` (an id of the phoneme tokenizer) is ``K + 3 + i``.
Codes and phonemes have their own embedding tables; the head scores ``K + 1`` classes
(codes and EOS), so a generated id is a valid input id. The loss counts only the ``T + 1``
predictions ``c_1 .. c_T, EOS``: phonemes, the prompt and padding are never targets.
Generation is the package's :func:`multimodal.generation.generate` (KV cache, temperature,
top-k, top-p, a seeded generator).

**NAR** (:class:`CodecNAR`, a bidirectional encoder) fills codebooks ``q = 2..Q`` one stage at
a time (greedy at inference). Stage ``q`` reads::

    tokens     ph_1 .. ph_P          | prompt frame 1 .. Tp            | target frame 1 .. T
    embedding  E_ph(p) + S_0         | sum_{i=1..Q} E_i(a_i) + S_1     | sum_{i<q} E_i(c_i) + S_2
               + pos 0..P-1 + G_q    | + pos 0 .. Tp-1 + G_q           | + pos Tp .. Tp+T-1 + G_q
    predicts                                                            c_q at every target frame

``E_i`` is codebook ``i``'s embedding table, ``S`` a segment embedding, ``G_q`` the stage
embedding and the head of stage ``q`` is its own ``(K, dim)`` matrix. Training draws one
``q`` per example; the loss is the cross-entropy of ``c_q`` over the real target frames.

Q, K and the phoneme vocabulary are config fields (``num_codebooks``, ``codebook_size``,
``num_phonemes``): they come from the codec and the tokenizer the model is trained with.
:class:`CodecLM` holds one AR and one NAR model (one checkpoint, one ``config``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from multimodal.generation import generate
from multimodal.models.backbone import model_config
from multimodal.nn.block import Transformer
from multimodal.nn.cache import KVCache
from multimodal.nn.init import init_weights
from multimodal.nn.pool import last_token
from multimodal.nn.position import sinusoidal_positions
from multimodal.registry import register_config_preset, register_model
from multimodal.weights import PretrainedMixin

__all__ = ["IGNORE_INDEX", "CodecAR", "CodecARConfig", "CodecLM", "CodecLMConfig", "CodecNAR",
           "CodecNARConfig", "nar_loss", "pack_segments"]

IGNORE_INDEX = -100
PositionKind = Literal["sinusoidal", "learned"]


# --- layout helpers ------------------------------------------------------------------------


def pack_segments(segments: list[Tensor], lengths: list[Tensor],
                  pad: float | int = 0) -> tuple[Tensor, list[Tensor], Tensor]:
    """Concatenate per-row segments without their padding.

    ``segments[i]``: ``(B, L_i, *rest)`` right-padded, ``lengths[i]``: ``(B,)`` real lengths.
    Returns ``packed`` ``(B, max_b sum_i lengths[i][b], *rest)`` (row ``b`` = its real
    tokens of segment 1, then of segment 2, ..., then ``pad``), the start of each segment in
    each row (a list of ``(B,)``), and the packed lengths ``(B,)``.
    """
    if len(segments) != len(lengths) or not segments:
        raise ValueError("pack_segments needs one lengths tensor per segment")
    batch = segments[0].shape[0]
    rest = segments[0].shape[2:]
    device = segments[0].device
    total = torch.zeros(batch, dtype=torch.long, device=device)
    for seg, n in zip(segments, lengths, strict=True):
        if seg.shape[0] != batch or seg.shape[2:] != rest or n.shape != (batch,):
            raise ValueError(f"segments must share (batch, *, *rest) = ({batch}, *, "
                             f"{tuple(rest)}) with (batch,) lengths; got {tuple(seg.shape)} "
                             f"and {tuple(n.shape)}")
        if n.numel() and (int(n.min()) < 0 or int(n.max()) > seg.shape[1]):
            raise ValueError(f"lengths {n.tolist()} outside [0, {seg.shape[1]}]")
        total = total + n
    width = int(total.max()) if batch else 0
    out = segments[0].new_full((batch, width, *rest), pad)
    offset = torch.zeros(batch, dtype=torch.long, device=device)
    starts = []
    for seg, n in zip(segments, lengths, strict=True):
        starts.append(offset.clone())
        j = torch.arange(seg.shape[1], device=device)
        rows, cols = (j[None] < n[:, None]).nonzero(as_tuple=True)
        out[rows, offset[rows] + cols] = seg[rows, cols]
        offset = offset + n
    return out, starts, total


def _left_align(ids: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
    """Right-padded ``(B, L)`` rows -> left-padded rows and their attention mask."""
    width = ids.shape[1]
    index = (torch.arange(width, device=ids.device)[None] + lengths[:, None]) % width
    mask = torch.arange(width, device=ids.device)[None] >= (width - lengths)[:, None]
    return ids.gather(1, index), mask.long()


def _add_positions(module: nn.Module, kind: PositionKind, max_len: int, dim: int) -> None:
    """Give ``module`` its position table ``pos_table`` (max_len, dim), a parameter when
    ``learned``, a fixed buffer when ``sinusoidal``, and its learned scale ``pos_alpha``."""
    if kind == "learned":
        module.pos_table = nn.Parameter(torch.randn(max_len, dim) * 0.02)
    elif kind == "sinusoidal":
        module.register_buffer("pos_table", sinusoidal_positions(max_len, dim),
                               persistent=False)
    else:
        raise ValueError(f"pos_embed must be 'sinusoidal' or 'learned', got {kind!r}")
    module.pos_alpha = nn.Parameter(torch.ones(()))


def _init_embeddings(dim: int, *tables: nn.Embedding) -> None:
    """N(0, 1/dim) tables: scaled by ``sqrt(dim)`` in the forward pass (Vaswani et al.), a
    token embedding has unit variance per channel, the scale of the sinusoidal positions."""
    for table in tables:
        nn.init.normal_(table.weight, std=dim ** -0.5)


def _check_lengths(name: str, lengths: Tensor, width: int, batch: int,
                   minimum: int = 1) -> None:
    if not isinstance(lengths, Tensor) or lengths.shape != (batch,):
        raise ValueError(f"{name} must be a (batch,) = ({batch},) tensor, got "
                         f"{getattr(lengths, 'shape', type(lengths).__name__)}")
    if batch and (int(lengths.min()) < minimum or int(lengths.max()) > width):
        raise ValueError(f"{name} must be in [{minimum}, {width}], got {lengths.tolist()}")


def _check_codes(name: str, codes: Tensor, codebook_size: int, dims: int) -> None:
    if not isinstance(codes, Tensor) or codes.dim() != dims or codes.dtype not in (
            torch.long, torch.int32):
        raise ValueError(f"{name} must be an integer tensor with {dims} dims, got "
                         f"{getattr(codes, 'dtype', type(codes).__name__)} "
                         f"{tuple(getattr(codes, 'shape', ()))}")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= codebook_size):
        raise ValueError(f"{name} holds codes outside [0, {codebook_size}): min "
                         f"{int(codes.min())}, max {int(codes.max())}")


def _check_stream_config(config: CodecARConfig | CodecNARConfig) -> None:
    """The size and position checks both codec-LM configs share."""
    for name in ("codebook_size", "num_phonemes", "max_len"):
        if getattr(config, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(config, name)}")
    if config.pos_embed not in ("sinusoidal", "learned"):
        raise ValueError(f"pos_embed must be 'sinusoidal' or 'learned', "
                         f"got {config.pos_embed!r}")


# --- AR: codebook 1 ------------------------------------------------------------------------


@model_config(dim=256, depth=4, heads=4, norm_eps=1e-5, activation="gelu",
              fixed={"causal": True, "norm": "pre"})
class CodecARConfig:
    """The AR model: a causal, pre-norm backbone over the id stream of the module doc.

    ``codebook_size`` = the codec's K; ``num_phonemes`` = the phoneme tokenizer's vocabulary
    (or more); ``max_len`` = the longest stream (phonemes + prompt + target + 3 specials).
    """

    codebook_size: int = 256
    num_phonemes: int = 128
    max_len: int = 1024
    pos_embed: PositionKind = "sinusoidal"

    def __post_init__(self) -> None:
        _check_stream_config(self)


class CodecAR(PretrainedMixin, nn.Module):
    """Causal decoder over ``[phonemes ; SEP ; prompt codebook 1 ; BOS ; codebook 1 ; EOS]``
    (module doc). ``forward(input_ids)`` returns logits ``(B, N, K + 1)`` (codes, EOS) and
    follows the decoder protocol of :mod:`multimodal.generation`."""

    config_class = CodecARConfig

    def __init__(self, config: CodecARConfig) -> None:
        super().__init__()
        self.config = config
        k = config.codebook_size
        self.eos_id, self.sep_id, self.bos_id = k, k + 1, k + 2
        self.phoneme_offset = k + 3
        self.code_embed = nn.Embedding(k + 3, config.dim)
        self.phoneme_embed = nn.Embedding(config.num_phonemes, config.dim)
        _add_positions(self, config.pos_embed, config.max_len, config.dim)
        self.drop = nn.Dropout(config.dropout)
        self.transformer = Transformer(config.backbone)
        self.head = nn.Linear(config.dim, k + 1, bias=False)
        self.apply(init_weights)
        _init_embeddings(config.dim, self.code_embed, self.phoneme_embed)

    @property
    def max_len(self) -> int:
        return self.config.max_len

    @property
    def vocab_size(self) -> int:
        """Input ids: ``K`` codes, EOS, SEP, BOS, then the phonemes."""
        return self.phoneme_offset + self.config.num_phonemes

    def make_cache(self, max_len: int | None = None) -> KVCache:
        return self.transformer.make_cache(max_len or self.max_len)

    # -- the id stream --------------------------------------------------------------------
    def build_stream(self, phonemes: Tensor, phoneme_lengths: Tensor, prompt: Tensor,
                     prompt_lengths: Tensor, codes: Tensor | None = None,
                     code_lengths: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Right-padded id streams ``(B, L)`` (padding: EOS), their lengths and the index of
        the BOS token in each row.

        ``phonemes`` (B, P) phoneme-tokenizer ids, ``prompt`` (B, Tp) codebook-1 tokens of the
        prompt; with ``codes`` (B, T) the target follows the BOS and an EOS closes the row
        (training); without, the row ends at BOS (generation).
        """
        b = phonemes.shape[0]
        _check_lengths("phoneme_lengths", phoneme_lengths, phonemes.shape[1], b)
        _check_lengths("prompt_lengths", prompt_lengths, prompt.shape[1], b, minimum=0)
        _check_codes("prompt", prompt, self.config.codebook_size, 2)
        if phonemes.numel() and (int(phonemes.max()) >= self.config.num_phonemes
                                 or int(phonemes.min()) < 0):
            raise ValueError(f"phonemes hold ids outside [0, {self.config.num_phonemes}) "
                             f"(num_phonemes): max {int(phonemes.max())}")
        one = torch.ones(b, dtype=torch.long, device=phonemes.device)

        def column(token: int) -> Tensor:
            return torch.full((b, 1), token, dtype=torch.long, device=phonemes.device)

        segments = [phonemes.long() + self.phoneme_offset, column(self.sep_id), prompt.long(),
                    column(self.bos_id)]
        lengths = [phoneme_lengths, one, prompt_lengths, one]
        if codes is not None:
            if code_lengths is None:
                raise ValueError("codes given without code_lengths")
            _check_codes("codes", codes, self.config.codebook_size, 2)
            _check_lengths("code_lengths", code_lengths, codes.shape[1], b)
            segments += [codes.long(), column(self.eos_id)]
            lengths += [code_lengths, one]
        ids, starts, total = pack_segments(segments, lengths, pad=self.eos_id)
        return ids, total, starts[3]

    def teacher_forcing(self, phonemes: Tensor, phoneme_lengths: Tensor, prompt: Tensor,
                        prompt_lengths: Tensor, codes: Tensor,
                        code_lengths: Tensor) -> tuple[Tensor, Tensor]:
        """``(input_ids, labels)`` for next-token training: ``input_ids = stream[:, :-1]``,
        ``labels = stream[:, 1:]`` with :data:`IGNORE_INDEX` everywhere except the target
        codes and the EOS (positions ``bos .. bos + T``)."""
        ids, total, bos = self.build_stream(phonemes, phoneme_lengths, prompt, prompt_lengths,
                                            codes, code_lengths)
        pos = torch.arange(ids.shape[1] - 1, device=ids.device)[None]
        # label column j holds stream token j + 1: targets are stream tokens bos+1 .. total-1
        target = (pos >= bos[:, None]) & (pos < (total - 1)[:, None])
        labels = ids[:, 1:].masked_fill(~target, IGNORE_INDEX)
        return ids[:, :-1], labels

    # -- forward --------------------------------------------------------------------------
    def _index(self, input_ids: Tensor, attention_mask: Tensor | None, past: int) -> Tensor:
        """Each new token's index among its row's real tokens (left padding skipped)."""
        b, n = input_ids.shape
        if attention_mask is not None and not bool(attention_mask.all()):
            return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past:]
        return torch.arange(past, past + n, device=input_ids.device).expand(b, n)

    def _positions(self, input_ids: Tensor, attention_mask: Tensor | None, past: int,
                   phoneme_lengths: Tensor | None) -> Tensor:
        index = self._index(input_ids, attention_mask, past)
        if phoneme_lengths is None:
            if past:
                raise ValueError("a cached step needs phoneme_lengths (B,): the position of "
                                 "an audio token counts from the end of the phonemes")
            phoneme_lengths = (input_ids >= self.phoneme_offset).sum(dim=1)
        n_ph = phoneme_lengths.to(index.device)[:, None]
        return torch.where(index < n_ph, index, index - n_ph)

    def embed(self, input_ids: Tensor) -> Tensor:
        """Code-side ids through ``code_embed``, phoneme ids through ``phoneme_embed``."""
        is_phone = input_ids >= self.phoneme_offset
        codes = self.code_embed(input_ids.clamp(max=self.phoneme_offset - 1))
        phones = self.phoneme_embed((input_ids - self.phoneme_offset).clamp(min=0))
        return torch.where(is_phone[..., None], phones, codes)

    def forward_features(self, input_ids: Tensor, attention_mask: Tensor | None = None, *,
                         cache: KVCache | None = None,
                         phoneme_lengths: Tensor | None = None) -> Tensor:
        """Hidden states ``(B, N, dim)``. ``attention_mask`` (B, past + N): 1 at tokens, 0 at
        left padding; ``phoneme_lengths`` (B,): required for cached steps (counted from the
        ids otherwise)."""
        past = cache.length if cache is not None else 0
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, tokens), got "
                             f"{getattr(input_ids, 'shape', type(input_ids).__name__)}")
        if past == 0 and input_ids.numel() and (int(input_ids.min()) < 0
                                                or int(input_ids.max()) >= self.vocab_size):
            raise ValueError(f"input_ids outside [0, {self.vocab_size}): min "
                             f"{int(input_ids.min())}, max {int(input_ids.max())}")
        if past + input_ids.shape[1] > self.max_len:
            raise ValueError(f"{past + input_ids.shape[1]} tokens exceed the AR context "
                             f"max_len={self.max_len}")
        if attention_mask is not None and attention_mask.shape != (
                input_ids.shape[0], past + input_ids.shape[1]):
            raise ValueError(f"attention_mask must be (batch, cached + new) = "
                             f"{(input_ids.shape[0], past + input_ids.shape[1])}, got "
                             f"{tuple(attention_mask.shape)}")
        pos = self._positions(input_ids, attention_mask, past, phoneme_lengths)
        x = self.embed(input_ids) * self.config.dim ** 0.5 \
            + self.pos_alpha * self.pos_table[pos].to(self.code_embed.weight.dtype)
        padding = None if attention_mask is None or bool(attention_mask.all()) \
            else ~attention_mask.bool()
        return self.transformer(self.drop(x), key_padding_mask=padding, cache=cache)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, *,
                cache: KVCache | None = None, phoneme_lengths: Tensor | None = None,
                eos_from: Tensor | None = None) -> Tensor:
        """Logits ``(B, N, K + 1)`` of the next token (a code or EOS) after each position.

        ``eos_from`` (B,): EOS gets ``-inf`` at every token whose index among the row's real
        tokens is below it (generation's minimum length)."""
        logits = self.head(self.forward_features(input_ids, attention_mask, cache=cache,
                                                 phoneme_lengths=phoneme_lengths))
        if eos_from is not None:
            past = cache.length - input_ids.shape[1] if cache is not None else 0
            early = self._index(input_ids, attention_mask, past) < eos_from[:, None]
            logits[..., self.eos_id] = logits[..., self.eos_id].masked_fill(early,
                                                                            float("-inf"))
        return logits

    @torch.no_grad()
    def generate(self, phonemes: Tensor, phoneme_lengths: Tensor, prompt: Tensor,
                 prompt_lengths: Tensor, max_new_tokens: int | None = None, *,
                 do_sample: bool = False, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, num_beams: int = 1,
                 generator: torch.Generator | None = None, use_cache: bool = True,
                 compile: bool = False, min_new_tokens: int = 0,
                 **kwargs: Any) -> tuple[Tensor, Tensor]:
        """Codebook-1 tokens of new speech: ``(codes (B, T), lengths (B,))``, right-padded
        with 0, each row ending before its EOS (or after ``max_new_tokens``); EOS is not
        allowed before ``min_new_tokens`` frames.

        The decoding arguments are those of :func:`multimodal.generation.generate` (greedy
        unless ``do_sample=True``); ``kwargs`` go there too.
        """
        ids, lengths, _ = self.build_stream(phonemes, phoneme_lengths, prompt, prompt_lengths)
        left, mask = _left_align(ids, lengths)
        room = self.max_len - left.shape[1]
        if room < 1:
            raise ValueError(f"phonemes + prompt + 2 specials = {left.shape[1]} tokens fill "
                             f"the AR context (max_len={self.max_len}): shorten the text or "
                             "the prompt")
        budget = room if max_new_tokens is None else min(max_new_tokens, room)
        if min_new_tokens > 0:  # the query predicting new token j has index lengths - 1 + j
            kwargs["eos_from"] = lengths - 1 + min_new_tokens
        out = generate(self, left, max_new_tokens=budget, eos_token_id=self.eos_id,
                       pad_token_id=self.eos_id, attention_mask=mask,
                       phoneme_lengths=phoneme_lengths, do_sample=do_sample,
                       temperature=temperature, top_k=top_k, top_p=top_p, num_beams=num_beams,
                       generator=generator, use_cache=use_cache, compile=compile, **kwargs)
        new = out[:, left.shape[1]:]
        ended = new == self.eos_id
        first_eos = torch.where(ended.any(1), ended.float().argmax(1),
                                torch.full_like(lengths, new.shape[1]))
        keep = torch.arange(new.shape[1], device=new.device)[None] < first_eos[:, None]
        return new.masked_fill(~keep, 0), first_eos


# --- NAR: codebooks 2..Q -------------------------------------------------------------------


@model_config(dim=256, depth=4, heads=4, norm_eps=1e-5, activation="gelu",
              fixed={"causal": False, "norm": "pre"})
class CodecNARConfig:
    """The NAR model: a bidirectional, pre-norm backbone (module doc). ``num_codebooks`` =
    the codec's Q (>= 2), ``codebook_size`` = K, ``max_len`` = the longest phonemes + prompt
    + target sequence."""

    codebook_size: int = 256
    num_codebooks: int = 8
    num_phonemes: int = 128
    max_len: int = 1024
    pos_embed: PositionKind = "sinusoidal"

    def __post_init__(self) -> None:
        _check_stream_config(self)
        if self.num_codebooks < 2:
            raise ValueError(f"num_codebooks must be >= 2 (the NAR fills codebooks 2..Q), "
                             f"got {self.num_codebooks}")


class CodecNAR(PretrainedMixin, nn.Module):
    """Bidirectional model that predicts codebook ``stage`` (0-based, ``1..Q-1``) of the
    target from the phonemes, the whole prompt and the target's codebooks ``< stage``."""

    config_class = CodecNARConfig

    def __init__(self, config: CodecNARConfig) -> None:
        super().__init__()
        self.config = config
        q, k, d = config.num_codebooks, config.codebook_size, config.dim
        self.phoneme_embed = nn.Embedding(config.num_phonemes, d)
        self.code_embeds = nn.ModuleList(nn.Embedding(k, d) for _ in range(q))
        self.segment_embed = nn.Embedding(3, d)  # phonemes, prompt, target
        self.stage_embed = nn.Embedding(q - 1, d)  # stage s = 1..Q-1 at row s - 1
        _add_positions(self, config.pos_embed, config.max_len, d)
        self.drop = nn.Dropout(config.dropout)
        self.transformer = Transformer(config.backbone)
        self.head_weight = nn.Parameter(torch.empty(q - 1, k, d))
        self.head_bias = nn.Parameter(torch.zeros(q - 1, k))
        self.apply(init_weights)
        _init_embeddings(d, self.phoneme_embed, *self.code_embeds, self.segment_embed,
                         self.stage_embed)
        nn.init.trunc_normal_(self.head_weight, std=0.02)

    @property
    def max_len(self) -> int:
        return self.config.max_len

    def _sum_codes(self, codes: Tensor, upto: Tensor) -> Tensor:
        """``sum_{i < upto_b} E_i(codes[b, i])``: ``codes`` (B, Q', T), ``upto`` (B,)."""
        out = codes.new_zeros(*codes.shape[::2], self.config.dim, dtype=self.pos_table.dtype)
        out = out.to(self.phoneme_embed.weight.dtype)
        for i in range(codes.shape[1]):
            use = (upto > i).to(out.dtype)[:, None, None]
            out = out + self.code_embeds[i](codes[:, i]) * use
        return out

    def forward(self, phonemes: Tensor, phoneme_lengths: Tensor, prompt: Tensor,
                prompt_lengths: Tensor, codes: Tensor, code_lengths: Tensor,
                stage: int | Tensor) -> Tensor:
        """Logits ``(B, T, K)`` for codebook ``stage`` (0-based, ``1..Q-1``; an int or one per
        row) at each target frame; frames ``>= code_lengths`` are padding.

        ``phonemes`` (B, P), ``prompt`` (B, Q, Tp), ``codes`` (B, q', T) with ``q' >= stage``
        (only codebooks ``< stage`` are read, so the codebooks being predicted may be there).
        """
        cfg = self.config
        b = phonemes.shape[0]
        stage = torch.as_tensor(stage, device=phonemes.device).long().expand(b)
        if int(stage.min()) < 1 or int(stage.max()) > cfg.num_codebooks - 1:
            raise ValueError(f"stage must be in [1, {cfg.num_codebooks - 1}] (the 0-based "
                             f"codebook to predict), got {stage.tolist()}")
        _check_lengths("phoneme_lengths", phoneme_lengths, phonemes.shape[1], b)
        _check_lengths("prompt_lengths", prompt_lengths, prompt.shape[-1], b, minimum=0)
        _check_lengths("code_lengths", code_lengths, codes.shape[-1], b)
        _check_codes("prompt", prompt, cfg.codebook_size, 3)
        _check_codes("codes", codes, cfg.codebook_size, 3)
        if prompt.shape[1] != cfg.num_codebooks:
            raise ValueError(f"prompt must hold all Q={cfg.num_codebooks} codebooks "
                             f"(B, Q, Tp), got {tuple(prompt.shape)}")
        if codes.shape[1] < int(stage.max()):
            raise ValueError(f"codes hold {codes.shape[1]} codebooks, stage {int(stage.max())} "
                             "needs the ones below it")
        if phonemes.numel() and int(phonemes.max()) >= cfg.num_phonemes:
            raise ValueError(f"phonemes hold ids outside [0, {cfg.num_phonemes})")
        dtype = self.phoneme_embed.weight.dtype
        scale = cfg.dim ** 0.5
        table = self.pos_alpha * self.pos_table.to(dtype)
        phones = (self.phoneme_embed(phonemes.long()) + self.segment_embed.weight[0]) * scale
        full = torch.full((b,), cfg.num_codebooks, device=phonemes.device)
        audio_prompt = (self._sum_codes(prompt.long(), full) + self.segment_embed.weight[1]) \
            * scale
        target = (self._sum_codes(codes[:, : int(stage.max())].long(), stage)
                  + self.segment_embed.weight[2]) * scale
        ph_pos = torch.arange(phonemes.shape[1], device=phonemes.device)
        phones = phones + table[ph_pos]
        pr_pos = torch.arange(prompt.shape[-1], device=phonemes.device)
        audio_prompt = audio_prompt + table[pr_pos]
        tg_pos = prompt_lengths[:, None] + torch.arange(codes.shape[-1], device=codes.device)
        if int(tg_pos.max()) >= cfg.max_len or phonemes.shape[1] > cfg.max_len:
            raise ValueError(f"prompt + target frames ({int(tg_pos.max()) + 1}) exceed the NAR "
                             f"context max_len={cfg.max_len}")
        target = target + table[tg_pos.clamp(max=cfg.max_len - 1)]
        x, starts, total = pack_segments([phones, audio_prompt, target],
                                         [phoneme_lengths, prompt_lengths, code_lengths])
        x = x + self.stage_embed(stage - 1)[:, None] * scale
        if x.shape[1] > cfg.max_len:
            raise ValueError(f"{x.shape[1]} tokens exceed the NAR context max_len={cfg.max_len}")
        padding = torch.arange(x.shape[1], device=x.device)[None] >= total[:, None]
        h = self.transformer(self.drop(x), key_padding_mask=padding if bool(padding.any())
                             else None)
        frames = (starts[2][:, None] + torch.arange(codes.shape[-1], device=h.device)).clamp(
            max=h.shape[1] - 1)
        h = h.gather(1, frames[..., None].expand(-1, -1, h.shape[-1]))
        w, bias = self.head_weight[stage - 1], self.head_bias[stage - 1]
        return torch.einsum("btd,bkd->btk", h, w) + bias[:, None]

    @torch.no_grad()
    def fill(self, phonemes: Tensor, phoneme_lengths: Tensor, prompt: Tensor,
             prompt_lengths: Tensor, first: Tensor, code_lengths: Tensor) -> Tensor:
        """All Q codebooks ``(B, Q, T)`` from codebook 1 ``first`` (B, T): stage ``q`` takes
        the argmax of its logits given the codebooks already filled."""
        was = self.training
        self.eval()
        try:
            codes = first.new_zeros(first.shape[0], self.config.num_codebooks, first.shape[1])
            codes[:, 0] = first
            for stage in range(1, self.config.num_codebooks):
                logits = self(phonemes, phoneme_lengths, prompt, prompt_lengths,
                              codes[:, :stage], code_lengths, stage)
                codes[:, stage] = logits.argmax(-1)
            pad = torch.arange(first.shape[1], device=first.device)[None] >= code_lengths[:, None]
            return codes.masked_fill(pad[:, None], 0)
        finally:
            self.train(was)


# --- both ----------------------------------------------------------------------------------


def _default_ar() -> CodecARConfig:
    return CodecARConfig()


def _default_nar() -> CodecNARConfig:
    return CodecNARConfig()


@dataclass
class CodecLMConfig:
    """One AR and one NAR model for one codec (same K, same phoneme vocabulary)."""

    ar: CodecARConfig = field(default_factory=_default_ar)
    nar: CodecNARConfig = field(default_factory=_default_nar)

    def __post_init__(self) -> None:
        if isinstance(self.ar, dict):
            self.ar = CodecARConfig(**self.ar)
        if isinstance(self.nar, dict):
            self.nar = CodecNARConfig(**self.nar)
        for name in ("codebook_size", "num_phonemes"):
            if getattr(self.ar, name) != getattr(self.nar, name):
                raise ValueError(f"ar.{name}={getattr(self.ar, name)} differs from "
                                 f"nar.{name}={getattr(self.nar, name)}")

    @property
    def codebook_size(self) -> int:
        return self.ar.codebook_size

    @property
    def num_codebooks(self) -> int:
        return self.nar.num_codebooks

    @property
    def num_phonemes(self) -> int:
        return self.ar.num_phonemes


@register_model
class CodecLM(PretrainedMixin, nn.Module):
    """VALL-E's pair: :class:`CodecAR` (``.ar``, codebook 1) and :class:`CodecNAR`
    (``.nar``, codebooks 2..Q). :meth:`synthesize_codes` runs both for one utterance."""

    config_class = CodecLMConfig
    modality = "text-audio"  # text in, speech (codec tokens) out

    def __init__(self, config: CodecLMConfig) -> None:
        super().__init__()
        self.config = config
        self.ar = CodecAR(config.ar)
        self.nar = CodecNAR(config.nar)

    # The model API (multimodal/models/api.py) on the AR stream: features are the AR's
    # hidden states, the head its next-token logits (codes and EOS), pooling the last real
    # token -- the verbs of a decoder, as TextDecoder's. The NAR is reached as ``.nar``.

    @property
    def num_features(self) -> int:
        return self.config.ar.dim

    def forward_features(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                         **kwargs: Any) -> Tensor:
        """The AR's hidden states ``(B, N, dim)`` (:meth:`CodecAR.forward_features`)."""
        return self.ar.forward_features(input_ids, attention_mask, **kwargs)

    def pool(self, features: Tensor, *, attention_mask: Tensor | None = None) -> Tensor:
        """The last real token's features ``(B, dim)``."""
        return last_token(features, attention_mask)

    def forward_head(self, features: Tensor, pre_logits: bool = False, *,
                     attention_mask: Tensor | None = None) -> Tensor:
        """Next-token logits ``(B, N, K + 1)`` (``pre_logits``: :meth:`pool`)."""
        if pre_logits:
            return self.pool(features, attention_mask=attention_mask)
        return self.ar.head(features)

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        """The AR logits (:meth:`CodecAR.forward`)."""
        return self.ar(*args, **kwargs)

    def example_inputs(self, batch_size: int = 2) -> tuple[Tensor, ...]:
        """An AR training stream ``(input_ids,)`` of random phonemes, prompt and target
        codes (6, 5 and 4 per row)."""
        k, b = self.config.codebook_size, batch_size
        phonemes = torch.randint(0, self.config.num_phonemes, (b, 6))
        prompt, codes = torch.randint(0, k, (b, 5)), torch.randint(0, k, (b, 4))
        full = lambda t: torch.full((b,), t.shape[1], dtype=torch.long)
        ids, _ = self.ar.teacher_forcing(phonemes, full(phonemes), prompt, full(prompt),
                                         codes, full(codes))
        return (ids,)

    @torch.no_grad()
    def synthesize_codes(self, phonemes: Tensor, prompt: Tensor,
                         max_new_tokens: int | None = None, stats: dict | None = None,
                         **generate_kwargs: Any) -> Tensor:
        """Codec tokens ``(Q, T)`` of new speech for one utterance: ``phonemes`` (P,) ids,
        ``prompt`` (Q, Tp) codec tokens. ``generate_kwargs`` go to the AR's sampling.
        ``stats`` (optional) receives ``ar_seconds``, ``nar_seconds`` and ``ar_tokens``.

        Raises ``ValueError`` when the AR ends at once (no frame before EOS)."""
        import time

        if phonemes.dim() != 1 or prompt.dim() != 2:
            raise ValueError(f"one utterance: phonemes (P,), prompt (Q, Tp); got "
                             f"{tuple(phonemes.shape)} and {tuple(prompt.shape)}")
        if prompt.shape[0] != self.config.num_codebooks:
            raise ValueError(f"prompt must be (Q={self.config.num_codebooks}, Tp), got "
                             f"{tuple(prompt.shape)}")
        ph, ph_len = phonemes[None].long(), torch.tensor([phonemes.numel()])
        pr, pr_len = prompt[None].long(), torch.tensor([prompt.shape[1]])
        start = time.perf_counter()
        first, length = self.ar.generate(ph, ph_len, pr[:, 0], pr_len, max_new_tokens,
                                         **generate_kwargs)
        mid = time.perf_counter()
        if int(length[0]) == 0:
            raise ValueError("the AR model ended the speech before its first frame; try "
                             "another seed / temperature, or a longer text")
        first = first[:, : int(length[0])]
        codes = self.nar.fill(ph, ph_len, pr, pr_len, first, length)
        end = time.perf_counter()
        if stats is not None:
            stats.update(ar_seconds=mid - start, nar_seconds=end - mid,
                         ar_tokens=int(length[0]))
        return codes[0]


def nar_loss(logits: Tensor, codes: Tensor, code_lengths: Tensor, stage: Tensor) -> Tensor:
    """Mean cross-entropy of ``codes[b, stage_b, t]`` over real frames ``t < code_lengths``."""
    target = codes.gather(1, stage[:, None, None].expand(-1, 1, codes.shape[-1]))[:, 0]
    pad = torch.arange(codes.shape[-1], device=codes.device)[None] >= code_lengths[:, None]
    target = target.masked_fill(pad, IGNORE_INDEX)
    return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten(),
                           ignore_index=IGNORE_INDEX)


# configs/tts_voices.yaml: width 128, a 4-block AR and a 3-block NAR model for a codec of
# Q = 8 codebooks of K = 256 (the data set them), 96 phoneme ids, rows of up to 320 positions
# (about 40 phonemes + 1 s of prompt + 3 s of speech at 50 frames/s).
register_config_preset(
    "tts_voices", CodecLM, CodecLMConfig,
    ar=CodecARConfig(codebook_size=256, num_phonemes=96, max_len=320, dim=128, depth=4,
                     heads=4, mlp_dim=512),
    nar=CodecNARConfig(codebook_size=256, num_codebooks=8, num_phonemes=96, max_len=320,
                       dim=128, depth=3, heads=4, mlp_dim=512))
