"""Position switches of the text encoder / Seq2Seq used by the road-to-attention study:
``pos_embed="none"`` adds nothing (the stack is then permutation-equivariant), rotary
positions (``rope="1d"``) make it order-aware again and depend only on relative offsets."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from multimodal.models.seq2seq import Seq2Seq, Seq2SeqConfig
from multimodal.models.text import TextDecoderConfig, TextEncoder, TextEncoderConfig


def encoder(**kw: object) -> TextEncoder:
    torch.manual_seed(0)
    return TextEncoder(TextEncoderConfig(vocab_size=50, max_len=32, dim=32, depth=2, heads=4,
                                         mlm_head=False, **kw)).eval()


def test_bad_pos_embed_is_named() -> None:
    with pytest.raises(ValueError, match="pos_embed"):
        TextEncoderConfig(pos_embed="rotary")


@torch.no_grad()
def test_no_positions_is_permutation_equivariant_and_rope_is_not() -> None:
    ids = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(1))
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(2))
    plain = encoder(pos_embed="none")
    assert plain.pos_embed is None
    torch.testing.assert_close(plain(ids[:, perm]), plain(ids)[:, perm])
    rotary = encoder(pos_embed="none", rope="1d")
    assert not torch.allclose(rotary(ids[:, perm]), rotary(ids)[:, perm], atol=1e-3)
    learned = encoder(pos_embed="learned")
    torch.nn.init.normal_(learned.pos_embed.weight, std=1.0)
    assert not torch.allclose(learned(ids[:, perm]), learned(ids)[:, perm], atol=1e-3)


@torch.no_grad()
def test_rope_encoder_depends_on_relative_positions_only() -> None:
    """RoPE scores are a function of i - j: the same tokens shifted right by padding on the
    left (masked out) give the same states, learned absolute positions do not."""
    ids = torch.randint(4, 50, (1, 10), generator=torch.Generator().manual_seed(3))
    shifted = torch.cat([torch.zeros(1, 5, dtype=torch.long), ids], dim=1)
    mask = torch.cat([torch.zeros(1, 5), torch.ones(1, 10)], dim=1).long()
    rotary = encoder(pos_embed="none", rope="1d")
    torch.testing.assert_close(rotary(shifted, attention_mask=mask)[:, 5:], rotary(ids),
                               atol=1e-5, rtol=1e-4)
    learned = encoder(pos_embed="learned")
    torch.nn.init.normal_(learned.pos_embed.weight, std=1.0)
    assert not torch.allclose(learned(shifted, attention_mask=mask)[:, 5:], learned(ids),
                              atol=1e-3)


def _benchmark():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "rnn_vs_transformer.py"
    spec = importlib.util.spec_from_file_location("rnn_vs_transformer", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["rnn_vs_transformer"] = module
    spec.loader.exec_module(module)
    return module


def test_benchmark_variants_build_what_they_name() -> None:
    bench = _benchmark()
    vocab = {"source_vocab_size": 40, "target_vocab_size": 14, "max_source_len": 96,
             "max_target_len": 29}
    torch.manual_seed(0)
    default = bench.transformer(vocab)
    torch.manual_seed(0)
    reference = Seq2Seq(Seq2SeqConfig(**vocab, dim=64, encoder_depth=2, decoder_depth=2,
                                      heads=4, mlp_dim=256))
    for (k1, a), (k2, b) in zip(default.state_dict().items(), reference.state_dict().items(),
                                strict=True):
        assert k1 == k2 and torch.equal(a, b)
    rope = bench.transformer(vocab, bench.parse_variant("transformer:pos=rope,norm=post")[1])
    for side in (rope.config.encoder, rope.config.decoder):
        assert side.pos_embed == "none" and side.backbone.rope == "1d"
    # post-norm reaches the encoder; the package's TextDecoder is fixed pre-norm
    assert rope.config.encoder.backbone.norm == "post"
    assert rope.config.decoder.backbone.norm == "pre"
    wide = bench.transformer(vocab, bench.parse_variant("transformer:dim=96,depth=1,mlp=3")[1])
    assert wide.config.encoder.dim == 96 and wide.config.decoder.backbone.depth == 1
    assert wide.config.encoder.backbone.mlp_dim == 288
    assert isinstance(TextDecoderConfig(pos_embed="none"), TextDecoderConfig)
    for bad in ("transformer:pos=alibi", "gru:dim=4", "transformer:width=3", "gpt"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"pos|variant|unknown"):
            bench.parse_variant(bad)


def test_benchmark_recipes_parse_per_model_and_grid_points() -> None:
    bench = _benchmark()
    assert bench.parse_recipe("gru+multiplicative@lr=3e-3,warmup=1") == (
        "gru+multiplicative", {"lr": 3e-3, "warmup": 1.0})
    assert bench.parse_recipe("transformer:dim=96,depth=1@lr=1e-3") == (
        "transformer:dim=96,depth=1", {"lr": 1e-3})
    assert bench.parse_recipe("lstm") == ("lstm", {})
    assert bench.grid_point("3e-3:1") == (3e-3, 1.0)
    assert bench.grid_point("1e-3") == (1e-3, 0.05)  # the budget mode's warm-up fraction
    for bad in ("gru@momentum=0.9", "gru@lr=fast", "gpt@lr=1e-3", "gru:dim=4@lr=1e-3"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"recipe|number|unknown|variant"):
            bench.parse_recipe(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="LR:WARMUP"):
        bench.grid_point("fast:1")
