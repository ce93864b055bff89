"""Import models from torchvision, timm and transformers: the one place that knows
foreign weight layouts.

>>> vit = from_torchvision(torchvision.models.vit_b_16(weights=None))
>>> vit = from_timm(timm.create_model("vit_tiny_patch16_224"), img_size=384)
>>> gpt = from_hf(transformers.GPT2LMHeadModel(config))

Every converter reads the source's hyper-parameters, builds the matching model of this
package, renames (and where needed fuses or transposes) the weights and loads them with
:func:`multimodal.hub.load_state_dict_checked`. The result gives the source's outputs
(to float rounding). A foreign key that is needed but absent, or present but never used
(a feature we do not implement, e.g. layer scale), is an error that lists the keys.

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

from collections.abc import Iterable, Mapping
from typing import Any

import torch
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
            "pooling without fc_norm)",
    "transformers": "ViTModel, ViTForImageClassification, GPT2Model, GPT2LMHeadModel, "
                    "BertModel, BertForMaskedLM, BertForSequenceClassification",
}

# transformers' activation names -> ours
_HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                   "gelu_fast": "gelu_tanh", "relu": "relu"}


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
    raise ValueError(f"unsupported MLP activation {type(module).__name__}; "
                     "supported: GELU (exact or tanh), ReLU")


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
    )
    src = _StateReader(model.state_dict(), "timm VisionTransformer")
    pos = src.take("pos_embed")
    prefix = 1 if config.class_token else 0
    src_grid = (src_size[0] // patch[0], src_size[1] // patch[1])
    if pos.numel():
        pos = torch.cat([pos[0, :prefix], resample_grid(pos[0, prefix:], src_grid,
                                                              config.grid_size)])[None]
    out: dict[str, Tensor] = {
        "pos_embed": pos,
        "patch_embed.proj.weight": src.take("patch_embed.proj.weight"),
    }
    if model.patch_embed.proj.bias is not None:
        out["patch_embed.proj.bias"] = src.take("patch_embed.proj.bias")
    if config.class_token:
        out["cls_token"] = src.take("cls_token")
    for i in range(config.depth):
        t, o = f"blocks.{i}", f"transformer.blocks.{i}"
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
        "register tokens (reg_tokens)": getattr(model, "num_reg_tokens", 0) > 0,
        "no_embed_class=True": getattr(model, "no_embed_class", False),
        "pre_norm (norm_pre)": not isinstance(model.norm_pre, nn.Identity),
        "fc_norm (a norm after pooling; global_pool='avg' defaults to it)":
            not isinstance(model.fc_norm, nn.Identity),
        "attention pooling (global_pool='map')": getattr(model, "attn_pool", None) is not None,
        f"global_pool={model.global_pool!r}": model.global_pool not in ("token", "avg"),
        "layer scale (init_values)": not isinstance(block0.ls1, nn.Identity),
        "qk_norm": not isinstance(getattr(block0.attn, "q_norm", nn.Identity()), nn.Identity),
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


def from_hf(model: nn.Module) -> ViT | TextDecoder | TextEncoder:
    """A transformers model -> the matching model of this package.

    ``ViTModel`` / ``ViTForImageClassification`` -> :class:`~multimodal.ViT`,
    ``GPT2Model`` / ``GPT2LMHeadModel`` -> :class:`~multimodal.TextDecoder`,
    ``BertModel`` / ``BertForMaskedLM`` / ``BertForSequenceClassification`` ->
    :class:`~multimodal.TextEncoder`.
    """
    name = type(model).__name__
    converters = {
        "ViTModel": _hf_vit, "ViTForImageClassification": _hf_vit,
        "GPT2Model": _hf_gpt2, "GPT2LMHeadModel": _hf_gpt2,
        "BertModel": _hf_bert, "BertForMaskedLM": _hf_bert,
        "BertForSequenceClassification": _hf_bert,
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
    bert = model if kind == "BertModel" else model.bert
    has_pooler = bert.pooler is not None
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
    state = model.state_dict()
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


__all__ = ["SUPPORTED", "convert", "from_hf", "from_timm", "from_torchvision"]
