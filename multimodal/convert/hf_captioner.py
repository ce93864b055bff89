"""transformers ``VisionEncoderDecoderModel`` (a ViT-family encoder + a GPT-2 decoder with
cross-attention) -> :class:`~multimodal.Captioner`.

The encoder half goes through the registered converter of its ``model_type`` (``vit``,
``deit``, ``dinov2``, ...: anything that becomes our ViT), the decoder half through the
GPT-2 converter (``add_cross_attention=True``). transformers feeds the decoder the whole
``last_hidden_state``, class token included: the captioner keeps it
(``CaptionerConfig.memory="all"``). When the widths differ, transformers projects the
memory with ``enc_to_dec_proj`` (``P m = W_p m + b_p``) before every layer's keys and
values ``W_kv (P m) + b_kv``; the projection is folded into each layer's ``kv`` Linear:
``W = W_kv W_p``, ``b = W_kv b_p + b_kv`` (one Linear instead of two, same function).

Decoding: ``decoder_start_token_id`` is the captioner's BOS, the decoder's ``eos_token_id``
its EOS, ``pad_token_id`` its padding. ``Captioner.generate`` equals transformers'
``generate`` token for token with the same settings: greedy, and beam search with
``early_stopping="never"`` (ours stops a row only when no running beam can beat its
finished hypotheses under the length penalty; transformers' default ``False`` stops on a
cheaper estimate).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import Tensor, nn

from multimodal.convert.common import (
    HF_CONVERTERS,
    HF_MODEL_TYPES,
    build,
    cfg_get,
    load_converted,
    register_hf,
    register_hf_model_type,
    sub_config,
)
from multimodal.models.backbone import BACKBONE_FIELDS
from multimodal.models.captioner import Captioner, CaptionerConfig
from multimodal.models.text import TextDecoder, TextDecoderConfig
from multimodal.models.vit import ViT


class _Half:
    """One half of the model as the converters read a model: ``config`` and
    ``state_dict()``; subclassed under the class name the converters dispatch on."""

    def __init__(self, config: Any, state: dict[str, Tensor]) -> None:
        self.config = config
        self._state = state

    def state_dict(self) -> dict[str, Tensor]:
        return self._state


def _half(cfg: Any, state: dict[str, Tensor], part: str, arch: str) -> Any:
    sub = {k[len(part) + 1:]: v for k, v in state.items() if k.startswith(part + ".")}
    return type(arch, (_Half,), {})(cfg, sub)


def _one_id(value: Any, name: str) -> int:
    if isinstance(value, (list, tuple)):
        value = value[0] if len(value) == 1 else None
    if value is None:
        raise ValueError(f"VisionEncoderDecoderModel: {name} must be set (one id) to "
                         "decode; set it in the config")
    return int(value)


def _hf_vision_encoder_decoder(model: nn.Module) -> Captioner:
    """``VisionEncoderDecoderModel`` -> :class:`~multimodal.Captioner` (see the module
    docstring)."""
    cfg, state = model.config, model.state_dict()
    ec, dc = sub_config(cfg, "encoder"), sub_config(cfg, "decoder")
    enc_type, dec_type = cfg_get(ec, "model_type"), cfg_get(dc, "model_type")
    if dec_type != "gpt2":
        raise ValueError(f"VisionEncoderDecoderModel with a {dec_type!r} decoder is not "
                         "supported (supported: gpt2)")
    if not getattr(dc, "add_cross_attention", False):
        raise ValueError("VisionEncoderDecoderModel: the GPT-2 decoder has no "
                         "cross-attention (add_cross_attention=False)")
    if getattr(dc, "cross_attention_hidden_size", None) is not None:
        raise ValueError("decoder.cross_attention_hidden_size is not supported")
    known = HF_MODEL_TYPES.get(enc_type)
    encoder = HF_CONVERTERS[known.base_class](_half(ec, state, "encoder", known.base_class)) \
        if known else None
    if not isinstance(encoder, ViT):
        supported = sorted(t for t, k in HF_MODEL_TYPES.items()
                           if k.base_class in ("ViTModel", "DeiTModel", "Dinov2Model",
                                               "Dinov2WithRegistersModel"))
        raise ValueError(f"VisionEncoderDecoderModel with a {enc_type!r} encoder is not "
                         f"supported (supported: {', '.join(supported)})")
    dec_state = {k: v for k, v in state.items() if k.startswith("decoder.")}
    if "decoder.lm_head.weight" not in dec_state:  # tied, stored once by save_pretrained
        dec_state["decoder.lm_head.weight"] = state["decoder.transformer.wte.weight"]
    decoder = HF_CONVERTERS["GPT2LMHeadModel"](
        _half(dc, dec_state, "decoder", "GPT2LMHeadModel"))
    assert isinstance(decoder, TextDecoder)
    projected = "enc_to_dec_proj.weight" in state
    if not projected and encoder.config.dim != decoder.config.dim:
        raise ValueError(f"encoder width {encoder.config.dim} != decoder width "
                         f"{decoder.config.dim} and no enc_to_dec_proj in the weights")
    used = {k for k in state if k.startswith(("encoder.", "decoder."))}
    extra = sorted(set(state) - used - {"enc_to_dec_proj.weight", "enc_to_dec_proj.bias"})
    if extra:
        raise ValueError("cannot convert this VisionEncoderDecoderModel state dict: not "
                         "converted: " + ", ".join(extra))
    dec_state_ours = decoder.state_dict()
    if projected:
        w_p, b_p = state["enc_to_dec_proj.weight"], state["enc_to_dec_proj.bias"]
        for key in [k for k in dec_state_ours if k.endswith("cross_attn.kv.weight")]:
            w_kv = dec_state_ours[key]
            bias_key = key[: -len("weight")] + "bias"
            dec_state_ours[bias_key] = w_kv @ b_p + dec_state_ours[bias_key]
            dec_state_ours[key] = w_kv @ w_p
    pad = getattr(cfg, "pad_token_id", None)
    if pad is None:
        pad = getattr(dc, "pad_token_id", None)
    eos = getattr(cfg, "eos_token_id", None)
    eos = _one_id(getattr(dc, "eos_token_id", None) if eos is None else eos, "eos_token_id")
    # the memory width is the encoder's (the projection is folded in): CaptionerConfig
    # fills it in when the decoder config leaves it unset
    dcfg = decoder.config
    dec_config = TextDecoderConfig(
        **{f.name: getattr(dcfg, f.name) for f in dataclasses.fields(dcfg)
           if f.name not in BACKBONE_FIELDS and f.name != "backbone"},
        backbone=dataclasses.replace(dcfg.backbone, memory_dim=None))
    config = CaptionerConfig(
        encoder=encoder.config, decoder=dec_config, memory="all",
        bos_token_id=_one_id(getattr(cfg, "decoder_start_token_id", None),
                             "decoder_start_token_id"),
        eos_token_id=eos, pad_token_id=eos if pad is None else _one_id(pad, "pad_token_id"))
    captioner = build(Captioner, config)
    ours = {f"encoder.{k}": v for k, v in encoder.state_dict().items()}
    ours.update({f"decoder.{k}": v for k, v in dec_state_ours.items()})
    return load_converted(captioner, ours)


register_hf(_hf_vision_encoder_decoder, "VisionEncoderDecoderModel")
register_hf_model_type("vision-encoder-decoder", "VisionEncoderDecoderModel")

