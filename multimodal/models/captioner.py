"""Image captioning: a ViT encoder and a cross-attending text decoder.

The encoder (:class:`~multimodal.models.vit.ViT`, no head) turns an image into patch
tokens ``M`` (B, P, D_e). Each decoder block (:class:`~multimodal.models.text.TextDecoder`
with ``cross_attention=True``) attends causally to the caption so far, then from the
caption (queries) to the image tokens (keys and values)::

    CrossAttn(X, M) = softmax((X W_q)(M W_k)^T / sqrt(d)) (M W_v)

Training is teacher forcing: ``forward(images, input_ids) -> logits`` predicts token t+1
from tokens <= t. Decoding goes through the package's one loop,
:func:`multimodal.generation.generate`, with ``memory=`` in its model kwargs; the image is
encoded once per call and the decoder's KV cache projects the cross-attention keys and
values once. The model is ids in, ids out: :func:`caption` turns ids into strings with
a tokenizer.

By default only patch tokens are the memory: a class token of the encoder (if it has
one) is dropped, so every cross-attention map is a distribution over the patch grid.
``CaptionerConfig.memory="all"`` keeps the encoder's prefix tokens (class, registers) in
the memory, as transformers' ``VisionEncoderDecoderModel`` does; its cross-attention maps
then show the patches' share only (rows sum to at most 1).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn

from multimodal.generation import generate
from multimodal.models.api import AttentionMaps, DecoderHeadMixin
from multimodal.models.text import TextDecoder, TextDecoderConfig, check_token_ids
from multimodal.models.vit import ViT, ViTConfig
from multimodal.registry import register_model, register_preset
from multimodal.tokenizers.text import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from multimodal.weights import PretrainedMixin

__all__ = ["Captioner", "CaptionerConfig", "caption", "cut_at_eos", "decode_captions"]


def _default_encoder() -> ViTConfig:
    return ViTConfig(image_size=32, patch_size=4, in_channels=3, num_classes=0, dim=128,
                     depth=3, heads=4, mlp_dim=256, pool="mean", class_token=False)


def _default_decoder() -> TextDecoderConfig:
    # cross_attention / memory_dim are filled in by CaptionerConfig from the encoder
    return TextDecoderConfig(vocab_size=64, max_len=32, dim=128, depth=2, heads=4, mlp_dim=256)


@dataclass
class CaptionerConfig:
    """An encoder config and a decoder config, plus the special token ids.

    The captioner always cross-attends: ``decoder.cross_attention`` is set to True and
    ``decoder.memory_dim`` to ``encoder.dim`` (a different explicit value is an error);
    ``encoder.num_classes`` is set to 0 (no classification head).
    """

    encoder: ViTConfig = field(default_factory=_default_encoder)
    decoder: TextDecoderConfig = field(default_factory=_default_decoder)
    bos_token_id: int = BOS_ID
    eos_token_id: int = EOS_ID
    pad_token_id: int = PAD_ID
    memory: Literal["patches", "all"] = "patches"  # all: class/register tokens too

    def __post_init__(self) -> None:
        if isinstance(self.encoder, dict):
            self.encoder = ViTConfig(**self.encoder)
        if isinstance(self.decoder, dict):
            self.decoder = TextDecoderConfig(**self.decoder)
        enc, dec = self.encoder, self.decoder
        if self.memory not in ("patches", "all"):
            raise ValueError(f"memory must be 'patches' or 'all', got {self.memory!r}")
        if dec.memory_dim is not None and dec.memory_dim != enc.dim:
            raise ValueError(f"decoder.memory_dim ({dec.memory_dim}) must equal the encoder "
                             f"width encoder.dim ({enc.dim}); leave it unset to fill it in")
        self.encoder = dataclasses.replace(enc, num_classes=0)
        self.decoder = dataclasses.replace(dec, cross_attention=True, memory_dim=enc.dim)
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(self, name)
            if not 0 <= value < dec.vocab_size:
                raise ValueError(f"{name}={value} is outside the decoder vocabulary "
                                 f"[0, {dec.vocab_size})")


@register_model
class Captioner(DecoderHeadMixin, PretrainedMixin, nn.Module):
    """Images (B, C, H, W) + caption ids (B, T) -> next-token logits (B, T, vocab).

    ``generate(images)`` returns ``[BOS] + generated ids`` (B, 1 + T), ``[PAD]`` after
    ``[EOS]``; :meth:`cross_attention_maps` then gives the cross-attention of every
    generated token over the patch grid.
    """

    config_class = CaptionerConfig
    modality = "image-text"

    def __init__(self, config: CaptionerConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = ViT(config.encoder)
        self.decoder = TextDecoder(config.decoder)

    @property
    def max_len(self) -> int:
        """Longest token sequence (BOS and EOS included) the decoder can read."""
        return self.decoder.max_len

    # -- encoder ----------------------------------------------------------------------
    def _check_images(self, images: Tensor) -> None:
        if isinstance(images, Tensor) and images.dim() == 4 and images.shape[0] == 0:
            raise ValueError(f"empty batch: images has shape {tuple(images.shape)}; "
                             "give at least one image")

    def patch_grid(self, images: Tensor) -> tuple[int, int]:
        """(rows, columns) of the patch grid the encoder makes of ``images``."""
        return self.encoder.patch_embed.grid_size(*images.shape[-2:])

    @property
    def memory_prefix(self) -> int:
        """How many encoder prefix tokens (class, registers) lead the memory: 0 unless
        ``memory="all"``."""
        return self.encoder.num_prefix_tokens if self.config.memory == "all" else 0

    def encode(self, images: Tensor) -> Tensor:
        """Patch tokens (B, P, encoder.dim) after the encoder's final norm (class token
        dropped unless ``memory="all"``, then (B, prefix + P, encoder.dim)). Images of
        another size than the config's get resampled positions when
        ``encoder.dynamic_size``, else a ValueError."""
        self._check_images(images)
        tokens = self.encoder.forward_features(images)
        if self.config.memory == "all":
            return tokens
        return tokens[:, self.encoder.num_prefix_tokens :]

    # -- teacher forcing --------------------------------------------------------------
    def _check_ids(self, input_ids: Tensor, batch: int) -> None:
        check_token_ids(input_ids, self.config.decoder.vocab_size)
        if input_ids.shape[0] != batch:
            raise ValueError(f"{batch} images but {input_ids.shape[0]} captions")
        if input_ids.shape[1] > self.max_len:
            raise ValueError(f"captions of {input_ids.shape[1]} tokens are longer than the "
                             f"decoder's context of {self.max_len} tokens; raise "
                             "decoder.max_len or shorten the captions")

    def forward(self, images: Tensor, input_ids: Tensor,
                attention_mask: Tensor | None = None) -> Tensor:
        """Logits (B, T, vocab): row t scores the token after ``input_ids[:, :t+1]``.
        ``attention_mask`` (B, T) is 1 at tokens and 0 at padding. With right padding it
        may be omitted: the causal mask already keeps real tokens from seeing later pads."""
        return self.forward_head(self.forward_features(images, input_ids, attention_mask))

    def forward_features(self, images: Tensor, input_ids: Tensor,
                         attention_mask: Tensor | None = None, *,
                         return_attention: bool = False) -> Any:
        """The decoder's hidden states (B, T, decoder.dim) after its final norm; with
        ``return_attention`` ``(hidden, AttentionMaps)``: the decoder's self-attention and
        its cross-attention over the memory tokens, per layer
        (:meth:`cross_attention_maps` lays the latter over the patch grid)."""
        self._check_images(images)
        self._check_ids(input_ids, images.shape[0])
        memory = self.encode(images)
        return self.decoder.forward_features(input_ids, attention_mask, memory=memory,
                                             return_attention=return_attention)

    def example_inputs(self, batch_size: int = 2) -> tuple[Tensor, ...]:
        """Random images and caption ids ``[BOS] + 7 random tokens`` (fewer if the decoder's
        context is shorter)."""
        (images,) = self.encoder.example_inputs(batch_size)
        (ids,) = self.decoder.example_inputs(batch_size)
        ids[:, 0] = self.config.bos_token_id
        return images, ids

    # -- attention ----------------------------------------------------------------------
    @torch.no_grad()
    def cross_attention_maps(self, images_or_memory: Tensor, ids: Tensor,
                             grid: tuple[int, int] | None = None,
                             layers: Literal["last", "mean"] = "last") -> Tensor:
        """Cross-attention of each predicted token over the patch grid: (B, T-1, rows, cols).

        Row t is the attention of the decoder query at position t, the one that predicted
        ``ids[:, t+1]``, averaged over heads, from the last layer (``layers="last"``) or
        averaged over layers (``"mean"``). Each row sums to 1 over the patches. It is one
        exact teacher-forced pass over the finished sequence (the decoder is causal, so
        position t sees exactly what it saw while decoding). ``images_or_memory`` is
        images (B, C, H, W) or an encoder output (B, P, dim) together with ``grid``.
        """
        if layers not in ("last", "mean"):
            raise ValueError(f"layers must be 'last' or 'mean', got {layers!r}")
        if images_or_memory.dim() == 4:
            grid = self.patch_grid(images_or_memory)
            memory = self.encode(images_or_memory)
        else:
            memory = images_or_memory
            if grid is None or grid[0] * grid[1] + self.memory_prefix != memory.shape[1]:
                raise ValueError(f"give the patch grid of the {memory.shape[1]} memory tokens, "
                                 f"got grid={grid}")
        if ids.shape[1] < 2:
            raise ValueError("ids must hold at least [BOS] and one generated token")
        _, maps = self.decoder(ids[:, :-1], memory=memory, return_attention=True)
        cross = maps.cross_attn  # per layer (B, H, T-1, P)
        att = cross[-1].mean(dim=1) if layers == "last" \
            else torch.stack(cross).mean(dim=(0, 2))
        att = att[..., self.memory_prefix :]
        return att.reshape(att.shape[0], att.shape[1], *grid)

    # -- decoding -----------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self,
        images: Tensor,
        max_new_tokens: int | None = None,
        *,
        num_beams: int = 1,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        length_penalty: float = 1.0,
        eos_token_id: int | None = None,
        bos_token_id: int | None = None,
        pad_token_id: int | None = None,
        generator: torch.Generator | None = None,
        use_cache: bool = True,
        compile: bool = False,
        static_cache: bool | None = None,
        return_attention: bool = False,
    ) -> Tensor | tuple[Tensor, AttentionMaps]:
        """Caption ids (B, 1 + T) starting with ``[BOS]``; the image is encoded once.

        Strategies are those of :func:`multimodal.generation.generate` (greedy, sampling
        with ``temperature`` / ``top_k`` / ``top_p``, beam search with ``num_beams`` and
        ``length_penalty``). ``max_new_tokens`` defaults to the decoder context minus the
        BOS token. With ``return_attention`` also the decoder's
        :class:`~multimodal.models.api.AttentionMaps` of the T steps that produced the
        generated tokens (query t produced token t; rows after ``[EOS]`` belong to padding;
        cross-attention keys: the memory tokens), from one teacher-forced pass over the
        finished sequence; ``cross_attention_maps(images, ids)`` lays them over the patch
        grid. ``compile`` / ``static_cache``: static-cache decoding
        (:func:`multimodal.generation.generate`), the same tokens.
        """
        cfg = self.config
        bos = cfg.bos_token_id if bos_token_id is None else bos_token_id
        eos = cfg.eos_token_id if eos_token_id is None else eos_token_id
        pad = cfg.pad_token_id if pad_token_id is None else pad_token_id
        steps = self.max_len - 1 if max_new_tokens is None else max_new_tokens
        was_training = self.training
        self.eval()
        try:
            memory = self.encode(images)
            start = torch.full((memory.shape[0], 1), bos, dtype=torch.long,
                               device=memory.device)
            ids = generate(self.decoder, start, steps, do_sample=do_sample,
                           temperature=temperature, top_k=top_k, top_p=top_p,
                           num_beams=num_beams, length_penalty=length_penalty,
                           eos_token_id=eos, pad_token_id=pad, generator=generator,
                           use_cache=use_cache, compile=compile,
                           static_cache=static_cache, memory=memory)
            if not return_attention:
                return ids
            if ids.shape[1] < 2:  # nothing generated: no step to show
                return ids, AttentionMaps([], [])
            _, maps = self.decoder(ids[:, :-1], memory=memory, return_attention=True)
            return ids, maps
        finally:
            self.train(was_training)


def caption(model: Captioner, images: Tensor, tokenizer: Any, **generate_kwargs: Any
            ) -> list[str]:
    """Generated captions as strings: ``model.generate`` then ``tokenizer.decode_batch``
    (structural special tokens dropped, ``[UNK]`` kept visible, everything after the first
    ``[EOS]`` cut)."""
    ids = model.generate(images, **generate_kwargs)
    if isinstance(ids, tuple):  # return_attention=True
        ids = ids[0]
    return decode_captions(ids, tokenizer, model.config.eos_token_id)


def decode_captions(ids: Tensor, tokenizer: Any, eos_token_id: int = EOS_ID) -> list[str]:
    """Strings of generated ids (B, N): cut at the first EOS, structural special tokens dropped
    (``[UNK]`` is written out). Ids beyond the tokenizer's vocabulary (the decoder's table may be
    larger) count as [UNK]."""
    rows = [[i if i < tokenizer.vocab_size else UNK_ID for i in row]
            for row in cut_at_eos(ids, eos_token_id)]
    return tokenizer.decode_batch(rows)


def cut_at_eos(ids: Tensor, eos_token_id: int = EOS_ID) -> list[list[int]]:
    """Each row of (B, N) ids up to (not including) its first ``eos_token_id``."""
    rows = []
    for row in ids.tolist():
        rows.append(row[: row.index(eos_token_id)] if eos_token_id in row else row)
    return rows


@register_preset("captioner_scenes")
def captioner_scenes(**overrides: Any) -> Captioner:
    """Small captioner for 32x32 procedural scenes (8x8 grid of 4x4 patches, conv stem,
    width 96, a 32-word vocabulary): the model of configs/caption_scenes.yaml."""
    defaults = {
        "encoder": dataclasses.replace(_default_encoder(), stem="conv", dim=96, mlp_dim=192),
        "decoder": dataclasses.replace(_default_decoder(), vocab_size=32, max_len=24, dim=96,
                                       mlp_dim=192)}
    return Captioner(CaptionerConfig(**{**defaults, **overrides}))


@register_preset("captioner_emoji")
def captioner_emoji(**overrides: Any) -> Captioner:
    """Small captioner for 32x32 emoji with a 1000-piece WordPiece vocabulary (8x8 grid of
    4x4 patches, width 96, dropout 0.1): the model of configs/caption_emoji.yaml and
    caption_manifest.yaml."""
    defaults = {
        "encoder": dataclasses.replace(_default_encoder(), dim=96, mlp_dim=192, dropout=0.1),
        "decoder": dataclasses.replace(_default_decoder(), vocab_size=1000, max_len=32, dim=96,
                                       mlp_dim=192, dropout=0.1),
    }
    return Captioner(CaptionerConfig(**{**defaults, **overrides}))
