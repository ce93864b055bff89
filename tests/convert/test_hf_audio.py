"""AST and Whisper's encoder converted from transformers give the source's outputs (fp32,
atol 1e-4); sources are random-weight models of small configs (no download). Folders
written with ``save_pretrained`` load with the transformers import blocked."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import multimodal as mm
from multimodal import convert
from multimodal.convert.hf_audio import ast_token_order

transformers = pytest.importorskip("transformers")

ATOL = 1e-4
ROOT = Path(__file__).resolve().parents[2]


def _perturb(model: nn.Module) -> nn.Module:
    """Random weights everywhere (norms start at (1, 0), tokens and positions at 0, which
    would hide a mix-up)."""
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def ast(kind="ASTForAudioClassification", **kw):
    args = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=48, patch_size=8, frequency_stride=5, time_stride=6,
                max_length=40, num_mel_bins=24, num_labels=5)
    args.update(kw)
    torch.manual_seed(0)
    return _perturb(getattr(transformers, kind)(transformers.ASTConfig(**args)))


def whisper(kind="WhisperModel", **kw):
    args = dict(d_model=32, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=48,
                decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=48, num_mel_bins=16,
                max_source_positions=30, vocab_size=100, pad_token_id=0, bos_token_id=1,
                eos_token_id=2, decoder_start_token_id=1)
    args.update(kw)
    torch.manual_seed(0)
    return _perturb(getattr(transformers, kind)(transformers.WhisperConfig(**args)))


def test_ast_classifier_logits_match():
    source = ast()
    ours = convert.from_hf(source)
    assert isinstance(ours, mm.AudioClassifier)
    c = ours.config
    assert (c.mode, c.patch_stride, c.freq_stride, c.distill_token, c.head_norm) == \
        ("patches", 6, 5, True, True)
    x = torch.randn(3, 40, 24)  # (B, max_length frames, mel bins), as AST's input_values
    with torch.no_grad():
        torch.testing.assert_close(ours(x), source(x).logits, atol=ATOL, rtol=1e-4)
        # the head is dense(LN((h_cls + h_dist) / 2)) of the final-normed tokens
        h = source.audio_spectrogram_transformer(x).last_hidden_state
        by_hand = source.classifier.dense(source.classifier.layernorm((h[:, 0] + h[:, 1]) / 2))
        torch.testing.assert_close(ours(x), by_hand, atol=ATOL, rtol=1e-4)


def test_ast_model_hidden_states_and_pooler_match():
    source = ast("ASTModel", frequency_stride=10, time_stride=4, patch_size=16, max_length=36)
    ours = convert.from_hf(source)
    x = torch.randn(2, 36, 24)
    with torch.no_grad():
        want = source(x)
        tokens = ours.forward_features(x)
        # our patch tokens are time-major, AST's frequency-major: same set, reordered
        fp, tp = ours.embed.freq_patches, ours.embed.time_patches(36)
        assert (fp, tp) == (1, 6) and tokens.shape == want.last_hidden_state.shape
        torch.testing.assert_close(tokens[:, ast_token_order(fp, tp)],
                                   want.last_hidden_state, atol=ATOL, rtol=1e-4)
        torch.testing.assert_close(ours(x), want.pooler_output, atol=ATOL, rtol=1e-4)


def test_ast_token_order_is_a_permutation_of_the_patch_grid():
    idx = ast_token_order(3, 4)
    assert sorted(idx.tolist()) == list(range(14))
    # AST token 2 + f*4 + t (f=1, t=2 -> 8) is ours 2 + t*3 + f (= 9)
    assert idx[8].item() == 9


@pytest.mark.parametrize("kind", ["WhisperModel", "WhisperForConditionalGeneration"])
def test_whisper_encoder_last_hidden_state_matches(kind):
    source = whisper(kind)
    converted = convert.from_hf(source)
    # the bare WhisperModel gives its encoder; WhisperForConditionalGeneration comes whole
    whole = kind == "WhisperForConditionalGeneration"
    assert isinstance(converted, mm.Whisper if whole else mm.AudioClassifier)
    ours = converted.encoder if whole else converted
    assert ours.config.mode == "conv"
    encoder = source.get_encoder()
    features = torch.randn(2, 16, 60)  # (B, mel bins, 2 * max_source_positions)
    with torch.no_grad():
        want = encoder(features).last_hidden_state
        got = ours.forward_features(features.transpose(1, 2))
    torch.testing.assert_close(got, want, atol=ATOL, rtol=1e-4)


def test_whisper_stem_is_two_convs_with_gelu_by_hand():
    ours = convert.from_hf(whisper())
    x = torch.randn(1, 9, 16)
    stem = ours.embed
    with torch.no_grad():
        h = torch.nn.functional.conv1d(x.transpose(1, 2), stem.conv1.weight, stem.conv1.bias,
                                       padding=1)
        h = torch.nn.functional.gelu(h)
        y = torch.nn.functional.conv1d(h, stem.conv2.weight, stem.conv2.bias, stride=2, padding=1)
        want = torch.nn.functional.gelu(y).transpose(1, 2)
        torch.testing.assert_close(stem(x), want)
    assert want.shape[1] == 5 and stem.output_lengths(torch.tensor([9, 8, 1])).tolist() == [5, 4, 1]


_BLOCKED = textwrap.dedent("""
    import sys
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name == "transformers" or name.startswith("transformers."):
                raise ImportError("transformers is blocked in this test")
    sys.meta_path.insert(0, Block())
    import torch
    from safetensors.torch import load_file
    import multimodal as mm
    for folder in sys.argv[1:]:
        io = load_file(folder + "/io.safetensors")
        model = mm.from_hf(folder)  # a WhisperForConditionalGeneration: the whole Whisper
        with torch.no_grad():
            got = model(io["input"]) if "ast" in folder else \
                model.encoder.forward_features(io["input"])
        torch.testing.assert_close(got, io["output"], atol=1e-4, rtol=1e-4)
        print("ok", folder, type(model).__name__)
    assert "transformers" not in sys.modules
""")


def test_audio_folders_load_without_transformers(tmp_path):
    src_ast, src_whisper = ast(), whisper("WhisperForConditionalGeneration")
    x, f = torch.randn(2, 40, 24), torch.randn(2, 16, 60)
    with torch.no_grad():
        cases = {"ast": (src_ast, x, src_ast(x).logits),
                 "whisper": (src_whisper, f.transpose(1, 2),
                             src_whisper.get_encoder()(f).last_hidden_state)}
    for name, (model, inp, out) in cases.items():
        model.save_pretrained(tmp_path / name)
        save_file({"input": inp.contiguous(), "output": out.contiguous()},
                  str(tmp_path / name / "io.safetensors"))
    assert json.loads((tmp_path / "whisper" / "config.json").read_text())["architectures"] == \
        ["WhisperForConditionalGeneration"]
    run = subprocess.run([sys.executable, "-c", _BLOCKED, str(tmp_path / "ast"),
                          str(tmp_path / "whisper")], capture_output=True, text=True, cwd=ROOT,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("ok ") == 2, run.stdout


def test_ast_position_table_of_another_length_is_named(tmp_path):
    source = ast("ASTModel")
    source.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["max_length"] = 52  # one more column of patches than the stored table has
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"position_embeddings has shape \(1, 26, 32\).*"
                                         r"needs \(1, 34, 32\)"):
        mm.from_hf(tmp_path)
