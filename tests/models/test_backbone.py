"""Every model config nests one ``backbone: TransformerConfig``; the flat keywords of the
public API, and configs / checkpoints saved while configs were flat, still work."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import multimodal as mm
from multimodal.loading import from_pretrained
from multimodal.models.backbone import BACKBONE_FIELDS, model_config
from multimodal.nn.block import TransformerConfig
from multimodal.registry import MODEL_CLASSES
from multimodal.weights import config_from_dict, config_to_dict

FIXTURES = Path(__file__).parents[1] / "fixtures" / "flat_configs"

# dataclasses.asdict(Config()) as written by commit f0deffe, the last with flat configs
OLD_DEFAULTS = {
    "ViTConfig": {"image_size": 224, "patch_size": 16, "in_channels": 3, "num_classes": 1000,
                  "dim": 192, "depth": 12, "heads": 3, "mlp_dim": None, "pool": "cls",
                  "class_token": True, "pos_embed": "learned", "stem": "patch",
                  "dynamic_size": True, "dropout": 0.0, "attn_dropout": 0.0, "drop_path": 0.0,
                  "norm": "pre", "norm_eps": 1e-06, "activation": "gelu", "qkv_bias": True,
                  "checkpoint_activations": False},
    "TextDecoderConfig": {"vocab_size": 8000, "max_len": 256, "dim": 256, "depth": 6,
                          "heads": 8, "mlp_dim": None, "pos_embed": "learned",
                          "norm_eps": 1e-05, "activation": "gelu_tanh", "dropout": 0.0,
                          "attn_dropout": 0.0, "tie_embeddings": True,
                          "cross_attention": False, "memory_dim": None,
                          "checkpoint_activations": False, "attention_pattern": "full",
                          "attention_window": 256},
    "TextEncoderConfig": {"vocab_size": 8000, "max_len": 256, "dim": 256, "depth": 6,
                          "heads": 8, "mlp_dim": None, "norm": "pre", "norm_eps": 1e-06,
                          "activation": "gelu", "pos_embed": "learned", "type_vocab_size": 0,
                          "embed_norm": False, "dropout": 0.0, "attn_dropout": 0.0,
                          "num_classes": 0, "mlm_head": True, "pooler": False},
    "ImageGPTConfig": {"image_size": 28, "vocab_size": 256, "dim": 256, "depth": 8,
                       "heads": 8, "mlp_dim": None, "num_classes": 0, "dropout": 0.0,
                       "attn_dropout": 0.0, "norm_eps": 1e-05, "activation": "gelu",
                       "qkv_bias": True, "checkpoint_activations": False,
                       "attention_pattern": "full", "attention_window": 256},
    "AudioClassifierConfig": {"num_classes": 20, "dim": 192, "depth": 6, "heads": 3,
                              "mlp_dim": None, "pool": "mean", "mode": "frames", "n_mels": 80,
                              "stack_frames": 1, "patch_size": 16, "patch_stride": 10,
                              "max_frames": None, "sample_rate": 16000, "win_ms": 25.0,
                              "hop_ms": 10.0, "f_min": 0.0, "f_max": None,
                              "pos_embed": "sincos", "pos_frames": 100, "dropout": 0.0,
                              "attn_dropout": 0.0, "drop_path": 0.0, "freq_mask": 0,
                              "time_mask": 0, "spec_augment_masks": 0, "norm": "pre",
                              "norm_eps": 1e-06, "activation": "gelu", "qkv_bias": True},
    "Seq2SeqConfig": {"source_vocab_size": 8000, "target_vocab_size": 8000,
                      "max_source_len": 128, "max_target_len": 64, "dim": 128,
                      "encoder_depth": 3, "decoder_depth": 3, "heads": 4, "mlp_dim": None,
                      "dropout": 0.0, "share_embeddings": False},
}


@pytest.mark.parametrize("name", sorted(OLD_DEFAULTS))
def test_old_flat_defaults_read_as_todays_defaults(name: str) -> None:
    """A flat config dict of the old layout becomes a nested config, and the defaults did
    not drift while the fields moved (norm_eps, activation, ... per model)."""
    cls = getattr(mm, name)
    assert config_from_dict(cls, OLD_DEFAULTS[name]) == cls()


def test_flat_keywords_fold_into_the_backbone() -> None:
    flat = mm.ViTConfig(image_size=32, patch_size=4, in_channels=1, num_classes=10, dim=64,
                        depth=2, heads=4, mlp_dim=96, pool="mean")
    nested = mm.ViTConfig(image_size=32, patch_size=4, in_channels=1, num_classes=10,
                          pool="mean", backbone=TransformerConfig(dim=64, depth=2, heads=4,
                                                                  mlp_dim=96))
    assert flat == nested
    assert (flat.dim, flat.depth, flat.heads, flat.mlp_dim) == (64, 2, 4, 96)
    assert "dim" not in config_to_dict(flat) and config_to_dict(flat)["backbone"]["dim"] == 64
    # a keyword wins over the same setting inside a backbone argument
    both = mm.ViTConfig(backbone=TransformerConfig(dim=64, heads=4), dim=32)
    assert (both.dim, both.heads) == (32, 4)
    # writing through a property changes the backbone; replace() keeps configs apart
    other = dataclasses.replace(flat, depth=5)
    flat.depth = 3
    assert (flat.backbone.depth, other.depth) == (3, 5)
    assert other.backbone is not flat.backbone


def test_architecture_settings_are_fixed() -> None:
    """A decoder's backbone is causal and pre-norm whatever the keywords say."""
    dec = mm.TextDecoderConfig(backbone=TransformerConfig(causal=False, norm="post"))
    assert (dec.backbone.causal, dec.backbone.norm) == (True, "pre")
    assert mm.ImageGPTConfig().backbone.causal
    assert not mm.TextEncoderConfig().backbone.causal


def test_a_config_may_not_redeclare_backbone_fields() -> None:
    with pytest.raises(TypeError, match="declares backbone fields"):
        @model_config()
        class Bad:
            dim: int = 3


def test_a_new_backbone_field_reaches_every_model_config() -> None:
    """Every model config (and the sides of the composite ones) exposes every
    TransformerConfig field, so a new backbone switch needs no model-config edit."""
    configs = {n: c for n, c in ((n, cls.config_class) for n, cls in MODEL_CLASSES.items())}
    nested = {"Captioner": ("encoder", "decoder"), "Seq2Seq": ("encoder", "decoder"),
              "CLIP": ("vision", "text"), "CodecLM": ("ar", "nar"),
              "Whisper": ("encoder", "decoder")}
    recurrent = {"RNNSeq2Seq"}  # GRU/LSTM baselines: no transformer backbone to configure
    for name in recurrent:
        assert not hasattr(configs.pop(name)(), "backbone"), name
    for name, cls in configs.items():
        for part in nested.get(name, (None,)):
            config = cls() if part is None else getattr(cls(), part)
            assert isinstance(config.backbone, TransformerConfig), name
            for field in BACKBONE_FIELDS:
                assert getattr(config, field) == getattr(config.backbone, field), (name, field)


def test_seq2seq_flat_keywords_fill_both_sides() -> None:
    cfg = mm.Seq2SeqConfig(source_vocab_size=39, target_vocab_size=17, max_source_len=24,
                           max_target_len=12, dim=64, encoder_depth=2, decoder_depth=3,
                           heads=4, mlp_dim=256)
    enc, dec = cfg.encoder, cfg.decoder
    assert (enc.vocab_size, enc.max_len, enc.dim, enc.depth, enc.heads, enc.mlp_dim) == \
        (39, 24, 64, 2, 4, 256)
    assert (dec.vocab_size, dec.max_len, dec.dim, dec.depth, dec.heads, dec.mlp_dim) == \
        (17, 12, 64, 3, 4, 256)
    assert dec.cross_attention and dec.memory_dim == 64
    assert (enc.num_classes, enc.mlm_head) == (0, False)
    assert (cfg.max_target_len, cfg.decoder_depth, cfg.dim) == (12, 3, 64)
    assert config_from_dict(mm.Seq2SeqConfig, config_to_dict(cfg)) == cfg


@pytest.mark.parametrize("name", ["vit", "text_decoder", "seq2seq"])
def test_folders_saved_with_flat_configs_still_load(name: str, tmp_path: Path) -> None:
    """save_pretrained folders written by the flat-config code (tests/fixtures/flat_configs,
    see make.py there) load and give the outputs that code computed."""
    folder = FIXTURES / name
    assert "dim" in json.loads((folder / "config.json").read_text())["config"]
    model = mm.from_pretrained(folder)
    inputs = load_file(str(folder / "inputs.safetensors"))
    want = load_file(str(folder / "outputs.safetensors"))["output"]
    with torch.no_grad():
        got = model(*(inputs[f"input{i}"] for i in range(len(inputs))))
    torch.testing.assert_close(got, want)
    # and saving again writes the nested layout, which loads to the same model
    model.save_pretrained(tmp_path / name)
    saved = json.loads((tmp_path / name / "config.json").read_text())["config"]
    assert "dim" not in saved and "source_vocab_size" not in saved
    again = mm.from_pretrained(tmp_path / name)
    assert again.config == model.config


def test_lightning_checkpoint_with_flat_config_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "old.ckpt"
    shutil.copy(FIXTURES / "text_encoder.ckpt", path)
    model = from_pretrained(path)
    assert isinstance(model, mm.TextEncoder)
    assert (model.config.norm, model.config.embed_norm) == ("post", True)
    io = load_file(str(FIXTURES / "text_encoder_io.safetensors"))
    with torch.no_grad():
        torch.testing.assert_close(model(io["input0"]), io["output"])


def test_unknown_layer_variant_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="norm_type must be one of"):
        mm.Transformer(TransformerConfig(dim=8, depth=1, heads=2, norm_type="nope"))
    with pytest.raises(ValueError, match="unknown ViTConfig fields: \\['dims'\\]"):
        config_from_dict(mm.ViTConfig, {"dims": 3})


def test_switches_reach_model_configs():
    """A backbone switch is a TransformerConfig field, so every model config accepts it."""
    model = mm.TextDecoder(mm.TextDecoderConfig(vocab_size=50, max_len=16, dim=16, depth=1,
                                                heads=4, kv_heads=2, norm_type="rmsnorm",
                                                mlp_type="glu", activation="silu"))
    blk = model.transformer.blocks[0]
    assert isinstance(blk.norm1, nn.Module) and blk.attn.kv_heads == 2
    assert hasattr(blk.mlp, "gate")
