"""torchvision ``VisionTransformer`` -> :class:`~multimodal.ViT`."""

from __future__ import annotations

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


def from_torchvision(model: nn.Module) -> ViT:
    """torchvision ``VisionTransformer`` (any size) -> :class:`~multimodal.ViT`."""
    try:
        from torchvision.models.vision_transformer import VisionTransformer
    except ImportError as err:  # pragma: no cover - torchvision is a dependency
        raise ImportError("from_torchvision needs torchvision") from err
    if not isinstance(model, VisionTransformer):
        raise ValueError(f"from_torchvision expects a {SUPPORTED['torchvision']}, "
                         f"got {type(model).__name__}")
    if not isinstance(model.conv_proj, nn.Conv2d):
        raise ValueError("torchvision ViTs with a convolutional stem (conv_stem_configs) are "
                         "not supported; only the patch-embedding Conv2d stem is")
    if model.representation_size is not None:
        raise ValueError("torchvision ViTs with representation_size (a pre-logits layer) "
                         "are not supported")
    layer0 = model.encoder.layers[0]
    config = ViTConfig(
        image_size=model.image_size, patch_size=model.patch_size,
        in_channels=model.conv_proj.in_channels, num_classes=model.num_classes,
        dim=model.hidden_dim, depth=len(model.encoder.layers),
        heads=layer0.self_attention.num_heads, mlp_dim=model.mlp_dim, pool="cls",
        norm_eps=layer0.ln_1.eps, activation=activation_of(layer0.mlp[1]),
        qkv_bias=layer0.self_attention.in_proj_bias is not None,
    )
    src = StateReader(model.state_dict(), "torchvision VisionTransformer")
    out: dict[str, Tensor] = {
        "cls_token": src.take("class_token"),
        "pos_embed": src.take("encoder.pos_embedding"),
        "patch_embed.proj.weight": src.take("conv_proj.weight"),
        "patch_embed.proj.bias": src.take("conv_proj.bias"),
    }
    for i in range(config.depth):
        t, o = f"encoder.layers.encoder_layer_{i}", f"transformer.blocks.{i}"
        put_norm(out, f"{o}.norm1", src, f"{t}.ln_1")
        put_linear(out, f"{o}.attn.qkv", src.take(f"{t}.self_attention.in_proj_weight"),
                   src.take(f"{t}.self_attention.in_proj_bias") if config.qkv_bias else None)
        put_linear(out, f"{o}.attn.proj", src.take(f"{t}.self_attention.out_proj.weight"),
                   src.take(f"{t}.self_attention.out_proj.bias"))
        put_norm(out, f"{o}.norm2", src, f"{t}.ln_2")
        put_linear(out, f"{o}.mlp.fc1", src.take(f"{t}.mlp.0.weight"), src.take(f"{t}.mlp.0.bias"))
        put_linear(out, f"{o}.mlp.fc2", src.take(f"{t}.mlp.3.weight"), src.take(f"{t}.mlp.3.bias"))
    put_norm(out, "transformer.norm", src, "encoder.ln")
    put_linear(out, "head", src.take("heads.head.weight"), src.take("heads.head.bias"))
    src.finish()
    return load_converted(ViT(config), out)
