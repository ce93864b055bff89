"""Vision Transformer (Dosovitskiy et al., 2021): 16x16 patches -> shared encoder -> head."""

from __future__ import annotations

from functools import partial
from typing import Literal

import torch
from torch import Tensor, nn

from multimodal.models.api import AttentionMaps, ClassifierHeadMixin
from multimodal.models.backbone import model_config
from multimodal.nn.block import NORM_LAYERS, Transformer
from multimodal.nn.embed import ConvPatchEmbed, PatchEmbed, as_pair, check_images
from multimodal.nn.init import init_weights
from multimodal.nn.layers import ACTIVATIONS
from multimodal.nn.pool import AttentionPool, mean_pool
from multimodal.nn.position import grid_positions, resample_grid, sincos_2d_positions
from multimodal.registry import register_config_preset, register_model
from multimodal.weights import PretrainedMixin


@model_config(dim=192, depth=12, heads=3, norm_eps=1e-6, activation="gelu")
class ViTConfig:
    """A ViT: patches of ``image_size`` images, a ``backbone`` (``dim``, ``depth``, ``heads``,
    ``mlp_dim``, ... are its fields, also accepted and readable here), a pooled head."""

    image_size: int | tuple[int, int] = 224
    patch_size: int | tuple[int, int] = 16
    in_channels: int = 3
    num_classes: int = 1000  # 0: no head, forward returns pooled features
    pool: Literal["cls", "mean", "map"] = "cls"  # map: attention pooling (nn.pool)
    class_token: bool = True
    registers: int = 0  # register tokens (Darcet et al., 2024) after the class token
    # DeiT: a distillation token after the class token, with its own position row and,
    # with a head, its own classifier; logits = (head(cls) + head_dist(dist)) / 2
    distill_token: bool = False
    pre_norm: bool = False  # a LayerNorm on the embedded tokens before the blocks (CLIP)
    patch_bias: bool = True  # bias of the patch projection (CLIP has none)
    # "none": no added positions (a backbone with rope="2d" rotates by (row, column))
    pos_embed: Literal["learned", "sincos", "none"] = "learned"
    stem: Literal["patch", "conv"] = "patch"  # linear patches, or ConvPatchEmbed (3x3 convs)
    dynamic_size: bool = True  # other image sizes: resample positions, else error

    def __post_init__(self) -> None:
        if self.pool == "cls" and not self.class_token:
            raise ValueError("pool='cls' needs class_token=True")
        if self.stem not in ("patch", "conv"):
            raise ValueError(f"stem must be 'patch' or 'conv', got {self.stem!r}")
        if self.pool not in ("cls", "mean", "map"):
            raise ValueError(f"pool must be 'cls', 'mean' or 'map', got {self.pool!r}")
        if self.pos_embed not in ("learned", "sincos", "none"):
            raise ValueError(f"pos_embed must be 'learned', 'sincos' or 'none', "
                             f"got {self.pos_embed!r}")
        if self.distill_token and not self.class_token:
            raise ValueError("distill_token=True needs class_token=True")
        if self.registers < 0:
            raise ValueError(f"registers must be >= 0, got {self.registers}")
        h, w = as_pair(self.image_size)
        ph, pw = as_pair(self.patch_size)
        if h % ph or w % pw:
            raise ValueError(f"image_size {h}x{w} is not a multiple of patch_size {ph}x{pw}")

    @property
    def grid_size(self) -> tuple[int, int]:
        h, w = as_pair(self.image_size)
        ph, pw = as_pair(self.patch_size)
        return h // ph, w // pw


@register_model
class ViT(ClassifierHeadMixin, PretrainedMixin, nn.Module):
    """Images (B, C, H, W) -> logits (B, num_classes).

    ``forward_features`` gives all tokens after the final norm (B, [1 +] [R +] N, dim):
    class token, ``registers`` register tokens, patches. Positions (learned or sin-cos)
    are added to the class token and the patches, never to registers; with a 2-D rotary
    backbone the patches' (row, column) go to attention instead.
    ``forward_head`` pools them (class token, mean of patch tokens, or attention pooling
    over all tokens) and classifies;
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
            self.patch_embed = PatchEmbed(config.patch_size, config.in_channels, config.dim,
                                          bias=config.patch_bias)
        else:
            self.patch_embed = ConvPatchEmbed(config.patch_size, config.in_channels, config.dim)
        self.num_class_tokens = (1 if config.class_token else 0) + int(config.distill_token)
        self.num_prefix_tokens = self.num_class_tokens + config.registers
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.dim)) if config.class_token \
            else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, config.dim)) \
            if config.distill_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, config.registers, config.dim)) \
            if config.registers else None
        num_patches = config.grid_size[0] * config.grid_size[1]
        if config.pos_embed == "learned":
            self.pos_embed = nn.Parameter(
                torch.randn(1, self.num_class_tokens + num_patches, config.dim) * 0.02
            )
        else:
            self.register_parameter("pos_embed", None)
        self.pos_drop = nn.Dropout(config.dropout)
        self.norm_pre = NORM_LAYERS[config.backbone.norm_type](
            config.dim, eps=config.backbone.norm_eps) if config.pre_norm else nn.Identity()
        self.transformer = Transformer(config.backbone)
        bb = config.backbone
        self.attn_pool = AttentionPool(
            config.dim, config.heads, config.mlp_dim, act_layer=ACTIVATIONS[bb.activation],
            norm_layer=partial(NORM_LAYERS[bb.norm_type], eps=bb.norm_eps),
            qkv_bias=bb.qkv_bias,
        ) if config.pool == "map" else None
        self.head_dist = nn.Linear(config.dim, config.num_classes) \
            if config.num_classes > 0 and config.distill_token else None
        self.head = nn.Linear(config.dim, config.num_classes) if config.num_classes > 0 \
            else nn.Identity()
        self.apply(init_weights)

    @property
    def num_features(self) -> int:
        return self.config.dim

    def example_inputs(self, batch_size: int = 2) -> tuple[Tensor, ...]:
        """Random images at the config's size: ``(B, in_channels, H, W)``."""
        return (torch.randn(batch_size, self.config.in_channels, *as_pair(self.config.image_size)),)

    # -- positions ---------------------------------------------------------------------
    def _positions(self, grid: tuple[int, int], x: Tensor) -> Tensor:
        """(1, cls + N, dim) position rows for a patch grid (class token row first)."""
        cfg = self.config
        if grid != cfg.grid_size and not cfg.dynamic_size:
            raise ValueError(
                f"image gives a {grid[0]}x{grid[1]} patch grid but the model was built for "
                f"{cfg.grid_size[0]}x{cfg.grid_size[1]} (image_size={cfg.image_size}); "
                "resize the images or set dynamic_size=True"
            )
        if self.pos_embed is None:
            patches = sincos_2d_positions(*grid, cfg.dim).to(x)
            prefix = patches.new_zeros(self.num_class_tokens, cfg.dim)
            return torch.cat([prefix, patches])[None]
        prefix, patches = self.pos_embed[0, : self.num_class_tokens], \
            self.pos_embed[0, self.num_class_tokens :]
        patches = resample_grid(patches, cfg.grid_size, grid)
        return torch.cat([prefix, patches])[None]

    # -- forward ------------------------------------------------------------------------
    def embed(self, images: Tensor) -> Tensor:
        """Patch tokens with class token, registers and positions: (B, prefix + N, dim)."""
        check_images(images, self.config.in_channels, self.config.patch_size)
        x = self.patch_embed(images)
        grid = self.patch_embed.grid_size(*images.shape[-2:])
        if self.dist_token is not None:
            x = torch.cat([self.dist_token.expand(x.shape[0], -1, -1), x], dim=1)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        if self.config.pos_embed != "none":
            x = x + self._positions(grid, x)
        if self.reg_token is not None:
            c = self.num_class_tokens
            x = torch.cat([x[:, :c], self.reg_token.expand(x.shape[0], -1, -1), x[:, c:]], 1)
        return self.norm_pre(self.pos_drop(x))

    def forward_features(
        self, images: Tensor, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, AttentionMaps]:
        positions = None
        if self.config.backbone.rope == "2d":
            grid = self.patch_embed.grid_size(*images.shape[-2:])
            positions = grid_positions(*grid, self.num_prefix_tokens, images.device)
        out = self.transformer(self.embed(images), return_attention=return_attention,
                               positions=positions)
        if return_attention:
            x, maps = out
            return x, AttentionMaps.from_layers(maps)
        return out

    def pool(self, features: Tensor, *, attention_mask: Tensor | None = None) -> Tensor:
        """The class token, the mean of the patch tokens, or attention pooling: ``(B, dim)``.
        Images do not pad; an ``attention_mask`` ``(B, prefix + N)`` (1 = real token) is
        honoured by the mean (over real patch tokens) and attention pooling (padded keys
        weigh 0); the class token is always real."""
        if self.config.pool == "cls":
            return features[:, 0]
        if attention_mask is not None and bool(attention_mask.all()):
            attention_mask = None  # every token real: the unmasked path, bit for bit
        if self.attn_pool is not None:
            padding = None if attention_mask is None else ~attention_mask.bool()
            return self.attn_pool(features, key_padding_mask=padding)
        patches = features[:, self.num_prefix_tokens :]
        if attention_mask is None:
            return patches.mean(dim=1)
        return mean_pool(patches, attention_mask[:, self.num_prefix_tokens :])

    def forward_head(self, features: Tensor, pre_logits: bool = False, *,
                     attention_mask: Tensor | None = None) -> Tensor:
        """Class logits ``(B, num_classes)`` of the pooled features (``pre_logits``: the pooled
        features; ``num_classes=0``: likewise)."""
        pooled = self.pool(features, attention_mask=attention_mask)
        if pre_logits:
            return pooled
        if self.head_dist is not None:  # DeiT at inference: mean of the two classifiers
            return (self.head(pooled) + self.head_dist(features[:, 1])) / 2
        return self.head(pooled)

    def forward(
        self, images: Tensor, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, AttentionMaps]:
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
# The main job's ViT (configs/vit_fashion_mnist.yaml): 28x28 grayscale resized to 32x32, a conv
# stem (three 3x3 stride-2 convs 1 -> 16 -> 32 -> 64, then 1x1 to dim) making a 4x4 grid
# of 16 tokens, mean pooling.
_vit_preset("vit_fashion_mnist", image_size=32, patch_size=8, in_channels=1, num_classes=10,
            stem="conv", dim=128, depth=4, heads=4, mlp_dim=256, pool="mean")
# configs/vit_fashion_mnist_long.yaml: a 7x7 grid of 4x4 patches of 28x28 grayscale images
# (49 tokens), ViT-Tiny width, 9 blocks, stochastic depth, mean pooling.
_vit_preset("vit_fashion_mnist_long", image_size=28, patch_size=4, in_channels=1, num_classes=10,
            dim=192, depth=9, heads=6, mlp_dim=384, drop_path=0.1, pool="mean")
# configs/vit_imagefolder.yaml: 64x64 RGB images through a conv stem (four 3x3 stride-2
# convs, then 1x1 to dim) into a 4x4 grid of 16 tokens, width 128, 4 blocks, mean pooling;
# the image size, channels and classes come from the data. Small and local for a few dozen
# to a few thousand images on a CPU (BENCHMARKS.md "Image folders"): the former 64 tokens
# of linear 8x8 patches, width 192, 6 blocks, stayed at chance on 60 images, ~6x slower.
_vit_preset("vit_imagefolder", image_size=64, patch_size=16, in_channels=3, stem="conv",
            dim=128, depth=4, heads=4, mlp_dim=256, pool="mean")
