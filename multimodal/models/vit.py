"""Vision Transformer (Dosovitskiy et al., 2021): 16x16 patches -> shared encoder -> head."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from multimodal.models.backbone import model_config
from multimodal.nn.block import Transformer
from multimodal.nn.init import init_weights
from multimodal.nn.position import resample_grid, sincos_2d_positions
from multimodal.registry import register_config_preset, register_model
from multimodal.tokenizers.image import ConvStem, PatchEmbed, _pair, check_images
from multimodal.weights import PretrainedMixin


@model_config(dim=192, depth=12, heads=3, norm_eps=1e-6, activation="gelu")
class ViTConfig:
    """A ViT: patches of ``image_size`` images, a ``backbone`` (``dim``, ``depth``, ``heads``,
    ``mlp_dim``, ... are its fields, also accepted and readable here), a pooled head."""

    image_size: int | tuple[int, int] = 224
    patch_size: int | tuple[int, int] = 16
    in_channels: int = 3
    num_classes: int = 1000  # 0: no head, forward returns pooled features
    pool: Literal["cls", "mean"] = "cls"
    class_token: bool = True
    pos_embed: Literal["learned", "sincos"] = "learned"
    stem: Literal["patch", "conv"] = "patch"  # linear patches, or ConvStem (3x3 convs)
    dynamic_size: bool = True  # other image sizes: resample positions, else error

    def __post_init__(self) -> None:
        if self.pool == "cls" and not self.class_token:
            raise ValueError("pool='cls' needs class_token=True")
        if self.stem not in ("patch", "conv"):
            raise ValueError(f"stem must be 'patch' or 'conv', got {self.stem!r}")
        if self.pool not in ("cls", "mean"):
            raise ValueError(f"pool must be 'cls' or 'mean', got {self.pool!r}")
        h, w = _pair(self.image_size)
        ph, pw = _pair(self.patch_size)
        if h % ph or w % pw:
            raise ValueError(f"image_size {h}x{w} is not a multiple of patch_size {ph}x{pw}")

    @property
    def grid_size(self) -> tuple[int, int]:
        h, w = _pair(self.image_size)
        ph, pw = _pair(self.patch_size)
        return h // ph, w // pw


@register_model
class ViT(PretrainedMixin, nn.Module):
    """Images (B, C, H, W) -> logits (B, num_classes).

    ``forward_features`` gives all tokens after the final norm (B, [1 +] N, dim);
    ``forward_head`` pools them (class token or mean of patch tokens) and classifies;
    ``forward(images, return_attention=True)`` also returns every layer's attention maps
    (B, heads, tokens, tokens). Images of another size than the config's get resampled
    positions when ``dynamic_size`` (else a ValueError).
    """

    config_class = ViTConfig
    modality = "image"

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = config
        if config.stem == "patch":
            self.patch_embed = PatchEmbed(config.patch_size, config.in_channels, config.dim)
        else:
            self.patch_embed = ConvStem(config.patch_size, config.in_channels, config.dim)
        self.num_prefix_tokens = 1 if config.class_token else 0
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.dim)) if config.class_token \
            else None
        num_patches = config.grid_size[0] * config.grid_size[1]
        if config.pos_embed == "learned":
            self.pos_embed = nn.Parameter(
                torch.randn(1, self.num_prefix_tokens + num_patches, config.dim) * 0.02
            )
        else:
            self.register_parameter("pos_embed", None)
        self.pos_drop = nn.Dropout(config.dropout)
        self.transformer = Transformer(config.backbone)
        self.head = nn.Linear(config.dim, config.num_classes) if config.num_classes > 0 \
            else nn.Identity()
        self.apply(init_weights)

    @property
    def num_features(self) -> int:
        return self.config.dim

    def example_inputs(self, batch_size: int = 2) -> tuple[Tensor, ...]:
        """Random images at the config's size: ``(B, in_channels, H, W)``."""
        return (torch.randn(batch_size, self.config.in_channels, *_pair(self.config.image_size)),)

    # -- positions ---------------------------------------------------------------------
    def _positions(self, grid: tuple[int, int], x: Tensor) -> Tensor:
        """(1, prefix + N, dim) position rows for a patch grid (prefix rows first)."""
        cfg = self.config
        if grid != cfg.grid_size and not cfg.dynamic_size:
            raise ValueError(
                f"image gives a {grid[0]}x{grid[1]} patch grid but the model was built for "
                f"{cfg.grid_size[0]}x{cfg.grid_size[1]} (image_size={cfg.image_size}); "
                "resize the images or set dynamic_size=True"
            )
        if self.pos_embed is None:
            patches = sincos_2d_positions(*grid, cfg.dim).to(x)
            prefix = patches.new_zeros(self.num_prefix_tokens, cfg.dim)
            return torch.cat([prefix, patches])[None]
        prefix, patches = self.pos_embed[0, : self.num_prefix_tokens], \
            self.pos_embed[0, self.num_prefix_tokens :]
        patches = resample_grid(patches, cfg.grid_size, grid)
        return torch.cat([prefix, patches])[None]

    # -- forward ------------------------------------------------------------------------
    def embed(self, images: Tensor) -> Tensor:
        """Patch tokens with class token and positions: (B, prefix + N, dim)."""
        check_images(images, self.config.in_channels, self.config.patch_size)
        x = self.patch_embed(images)
        grid = self.patch_embed.grid_size(*images.shape[-2:])
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return self.pos_drop(x + self._positions(grid, x))

    def forward_features(
        self, images: Tensor, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        out = self.transformer(self.embed(images), return_attention=return_attention)
        if return_attention:
            x, maps = out
            return x, maps["self"]
        return out

    def pool(self, features: Tensor) -> Tensor:
        """The class token, or the mean of the patch tokens: ``(B, dim)``."""
        if self.config.pool == "cls":
            return features[:, 0]
        return features[:, self.num_prefix_tokens :].mean(dim=1)

    def forward_head(self, features: Tensor, pre_logits: bool = False) -> Tensor:
        """Class logits ``(B, num_classes)`` of the pooled features (``pre_logits``: the pooled
        features; ``num_classes=0``: likewise)."""
        pooled = self.pool(features)
        return pooled if pre_logits else self.head(pooled)

    def forward(
        self, images: Tensor, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        if return_attention:
            features, maps = self.forward_features(images, return_attention=True)
            return self.forward_head(features), maps
        return self.forward_head(self.forward_features(images))


def _vit_preset(name: str, **defaults: object) -> None:
    register_config_preset(name, ViT, ViTConfig, **defaults)


_vit_preset("vit_tiny_patch16_224", dim=192, depth=12, heads=3)
_vit_preset("vit_small_patch16_224", dim=384, depth=12, heads=6)
_vit_preset("vit_base_patch16_224", dim=768, depth=12, heads=12)
_vit_preset("vit_large_patch16_224", dim=1024, depth=24, heads=16)
# A small ViT for 28x28 grayscale (Fashion-MNIST / MNIST): 7x7 = 49 patches of 4x4.
_vit_preset("vit_fashion_mnist", image_size=28, patch_size=4, in_channels=1, num_classes=10,
            dim=128, depth=6, heads=4, mlp_dim=256)
