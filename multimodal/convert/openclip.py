"""open_clip's ``CLIP`` / ``CustomTextCLIP`` (their own ViT image tower and
``TextTransformer``) -> :class:`~multimodal.CLIP`.

>>> clip = from_open_clip(open_clip.create_model("ViT-B-32", pretrained=None))

Read from the modules (hyper-parameters open_clip keeps out of the state dict) and the
state dict (weights, widths):

- image tower: ``conv1`` (no bias) patches, ``class_embedding`` and
  ``positional_embedding`` (class row first), ``ln_pre`` (ViT ``pre_norm``; absent with
  ``no_ln_pre``), pre-norm blocks (``nn.MultiheadAttention``, ``mlp.c_fc`` / ``c_proj``,
  optional LayerScale ``ls_1`` / ``ls_2``), ``ln_post`` on every token then the class
  token (``pool_type="tok"``) or the mean of the patches (``"avg"``), then ``x @ proj``:
  our ``visual_projection`` is ``proj.T`` (none: ``image_projection=False``).
- text tower: token and learned positions, blocks under the causal ``attn_mask`` (absent:
  bidirectional), ``ln_final`` on every token, pooled by ``text_pool_type``: ``"argmax"``
  (the largest id of each row: the end-of-text token of OpenAI's vocabulary, its largest
  id, so ``eot_token_id = vocab_size - 1``), ``"eos"`` (the first ``eos_id``) or
  ``"last"``; then ``x @ text_projection`` (a Parameter, transposed) or an ``nn.Linear``
  (with its bias: ``text_projection_bias``).
- ``logit_scale``; a ``logit_bias`` makes it a sigmoid-loss (SigLIP-style) model.

``encode_image(x, normalize=False)`` / ``encode_text(ids, normalize=False)`` equal
open_clip's ``encode_image`` / ``encode_text`` (which take no attention mask: give full
rows, padded after the end-of-text token as open_clip's tokenizer does). Refused, naming
the feature: timm or Hugging Face towers, attentional pooling, ``final_ln_after_pool``,
CoCa's text class embedding, padding masks, custom attention blocks (qk norm, scaled
cosine attention).
"""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor, nn

from multimodal.convert.common import (
    StateReader,
    activation_of,
    load_converted,
    put_linear,
    put_norm,
)
from multimodal.models.clip import CLIP, CLIPConfig
from multimodal.models.text import TextEncoderConfig
from multimodal.models.vit import ViTConfig


def _refuse(what: str) -> ValueError:
    return ValueError(f"from_open_clip: {what} is not supported (supported: open_clip CLIP / "
                      "CustomTextCLIP with its own VisionTransformer and TextTransformer)")


def _blocks(stack: nn.Module, where: str) -> dict[str, Any]:
    """Backbone settings of an open_clip ``Transformer``, checked block by block."""
    blocks = list(stack.resblocks)
    if not blocks:
        raise _refuse(f"an empty {where} transformer")
    first = blocks[0]
    for block in blocks:
        if type(block).__name__ != "ResidualAttentionBlock" or \
                not isinstance(block.attn, nn.MultiheadAttention):
            raise _refuse(f"{where} block {type(block).__name__} (custom attention: qk norm, "
                          "scaled cosine attention, head scaling)")
        if not isinstance(getattr(block, "ln_attn", nn.Identity()), nn.Identity):
            raise _refuse(f"{where} ln_attn (scale_attn)")
    ls = first.ls_1
    return dict(
        dim=first.attn.embed_dim, depth=len(blocks), heads=first.attn.num_heads,
        mlp_dim=first.mlp.c_fc.out_features, norm_eps=first.ln_1.eps,
        activation=activation_of(first.mlp.gelu) if hasattr(first.mlp, "gelu")
        else activation_of(first.mlp[1]),
        layer_scale=None if isinstance(ls, nn.Identity) else 1.0,
    )


def _put_blocks(out: dict[str, Tensor], src: StateReader, theirs: str, ours: str,
                depth: int, layer_scale: bool) -> None:
    for i in range(depth):
        t, o = f"{theirs}.resblocks.{i}", f"{ours}.blocks.{i}"
        put_linear(out, f"{o}.attn.qkv", src.take(f"{t}.attn.in_proj_weight"),
                   src.take(f"{t}.attn.in_proj_bias"))
        put_linear(out, f"{o}.attn.proj", src.take(f"{t}.attn.out_proj.weight"),
                   src.take(f"{t}.attn.out_proj.bias"))
        put_norm(out, f"{o}.norm1", src, f"{t}.ln_1")
        put_norm(out, f"{o}.norm2", src, f"{t}.ln_2")
        for ours_fc, theirs_fc in (("fc1", "c_fc"), ("fc2", "c_proj")):
            put_linear(out, f"{o}.mlp.{ours_fc}", src.take(f"{t}.mlp.{theirs_fc}.weight"),
                       src.take(f"{t}.mlp.{theirs_fc}.bias"))
        if layer_scale:
            out[f"{o}.ls1.gamma"] = src.take(f"{t}.ls_1.gamma")
            out[f"{o}.ls2.gamma"] = src.take(f"{t}.ls_2.gamma")


def _vision(visual: nn.Module, src: StateReader, out: dict[str, Tensor]) -> ViTConfig:
    if type(visual).__name__ != "VisionTransformer":
        raise _refuse(f"the image tower {type(visual).__name__}")
    if getattr(visual, "attn_pool", None) is not None:
        raise _refuse("attentional pooling in the image tower (attn_pool)")
    if getattr(visual, "final_ln_after_pool", False):
        raise _refuse("final_ln_after_pool")
    pool = {"tok": "cls", "avg": "mean"}.get(visual.pool_type)
    if pool is None:
        raise _refuse(f"image pool_type={visual.pool_type!r}")
    bb = _blocks(visual.transformer, "image")
    pre_norm = not isinstance(visual.ln_pre, nn.Identity)
    config = ViTConfig(
        image_size=tuple(visual.image_size), patch_size=tuple(visual.patch_size),
        in_channels=visual.conv1.in_channels, num_classes=0, pool=pool, pre_norm=pre_norm,
        patch_bias=visual.conv1.bias is not None, **bb)
    v = "vision_model."
    out[f"{v}cls_token"] = src.take("visual.class_embedding").reshape(1, 1, -1)
    out[f"{v}pos_embed"] = src.take("visual.positional_embedding")[None]
    put_linear(out, f"{v}patch_embed.proj", src.take("visual.conv1.weight"),
               src.take("visual.conv1.bias") if config.patch_bias else None)
    if pre_norm:
        put_norm(out, f"{v}norm_pre", src, "visual.ln_pre")
    _put_blocks(out, src, "visual.transformer", f"{v}transformer", config.depth,
                bb["layer_scale"] is not None)
    put_norm(out, f"{v}transformer.norm", src, "visual.ln_post")
    return config


def from_open_clip(model: nn.Module) -> CLIP:
    """An open_clip ``CLIP`` / ``CustomTextCLIP`` -> :class:`~multimodal.CLIP` (see the
    module docstring for what is read and what is refused)."""
    kind = type(model).__name__
    if kind not in ("CLIP", "CustomTextCLIP") or not hasattr(model, "visual"):
        raise _refuse(f"a {type(model).__module__}.{kind}")
    src = StateReader(model.state_dict(), f"open_clip {kind}")
    out: dict[str, Tensor] = {}
    vision = _vision(model.visual, src, out)

    if kind == "CustomTextCLIP":
        text_tower, p = model.text, "text."
        if type(text_tower).__name__ != "TextTransformer":
            raise _refuse(f"the text tower {type(text_tower).__name__}")
        if getattr(text_tower, "cls_emb", None) is not None:
            raise _refuse("a text class embedding (CoCa's embed_cls)")
        if getattr(text_tower, "use_pad_mask", False):
            raise _refuse("a text padding mask (use_pad_mask)")
        pool_type, eos_id = text_tower.pool_type, getattr(text_tower, "eos_id", None)
    else:
        text_tower, p = model, ""
        pool_type, eos_id = model.text_pool_type, getattr(model, "text_eos_id", None)
    bb = _blocks(text_tower.transformer, "text")
    vocab = text_tower.token_embedding.num_embeddings
    text = TextEncoderConfig(
        vocab_size=vocab, max_len=text_tower.positional_embedding.shape[0],
        pos_embed="learned", type_vocab_size=0, embed_norm=False, mlm_head=False, norm="pre",
        causal=getattr(text_tower, "attn_mask", None) is not None, **bb)
    t = "text_model."
    out[f"{t}tok_embed.weight"] = src.take(f"{p}token_embedding.weight")
    out[f"{t}pos_embed.weight"] = src.take(f"{p}positional_embedding")
    _put_blocks(out, src, f"{p}transformer", f"{t}transformer", text.depth,
                bb["layer_scale"] is not None)
    put_norm(out, f"{t}transformer.norm", src, f"{p}ln_final")
    if pool_type == "argmax":
        text_pool, eot = "eot", vocab - 1
    elif pool_type == "eos":
        text_pool, eot = "eot", int(eos_id)
    elif pool_type == "last":
        text_pool, eot = "last", None
    else:
        raise _refuse(f"text pool_type={pool_type!r}")

    proj = text_tower.text_projection
    if proj is None:
        raise _refuse("a text tower without text_projection")
    if isinstance(proj, nn.Linear):
        put_linear(out, "text_projection", src.take(f"{p}text_projection.weight"),
                   src.take(f"{p}text_projection.bias") if proj.bias is not None else None)
        text_bias = proj.bias is not None
    else:
        out["text_projection.weight"] = src.take(f"{p}text_projection").T
        text_bias = False
    embed_dim = out["text_projection.weight"].shape[0]
    image_projection = model.visual.proj is not None
    if image_projection:
        out["visual_projection.weight"] = src.take("visual.proj").T

    scale = src.take("logit_scale").reshape(())
    out["logit_scale"] = scale
    sigmoid = getattr(model, "logit_bias", None) is not None
    if sigmoid:
        out["logit_bias"] = src.take("logit_bias").reshape(())
    src.finish()
    log_scale = float(scale)
    config = CLIPConfig(
        vision=vision, text=text, embed_dim=embed_dim, text_pool=text_pool, eot_token_id=eot,
        loss="sigmoid" if sigmoid else "softmax", image_projection=image_projection,
        text_projection_bias=text_bias, logit_scale_init=log_scale,
        logit_scale_max=max(math.log(100.0), log_scale),
        **({"logit_bias_init": float(out["logit_bias"])} if sigmoid else {}))
    return load_converted(CLIP(config), out)
