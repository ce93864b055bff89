"""transformers audio encoders -> :class:`~multimodal.AudioClassifier`: AST and Whisper's
encoder.

AST (``ASTModel``, ``ASTForAudioClassification``): overlapping ``p x p`` patches of the
(mel, time) fbank with strides ``(frequency_stride, time_stride)``, a class and a
distillation token, learned positions for exactly ``max_length`` frames, post-LN-free
pre-norm ViT blocks, a final LayerNorm; the classifier is ``dense(LN((h_cls + h_dist) / 2))``.
Ours: ``mode="patches"``, ``freq_stride``, ``distill_token=True``, ``pool="cls"``,
``head_norm=True``, ``pos_embed="learned"`` with ``pos_frames = max_length``.

- AST orders patch tokens frequency-major (token ``f * T_p + t``), ours time-major
  (``t * F_p + f``): attention is equivariant to the order of the tokens, so only the
  position table is reordered; ``last_hidden_state`` equals our ``forward_features`` with
  the patch tokens permuted back (:func:`ast_token_order`).
- AST adds position rows to its two prefix tokens; ours carry no position, so those rows
  are folded into the tokens (``cls + pos_0``, ``dist + pos_1``): the same sum.

Whisper's encoder (``WhisperModel``; ``WhisperForConditionalGeneration`` converts whole,
encoder and decoder, with :func:`whisper_from_hf`, and the encoder is its ``encoder``): the
stem ``GELU(conv2(GELU(conv1(x))))`` (stride 2 on the second), the stored sinusoidal
position table (``embed_positions``, ``max_source_positions`` rows) as our learned table,
pre-norm blocks with LayerNorm eps 1e-5 and no key bias (a zero bias in our fused
``qkv``), and the final LayerNorm. Ours: ``mode="conv"``, ``pool="mean"``, no head;
``forward_features(input_features.transpose(1, 2))`` equals ``last_hidden_state``.

Front ends come along: the converted AST reads waveforms through Kaldi's fbank normalised
with AST's AudioSet statistics ``(x - mean) / (2 std)``, Whisper through its log-mel and
``(L + 4) / 4`` (``frontend`` of the config, ``model(waveform=...)``;
:mod:`multimodal.tokenizers.audio_frontends`). A folder's ``preprocessor_config.json``
overrides the statistics (:mod:`multimodal.convert.hf_preprocess`).
"""

from __future__ import annotations

from typing import Any

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
)
from multimodal.convert.hf_vision import vit_encoder_layers
from multimodal.models.audio import AudioClassifier, AudioClassifierConfig
from multimodal.models.text import TextDecoderConfig
from multimodal.models.whisper import WHISPER_LANGUAGES, Whisper, WhisperConfig
from multimodal.tokenizers.audio_frontends import AST_MEAN, AST_STD


def ast_token_order(freq_patches: int, time_patches: int, prefix: int = 2) -> Tensor:
    """Index ``idx`` with ``ours[:, idx] == ast[:, :]``: AST's token ``prefix + f T + t``
    is our token ``prefix + t F + f``."""
    f, t = torch.meshgrid(torch.arange(freq_patches), torch.arange(time_patches), indexing="ij")
    return torch.cat([torch.arange(prefix), prefix + (t * freq_patches + f).flatten()])


def _hf_ast(model: nn.Module) -> AudioClassifier:
    """``ASTModel`` (``num_classes=0``: ``forward`` gives ``pooler_output``) or
    ``ASTForAudioClassification`` (``forward`` gives its ``logits``) -> AudioClassifier."""
    cfg, kind = model.config, type(model).__name__
    classifier = kind == "ASTForAudioClassification"
    dim = cfg_get(cfg, "hidden_size")
    config = AudioClassifierConfig(
        num_classes=cfg_get(cfg, "num_labels") if classifier else 0, pool="cls",
        mode="patches", n_mels=cfg_get(cfg, "num_mel_bins"), patch_size=cfg_get(cfg, "patch_size"),
        patch_stride=cfg_get(cfg, "time_stride"), freq_stride=cfg_get(cfg, "frequency_stride"),
        distill_token=True, head_norm=classifier, pos_embed="learned",
        pos_frames=cfg_get(cfg, "max_length"), max_frames=cfg_get(cfg, "max_length"),
        frontend="kaldi_fbank", dim=dim, depth=cfg_get(cfg, "num_hidden_layers"),
        heads=cfg_get(cfg, "num_attention_heads"), mlp_dim=cfg_get(cfg, "intermediate_size"),
        norm_eps=cfg_get(cfg, "layer_norm_eps"), activation=hf_activation(cfg, "hidden_act"),
        qkv_bias=bool(cfg_get(cfg, "qkv_bias", True)),
    )
    ours = build(AudioClassifier, config)
    set_normalisation(ours, AST_MEAN, 2 * AST_STD)
    fp, tp = ours.embed.freq_patches, ours._time_tokens(config.pos_frames)
    src = StateReader(model.state_dict(), kind,
                      prefix="audio_spectrogram_transformer." if classifier else "")
    e = "embeddings"
    pos = src.take(f"{e}.position_embeddings")
    if pos.numel() and pos.shape != (1, 2 + fp * tp, dim):
        raise ValueError(f"{kind}: {e}.position_embeddings has shape {tuple(pos.shape)}, the "
                         f"config's fbank grid needs (1, {2 + fp * tp}, {dim}) "
                         f"({fp} x {tp} patches + 2)")
    out: dict[str, Tensor] = {
        "cls_token": src.take(f"{e}.cls_token") + pos[:, :1],
        "dist_token": src.take(f"{e}.distillation_token") + pos[:, 1:2],
        # AST's rows are frequency-major (f, t); ours (t, f)
        "pos_table": pos[0, 2:].reshape(fp, tp, dim).transpose(0, 1).contiguous()
        if pos.numel() else pos,
        "embed.proj.weight": src.take(f"{e}.patch_embeddings.projection.weight"),
        "embed.proj.bias": src.take(f"{e}.patch_embeddings.projection.bias"),
    }
    vit_encoder_layers(out, src, config)  # AST's encoder is the transformers ViT's
    if classifier:
        src.prefix = ""
        put_norm(out, "head_norm", src, "classifier.layernorm")
        put_linear(out, "head", src.take("classifier.dense.weight"),
                   src.take("classifier.dense.bias"))
    src.finish()
    _keep_tokenizer_state(ours, out)
    return load_converted(ours, out)


def set_normalisation(model: AudioClassifier, mean: float, std: float) -> None:
    """The front end's ``(x - mean) / std``, the same for every mel bin, marked fitted."""
    with torch.no_grad():
        model.tokenizer.mean.fill_(mean)
        model.tokenizer.std.fill_(std)
        model.tokenizer.fitted.fill_(True)


def _keep_tokenizer_state(model: AudioClassifier, out: dict[str, Tensor]) -> None:
    """The front end's buffers (window, filter bank, normalisation) are ours, not the
    source's: keep the freshly built ones."""
    for key, value in model.state_dict().items():
        if key.startswith("tokenizer."):
            out.setdefault(key, value)


def _whisper_encoder(model: Any) -> tuple[AudioClassifierConfig, dict[str, Tensor]]:
    """The encoder config and state (our names) of a transformers Whisper."""
    cfg, kind = model.config, type(model).__name__
    prefix = "model.encoder." if kind == "WhisperForConditionalGeneration" else "encoder."
    state = model.state_dict()
    positions = cfg_get(cfg, "max_source_positions")
    config = AudioClassifierConfig(
        num_classes=0, pool="mean", mode="conv", n_mels=cfg_get(cfg, "num_mel_bins"),
        pos_embed="learned", pos_frames=2 * positions, max_frames=2 * positions,
        frontend="whisper", dim=cfg_get(cfg, "d_model"),
        depth=cfg_get(cfg, "encoder_layers"), heads=cfg_get(cfg, "encoder_attention_heads"),
        mlp_dim=cfg_get(cfg, "encoder_ffn_dim"), norm_eps=1e-5,
        activation=hf_activation(cfg, "activation_function"), qkv_bias=True,
    )
    src = StateReader({k: v for k, v in state.items() if k.startswith(prefix)}, kind, prefix)
    out: dict[str, Tensor] = {"pos_table": src.take("embed_positions.weight")}
    for conv in ("conv1", "conv2"):
        put_linear(out, f"embed.{conv}", src.take(f"{conv}.weight"), src.take(f"{conv}.bias"))
    for i in range(config.depth):
        _whisper_layer(out, src, f"layers.{i}", f"transformer.blocks.{i}", cross=False)
    put_norm(out, "transformer.norm", src, "layer_norm")
    src.finish()
    return config, out


def _whisper_layer(out: dict[str, Tensor], src: StateReader, t: str, o: str,
                   cross: bool) -> None:
    """One Whisper layer: self-attention (no key bias: a zero bias in our fused ``qkv``),
    [cross-attention: ``q``, fused ``kv``], MLP, and their pre-norms."""
    a = f"{t}.self_attn"
    q_bias = src.take(f"{a}.q_proj.bias")
    put_linear(out, f"{o}.attn.qkv",
               torch.cat([src.take(f"{a}.{p}_proj.weight") for p in "qkv"]),
               torch.cat([q_bias, torch.zeros_like(q_bias), src.take(f"{a}.v_proj.bias")]))
    put_linear(out, f"{o}.attn.proj", src.take(f"{a}.out_proj.weight"),
               src.take(f"{a}.out_proj.bias"))
    put_norm(out, f"{o}.norm1", src, f"{t}.self_attn_layer_norm")
    if cross:
        c = f"{t}.encoder_attn"
        put_linear(out, f"{o}.cross_attn.q", src.take(f"{c}.q_proj.weight"),
                   src.take(f"{c}.q_proj.bias"))
        v_bias = src.take(f"{c}.v_proj.bias")
        put_linear(out, f"{o}.cross_attn.kv",
                   torch.cat([src.take(f"{c}.k_proj.weight"), src.take(f"{c}.v_proj.weight")]),
                   torch.cat([torch.zeros_like(v_bias), v_bias]))
        put_linear(out, f"{o}.cross_attn.proj", src.take(f"{c}.out_proj.weight"),
                   src.take(f"{c}.out_proj.bias"))
        put_norm(out, f"{o}.norm_cross", src, f"{t}.encoder_attn_layer_norm")
    put_norm(out, f"{o}.norm2", src, f"{t}.final_layer_norm")
    for fc in ("fc1", "fc2"):
        put_linear(out, f"{o}.mlp.{fc}", src.take(f"{t}.{fc}.weight"),
                   src.take(f"{t}.{fc}.bias"))


def _hf_whisper(model: nn.Module) -> AudioClassifier:
    """``WhisperModel`` (the bare encoder-decoder, no output layer) -> its encoder as an
    AudioClassifier without head (a ``WhisperForConditionalGeneration`` converts whole:
    :func:`whisper_from_hf`)."""
    config, out = _whisper_encoder(model)
    ours = build(AudioClassifier, config)
    set_normalisation(ours, -4.0, 4.0)  # Whisper's (L + 4) / 4
    _keep_tokenizer_state(ours, out)
    return load_converted(ours, out)


def whisper_from_hf(model: Any, **tokens: Any) -> Whisper:
    """``WhisperForConditionalGeneration`` (a live transformers model, or anything with
    its ``config`` and ``state_dict()``) -> :class:`~multimodal.models.whisper.Whisper`,
    encoder and decoder. The decoder: learned positions (``max_target_positions``),
    pre-norm blocks with cross-attention (no key biases), final LayerNorm, output tied
    to the token embedding. Special tokens come from the config
    (``decoder_start_token_id``, ``eos_token_id``, ``suppress_tokens``,
    ``begin_suppress_tokens``) and the Whisper vocabulary layout (``<|notimestamps|>``
    = ``<|startoftranscript|>`` + ``len(languages)`` + 6 ...); ``tokens`` overrides
    :class:`~multimodal.models.whisper.WhisperConfig` token fields."""
    cfg, kind = model.config, type(model).__name__
    if kind != "WhisperForConditionalGeneration":
        raise ValueError(f"whisper_from_hf converts WhisperForConditionalGeneration (encoder "
                         f"and decoder with its output layer), got {kind}")
    enc_config, enc_state = _whisper_encoder(model)
    vocab = cfg_get(cfg, "vocab_size")
    dec_config = TextDecoderConfig(
        vocab_size=vocab, max_len=cfg_get(cfg, "max_target_positions"),
        dim=cfg_get(cfg, "d_model"), depth=cfg_get(cfg, "decoder_layers"),
        heads=cfg_get(cfg, "decoder_attention_heads"), mlp_dim=cfg_get(cfg, "decoder_ffn_dim"),
        norm_eps=1e-5, activation=hf_activation(cfg, "activation_function"),
        pos_embed="learned", tie_embeddings=True)
    src = StateReader({k: v for k, v in model.state_dict().items()
                       if k.startswith("model.decoder.")}, kind, "model.decoder.")
    out: dict[str, Tensor] = {f"encoder.{k}": v for k, v in enc_state.items()}
    out["decoder.tok_embed.weight"] = src.take("embed_tokens.weight")
    out["decoder.pos_embed.weight"] = src.take("embed_positions.weight")
    for i in range(dec_config.depth):
        _whisper_layer(out, src, f"layers.{i}", f"decoder.transformer.blocks.{i}", cross=True)
    put_norm(out, "decoder.transformer.norm", src, "layer_norm")
    src.finish()
    proj = model.state_dict().get("proj_out.weight")
    embed = out["decoder.tok_embed.weight"]  # a folder omits the tied copy: the same tensor
    if proj is not None and proj is not embed and not torch.equal(proj, embed):
        raise ValueError(f"{kind}: proj_out differs from the token embedding; Whisper ties "
                         "them (an untied output layer is not supported)")
    sot = cfg_get(cfg, "decoder_start_token_id")
    # 99 language tokens (100 with Cantonese from large-v3, vocabulary 51866); a vocabulary
    # too small for that layout (a tiny random test model) keeps the languages that fit
    # before <|notimestamps|> (sot + 6 + languages) and the suppressed ids inside it
    n_langs = len(tokens["languages"]) if tokens.get("languages") else \
        max(0, min(100 if vocab >= 51866 else 99, vocab - sot - 7))

    def inside(ids: Any) -> tuple[int, ...]:
        return tuple(int(i) for i in ids or () if 0 <= int(i) < vocab)

    fields = dict(eot_token_id=cfg_get(cfg, "eos_token_id"), sot_token_id=sot,
                  first_language_token_id=sot + 1,
                  languages=WHISPER_LANGUAGES[:n_langs],
                  translate_token_id=sot + 1 + n_langs,
                  transcribe_token_id=sot + 2 + n_langs,
                  no_timestamps_token_id=sot + 6 + n_langs,
                  suppress_tokens=inside(getattr(cfg, "suppress_tokens", None)),
                  begin_suppress_tokens=inside(getattr(cfg, "begin_suppress_tokens", None)))
    fields.update(tokens)
    ours = build(Whisper, WhisperConfig(encoder=enc_config, decoder=dec_config, **fields))
    set_normalisation(ours.encoder, -4.0, 4.0)
    for key, value in ours.state_dict().items():
        if key.startswith("encoder.tokenizer."):
            out.setdefault(key, value)
    return load_converted(ours, out)


register_hf(_hf_ast, "ASTModel", "ASTForAudioClassification")
register_hf(_hf_whisper, "WhisperModel")
register_hf(whisper_from_hf, "WhisperForConditionalGeneration",
            tied={"WhisperForConditionalGeneration": ("proj_out.weight",
                                                      "model.decoder.embed_tokens.weight")})
register_hf_model_type("audio-spectrogram-transformer", "ASTModel",
                       "audio_spectrogram_transformer.", hidden_act="gelu",
                       layer_norm_eps=1e-12, qkv_bias=True, patch_size=16, frequency_stride=10,
                       time_stride=10, max_length=1024, num_mel_bins=128, num_labels=2)
register_hf_model_type("whisper", "WhisperModel", "model.", activation_function="gelu",
                       max_source_positions=1500, num_mel_bins=80)
