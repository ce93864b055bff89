"""Import models from torchvision, timm and transformers: the one place that knows
foreign weight layouts.

>>> vit = from_torchvision(torchvision.models.vit_b_16(weights=None))
>>> vit = from_timm(timm.create_model("vit_tiny_patch16_224"), img_size=384)
>>> gpt = from_hf(transformers.GPT2LMHeadModel(config))
>>> llama = from_hf("path/to/hf_folder")   # config.json + safetensors, no transformers

Every converter reads the source's hyper-parameters, builds the matching model of this
package, renames (and where needed fuses or transposes) the weights and loads them with
:func:`multimodal.hub.load_state_dict_checked`. The result gives the source's outputs
(to float rounding). A foreign key that is needed but absent, or present but never used
(a feature we do not implement, e.g. attention pooling), is an error that lists the keys.

Layout notes:

- fused attention: our ``qkv`` Linear maps D -> 3D with rows ``[W_q; W_k; W_v]``, each
  split into heads by contiguous blocks of ``d = D / H`` rows. This is the layout of
  ``nn.MultiheadAttention.in_proj_weight`` (torchvision) and timm's ``qkv``; separate
  ``query/key/value`` Linears (transformers ViT, BERT) are concatenated in that order.
- GPT-2 stores ``Conv1D`` weights as (in, out): they are transposed to ``nn.Linear``'s
  (out, in). ``gelu_new`` is the tanh approximation of GELU.
- transformers ``ViTModel`` ends in a pooler (``tanh(W h_cls + b)``), which our ViT has
  not: the converted ViT has no head (``num_classes=0``); ``forward_features`` equals
  ``last_hidden_state`` and ``forward`` returns the normalised class token
  ``last_hidden_state[:, 0]``. The pooler weights are dropped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from multimodal.models.text import TextDecoder, TextDecoderConfig, TextEncoder, TextEncoderConfig
from multimodal.models.vit import ViT, ViTConfig
from multimodal.nn.position import resample_grid
from multimodal.tokenizers.image import _pair
from multimodal.weights import load_state_dict_checked

SUPPORTED = {
    "torchvision": "torchvision.models.VisionTransformer (vit_b_16, vit_b_32, vit_l_16, "
                   "vit_l_32, vit_h_14 or any custom size)",
    "timm": "timm VisionTransformer (vit_* models with a class token or global average "
            "pooling without fc_norm; layer scale, register tokens, qk_norm, distilled DeiT: "
            "vit_small_patch14_dinov2, vit_small_patch14_reg4_dinov2, deit_*_distilled_*)",
    "transformers": "ViTModel, ViTForImageClassification, GPT2Model, GPT2LMHeadModel, "
                    "BertModel, BertForMaskedLM, BertForSequenceClassification, "
                    "LlamaForCausalLM, LlamaModel, Dinov2Model, Dinov2WithRegistersModel, "
                    "DeiTModel, DeiTForImageClassificationWithTeacher; or a Hugging Face "
                    "layout folder of one of them (from_hf_folder)",
}

# transformers' activation names -> ours
_HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                   "gelu_fast": "gelu_tanh", "relu": "relu", "silu": "silu", "swish": "silu",
                   "quick_gelu": "quick_gelu"}


# ======================================================================================
# reading a foreign state dict
# ======================================================================================


class _StateReader:
    """Hands out the tensors of a foreign state dict by name and remembers which were
    used, so that absent keys and keys nothing reads can be reported together."""

    def __init__(self, state: Mapping[str, Tensor], source: str, prefix: str = "") -> None:
        self.state = dict(state)
        self.source = source
        self.prefix = prefix
        self.used: set[str] = set()
        self.missing: list[str] = []

    def take(self, *names: str) -> Tensor:
        """The first of ``names`` (alternative spellings) present, after the prefix."""
        for name in names:
            key = self.prefix + name
            if key in self.state:
                self.used.add(key)
                return self.state[key]
        self.missing.append(self.prefix + names[0])
        return torch.empty(0)

    def skip(self, *names: str) -> None:
        """Mark keys as deliberately not converted (they need not exist)."""
        self.used.update(self.prefix + n for n in names)

    def finish(self, ignore: Iterable[str] = ()) -> None:
        ignore = tuple(ignore)
        unused = [k for k in self.state if k not in self.used and not any(
            part in k for part in ignore)]
        problems = []
        if self.missing:
            problems.append("missing: " + ", ".join(self.missing))
        if unused:
            problems.append("not converted (a feature this package does not implement?): "
                            + ", ".join(unused))
        if problems:
            raise ValueError(f"cannot convert this {self.source} state dict: "
                             + " | ".join(problems))


def _load(model: nn.Module, state: dict[str, Tensor]) -> nn.Module:
    load_state_dict_checked(model, state)
    return model.eval()


def _linear(out: dict[str, Tensor], ours: str, weight: Tensor, bias: Tensor | None) -> None:
    out[f"{ours}.weight"] = weight
    if bias is not None:
        out[f"{ours}.bias"] = bias


def _norm(out: dict[str, Tensor], ours: str, src: _StateReader, theirs: str) -> None:
    out[f"{ours}.weight"] = src.take(f"{theirs}.weight")
    out[f"{ours}.bias"] = src.take(f"{theirs}.bias")


def _activation_of(module: nn.Module) -> str:
    name = type(module).__name__  # torch's and timm's classes of the same name
    if name == "GELU":
        return "gelu_tanh" if getattr(module, "approximate", "none") == "tanh" else "gelu"
    if name == "GELUTanh":
        return "gelu_tanh"
    if name == "ReLU":
        return "relu"
    if name == "QuickGELU":
        return "quick_gelu"
    if name in ("SiLU", "Swish"):
        return "silu"
    raise ValueError(f"unsupported MLP activation {type(module).__name__}; "
                     "supported: GELU (exact or tanh), ReLU, QuickGELU, SiLU")


# ======================================================================================
# torchvision
# ======================================================================================


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
        norm_eps=layer0.ln_1.eps, activation=_activation_of(layer0.mlp[1]),
        qkv_bias=layer0.self_attention.in_proj_bias is not None,
    )
    src = _StateReader(model.state_dict(), "torchvision VisionTransformer")
    out: dict[str, Tensor] = {
        "cls_token": src.take("class_token"),
        "pos_embed": src.take("encoder.pos_embedding"),
        "patch_embed.proj.weight": src.take("conv_proj.weight"),
        "patch_embed.proj.bias": src.take("conv_proj.bias"),
    }
    for i in range(config.depth):
        t, o = f"encoder.layers.encoder_layer_{i}", f"transformer.blocks.{i}"
        _norm(out, f"{o}.norm1", src, f"{t}.ln_1")
        _linear(out, f"{o}.attn.qkv", src.take(f"{t}.self_attention.in_proj_weight"),
                src.take(f"{t}.self_attention.in_proj_bias") if config.qkv_bias else None)
        _linear(out, f"{o}.attn.proj", src.take(f"{t}.self_attention.out_proj.weight"),
                src.take(f"{t}.self_attention.out_proj.bias"))
        _norm(out, f"{o}.norm2", src, f"{t}.ln_2")
        _linear(out, f"{o}.mlp.fc1", src.take(f"{t}.mlp.0.weight"), src.take(f"{t}.mlp.0.bias"))
        _linear(out, f"{o}.mlp.fc2", src.take(f"{t}.mlp.3.weight"), src.take(f"{t}.mlp.3.bias"))
    _norm(out, "transformer.norm", src, "encoder.ln")
    _linear(out, "head", src.take("heads.head.weight"), src.take("heads.head.bias"))
    src.finish()
    return _load(ViT(config), out)


# ======================================================================================
# timm
# ======================================================================================


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
    src_size = _pair(model.patch_embed.img_size)
    patch = _pair(model.patch_embed.patch_size)
    new_size = _pair(img_size) if img_size is not None else src_size
    pool = "cls" if model.global_pool == "token" else "mean"
    config = ViTConfig(
        image_size=new_size, patch_size=patch, in_channels=model.patch_embed.proj.in_channels,
        num_classes=model.num_classes, dim=model.embed_dim, depth=len(model.blocks),
        heads=block0.attn.num_heads, mlp_dim=block0.mlp.fc1.out_features, pool=pool,
        class_token=model.cls_token is not None, norm_eps=block0.norm1.eps,
        activation=_activation_of(block0.mlp.act), qkv_bias=block0.attn.qkv.bias is not None,
        registers=getattr(model, "num_reg_tokens", 0),
        distill_token=getattr(model, "dist_token", None) is not None,
        pre_norm=not isinstance(model.norm_pre, nn.Identity),
        patch_bias=model.patch_embed.proj.bias is not None,
        layer_scale=None if isinstance(block0.ls1, nn.Identity) else 1.0,
        qk_norm=isinstance(getattr(block0.attn, "q_norm", None), nn.LayerNorm),
    )
    src = _StateReader(model.state_dict(), "timm VisionTransformer")
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
            _linear(out, "head_dist", src.take("head_dist.weight"), src.take("head_dist.bias"))
    if config.pre_norm:
        _norm(out, "norm_pre", src, "norm_pre")
    for i in range(config.depth):
        t, o = f"blocks.{i}", f"transformer.blocks.{i}"
        if config.layer_scale is not None:
            out[f"{o}.ls1.gamma"] = src.take(f"{t}.ls1.gamma")
            out[f"{o}.ls2.gamma"] = src.take(f"{t}.ls2.gamma")
        if config.qk_norm:
            _norm(out, f"{o}.attn.q_norm", src, f"{t}.attn.q_norm")
            _norm(out, f"{o}.attn.k_norm", src, f"{t}.attn.k_norm")
        _norm(out, f"{o}.norm1", src, f"{t}.norm1")
        _linear(out, f"{o}.attn.qkv", src.take(f"{t}.attn.qkv.weight"),
                src.take(f"{t}.attn.qkv.bias") if config.qkv_bias else None)
        _linear(out, f"{o}.attn.proj", src.take(f"{t}.attn.proj.weight"),
                src.take(f"{t}.attn.proj.bias"))
        _norm(out, f"{o}.norm2", src, f"{t}.norm2")
        for fc in ("fc1", "fc2"):
            _linear(out, f"{o}.mlp.{fc}", src.take(f"{t}.mlp.{fc}.weight"),
                    src.take(f"{t}.mlp.{fc}.bias"))
    _norm(out, "transformer.norm", src, "norm")
    if config.num_classes > 0:
        _linear(out, "head", src.take("head.weight"), src.take("head.bias"))
    src.finish()
    return _load(ViT(config), out)


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


# ======================================================================================
# transformers
# ======================================================================================


def from_hf(model: nn.Module | str | os.PathLike) -> ViT | TextDecoder | TextEncoder:
    """A transformers model, or a folder in the Hugging Face layout (see
    :func:`from_hf_folder`; transformers need not be installed), -> our model.

    ``ViTModel`` / ``ViTForImageClassification`` -> :class:`~multimodal.ViT`,
    ``GPT2Model`` / ``GPT2LMHeadModel`` -> :class:`~multimodal.TextDecoder`,
    ``BertModel`` / ``BertForMaskedLM`` / ``BertForSequenceClassification`` ->
    :class:`~multimodal.TextEncoder`.
    """
    if isinstance(model, (str, os.PathLike)):
        return from_hf_folder(model)
    name = type(model).__name__
    converters = {
        "ViTModel": _hf_vit, "ViTForImageClassification": _hf_vit,
        "GPT2Model": _hf_gpt2, "GPT2LMHeadModel": _hf_gpt2,
        "BertModel": _hf_bert, "BertForMaskedLM": _hf_bert,
        "BertForSequenceClassification": _hf_bert,
        **_MODERN_HF,
    }
    if name not in converters or not hasattr(model, "config"):
        raise ValueError(f"from_hf supports {SUPPORTED['transformers']}; got {name}")
    return converters[name](model)


def _hf_activation(cfg: Any, attr: str) -> str:
    act = getattr(cfg, attr)
    if act not in _HF_ACTIVATIONS:
        raise ValueError(f"unsupported activation {attr}={act!r}; "
                         f"supported: {sorted(_HF_ACTIVATIONS)}")
    return _HF_ACTIVATIONS[act]


def _hf_vit(model: nn.Module) -> ViT:
    cfg = model.config
    classifier = type(model).__name__ == "ViTForImageClassification"
    config = ViTConfig(
        image_size=cfg.image_size, patch_size=cfg.patch_size, in_channels=cfg.num_channels,
        num_classes=cfg.num_labels if classifier else 0, dim=cfg.hidden_size,
        depth=cfg.num_hidden_layers, heads=cfg.num_attention_heads, mlp_dim=cfg.intermediate_size,
        pool="cls", norm_eps=cfg.layer_norm_eps, activation=_hf_activation(cfg, "hidden_act"),
        qkv_bias=cfg.qkv_bias,
    )
    src = _StateReader(model.state_dict(), type(model).__name__,
                       prefix="vit." if classifier else "")
    out: dict[str, Tensor] = {
        "cls_token": src.take("embeddings.cls_token"),
        "pos_embed": src.take("embeddings.position_embeddings"),
        "patch_embed.proj.weight": src.take("embeddings.patch_embeddings.projection.weight"),
        "patch_embed.proj.bias": src.take("embeddings.patch_embeddings.projection.bias"),
    }
    for i in range(config.depth):
        # transformers >= 5 names first, then the older ones
        new, old, o = f"layers.{i}", f"encoder.layer.{i}", f"transformer.blocks.{i}"
        qkv = [src.take(f"{new}.attention.{p}_proj.weight", f"{old}.attention.attention.{n}.weight")
               for p, n in (("q", "query"), ("k", "key"), ("v", "value"))]
        bias = [src.take(f"{new}.attention.{p}_proj.bias", f"{old}.attention.attention.{n}.bias")
                for p, n in (("q", "query"), ("k", "key"), ("v", "value"))] \
            if config.qkv_bias else None
        _linear(out, f"{o}.attn.qkv", torch.cat(qkv), torch.cat(bias) if bias else None)
        _linear(out, f"{o}.attn.proj",
                src.take(f"{new}.attention.o_proj.weight", f"{old}.attention.output.dense.weight"),
                src.take(f"{new}.attention.o_proj.bias", f"{old}.attention.output.dense.bias"))
        for ours, theirs in (("norm1", "layernorm_before"), ("norm2", "layernorm_after")):
            out[f"{o}.{ours}.weight"] = src.take(f"{new}.{theirs}.weight", f"{old}.{theirs}.weight")
            out[f"{o}.{ours}.bias"] = src.take(f"{new}.{theirs}.bias", f"{old}.{theirs}.bias")
        for ours, theirs in (("fc1", "intermediate.dense"), ("fc2", "output.dense")):
            _linear(out, f"{o}.mlp.{ours}",
                    src.take(f"{new}.mlp.{ours}.weight", f"{old}.{theirs}.weight"),
                    src.take(f"{new}.mlp.{ours}.bias", f"{old}.{theirs}.bias"))
    _norm(out, "transformer.norm", src, "layernorm")
    src.skip("pooler.dense.weight", "pooler.dense.bias")  # no pooler in our ViT (see top)
    if classifier:
        src.prefix = ""
        _linear(out, "head", src.take("classifier.weight"), src.take("classifier.bias"))
    src.finish()
    return _load(ViT(config), out)


def _hf_gpt2(model: nn.Module) -> TextDecoder:
    cfg = model.config
    if getattr(cfg, "scale_attn_by_inverse_layer_idx", False) or not getattr(
        cfg, "scale_attn_weights", True
    ):
        raise ValueError("GPT-2 variants with scale_attn_by_inverse_layer_idx=True or "
                         "scale_attn_weights=False are not supported")
    if getattr(cfg, "add_cross_attention", False):
        raise ValueError("GPT-2 with add_cross_attention=True is not supported")
    lm = type(model).__name__ == "GPT2LMHeadModel"
    state = model.state_dict()
    tied = True
    if lm:
        tied = torch.equal(state["lm_head.weight"], state["transformer.wte.weight"])
    config = TextDecoderConfig(
        vocab_size=cfg.vocab_size, max_len=cfg.n_positions, dim=cfg.n_embd, depth=cfg.n_layer,
        heads=cfg.n_head, mlp_dim=cfg.n_inner or 4 * cfg.n_embd, pos_embed="learned",
        norm_eps=cfg.layer_norm_epsilon, activation=_hf_activation(cfg, "activation_function"),
        tie_embeddings=tied,
    )
    src = _StateReader(state, type(model).__name__, prefix="transformer." if lm else "")
    out: dict[str, Tensor] = {"tok_embed.weight": src.take("wte.weight"),
                              "pos_embed.weight": src.take("wpe.weight")}
    for i in range(config.depth):
        t, o = f"h.{i}", f"transformer.blocks.{i}"
        _norm(out, f"{o}.norm1", src, f"{t}.ln_1")
        _norm(out, f"{o}.norm2", src, f"{t}.ln_2")
        # Conv1D keeps (in, out) weights: transpose to nn.Linear's (out, in)
        for ours, theirs in (("attn.qkv", "attn.c_attn"), ("attn.proj", "attn.c_proj"),
                             ("mlp.fc1", "mlp.c_fc"), ("mlp.fc2", "mlp.c_proj")):
            _linear(out, f"{o}.{ours}", src.take(f"{t}.{theirs}.weight").t(),
                    src.take(f"{t}.{theirs}.bias"))
    _norm(out, "transformer.norm", src, "ln_f")
    if lm:
        src.prefix = ""
        head = src.take("lm_head.weight")
        if not tied:
            out["lm_head.weight"] = head
    src.finish(ignore=(".attn.bias", ".attn.masked_bias"))  # old causal-mask buffers
    return _load(TextDecoder(config), out)


def _hf_bert(model: nn.Module) -> TextEncoder:
    cfg = model.config
    kind = type(model).__name__
    if getattr(cfg, "position_embedding_type", "absolute") != "absolute":
        raise ValueError("only BERT with absolute position embeddings is supported, got "
                         f"position_embedding_type={cfg.position_embedding_type!r}")
    if getattr(cfg, "is_decoder", False):
        raise ValueError("BERT configured as a decoder (is_decoder=True) is not supported")
    state = model.state_dict()
    has_pooler = any(k.endswith("pooler.dense.weight") for k in state)
    mlm = kind == "BertForMaskedLM"
    config = TextEncoderConfig(
        vocab_size=cfg.vocab_size, max_len=cfg.max_position_embeddings, dim=cfg.hidden_size,
        depth=cfg.num_hidden_layers, heads=cfg.num_attention_heads,
        mlp_dim=cfg.intermediate_size, norm="post", norm_eps=cfg.layer_norm_eps,
        activation=_hf_activation(cfg, "hidden_act"), pos_embed="learned",
        type_vocab_size=cfg.type_vocab_size, embed_norm=True,
        num_classes=cfg.num_labels if kind == "BertForSequenceClassification" else 0,
        mlm_head=mlm, pooler=has_pooler,
    )
    src = _StateReader(state, kind, prefix="" if kind == "BertModel" else "bert.")
    out: dict[str, Tensor] = {
        "tok_embed.weight": src.take("embeddings.word_embeddings.weight"),
        "pos_embed.weight": src.take("embeddings.position_embeddings.weight"),
        "type_embed.weight": src.take("embeddings.token_type_embeddings.weight"),
    }
    _norm(out, "embed_norm", src, "embeddings.LayerNorm")
    for i in range(config.depth):
        t, o = f"encoder.layer.{i}", f"transformer.blocks.{i}"
        names = ("query", "key", "value")
        _linear(out, f"{o}.attn.qkv",
                torch.cat([src.take(f"{t}.attention.self.{n}.weight") for n in names]),
                torch.cat([src.take(f"{t}.attention.self.{n}.bias") for n in names]))
        _linear(out, f"{o}.attn.proj", src.take(f"{t}.attention.output.dense.weight"),
                src.take(f"{t}.attention.output.dense.bias"))
        _norm(out, f"{o}.norm1", src, f"{t}.attention.output.LayerNorm")
        _linear(out, f"{o}.mlp.fc1", src.take(f"{t}.intermediate.dense.weight"),
                src.take(f"{t}.intermediate.dense.bias"))
        _linear(out, f"{o}.mlp.fc2", src.take(f"{t}.output.dense.weight"),
                src.take(f"{t}.output.dense.bias"))
        _norm(out, f"{o}.norm2", src, f"{t}.output.LayerNorm")
    if has_pooler:
        _linear(out, "pooler.0", src.take("pooler.dense.weight"), src.take("pooler.dense.bias"))
    src.prefix = ""
    if mlm:
        p = "cls.predictions"
        _linear(out, "mlm.dense", src.take(f"{p}.transform.dense.weight"),
                src.take(f"{p}.transform.dense.bias"))
        _norm(out, "mlm.norm", src, f"{p}.transform.LayerNorm")
        decoder = src.take(f"{p}.decoder.weight")
        if decoder.numel() and not torch.equal(decoder, out["tok_embed.weight"]):
            raise ValueError("BertForMaskedLM with an MLM decoder not tied to the word "
                             "embeddings is not supported")
        out["mlm.decoder.bias"] = src.take(f"{p}.bias", f"{p}.decoder.bias")
        src.skip(f"{p}.decoder.bias")
    if config.num_classes:
        _linear(out, "head", src.take("classifier.weight"), src.take("classifier.bias"))
    src.finish(ignore=("embeddings.position_ids", "embeddings.token_type_ids"))
    return _load(TextEncoder(config), out)


# ======================================================================================
# modern encoders and decoders (issue 18): Llama, DINOv2, DeiT
# Each converter reads only ``model.config`` (attributes) and ``model.state_dict()``, so
# the same functions serve live transformers models and folders read without
# transformers (multimodal.hf_folder).
# ======================================================================================

_MISSING = object()


def _cfg(cfg: Any, name: str, default: Any = _MISSING) -> Any:
    value = getattr(cfg, name, default)
    if value is _MISSING:
        raise ValueError(f"config has no {name!r} (needed to convert "
                         f"{getattr(cfg, 'model_type', 'this model')})")
    return value


def _rope_theta(cfg: Any) -> float:
    params = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if isinstance(params, dict) and params.get("rope_type", params.get("type", "default")) \
            not in ("default", None):
        raise ValueError(f"rope scaling {params!r} is not supported (only the default rope)")
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    return float(theta if theta is not None else getattr(cfg, "rope_theta", 10000.0))


def _hf_llama(model: nn.Module) -> TextDecoder:
    """``LlamaForCausalLM`` / ``LlamaModel`` -> :class:`~multimodal.TextDecoder`.

    RMSNorm, SwiGLU (``down(silu(gate x) * up x)``), grouped-query attention and 1-D
    rotary positions in the "rotate half" layout, all as backbone switches. ``LlamaModel``
    (no LM head) gets the tied head of the token embedding: its ``forward_features``
    equals ``last_hidden_state``.
    """
    cfg, state, kind = model.config, model.state_dict(), type(model).__name__
    dim, heads = _cfg(cfg, "hidden_size"), _cfg(cfg, "num_attention_heads")
    head_dim = getattr(cfg, "head_dim", None) or dim // heads
    if head_dim * heads != dim:
        raise ValueError(f"Llama with head_dim ({head_dim}) * heads ({heads}) != hidden_size "
                         f"({dim}) is not supported")
    lm = kind == "LlamaForCausalLM"
    tied = not lm or bool(getattr(cfg, "tie_word_embeddings", False))
    act = _hf_activation(cfg, "hidden_act")
    attn_bias = bool(getattr(cfg, "attention_bias", False))
    config = TextDecoderConfig(
        vocab_size=_cfg(cfg, "vocab_size"), max_len=_cfg(cfg, "max_position_embeddings"),
        pos_embed="none", tie_embeddings=tied, dim=dim, depth=_cfg(cfg, "num_hidden_layers"),
        heads=heads, kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        mlp_dim=_cfg(cfg, "intermediate_size"), norm_type="rmsnorm",
        norm_eps=_cfg(cfg, "rms_norm_eps", 1e-6), mlp_type="glu", activation=act,
        qkv_bias=attn_bias, proj_bias=attn_bias, mlp_bias=bool(getattr(cfg, "mlp_bias", False)),
        rope="1d", rope_base=_rope_theta(cfg),
    )
    src = _StateReader(state, kind, prefix="model." if lm else "")
    out: dict[str, Tensor] = {"tok_embed.weight": src.take("embed_tokens.weight")}
    for i in range(config.depth):
        t, o = f"layers.{i}", f"transformer.blocks.{i}"
        out[f"{o}.norm1.weight"] = src.take(f"{t}.input_layernorm.weight")
        out[f"{o}.norm2.weight"] = src.take(f"{t}.post_attention_layernorm.weight")
        a = f"{t}.self_attn"
        _linear(out, f"{o}.attn.qkv",
                torch.cat([src.take(f"{a}.{p}_proj.weight") for p in "qkv"]),
                torch.cat([src.take(f"{a}.{p}_proj.bias") for p in "qkv"]) if attn_bias
                else None)
        _linear(out, f"{o}.attn.proj", src.take(f"{a}.o_proj.weight"),
                src.take(f"{a}.o_proj.bias") if attn_bias else None)
        for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("fc2", "down_proj")):
            _linear(out, f"{o}.mlp.{ours}", src.take(f"{t}.mlp.{theirs}.weight"),
                    src.take(f"{t}.mlp.{theirs}.bias") if config.mlp_bias else None)
    out["transformer.norm.weight"] = src.take("norm.weight")
    if lm:
        src.prefix = ""
        head = src.take("lm_head.weight")
        if not tied:
            out["lm_head.weight"] = head
    src.finish(ignore=("rotary_emb.inv_freq",))
    return _load(TextDecoder(config), out)


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
    src = _StateReader(state, kind)
    mlp0 = "encoder.layer.0.mlp."
    hidden = int(_cfg(cfg, "hidden_size") * _cfg(cfg, "mlp_ratio", 4))
    if swiglu:  # two thirds of the MLP width, rounded up to a multiple of 8
        hidden = (int(hidden * 2 / 3) + 7) // 8 * 8
    for key, rows in (("fc1.weight", 1), ("gate_proj.weight", 1), ("weights_in.weight", 2)):
        if mlp0 + key in state:  # the stored width wins
            hidden = state[mlp0 + key].shape[0] // rows
    config = ViTConfig(
        image_size=_cfg(cfg, "image_size"), patch_size=_cfg(cfg, "patch_size"),
        in_channels=_cfg(cfg, "num_channels", 3), num_classes=0, pool="cls",
        registers=int(getattr(cfg, "num_register_tokens", 0) or 0),
        dim=_cfg(cfg, "hidden_size"), depth=_cfg(cfg, "num_hidden_layers"),
        heads=_cfg(cfg, "num_attention_heads"), mlp_dim=hidden,
        norm_eps=_cfg(cfg, "layer_norm_eps", 1e-6),
        activation="silu" if swiglu else _hf_activation(cfg, "hidden_act"),
        mlp_type="glu" if swiglu else "mlp", qkv_bias=bool(getattr(cfg, "qkv_bias", True)),
        layer_scale=float(_cfg(cfg, "layerscale_value", 1.0)),
    )
    e = "embeddings"
    out: dict[str, Tensor] = {
        "cls_token": src.take(f"{e}.cls_token"),
        "pos_embed": src.take(f"{e}.position_embeddings"),
        "patch_embed.proj.weight": src.take(f"{e}.patch_embeddings.projection.weight"),
        "patch_embed.proj.bias": src.take(f"{e}.patch_embeddings.projection.bias"),
    }
    if config.registers:
        out["reg_token"] = src.take(f"{e}.register_tokens")
    src.skip(f"{e}.mask_token")  # masked-image pre-training only
    for i in range(config.depth):
        t, o = f"encoder.layer.{i}", f"transformer.blocks.{i}"
        _qkv_from_separate(out, f"{o}.attn", src, t, config.qkv_bias)
        _norm(out, f"{o}.norm1", src, f"{t}.norm1")
        _norm(out, f"{o}.norm2", src, f"{t}.norm2")
        out[f"{o}.ls1.gamma"] = src.take(f"{t}.layer_scale1.lambda1")
        out[f"{o}.ls2.gamma"] = src.take(f"{t}.layer_scale2.lambda1")
        if swiglu and f"{t}.mlp.gate_proj.weight" in state:  # transformers >= 5
            for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("fc2", "down_proj")):
                _linear(out, f"{o}.mlp.{ours}", src.take(f"{t}.mlp.{theirs}.weight"),
                        src.take(f"{t}.mlp.{theirs}.bias"))
        elif swiglu:  # before: one fused Linear, rows [gate; up]
            w_in = src.take(f"{t}.mlp.weights_in.weight")
            b_in = src.take(f"{t}.mlp.weights_in.bias")
            _linear(out, f"{o}.mlp.gate", w_in[:hidden], b_in[:hidden])
            _linear(out, f"{o}.mlp.up", w_in[hidden:], b_in[hidden:])
            _linear(out, f"{o}.mlp.fc2", src.take(f"{t}.mlp.weights_out.weight"),
                    src.take(f"{t}.mlp.weights_out.bias"))
        else:
            for fc in ("fc1", "fc2"):
                _linear(out, f"{o}.mlp.{fc}", src.take(f"{t}.mlp.{fc}.weight"),
                        src.take(f"{t}.mlp.{fc}.bias"))
    _norm(out, "transformer.norm", src, "layernorm")
    src.finish()
    return _load(ViT(config), out)


def _qkv_from_separate(out: dict[str, Tensor], ours: str, src: _StateReader, layer: str,
                       bias: bool) -> None:
    """Separate q/k/v (transformers >= 5: ``attention.{q,k,v,o}_proj``; before:
    ``attention.attention.{query,key,value}`` and ``attention.output.dense``) -> fused."""
    names = (("q", "query"), ("k", "key"), ("v", "value"))
    a = f"{layer}.attention"
    _linear(out, f"{ours}.qkv",
            torch.cat([src.take(f"{a}.{p}_proj.weight", f"{a}.attention.{n}.weight")
                       for p, n in names]),
            torch.cat([src.take(f"{a}.{p}_proj.bias", f"{a}.attention.{n}.bias")
                       for p, n in names]) if bias else None)
    _linear(out, f"{ours}.proj", src.take(f"{a}.o_proj.weight", f"{a}.output.dense.weight"),
            src.take(f"{a}.o_proj.bias", f"{a}.output.dense.bias"))


_MODERN_HF = {"LlamaForCausalLM": _hf_llama, "LlamaModel": _hf_llama}
_MODERN_HF.update({"Dinov2Model": _hf_dinov2, "Dinov2WithRegistersModel": _hf_dinov2})


def _hf_deit(model: nn.Module) -> ViT:
    """``DeiTModel`` -> :class:`~multimodal.ViT` with a distillation token (no head:
    ``forward_features`` equals ``last_hidden_state``; the pooler is dropped as for
    ``ViTModel``); ``DeiTForImageClassificationWithTeacher`` -> the same with both
    classifiers, ``forward`` equal to its ``logits`` (their mean)."""
    cfg, state, kind = model.config, model.state_dict(), type(model).__name__
    classifier = kind == "DeiTForImageClassificationWithTeacher"
    config = ViTConfig(
        image_size=_cfg(cfg, "image_size"), patch_size=_cfg(cfg, "patch_size"),
        in_channels=_cfg(cfg, "num_channels", 3), distill_token=True, pool="cls",
        num_classes=_cfg(cfg, "num_labels") if classifier else 0,
        dim=_cfg(cfg, "hidden_size"), depth=_cfg(cfg, "num_hidden_layers"),
        heads=_cfg(cfg, "num_attention_heads"), mlp_dim=_cfg(cfg, "intermediate_size"),
        norm_eps=_cfg(cfg, "layer_norm_eps", 1e-12), activation=_hf_activation(cfg, "hidden_act"),
        qkv_bias=bool(getattr(cfg, "qkv_bias", True)),
    )
    src = _StateReader(state, kind, prefix="deit." if classifier else "")
    e = "embeddings"
    out: dict[str, Tensor] = {
        "cls_token": src.take(f"{e}.cls_token"),
        "dist_token": src.take(f"{e}.distillation_token"),
        "pos_embed": src.take(f"{e}.position_embeddings"),
        "patch_embed.proj.weight": src.take(f"{e}.patch_embeddings.projection.weight"),
        "patch_embed.proj.bias": src.take(f"{e}.patch_embeddings.projection.bias"),
    }
    src.skip(f"{e}.mask_token")
    for i in range(config.depth):  # transformers >= 5 names first, then the older ones
        new, old, o = f"layers.{i}", f"encoder.layer.{i}", f"transformer.blocks.{i}"
        t = new if f"{src.prefix}{new}.layernorm_before.weight" in src.state else old
        _qkv_from_separate(out, f"{o}.attn", src, t, config.qkv_bias)
        _norm(out, f"{o}.norm1", src, f"{t}.layernorm_before")
        _norm(out, f"{o}.norm2", src, f"{t}.layernorm_after")
        for ours, theirs in (("fc1", "intermediate.dense"), ("fc2", "output.dense")):
            _linear(out, f"{o}.mlp.{ours}",
                    src.take(f"{t}.mlp.{ours}.weight", f"{t}.{theirs}.weight"),
                    src.take(f"{t}.mlp.{ours}.bias", f"{t}.{theirs}.bias"))
    _norm(out, "transformer.norm", src, "layernorm")
    src.skip("pooler.dense.weight", "pooler.dense.bias")
    if classifier:
        src.prefix = ""
        _linear(out, "head", src.take("cls_classifier.weight"), src.take("cls_classifier.bias"))
        _linear(out, "head_dist", src.take("distillation_classifier.weight"),
                src.take("distillation_classifier.bias"))
    src.finish()
    return _load(ViT(config), out)


_MODERN_HF.update({"DeiTModel": _hf_deit, "DeiTForImageClassificationWithTeacher": _hf_deit})


class ConvertedCLIP(nn.Module):
    """A converted CLIP: our :class:`~multimodal.ViT` image tower and our causal, pre-norm
    :class:`~multimodal.TextDecoder` text tower (its ``forward_features``; the tied LM
    head is unused), bias-free projections and ``logit_scale``.

    A stand-in until the package's own CLIP model class lands (its weights map one to one).
    ``logits_per_image = exp(logit_scale) * norm(f_img) norm(f_txt)^T``; the text feature is
    the token at the end-of-text position: the largest id when ``eos_token_id == 2`` (the
    original CLIP vocabulary, as transformers does), else the first ``eos_token_id``.
    """

    def __init__(self, vision: ViT, text: TextDecoder, projection_dim: int,
                 eos_token_id: int) -> None:
        super().__init__()
        self.vision, self.text, self.eos_token_id = vision, text, eos_token_id
        self.visual_projection = nn.Linear(vision.config.dim, projection_dim, bias=False)
        self.text_projection = nn.Linear(text.config.dim, projection_dim, bias=False)
        self.logit_scale = nn.Parameter(torch.tensor(2.6592))

    def get_image_features(self, images: Tensor) -> Tensor:
        return self.visual_projection(self.vision.pool(self.vision.forward_features(images)))

    def get_text_features(self, input_ids: Tensor,
                          attention_mask: Tensor | None = None) -> Tensor:
        hidden = self.text.forward_features(input_ids, attention_mask)
        if self.eos_token_id == 2:
            end = input_ids.argmax(dim=-1)
        else:
            end = (input_ids == self.eos_token_id).int().argmax(dim=-1)
        pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), end]
        return self.text_projection(pooled)

    def forward(self, images: Tensor, input_ids: Tensor,
                attention_mask: Tensor | None = None) -> Tensor:
        """``logits_per_image`` (B_img, B_txt)."""
        img = F.normalize(self.get_image_features(images), dim=-1)
        txt = F.normalize(self.get_text_features(input_ids, attention_mask), dim=-1)
        return self.logit_scale.exp() * img @ txt.T


def _clip_layers(out: dict[str, Tensor], src: _StateReader, depth: int) -> None:
    for i in range(depth):
        t, o = f"encoder.layers.{i}", f"transformer.blocks.{i}"
        a = f"{t}.self_attn"
        _linear(out, f"{o}.attn.qkv", torch.cat([src.take(f"{a}.{p}_proj.weight") for p in "qkv"]),
                torch.cat([src.take(f"{a}.{p}_proj.bias") for p in "qkv"]))
        _linear(out, f"{o}.attn.proj", src.take(f"{a}.out_proj.weight"),
                src.take(f"{a}.out_proj.bias"))
        _norm(out, f"{o}.norm1", src, f"{t}.layer_norm1")
        _norm(out, f"{o}.norm2", src, f"{t}.layer_norm2")
        for fc in ("fc1", "fc2"):
            _linear(out, f"{o}.mlp.{fc}", src.take(f"{t}.mlp.{fc}.weight"),
                    src.take(f"{t}.mlp.{fc}.bias"))


def _sub_config(cfg: Any, name: str) -> Any:
    sub = _cfg(cfg, name)
    return _HFConfig(sub, Path(f"config.json:{name}")) if isinstance(sub, dict) else sub


def _hf_clip(model: nn.Module) -> ConvertedCLIP:
    """``CLIPModel`` -> :class:`ConvertedCLIP` (image and text features, ``logits_per_image``
    equal to transformers'). The image tower: class embedding, bias-free patches,
    ``pre_layrnorm`` (ViT ``pre_norm``), ``post_layernorm`` as the final norm (applied to
    every token; transformers applies it to the pooled class token only, so
    ``forward_features`` differs from ``last_hidden_state`` but the pooled feature agrees)."""
    cfg, state = model.config, model.state_dict()
    vc, tc = _sub_config(cfg, "vision_config"), _sub_config(cfg, "text_config")
    src = _StateReader(state, type(model).__name__)
    vision = ViT(ViTConfig(
        image_size=_cfg(vc, "image_size"), patch_size=_cfg(vc, "patch_size"),
        in_channels=_cfg(vc, "num_channels", 3), num_classes=0, pool="cls", pre_norm=True,
        patch_bias=False, dim=_cfg(vc, "hidden_size"), depth=_cfg(vc, "num_hidden_layers"),
        heads=_cfg(vc, "num_attention_heads"), mlp_dim=_cfg(vc, "intermediate_size"),
        norm_eps=_cfg(vc, "layer_norm_eps", 1e-5), activation=_hf_activation(vc, "hidden_act"),
    ))
    text = TextDecoder(TextDecoderConfig(
        vocab_size=_cfg(tc, "vocab_size"), max_len=_cfg(tc, "max_position_embeddings"),
        pos_embed="learned", tie_embeddings=True, dim=_cfg(tc, "hidden_size"),
        depth=_cfg(tc, "num_hidden_layers"), heads=_cfg(tc, "num_attention_heads"),
        mlp_dim=_cfg(tc, "intermediate_size"), norm_eps=_cfg(tc, "layer_norm_eps", 1e-5),
        activation=_hf_activation(tc, "hidden_act"),
    ))
    v: dict[str, Tensor] = {}
    src.prefix = "vision_model."
    cls = src.take("embeddings.class_embedding")
    v["cls_token"] = cls.reshape(1, 1, -1)
    v["pos_embed"] = src.take("embeddings.position_embedding.weight")[None]
    v["patch_embed.proj.weight"] = src.take("embeddings.patch_embedding.weight")
    _norm(v, "norm_pre", src, "pre_layrnorm")
    _clip_layers(v, src, vision.config.depth)
    _norm(v, "transformer.norm", src, "post_layernorm")
    src.skip("embeddings.position_ids")
    t: dict[str, Tensor] = {}
    src.prefix = "text_model."
    t["tok_embed.weight"] = src.take("embeddings.token_embedding.weight")
    t["pos_embed.weight"] = src.take("embeddings.position_embedding.weight")
    _clip_layers(t, src, text.config.depth)
    _norm(t, "transformer.norm", src, "final_layer_norm")
    src.skip("embeddings.position_ids")
    src.prefix = ""
    top = {"visual_projection.weight": src.take("visual_projection.weight"),
           "text_projection.weight": src.take("text_projection.weight"),
           "logit_scale": src.take("logit_scale")}
    src.finish()
    _load(vision, v)
    _load(text, t)
    clip = ConvertedCLIP(vision, text, top["visual_projection.weight"].shape[0]
                         if top["visual_projection.weight"].numel() else 1,
                         int(getattr(tc, "eos_token_id", 2)))
    load_state_dict_checked(clip, {**top, **{f"vision.{k}": p for k, p in
                                             vision.state_dict().items()},
                                   **{f"text.{k}": p for k, p in text.state_dict().items()}})
    return clip.eval()


_MODERN_HF.update({"CLIPModel": _hf_clip})


# ======================================================================================
# a Hugging Face layout folder, without transformers
# ======================================================================================

# config.json values older writers may leave out (transformers' own class defaults), for
# the keys the converters read; anything else absent is an error naming the key
_HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "bert": dict(hidden_act="gelu", layer_norm_eps=1e-12, type_vocab_size=2,
                 position_embedding_type="absolute", is_decoder=False, num_labels=2),
    "gpt2": dict(activation_function="gelu_new", layer_norm_epsilon=1e-5, n_inner=None,
                 scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False,
                 add_cross_attention=False),
    "vit": dict(hidden_act="gelu", layer_norm_eps=1e-12, num_channels=3, qkv_bias=True,
                num_labels=2),
    "llama": dict(hidden_act="silu", rms_norm_eps=1e-6, attention_bias=False, mlp_bias=False,
                  tie_word_embeddings=False, rope_theta=10000.0),
    "dinov2": dict(hidden_act="gelu", layer_norm_eps=1e-6, num_channels=3, qkv_bias=True,
                   mlp_ratio=4, layerscale_value=1.0, use_swiglu_ffn=False),
    "deit": dict(hidden_act="gelu", layer_norm_eps=1e-12, num_channels=3, qkv_bias=True,
                 num_labels=2),
    "dinov2_with_registers": dict(hidden_act="gelu", layer_norm_eps=1e-6, num_channels=3,
                                  qkv_bias=True, mlp_ratio=4, layerscale_value=1.0,
                                  use_swiglu_ffn=False, num_register_tokens=4),
}
# model_type -> the class converted when config.json names no (supported) architecture
_HF_BASE_CLASS = {"bert": "BertModel", "gpt2": "GPT2Model", "vit": "ViTModel",
                  "llama": "LlamaModel", "dinov2": "Dinov2Model",
                  "dinov2_with_registers": "Dinov2WithRegistersModel", "deit": "DeiTModel",
                  "clip": "CLIPModel"}
# the prefix a task model puts before its base model's keys
_HF_BASE_PREFIX = {"bert": "bert.", "gpt2": "transformer.", "vit": "vit.", "llama": "model.",
                   "dinov2": "dinov2.", "dinov2_with_registers": "dinov2_with_registers.",
                   "deit": "deit."}


# tied output weights that save_pretrained stores once: (omitted key, the key it equals)
_HF_TIED = {"GPT2LMHeadModel": ("lm_head.weight", "transformer.wte.weight"),
            "LlamaForCausalLM": ("lm_head.weight", "model.embed_tokens.weight"),
            "BertForMaskedLM": ("cls.predictions.decoder.weight",
                                "bert.embeddings.word_embeddings.weight")}


class _HFConfig:
    """config.json as attributes, with :data:`_HF_DEFAULTS` for the keys older files omit."""

    def __init__(self, data: dict[str, Any], file: Path) -> None:
        self._data, self._file = data, file
        self._defaults = _HF_DEFAULTS.get(data.get("model_type", ""), {})

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name == "num_labels" and "id2label" in self._data:
            return len(self._data["id2label"])
        if name in self._data:
            return self._data[name]
        if name in self._defaults:
            return self._defaults[name]
        raise AttributeError(f"{self._file} has no {name!r}")


class _FolderModel:
    """What the converters read from a model: ``config`` and ``state_dict()``. Subclassed
    under the architecture's class name, the name the converters dispatch on."""

    def __init__(self, config: _HFConfig, state: dict[str, Tensor]) -> None:
        self.config = config
        self._state = state

    def state_dict(self) -> dict[str, Tensor]:
        return self._state


def _folder_converters() -> dict[str, Any]:
    return {"ViTModel": _hf_vit, "ViTForImageClassification": _hf_vit,
            "GPT2Model": _hf_gpt2, "GPT2LMHeadModel": _hf_gpt2,
            "BertModel": _hf_bert, "BertForMaskedLM": _hf_bert,
            "BertForSequenceClassification": _hf_bert, **_MODERN_HF}


def read_hf_weights(folder: str | Path) -> dict[str, Tensor]:
    """The tensors of ``model.safetensors``, or of every shard named by
    ``model.safetensors.index.json``. Pickled checkpoints (``pytorch_model.bin``, ...) are
    refused: unpickling can run code."""
    from safetensors.torch import load_file

    folder = Path(folder)
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        return load_file(str(single))
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index} has no 'weight_map'")
        shards = sorted(set(weight_map.values()))
        absent = [s for s in shards if not (folder / s).is_file()]
        if absent:
            raise FileNotFoundError(f"{index} names shards that are not in {folder}: "
                                    + ", ".join(absent))
        state: dict[str, Tensor] = {}
        for shard in shards:
            state.update(load_file(str(folder / shard)))
        listed = set(weight_map)
        if set(state) != listed:
            raise ValueError(f"{index} and its shards disagree: in the index only: "
                             f"{sorted(listed - set(state))}; in the shards only: "
                             f"{sorted(set(state) - listed)}")
        return state
    pickles = sorted(p.name for p in folder.iterdir()
                     if p.suffix in (".bin", ".pt", ".pth", ".ckpt", ".pkl"))
    if pickles:
        raise ValueError(f"{folder} holds only pickled weights ({', '.join(pickles)}); they "
                         "are refused because loading them can execute code. Save the model "
                         "as safetensors (save_pretrained(..., safe_serialization=True))")
    raise FileNotFoundError(f"{folder} has no model.safetensors or "
                            "model.safetensors.index.json")


def from_hf_folder(folder: str | Path) -> nn.Module:
    """A folder in the Hugging Face layout -> our model, without transformers.

    Reads ``config.json`` (its ``architectures``, else its ``model_type``) and the
    safetensors weights (one file or shards), then runs the same converter as for a live
    transformers model, so the result is identical. Errors name what is wrong: no
    ``config.json``, an unsupported architecture (with the supported ones), missing or
    unconverted keys, mis-shaped tensors, a missing shard, pickle-only weights.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder")
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{folder} has no config.json (a Hugging Face layout folder "
                                "holds config.json and model.safetensors)")
    data = json.loads(config_file.read_text())
    converters = _folder_converters()
    model_type = data.get("model_type")
    archs = [a for a in data.get("architectures") or [] if a in converters]
    arch = archs[0] if archs else _HF_BASE_CLASS.get(model_type or "")
    if arch is None:
        raise ValueError(
            f"{config_file}: unsupported model (model_type={model_type!r}, architectures="
            f"{data.get('architectures')}); supported model_type: {sorted(_HF_BASE_CLASS)}, "
            f"architectures: {sorted(converters)}")
    state = read_hf_weights(folder)
    prefix = _HF_BASE_PREFIX.get(model_type or "", "")
    if arch == _HF_BASE_CLASS.get(model_type or "") and prefix and state and all(
        k.startswith(prefix) for k in state
    ):  # a base model saved inside its task model's naming
        state = {k[len(prefix):]: v for k, v in state.items()}
    config = _HFConfig(data, config_file)
    if arch in _HF_TIED and getattr(config, "tie_word_embeddings", model_type != "llama"):
        omitted, source = _HF_TIED[arch]
        if omitted not in state and source in state:
            state[omitted] = state[source]
    snapshot = type(arch, (_FolderModel,), {})(config, state)
    try:
        return converters[arch](snapshot)
    except ValueError as err:
        raise ValueError(f"{folder}: {err}") from None


# ======================================================================================
# any of the above
# ======================================================================================


def convert(model: nn.Module, **kwargs: Any) -> nn.Module:
    """Dispatch on the source library: torchvision, timm or transformers."""
    module = type(model).__module__
    if module.startswith("torchvision."):
        return from_torchvision(model, **kwargs)
    if module.startswith("timm."):
        return from_timm(model, **kwargs)
    if module.startswith("transformers."):
        return from_hf(model, **kwargs)
    raise ValueError(f"cannot convert a {module}.{type(model).__name__}; supported: "
                     + "; ".join(f"{lib}: {what}" for lib, what in SUPPORTED.items()))


__all__ = ["SUPPORTED", "ConvertedCLIP", "convert", "from_hf", "from_hf_folder", "from_timm",
           "from_torchvision", "read_hf_weights"]
