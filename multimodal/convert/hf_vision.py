"""transformers image encoders -> :class:`~multimodal.ViT`: ViT, DINOv2 (with registers), DeiT."""

from __future__ import annotations

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
    qkv_from_separate,
    register_hf,
    register_hf_model_type,
)
from multimodal.models.vit import ViT, ViTConfig


def _embeddings(src: StateReader, **extra: str) -> dict[str, Tensor]:
    """The class token, positions and patch projection every transformers ViT family
    stores under ``embeddings.``; ``extra`` maps more of our keys to theirs (a
    distillation token, registers). The mask token (masked-image pre-training) is dropped."""
    e = "embeddings"
    out = {"cls_token": src.take(f"{e}.cls_token"),
           "pos_embed": src.take(f"{e}.position_embeddings"),
           "patch_embed.proj.weight": src.take(f"{e}.patch_embeddings.projection.weight"),
           "patch_embed.proj.bias": src.take(f"{e}.patch_embeddings.projection.bias")}
    out.update({ours: src.take(f"{e}.{theirs}") for ours, theirs in extra.items()})
    src.skip(f"{e}.mask_token")
    return out


def vit_encoder_layers(out: dict[str, Tensor], src: StateReader, config: Any) -> None:
    """The transformers ViT / DeiT / AST encoder layers (``config``: our config, its depth
    and qkv_bias): separate q/k/v, ``layernorm_before`` / ``layernorm_after``,
    ``intermediate`` / ``output`` MLP (transformers >= 5 names first, then the older
    ``encoder.layer.{i}`` ones), then the final ``layernorm``."""
    for i in range(config.depth):
        new, old, o = f"layers.{i}", f"encoder.layer.{i}", f"transformer.blocks.{i}"
        t = new if f"{src.prefix}{new}.layernorm_before.weight" in src.state else old
        qkv_from_separate(out, f"{o}.attn", src, t, config.qkv_bias)
        put_norm(out, f"{o}.norm1", src, f"{t}.layernorm_before")
        put_norm(out, f"{o}.norm2", src, f"{t}.layernorm_after")
        for ours, theirs in (("fc1", "intermediate.dense"), ("fc2", "output.dense")):
            put_linear(out, f"{o}.mlp.{ours}",
                       src.take(f"{t}.mlp.{ours}.weight", f"{t}.{theirs}.weight"),
                       src.take(f"{t}.mlp.{ours}.bias", f"{t}.{theirs}.bias"))
    put_norm(out, "transformer.norm", src, "layernorm")
    src.skip("pooler.dense.weight", "pooler.dense.bias")  # no pooler in our ViT (see top)


def _hf_vit(model: nn.Module) -> ViT:
    cfg = model.config
    classifier = type(model).__name__ == "ViTForImageClassification"
    config = ViTConfig(
        image_size=cfg.image_size, patch_size=cfg.patch_size, in_channels=cfg.num_channels,
        num_classes=cfg.num_labels if classifier else 0, dim=cfg.hidden_size,
        depth=cfg.num_hidden_layers, heads=cfg.num_attention_heads, mlp_dim=cfg.intermediate_size,
        pool="cls", norm_eps=cfg.layer_norm_eps, activation=hf_activation(cfg, "hidden_act"),
        qkv_bias=cfg.qkv_bias,
    )
    src = StateReader(model.state_dict(), type(model).__name__,
                      prefix="vit." if classifier else "")
    out = _embeddings(src)
    vit_encoder_layers(out, src, config)
    if classifier:
        src.prefix = ""
        put_linear(out, "head", src.take("classifier.weight"), src.take("classifier.bias"))
    src.finish()
    return load_converted(build(ViT, config), out)


def _hf_dinov2(model: nn.Module) -> ViT:
    """``Dinov2Model`` / ``Dinov2WithRegistersModel`` -> :class:`~multimodal.ViT`
    (``num_classes=0``: ``forward_features`` equals ``last_hidden_state``, ``forward``
    its class token, ``pooler_output``).

    LayerScale (``layer_scale{1,2}.lambda1``), register tokens after the class token, and
    the SwiGLU MLP when ``use_swiglu_ffn`` (``gate_proj``/``up_proj``/``down_proj``, or
    before transformers 5 ``weights_in`` = [gate; up] and ``weights_out``). Position rows
    are used as stored: give images of the config's ``image_size`` (DINOv2 resamples its
    positions with its own interpolation for other sizes).
    """
    cfg, state, kind = model.config, model.state_dict(), type(model).__name__
    swiglu = bool(getattr(cfg, "use_swiglu_ffn", False))
    src = StateReader(state, kind)
    mlp0 = "encoder.layer.0.mlp."
    hidden = int(cfg_get(cfg, "hidden_size") * cfg_get(cfg, "mlp_ratio", 4))
    if swiglu:  # two thirds of the MLP width, rounded up to a multiple of 8
        hidden = (int(hidden * 2 / 3) + 7) // 8 * 8
    for key, rows in (("fc1.weight", 1), ("gate_proj.weight", 1), ("weights_in.weight", 2)):
        if mlp0 + key in state:  # the stored width wins
            hidden = state[mlp0 + key].shape[0] // rows
    config = ViTConfig(
        image_size=cfg_get(cfg, "image_size"), patch_size=cfg_get(cfg, "patch_size"),
        in_channels=cfg_get(cfg, "num_channels", 3), num_classes=0, pool="cls",
        registers=int(getattr(cfg, "num_register_tokens", 0) or 0),
        dim=cfg_get(cfg, "hidden_size"), depth=cfg_get(cfg, "num_hidden_layers"),
        heads=cfg_get(cfg, "num_attention_heads"), mlp_dim=hidden,
        norm_eps=cfg_get(cfg, "layer_norm_eps", 1e-6),
        activation="silu" if swiglu else hf_activation(cfg, "hidden_act"),
        mlp_type="glu" if swiglu else "mlp", qkv_bias=bool(getattr(cfg, "qkv_bias", True)),
        layer_scale=float(cfg_get(cfg, "layerscale_value", 1.0)),
    )
    out = _embeddings(src, **({"reg_token": "register_tokens"} if config.registers else {}))
    for i in range(config.depth):
        t, o = f"encoder.layer.{i}", f"transformer.blocks.{i}"
        qkv_from_separate(out, f"{o}.attn", src, t, config.qkv_bias)
        put_norm(out, f"{o}.norm1", src, f"{t}.norm1")
        put_norm(out, f"{o}.norm2", src, f"{t}.norm2")
        out[f"{o}.ls1.gamma"] = src.take(f"{t}.layer_scale1.lambda1")
        out[f"{o}.ls2.gamma"] = src.take(f"{t}.layer_scale2.lambda1")
        if swiglu and f"{t}.mlp.gate_proj.weight" in state:  # transformers >= 5
            for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("fc2", "down_proj")):
                put_linear(out, f"{o}.mlp.{ours}", src.take(f"{t}.mlp.{theirs}.weight"),
                           src.take(f"{t}.mlp.{theirs}.bias"))
        elif swiglu:  # before: one fused Linear, rows [gate; up]
            w_in = src.take(f"{t}.mlp.weights_in.weight")
            b_in = src.take(f"{t}.mlp.weights_in.bias")
            put_linear(out, f"{o}.mlp.gate", w_in[:hidden], b_in[:hidden])
            put_linear(out, f"{o}.mlp.up", w_in[hidden:], b_in[hidden:])
            put_linear(out, f"{o}.mlp.fc2", src.take(f"{t}.mlp.weights_out.weight"),
                       src.take(f"{t}.mlp.weights_out.bias"))
        else:
            for fc in ("fc1", "fc2"):
                put_linear(out, f"{o}.mlp.{fc}", src.take(f"{t}.mlp.{fc}.weight"),
                           src.take(f"{t}.mlp.{fc}.bias"))
    put_norm(out, "transformer.norm", src, "layernorm")
    src.finish()
    return load_converted(build(ViT, config), out)


def _hf_deit(model: nn.Module) -> ViT:
    """``DeiTModel`` -> :class:`~multimodal.ViT` with a distillation token (no head:
    ``forward_features`` equals ``last_hidden_state``; the pooler is dropped as for
    ``ViTModel``); ``DeiTForImageClassificationWithTeacher`` -> the same with both
    classifiers, ``forward`` equal to its ``logits`` (their mean)."""
    cfg, state, kind = model.config, model.state_dict(), type(model).__name__
    classifier = kind == "DeiTForImageClassificationWithTeacher"
    config = ViTConfig(
        image_size=cfg_get(cfg, "image_size"), patch_size=cfg_get(cfg, "patch_size"),
        in_channels=cfg_get(cfg, "num_channels", 3), distill_token=True, pool="cls",
        num_classes=cfg_get(cfg, "num_labels") if classifier else 0,
        dim=cfg_get(cfg, "hidden_size"), depth=cfg_get(cfg, "num_hidden_layers"),
        heads=cfg_get(cfg, "num_attention_heads"), mlp_dim=cfg_get(cfg, "intermediate_size"),
        norm_eps=cfg_get(cfg, "layer_norm_eps", 1e-12), activation=hf_activation(cfg, "hidden_act"),
        qkv_bias=bool(getattr(cfg, "qkv_bias", True)),
    )
    src = StateReader(state, kind, prefix="deit." if classifier else "")
    out = _embeddings(src, dist_token="distillation_token")
    vit_encoder_layers(out, src, config)
    if classifier:
        src.prefix = ""
        put_linear(out, "head", src.take("cls_classifier.weight"), src.take("cls_classifier.bias"))
        put_linear(out, "head_dist", src.take("distillation_classifier.weight"),
                   src.take("distillation_classifier.bias"))
    src.finish()
    return load_converted(build(ViT, config), out)


register_hf(_hf_vit, "ViTModel", "ViTForImageClassification")
register_hf(_hf_dinov2, "Dinov2Model", "Dinov2WithRegistersModel")
register_hf(_hf_deit, "DeiTModel", "DeiTForImageClassificationWithTeacher")
register_hf_model_type("vit", "ViTModel", "vit.", hidden_act="gelu", layer_norm_eps=1e-12,
                       num_channels=3, qkv_bias=True, num_labels=2)
register_hf_model_type("dinov2", "Dinov2Model", "dinov2.", hidden_act="gelu",
                       layer_norm_eps=1e-6, num_channels=3, qkv_bias=True, mlp_ratio=4,
                       layerscale_value=1.0, use_swiglu_ffn=False)
register_hf_model_type("dinov2_with_registers", "Dinov2WithRegistersModel",
                       "dinov2_with_registers.", hidden_act="gelu", layer_norm_eps=1e-6,
                       num_channels=3, qkv_bias=True, mlp_ratio=4, layerscale_value=1.0,
                       use_swiglu_ffn=False, num_register_tokens=4)
register_hf_model_type("deit", "DeiTModel", "deit.", hidden_act="gelu", layer_norm_eps=1e-12,
                       num_channels=3, qkv_bias=True, num_labels=2)
