"""transformers ``SiglipModel`` -> :class:`~multimodal.CLIP` with SigLIP's switches.

SigLIP (Zhai et al., 2023) differs from CLIP in layout only:

- image tower: patches with a bias, learned positions for the patches only (no class
  token), no LayerNorm before the blocks, ``post_layernorm`` on every token, then a
  multihead attention-pooling head (a learned probe; ``nn.MultiheadAttention``, then
  ``y = z + MLP(LN z)``): our ViT with ``class_token=False, pool="map"``. Its output is
  the image embedding: no image projection (``CLIPConfig.image_projection=False``).
- text tower: bidirectional pre-norm blocks (not causal), ``final_layer_norm``, pooled at
  the *last column* whatever the mask (``text_pool="last"``: SigLIP pads to the full
  context and reads the last position), then ``head``, a Linear *with* a bias
  (``text_projection_bias=True``).
- scores: ``exp(logit_scale) · I Tᵀ + logit_bias`` (``loss="sigmoid"``).

``encode_image(x, normalize=False)`` = ``get_image_features`` (its ``pooler_output``),
``encode_text(ids, mask, normalize=False)`` = ``get_text_features``,
``similarity(images, ids, mask)`` = ``logits_per_image``.
"""

from __future__ import annotations

import math
from typing import Any

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
from multimodal.convert.hf_clip import clip_layers
from multimodal.models.clip import CLIP, CLIPConfig
from multimodal.models.text import TextEncoderConfig
from multimodal.models.vit import ViTConfig


def _tower(c: Any) -> dict[str, Any]:
    return dict(dim=cfg_get(c, "hidden_size"), depth=cfg_get(c, "num_hidden_layers"),
                heads=cfg_get(c, "num_attention_heads"),
                mlp_dim=cfg_get(c, "intermediate_size"),
                norm_eps=cfg_get(c, "layer_norm_eps", 1e-6),
                activation=hf_activation(c, "hidden_act"))


def _hf_siglip(model: nn.Module) -> CLIP:
    """``SiglipModel`` -> :class:`~multimodal.CLIP` (see the module docstring)."""
    cfg, state = model.config, model.state_dict()
    vc, tc = sub_config(cfg, "vision_config"), sub_config(cfg, "text_config")
    if not getattr(vc, "vision_use_head", True):
        raise ValueError("SigLIP vision_config.vision_use_head=False: this model has no "
                         "attention-pooling head, so get_image_features has no pooled "
                         "output to match; only models with the head are supported")
    src = StateReader(state, type(model).__name__)
    vision = ViTConfig(
        image_size=cfg_get(vc, "image_size"), patch_size=cfg_get(vc, "patch_size"),
        in_channels=cfg_get(vc, "num_channels", 3), num_classes=0, class_token=False,
        pool="map", **_tower(vc))
    text = TextEncoderConfig(
        vocab_size=cfg_get(tc, "vocab_size"), max_len=cfg_get(tc, "max_position_embeddings"),
        pos_embed="learned", type_vocab_size=0, embed_norm=False, mlm_head=False,
        norm="pre", causal=False, **_tower(tc))
    out: dict[str, Tensor] = {}
    src.prefix = "vision_model."
    v = "vision_model."
    out[f"{v}pos_embed"] = src.take("embeddings.position_embedding.weight")[None]
    put_linear(out, f"{v}patch_embed.proj", src.take("embeddings.patch_embedding.weight"),
               src.take("embeddings.patch_embedding.bias"))
    clip_layers(out, src, vision.depth, f"{v}transformer")
    put_norm(out, f"{v}transformer.norm", src, "post_layernorm")
    # the MAP head: nn.MultiheadAttention's in_proj rows are [W_q; W_k; W_v]
    p, d = f"{v}attn_pool", vision.dim
    out[f"{p}.probe"] = src.take("head.probe")
    w, b = src.take("head.attention.in_proj_weight"), src.take("head.attention.in_proj_bias")
    put_linear(out, f"{p}.attn.q", w[:d], b[:d])
    put_linear(out, f"{p}.attn.kv", w[d:], b[d:])
    put_linear(out, f"{p}.attn.proj", src.take("head.attention.out_proj.weight"),
               src.take("head.attention.out_proj.bias"))
    put_norm(out, f"{p}.norm", src, "head.layernorm")
    for fc in ("fc1", "fc2"):
        put_linear(out, f"{p}.mlp.{fc}", src.take(f"head.mlp.{fc}.weight"),
                   src.take(f"head.mlp.{fc}.bias"))
    src.skip("embeddings.position_ids")
    src.prefix = "text_model."
    t = "text_model."
    out[f"{t}tok_embed.weight"] = src.take("embeddings.token_embedding.weight")
    out[f"{t}pos_embed.weight"] = src.take("embeddings.position_embedding.weight")
    clip_layers(out, src, text.depth, f"{t}transformer")
    put_norm(out, f"{t}transformer.norm", src, "final_layer_norm")
    put_linear(out, "text_projection", src.take("head.weight"), src.take("head.bias"))
    src.skip("embeddings.position_ids")
    src.prefix = ""
    scale, bias = src.take("logit_scale"), src.take("logit_bias")
    src.finish()
    if out["text_projection.weight"].shape[0] != vision.dim:
        raise ValueError(f"SigLIP text head maps to {out['text_projection.weight'].shape[0]} "
                         f"features but the image tower gives {vision.dim}: they must agree "
                         "(text_config.projection_size = vision_config.hidden_size)")
    out["logit_scale"] = scale.reshape(())
    out["logit_bias"] = bias.reshape(())
    log_scale = float(scale.reshape(-1)[0])
    config = CLIPConfig(
        vision=vision, text=text, embed_dim=vision.dim, text_pool="last", loss="sigmoid",
        image_projection=False, text_projection_bias=True, logit_scale_init=log_scale,
        logit_scale_max=max(math.log(100.0), log_scale),
        logit_bias_init=float(bias.reshape(-1)[0]))
    return load_converted(build(CLIP, config), out)


register_hf(_hf_siglip, "SiglipModel")
register_hf_model_type("siglip", "SiglipModel")
