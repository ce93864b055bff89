"""timm ``VisionTransformer`` (ViT, distilled DeiT, DINOv2 with registers) ->
:class:`~multimodal.ViT`."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from multimodal.convert.common import (
    SUPPORTED,
    StateReader,
    activation_of,
    load_converted,
    put_linear,
    put_norm,
)
from multimodal.models.vit import ViT, ViTConfig
from multimodal.nn.embed import as_pair
from multimodal.nn.position import resample_grid


def from_timm(model: nn.Module, img_size: int | tuple[int, int] | None = None) -> ViT:
    """timm ``VisionTransformer`` -> :class:`~multimodal.ViT`.

    ``img_size`` builds the ViT for another image size than the source's: the learned
    position grid is resampled (bicubic, the same interpolation as timm's
    ``resample_abs_pos_embed``, see :func:`multimodal.nn.position.resample_grid`);
    class-token positions are kept as they are.
    """
    try:
        from timm.models.vision_transformer import VisionTransformer
    except ImportError as err:
        raise ImportError("from_timm needs timm (pip install timm)") from err
    if not isinstance(model, VisionTransformer):
        raise ValueError(f"from_timm expects a {SUPPORTED['timm']}, got {type(model).__name__}")
    _check_timm_features(model)
    block0 = model.blocks[0]
    src_size = as_pair(model.patch_embed.img_size)
    patch = as_pair(model.patch_embed.patch_size)
    new_size = as_pair(img_size) if img_size is not None else src_size
    pool = "cls" if model.global_pool == "token" else "mean"
    config = ViTConfig(
        image_size=new_size, patch_size=patch, in_channels=model.patch_embed.proj.in_channels,
        num_classes=model.num_classes, dim=model.embed_dim, depth=len(model.blocks),
        heads=block0.attn.num_heads, mlp_dim=block0.mlp.fc1.out_features, pool=pool,
        class_token=model.cls_token is not None, norm_eps=block0.norm1.eps,
        activation=activation_of(block0.mlp.act), qkv_bias=block0.attn.qkv.bias is not None,
        registers=getattr(model, "num_reg_tokens", 0),
        distill_token=getattr(model, "dist_token", None) is not None,
        pre_norm=not isinstance(model.norm_pre, nn.Identity),
        patch_bias=model.patch_embed.proj.bias is not None,
        layer_scale=None if isinstance(block0.ls1, nn.Identity) else 1.0,
        qk_norm=isinstance(getattr(block0.attn, "q_norm", None), nn.LayerNorm),
    )
    src = StateReader(model.state_dict(), "timm VisionTransformer")
    pos = src.take("pos_embed")
    prefix = (1 if config.class_token else 0) + int(config.distill_token)
    # no_embed_class (DINOv2 with registers, DeiT-3): the class token has no position row
    pos_prefix = 0 if getattr(model, "no_embed_class", False) else prefix
    src_grid = (src_size[0] // patch[0], src_size[1] // patch[1])
    if pos.numel():
        cls_rows = pos[0, :pos_prefix] if pos_prefix else pos.new_zeros(prefix, pos.shape[-1])
        pos = torch.cat([cls_rows, resample_grid(pos[0, pos_prefix:], src_grid,
                                                 config.grid_size)])[None]
    out: dict[str, Tensor] = {
        "pos_embed": pos,
        "patch_embed.proj.weight": src.take("patch_embed.proj.weight"),
    }
    if model.patch_embed.proj.bias is not None:
        out["patch_embed.proj.bias"] = src.take("patch_embed.proj.bias")
    if config.class_token:
        out["cls_token"] = src.take("cls_token")
    if config.registers:
        out["reg_token"] = src.take("reg_token")
    if config.distill_token:
        out["dist_token"] = src.take("dist_token")
        if config.num_classes > 0:
            put_linear(out, "head_dist", src.take("head_dist.weight"), src.take("head_dist.bias"))
    if config.pre_norm:
        put_norm(out, "norm_pre", src, "norm_pre")
    for i in range(config.depth):
        t, o = f"blocks.{i}", f"transformer.blocks.{i}"
        if config.layer_scale is not None:
            out[f"{o}.ls1.gamma"] = src.take(f"{t}.ls1.gamma")
            out[f"{o}.ls2.gamma"] = src.take(f"{t}.ls2.gamma")
        if config.qk_norm:
            put_norm(out, f"{o}.attn.q_norm", src, f"{t}.attn.q_norm")
            put_norm(out, f"{o}.attn.k_norm", src, f"{t}.attn.k_norm")
        put_norm(out, f"{o}.norm1", src, f"{t}.norm1")
        put_linear(out, f"{o}.attn.qkv", src.take(f"{t}.attn.qkv.weight"),
                   src.take(f"{t}.attn.qkv.bias") if config.qkv_bias else None)
        put_linear(out, f"{o}.attn.proj", src.take(f"{t}.attn.proj.weight"),
                   src.take(f"{t}.attn.proj.bias"))
        put_norm(out, f"{o}.norm2", src, f"{t}.norm2")
        for fc in ("fc1", "fc2"):
            put_linear(out, f"{o}.mlp.{fc}", src.take(f"{t}.mlp.{fc}.weight"),
                       src.take(f"{t}.mlp.{fc}.bias"))
    put_norm(out, "transformer.norm", src, "norm")
    if config.num_classes > 0:
        put_linear(out, "head", src.take("head.weight"), src.take("head.bias"))
    src.finish()
    return load_converted(ViT(config), out)


def _check_timm_features(model: nn.Module) -> None:
    """Refuse, by name, the timm options our ViT does not implement."""
    block0 = model.blocks[0]
    unsupported = {
        "no_embed_class=True without a class token": getattr(model, "no_embed_class", False)
            and model.cls_token is None,
        "fc_norm (a norm after pooling; global_pool='avg' defaults to it)":
            not isinstance(model.fc_norm, nn.Identity),
        "attention pooling (global_pool='map')": getattr(model, "attn_pool", None) is not None,
        f"global_pool={model.global_pool!r}": model.global_pool not in ("token", "avg"),
        f"qk_norm by {type(getattr(block0.attn, 'q_norm', None)).__name__}":
            not isinstance(getattr(block0.attn, "q_norm", nn.Identity()),
                           (nn.Identity, nn.LayerNorm)),
        "a norm in the patch embedding": not isinstance(model.patch_embed.norm, nn.Identity),
        "no position embedding": model.pos_embed is None,
        f"block type {type(block0).__name__}": type(block0).__name__ != "Block",
        f"MLP type {type(block0.mlp).__name__}": type(block0.mlp).__name__ != "Mlp",
        "a norm inside the MLP": not isinstance(getattr(block0.mlp, "norm", nn.Identity()),
                                               nn.Identity),
    }
    found = [name for name, present in unsupported.items() if present]
    if found:
        raise ValueError(f"this timm ViT uses features the converter does not support: "
                         f"{', '.join(found)}. Supported: {SUPPORTED['timm']}")
