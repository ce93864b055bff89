"""transformers text models: GPT-2 and Llama -> :class:`~multimodal.TextDecoder`,
BERT -> :class:`~multimodal.TextEncoder`."""

from __future__ import annotations

import torch
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
    rope_theta,
)
from multimodal.models.text import TextDecoder, TextDecoderConfig, TextEncoder, TextEncoderConfig


def _hf_gpt2(model: nn.Module) -> TextDecoder:
    cfg = model.config
    if getattr(cfg, "scale_attn_by_inverse_layer_idx", False) or not getattr(
        cfg, "scale_attn_weights", True
    ):
        raise ValueError("GPT-2 variants with scale_attn_by_inverse_layer_idx=True or "
                         "scale_attn_weights=False are not supported")
    # add_cross_attention (the decoder of a VisionEncoderDecoderModel): after each
    # self-attention, ln_cross_attn + crossattention (q_attn on the tokens, c_attn = [k; v]
    # on a memory of width n_embd) -> our Block's norm_cross / cross_attn
    cross = bool(getattr(cfg, "add_cross_attention", False))
    lm = type(model).__name__ == "GPT2LMHeadModel"
    state = model.state_dict()
    tied = True
    if lm:
        tied = torch.equal(state["lm_head.weight"], state["transformer.wte.weight"])
    config = TextDecoderConfig(
        vocab_size=cfg.vocab_size, max_len=cfg.n_positions, dim=cfg.n_embd, depth=cfg.n_layer,
        heads=cfg.n_head, mlp_dim=cfg.n_inner or 4 * cfg.n_embd, pos_embed="learned",
        norm_eps=cfg.layer_norm_epsilon, activation=hf_activation(cfg, "activation_function"),
        tie_embeddings=tied, cross_attention=cross, memory_dim=cfg.n_embd if cross else None,
    )
    src = StateReader(state, type(model).__name__, prefix="transformer." if lm else "")
    out: dict[str, Tensor] = {"tok_embed.weight": src.take("wte.weight"),
                              "pos_embed.weight": src.take("wpe.weight")}
    for i in range(config.depth):
        t, o = f"h.{i}", f"transformer.blocks.{i}"
        put_norm(out, f"{o}.norm1", src, f"{t}.ln_1")
        put_norm(out, f"{o}.norm2", src, f"{t}.ln_2")
        # Conv1D keeps (in, out) weights: transpose to nn.Linear's (out, in)
        for ours, theirs in (("attn.qkv", "attn.c_attn"), ("attn.proj", "attn.c_proj"),
                             ("mlp.fc1", "mlp.c_fc"), ("mlp.fc2", "mlp.c_proj")):
            put_linear(out, f"{o}.{ours}", src.take(f"{t}.{theirs}.weight").t(),
                       src.take(f"{t}.{theirs}.bias"))
        if cross:
            put_norm(out, f"{o}.norm_cross", src, f"{t}.ln_cross_attn")
            for ours, theirs in (("q", "q_attn"), ("kv", "c_attn"), ("proj", "c_proj")):
                put_linear(out, f"{o}.cross_attn.{ours}",
                           src.take(f"{t}.crossattention.{theirs}.weight").t(),
                           src.take(f"{t}.crossattention.{theirs}.bias"))
    put_norm(out, "transformer.norm", src, "ln_f")
    if lm:
        src.prefix = ""
        head = src.take("lm_head.weight")
        if not tied:
            out["lm_head.weight"] = head
    src.finish(ignore=(".attn.bias", ".attn.masked_bias",  # old causal-mask buffers
                       ".crossattention.bias", ".crossattention.masked_bias"))
    return load_converted(build(TextDecoder, config), out)


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
        activation=hf_activation(cfg, "hidden_act"), pos_embed="learned",
        type_vocab_size=cfg.type_vocab_size, embed_norm=True,
        num_classes=cfg.num_labels if kind == "BertForSequenceClassification" else 0,
        mlm_head=mlm, pooler=has_pooler,
    )
    src = StateReader(state, kind, prefix="" if kind == "BertModel" else "bert.")
    out: dict[str, Tensor] = {
        "tok_embed.weight": src.take("embeddings.word_embeddings.weight"),
        "pos_embed.weight": src.take("embeddings.position_embeddings.weight"),
        "type_embed.weight": src.take("embeddings.token_type_embeddings.weight"),
    }
    put_norm(out, "embed_norm", src, "embeddings.LayerNorm")
    for i in range(config.depth):
        t, o = f"encoder.layer.{i}", f"transformer.blocks.{i}"
        names = ("query", "key", "value")
        put_linear(out, f"{o}.attn.qkv",
                   torch.cat([src.take(f"{t}.attention.self.{n}.weight") for n in names]),
                   torch.cat([src.take(f"{t}.attention.self.{n}.bias") for n in names]))
        put_linear(out, f"{o}.attn.proj", src.take(f"{t}.attention.output.dense.weight"),
                   src.take(f"{t}.attention.output.dense.bias"))
        put_norm(out, f"{o}.norm1", src, f"{t}.attention.output.LayerNorm")
        put_linear(out, f"{o}.mlp.fc1", src.take(f"{t}.intermediate.dense.weight"),
                   src.take(f"{t}.intermediate.dense.bias"))
        put_linear(out, f"{o}.mlp.fc2", src.take(f"{t}.output.dense.weight"),
                   src.take(f"{t}.output.dense.bias"))
        put_norm(out, f"{o}.norm2", src, f"{t}.output.LayerNorm")
    if has_pooler:
        put_linear(out, "pooler.0", src.take("pooler.dense.weight"), src.take("pooler.dense.bias"))
    src.prefix = ""
    if mlm:
        p = "cls.predictions"
        put_linear(out, "mlm.dense", src.take(f"{p}.transform.dense.weight"),
                   src.take(f"{p}.transform.dense.bias"))
        put_norm(out, "mlm.norm", src, f"{p}.transform.LayerNorm")
        decoder = src.take(f"{p}.decoder.weight")
        if decoder.numel() and not torch.equal(decoder, out["tok_embed.weight"]):
            raise ValueError("BertForMaskedLM with an MLM decoder not tied to the word "
                             "embeddings is not supported")
        out["mlm.decoder.bias"] = src.take(f"{p}.bias", f"{p}.decoder.bias")
        src.skip(f"{p}.decoder.bias")
    if config.num_classes:
        put_linear(out, "head", src.take("classifier.weight"), src.take("classifier.bias"))
    src.finish(ignore=("embeddings.position_ids", "embeddings.token_type_ids"))
    return load_converted(build(TextEncoder, config), out)


def _hf_llama(model: nn.Module) -> TextDecoder:
    """``LlamaForCausalLM`` / ``LlamaModel`` -> :class:`~multimodal.TextDecoder`.

    RMSNorm, SwiGLU (``down(silu(gate x) * up x)``), grouped-query attention and 1-D
    rotary positions in the "rotate half" layout, all as backbone switches. ``LlamaModel``
    (no LM head) gets the tied head of the token embedding: its ``forward_features``
    equals ``last_hidden_state``.
    """
    cfg, state, kind = model.config, model.state_dict(), type(model).__name__
    dim, heads = cfg_get(cfg, "hidden_size"), cfg_get(cfg, "num_attention_heads")
    head_dim = getattr(cfg, "head_dim", None) or dim // heads
    if head_dim * heads != dim:
        raise ValueError(f"Llama with head_dim ({head_dim}) * heads ({heads}) != hidden_size "
                         f"({dim}) is not supported")
    lm = kind == "LlamaForCausalLM"
    tied = not lm or bool(getattr(cfg, "tie_word_embeddings", False))
    act = hf_activation(cfg, "hidden_act")
    attn_bias = bool(getattr(cfg, "attention_bias", False))
    config = TextDecoderConfig(
        vocab_size=cfg_get(cfg, "vocab_size"), max_len=cfg_get(cfg, "max_position_embeddings"),
        pos_embed="none", tie_embeddings=tied, dim=dim, depth=cfg_get(cfg, "num_hidden_layers"),
        heads=heads, kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        mlp_dim=cfg_get(cfg, "intermediate_size"), norm_type="rmsnorm",
        norm_eps=cfg_get(cfg, "rms_norm_eps", 1e-6), mlp_type="glu", activation=act,
        qkv_bias=attn_bias, proj_bias=attn_bias, mlp_bias=bool(getattr(cfg, "mlp_bias", False)),
        rope="1d", rope_base=rope_theta(cfg),
    )
    src = StateReader(state, kind, prefix="model." if lm else "")
    out: dict[str, Tensor] = {"tok_embed.weight": src.take("embed_tokens.weight")}
    for i in range(config.depth):
        t, o = f"layers.{i}", f"transformer.blocks.{i}"
        out[f"{o}.norm1.weight"] = src.take(f"{t}.input_layernorm.weight")
        out[f"{o}.norm2.weight"] = src.take(f"{t}.post_attention_layernorm.weight")
        a = f"{t}.self_attn"
        put_linear(out, f"{o}.attn.qkv",
                   torch.cat([src.take(f"{a}.{p}_proj.weight") for p in "qkv"]),
                   torch.cat([src.take(f"{a}.{p}_proj.bias") for p in "qkv"]) if attn_bias
                   else None)
        put_linear(out, f"{o}.attn.proj", src.take(f"{a}.o_proj.weight"),
                   src.take(f"{a}.o_proj.bias") if attn_bias else None)
        for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("fc2", "down_proj")):
            put_linear(out, f"{o}.mlp.{ours}", src.take(f"{t}.mlp.{theirs}.weight"),
                       src.take(f"{t}.mlp.{theirs}.bias") if config.mlp_bias else None)
    out["transformer.norm.weight"] = src.take("norm.weight")
    if lm:
        src.prefix = ""
        head = src.take("lm_head.weight")
        if not tied:
            out["lm_head.weight"] = head
    src.finish(ignore=("rotary_emb.inv_freq",))
    return load_converted(build(TextDecoder, config), out)


register_hf(_hf_gpt2, "GPT2Model", "GPT2LMHeadModel",
            tied={"GPT2LMHeadModel": ("lm_head.weight", "transformer.wte.weight")})
register_hf(_hf_bert, "BertModel", "BertForMaskedLM", "BertForSequenceClassification",
            tied={"BertForMaskedLM": ("cls.predictions.decoder.weight",
                                      "bert.embeddings.word_embeddings.weight")})
register_hf(_hf_llama, "LlamaForCausalLM", "LlamaModel",
            tied={"LlamaForCausalLM": ("lm_head.weight", "model.embed_tokens.weight")})
register_hf_model_type("bert", "BertModel", "bert.", hidden_act="gelu", layer_norm_eps=1e-12,
                       type_vocab_size=2, position_embedding_type="absolute",
                       is_decoder=False, num_labels=2)
register_hf_model_type("gpt2", "GPT2Model", "transformer.", activation_function="gelu_new",
                       layer_norm_epsilon=1e-5, n_inner=None, scale_attn_weights=True,
                       scale_attn_by_inverse_layer_idx=False, add_cross_attention=False)
register_hf_model_type("llama", "LlamaModel", "model.", hidden_act="silu", rms_norm_eps=1e-6,
                       attention_bias=False, mlp_bias=False, tie_word_embeddings=False,
                       rope_theta=10000.0)
