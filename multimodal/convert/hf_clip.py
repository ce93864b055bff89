"""transformers ``CLIPModel`` -> :class:`~multimodal.CLIP`."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from multimodal.convert.common import (
    StateReader,
    build,
    cfg_get,
    hf_activation,
    load_converted,
    put_linear,
    put_norm,
    register_hf,
    register_hf_model_type,
    sub_config,
)
from multimodal.models.clip import CLIP, CLIPConfig
from multimodal.models.text import TextEncoderConfig
from multimodal.models.vit import ViTConfig


def clip_layers(out: dict[str, Tensor], src: StateReader, depth: int,
                ours: str = "transformer") -> None:
    """Move ``depth`` transformers CLIP encoder layers (``encoder.layers.i``: q/k/v/out
    projections, two layer norms, ``mlp.fc1`` / ``fc2``) from ``src`` into ``out`` as our
    blocks ``{ours}.blocks.i`` (q, k, v stacked into one ``qkv``). SigLIP's towers share
    the layout."""
    for i in range(depth):
        t, o = f"encoder.layers.{i}", f"{ours}.blocks.{i}"
        a = f"{t}.self_attn"
        put_linear(out, f"{o}.attn.qkv",
                   torch.cat([src.take(f"{a}.{p}_proj.weight") for p in "qkv"]),
                   torch.cat([src.take(f"{a}.{p}_proj.bias") for p in "qkv"]))
        put_linear(out, f"{o}.attn.proj", src.take(f"{a}.out_proj.weight"),
                   src.take(f"{a}.out_proj.bias"))
        put_norm(out, f"{o}.norm1", src, f"{t}.layer_norm1")
        put_norm(out, f"{o}.norm2", src, f"{t}.layer_norm2")
        for fc in ("fc1", "fc2"):
            put_linear(out, f"{o}.mlp.{fc}", src.take(f"{t}.mlp.{fc}.weight"),
                       src.take(f"{t}.mlp.{fc}.bias"))


def _clip_eot_token_id(tc: Any) -> int:
    """Where transformers' CLIP text tower pools: the first ``eos_token_id``, or, for legacy
    configs with ``eos_token_id == 2``, ``argmax`` of the ids, which is the first
    ``<|endoftext|>``, the largest id of the original vocabulary: ``vocab_size - 1``."""
    eos = cfg_get(tc, "eos_token_id", 2)
    if isinstance(eos, (list, tuple)):
        if len(eos) != 1:
            raise ValueError(f"text_config.eos_token_id must be one id, got {eos!r}")
        eos = eos[0]
    return int(cfg_get(tc, "vocab_size")) - 1 if int(eos) == 2 else int(eos)


def _hf_clip(model: nn.Module) -> CLIP:
    """``CLIPModel`` -> :class:`~multimodal.CLIP`, so ``encode_image`` / ``encode_text`` /
    ``similarity`` / ``zero_shot`` work on an imported CLIP as on one trained here.

    ``encode_*(x, normalize=False)`` equal ``get_image_features`` / ``get_text_features`` and
    ``similarity`` equals ``logits_per_image``. The image tower: class embedding, bias-free
    patches, ``pre_layrnorm`` (ViT ``pre_norm``), ``post_layernorm`` as the final norm
    (applied to every token; transformers applies it to the pooled class token only, so
    ``forward_features`` differs from ``last_hidden_state`` but the pooled feature agrees).
    The text tower: a :class:`~multimodal.TextEncoder` switched to CLIP's (learned
    positions, no embedding norm, pre-norm causal blocks, final norm) pooled at the
    end-of-text token (:func:`_clip_eot_token_id`). transformers does not clamp
    ``logit_scale`` at inference: ``logit_scale_max`` is raised to the stored value if
    above log(100)."""
    cfg, state = model.config, model.state_dict()
    vc, tc = sub_config(cfg, "vision_config"), sub_config(cfg, "text_config")
    src = StateReader(state, type(model).__name__)
    vision = ViTConfig(
        image_size=cfg_get(vc, "image_size"), patch_size=cfg_get(vc, "patch_size"),
        in_channels=cfg_get(vc, "num_channels", 3), num_classes=0, pool="cls", pre_norm=True,
        patch_bias=False, dim=cfg_get(vc, "hidden_size"), depth=cfg_get(vc, "num_hidden_layers"),
        heads=cfg_get(vc, "num_attention_heads"), mlp_dim=cfg_get(vc, "intermediate_size"),
        norm_eps=cfg_get(vc, "layer_norm_eps", 1e-5), activation=hf_activation(vc, "hidden_act"),
    )
    text = TextEncoderConfig(
        vocab_size=cfg_get(tc, "vocab_size"), max_len=cfg_get(tc, "max_position_embeddings"),
        pos_embed="learned", type_vocab_size=0, embed_norm=False, mlm_head=False,
        norm="pre", causal=True, dim=cfg_get(tc, "hidden_size"),
        depth=cfg_get(tc, "num_hidden_layers"), heads=cfg_get(tc, "num_attention_heads"),
        mlp_dim=cfg_get(tc, "intermediate_size"), norm_eps=cfg_get(tc, "layer_norm_eps", 1e-5),
        activation=hf_activation(tc, "hidden_act"),
    )
    out: dict[str, Tensor] = {}
    src.prefix = "vision_model."
    v = "vision_model."
    out[f"{v}cls_token"] = src.take("embeddings.class_embedding").reshape(1, 1, -1)
    out[f"{v}pos_embed"] = src.take("embeddings.position_embedding.weight")[None]
    out[f"{v}patch_embed.proj.weight"] = src.take("embeddings.patch_embedding.weight")
    put_norm(out, f"{v}norm_pre", src, "pre_layrnorm")
    clip_layers(out, src, vision.depth, f"{v}transformer")
    put_norm(out, f"{v}transformer.norm", src, "post_layernorm")
    src.skip("embeddings.position_ids")
    src.prefix = "text_model."
    t = "text_model."
    out[f"{t}tok_embed.weight"] = src.take("embeddings.token_embedding.weight")
    out[f"{t}pos_embed.weight"] = src.take("embeddings.position_embedding.weight")
    clip_layers(out, src, text.depth, f"{t}transformer")
    put_norm(out, f"{t}transformer.norm", src, "final_layer_norm")
    src.skip("embeddings.position_ids")
    src.prefix = ""
    for name in ("visual_projection.weight", "text_projection.weight", "logit_scale"):
        out[name] = src.take(name)
    src.finish()
    projection = out["visual_projection.weight"]
    scale = float(out["logit_scale"]) if out["logit_scale"].numel() == 1 else math.log(100.0)
    config = CLIPConfig(
        vision=vision, text=text, embed_dim=projection.shape[0] if projection.numel() else 1,
        text_pool="eot", eot_token_id=_clip_eot_token_id(tc), loss="softmax",
        logit_scale_init=scale, logit_scale_max=max(math.log(100.0), scale))
    return load_converted(build(CLIP, config), out)


register_hf(_hf_clip, "CLIPModel")
register_hf_model_type("clip", "CLIPModel")
