"""Bad Hugging Face folders give clear errors and no model (complements test_hf_folder.py:
no config.json, unsupported model_type, missing / unexpected keys, shape mismatch, missing
shard and pickle-only weights are tested there)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

import multimodal as mm
from multimodal.convert import hf_folder

transformers = pytest.importorskip("transformers")


def _ast(tmp_path):
    cfg = transformers.ASTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=32, max_length=32, num_mel_bins=24,
                                 patch_size=8, num_labels=3)
    transformers.ASTForAudioClassification(cfg).save_pretrained(tmp_path)
    return tmp_path


def _edit_config(folder, **changes):
    file = folder / "config.json"
    cfg = json.loads(file.read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    file.write_text(json.dumps(cfg))


def test_unsupported_architecture_lists_supported_ones(tmp_path):
    folder = _ast(tmp_path)
    _edit_config(folder, model_type="wav2vec2", architectures=["Wav2Vec2ForCTC"])
    with pytest.raises(ValueError) as err:
        mm.from_hf(folder)
    msg = str(err.value)
    assert "model_type='wav2vec2'" in msg and "Wav2Vec2ForCTC" in msg
    for name in ("'audio-spectrogram-transformer'", "'whisper'", "'ASTForAudioClassification'",
                 "'WhisperModel'", "'BertModel'"):
        assert name in msg, name


def test_audio_missing_and_unexpected_keys_are_listed(tmp_path):
    folder = _ast(tmp_path)
    file = folder / "model.safetensors"
    state = load_file(str(file))
    del state["classifier.layernorm.bias"]
    state["audio_spectrogram_transformer.embeddings.extra_token"] = torch.zeros(1, 1, 16)
    save_file(state, str(file))
    with pytest.raises(ValueError, match=r"missing: classifier\.layernorm\.bias.*not converted"
                                         r".*audio_spectrogram_transformer\.embeddings\."
                                         r"extra_token"):
        mm.from_hf(folder)


def test_whisper_shape_mismatch_names_both_shapes(tmp_path):
    cfg = transformers.WhisperConfig(
        d_model=16, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_layers=1, decoder_attention_heads=2, decoder_ffn_dim=32, num_mel_bins=8,
        max_source_positions=10, vocab_size=50, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, decoder_start_token_id=1)
    transformers.WhisperModel(cfg).save_pretrained(tmp_path)
    _edit_config(tmp_path, num_mel_bins=10)  # the stem's conv1 was saved for 8 mel bins
    with pytest.raises(ValueError, match=r"embed\.conv1\.weight: expected \(16, 10, 3\), "
                                         r"got \(16, 8, 3\)"):
        mm.from_hf(tmp_path)


def test_config_without_a_needed_key_is_named(tmp_path):
    folder = _ast(tmp_path)
    _edit_config(folder, hidden_size=None)
    with pytest.raises(ValueError, match=r"config has no 'hidden_size'"):
        mm.from_hf(folder)


def test_config_json_that_is_not_json(tmp_path):
    folder = _ast(tmp_path)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config\.json is not valid JSON"):
        mm.from_hf(folder)


def _sharded_bert(tmp_path):
    model = transformers.BertModel(transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32))
    model.save_pretrained(tmp_path, max_shard_size="8KB")
    index = tmp_path / "model.safetensors.index.json"
    assert index.is_file()
    return index


def test_missing_shard_reads_no_shard_at_all(tmp_path, monkeypatch):
    """Nothing half-loaded: every shard is checked before the first one is read."""
    index = _sharded_bert(tmp_path)
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    (tmp_path / shards[-1]).unlink()
    import safetensors.torch

    reads = []
    real = safetensors.torch.load_file
    monkeypatch.setattr(safetensors.torch, "load_file", lambda f, *a, **k: reads.append(f)
                        or real(f, *a, **k))
    with pytest.raises(FileNotFoundError, match=shards[-1]):
        hf_folder.read_hf_weights(tmp_path)
    assert reads == []


def test_index_and_shards_that_disagree_are_listed(tmp_path):
    index = _sharded_bert(tmp_path)
    data = json.loads(index.read_text())
    key = sorted(data["weight_map"])[0]
    data["weight_map"]["pooler.extra.weight"] = data["weight_map"].pop(key)
    index.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=rf"in the index only: \['pooler\.extra\.weight'\]; "
                                         rf"in the shards only: \['{key}'\]"):
        mm.from_hf(tmp_path)


def test_converted_audio_model_round_trips_through_save_pretrained(tmp_path):
    ours = mm.from_hf(_ast(tmp_path / "src"))
    ours.save_pretrained(tmp_path / "ours")
    again = mm.from_pretrained(tmp_path / "ours")
    x = torch.randn(2, 32, 24)
    with torch.no_grad():
        torch.testing.assert_close(again(x), ours(x), rtol=0, atol=0)
    wave = torch.randn(16000) * 0.1
    with torch.no_grad():
        torch.testing.assert_close(again(waveform=wave), ours(waveform=wave), rtol=0, atol=0)


def test_folder_weights_are_assigned_once_and_tied_weights_stay_tied(tmp_path):
    """Folder loading builds the model without parameter memory and assigns the file's
    tensors (one copy): every parameter ends real, trainable, and GPT-2's tied output
    layer is still the token embedding."""
    source = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=60, n_embd=16, n_layer=1, n_head=2)).eval()
    source.save_pretrained(tmp_path)
    ours = mm.from_hf(tmp_path)
    assert ours.lm_head.weight is ours.tok_embed.weight
    assert all(p.device.type == "cpu" and p.requires_grad for p in ours.parameters())
    assert torch.nn.Linear(2, 2).weight.device.type == "cpu"  # the meta patch is undone
    ids = torch.randint(0, 60, (1, 6))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), source(ids).logits, atol=1e-4, rtol=1e-4)


def test_meta_parameters_acts_only_in_its_own_context() -> None:
    """Inside ``meta_parameters`` new parameters land on ``meta`` (buffers stay real); a
    model built meanwhile in another thread, and any model built after it, stays real."""
    import threading

    from multimodal.convert.common import meta_parameters

    built: dict[str, nn.Module] = {}
    with meta_parameters():
        inside = nn.BatchNorm1d(4)
        thread = threading.Thread(target=lambda: built.setdefault("other", nn.Linear(3, 2)))
        thread.start()
        thread.join()
    after = nn.Linear(3, 2)
    assert inside.weight.is_meta and inside.bias.is_meta
    assert not inside.running_mean.is_meta  # buffers keep their values
    assert not any(p.is_meta for p in built["other"].parameters())
    assert not any(p.is_meta for p in after.parameters())
