"""The shared backbone: attention, blocks, positions, KV cache, LoRA."""

from multimodal.nn.attention import Attention, scaled_dot_product_attention, simple_self_attention
from multimodal.nn.block import Block, Transformer, TransformerConfig
from multimodal.nn.cache import KVCache, LayerCache
from multimodal.nn.layers import MLP
from multimodal.nn.position import (
    LearnedPositions,
    SinusoidalPositions,
    resample_grid,
    sincos_2d_positions,
    sinusoidal_positions,
)

__all__ = [
    "MLP", "Attention", "Block", "KVCache", "LayerCache", "LearnedPositions",
    "SinusoidalPositions", "Transformer", "TransformerConfig", "resample_grid",
    "scaled_dot_product_attention", "simple_self_attention", "sincos_2d_positions",
    "sinusoidal_positions",
]
