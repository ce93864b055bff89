"""Whisper whole (encoder + cross-attending decoder on the shared backbone) against
transformers' WhisperForConditionalGeneration, and the CTranslate2 reader against files
written by CTranslate2's own converter (tiny random models; the real wheels: slow tests in
tests/convert/test_ctranslate2_real.py)."""

from __future__ import annotations

import copy
import json
import shutil
import struct
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import multimodal as mm  # noqa: E402
from multimodal.convert.ctranslate2 import (  # noqa: E402
    from_ctranslate2,
    read_ctranslate2,
)
from multimodal.convert.hf_audio import whisper_from_hf  # noqa: E402
from multimodal.models.whisper import Whisper  # noqa: E402

# a tiny vocabulary laid out as Whisper's: text tokens, <|endoftext|>, <|startoftranscript|>,
# languages, task tokens, <|notimestamps|> (the converter appends timestamp tokens)
TEXT = [chr(c) for c in range(ord("a"), ord("a") + 40)]
SPECIAL = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|de|>", "<|translate|>",
           "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>",
           "<|notimestamps|>"]
VOCAB = TEXT + SPECIAL
EOT, SOT = VOCAB.index("<|endoftext|>"), VOCAB.index("<|startoftranscript|>")
NO_TS = VOCAB.index("<|notimestamps|>")
VOCAB_SIZE = len(VOCAB) + 6  # + timestamp tokens
SUPPRESS = [3, 7, 11, *range(SOT, NO_TS)]
BEGIN_SUPPRESS = [5, EOT]
MEL_FRAMES = 100  # max_source_positions 50


def hf_whisper(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = transformers.WhisperConfig(
        vocab_size=VOCAB_SIZE, num_mel_bins=16, d_model=32, encoder_layers=2,
        decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=MEL_FRAMES // 2,
        max_target_positions=40, pad_token_id=EOT, bos_token_id=EOT, eos_token_id=EOT,
        decoder_start_token_id=SOT, suppress_tokens=SUPPRESS,
        begin_suppress_tokens=BEGIN_SUPPRESS)
    model = transformers.WhisperForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # non-trivial norms and biases, a sharper output distribution
        for name, p in model.named_parameters():
            if name.endswith("bias") or "layer_norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
        model.model.decoder.embed_tokens.weight.mul_(8.0)
    return model


def features(batch: int = 2, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, MEL_FRAMES, 16, generator=g)


def hf_generate(hf, feats, prompt, **kw):
    """transformers' generation loop with Whisper's suppressions, from ``prompt``."""
    ids = torch.tensor([prompt] * feats.shape[0])
    out = transformers.GenerationMixin.generate(
        hf, input_features=feats.transpose(1, 2), decoder_input_ids=ids,
        suppress_tokens=SUPPRESS, begin_suppress_tokens=BEGIN_SUPPRESS, eos_token_id=EOT,
        pad_token_id=EOT, max_new_tokens=12, do_sample=False, **kw)
    return out


def strip(ids: torch.Tensor) -> list[list[int]]:
    rows = []
    for row in ids.tolist():
        rows.append(row[: row.index(EOT) + 1] if EOT in row[2:] else row)
    return rows


def test_whole_whisper_matches_transformers_logits_and_tokens():
    hf = hf_whisper()
    ours = whisper_from_hf(hf, languages=("en", "de"), translate_token_id=SOT + 3,
                           transcribe_token_id=SOT + 4, no_timestamps_token_id=NO_TS)
    assert isinstance(ours, Whisper)
    # one Transformer config each: the decoder cross-attends, the encoder does not
    assert ours.decoder.config.backbone.cross_attention
    assert not ours.encoder.config.backbone.cross_attention
    feats = features()
    ids = torch.tensor([[SOT, NO_TS, 1, 2, 3], [SOT, NO_TS, 9, 8, 7]])
    with torch.no_grad():
        want = hf(input_features=feats.transpose(1, 2), decoder_input_ids=ids).logits
        got = ours(feats, ids)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    prompt = ours.prompt()
    assert prompt == [SOT, NO_TS]  # English-only (small vocabulary): no language, no task
    for beams in (1, 3):
        mine = ours.generate(feats, max_new_tokens=12, num_beams=beams)
        theirs = hf_generate(hf, feats, prompt, num_beams=beams)
        assert strip(mine) == strip(theirs), beams


def test_suppressed_tokens_never_appear_and_begin_suppression_holds():
    hf = hf_whisper(seed=3)
    ours = whisper_from_hf(hf, languages=("en", "de"), no_timestamps_token_id=NO_TS)
    with torch.no_grad():  # make suppressed tokens the most likely ones
        ours.decoder.tok_embed.weight[SUPPRESS[0]].mul_(50)
        ours.decoder.tok_embed.weight[BEGIN_SUPPRESS[0]].mul_(50)
    out = ours.generate(features(4), max_new_tokens=10)
    generated = out[:, 2:]
    assert not torch.isin(generated, torch.tensor(SUPPRESS)).any()
    assert not torch.isin(generated[:, 0], torch.tensor(BEGIN_SUPPRESS)).any()
    # without the rules the same model does emit them: the rules are what removed them
    plain = mm.generation.generate(ours.decoder, out[:, :2], 10,
                                   memory=ours.encode(features(4)))
    assert torch.isin(plain[:, 2:], torch.tensor(SUPPRESS + BEGIN_SUPPRESS)).any()


def test_multilingual_prompt_and_language_detection():
    hf = hf_whisper()
    ours = whisper_from_hf(hf, languages=("en", "de"), translate_token_id=SOT + 3,
                           transcribe_token_id=SOT + 4, no_timestamps_token_id=NO_TS,
                           multilingual=True)
    assert ours.prompt("de", "translate") == [SOT, SOT + 2, SOT + 3, NO_TS]
    assert ours.prompt("en") == [SOT, SOT + 1, SOT + 4, NO_TS]
    memory = ours.encode(features())
    logits = ours.decoder(torch.tensor([[SOT]] * 2), memory=memory)[:, -1, SOT + 1 : SOT + 3]
    want = [("en", "de")[i] for i in logits.argmax(-1).tolist()]
    assert ours.detect_language(memory) == want
    out = ours.generate(features(), max_new_tokens=3)
    assert [ours.config.languages[t - SOT - 1] for t in out[:, 1].tolist()] == want
    with pytest.raises(ValueError, match="unknown language 'xx'"):
        ours.prompt("xx")


def test_whisper_save_and_reload_gives_the_same_tokens(tmp_path):
    ours = whisper_from_hf(hf_whisper(), languages=("en", "de"), no_timestamps_token_id=NO_TS)
    ours.save_pretrained(tmp_path / "w")
    again = mm.from_pretrained(tmp_path / "w")
    assert isinstance(again, Whisper)
    assert again.config.suppress_tokens == ours.config.suppress_tokens
    assert torch.equal(again.generate(features(), max_new_tokens=6),
                       ours.generate(features(), max_new_tokens=6))


# -- CTranslate2 directories written by CTranslate2's own converter ---------------------


class _Tokenizer:
    """What CTranslate2's Whisper loader reads of a tokenizer."""

    additional_special_tokens = SPECIAL

    def get_vocab(self):
        return {t: i for i, t in enumerate(VOCAB)}

    def convert_tokens_to_ids(self, token):
        return VOCAB.index(token)


def write_ct2(hf, folder: Path, quantization: str) -> Path:
    ct2 = pytest.importorskip("ctranslate2")
    from ctranslate2.converters.transformers import WhisperLoader

    # a copy: the converter's int8 quantisation scales the float32 weights in place
    spec = WhisperLoader()(copy.deepcopy(hf), _Tokenizer())
    spec.validate()
    spec.optimize(quantization=quantization)
    folder.mkdir(parents=True)
    spec.save(str(folder))
    assert (folder / "model.bin").is_file() and ct2
    return folder


@pytest.fixture(scope="module")
def ct2_dirs(tmp_path_factory):
    hf = hf_whisper()
    root = tmp_path_factory.mktemp("ct2")
    return hf, {q: write_ct2(hf, root / q, q) for q in ("float32", "float16", "int8")}


def _logits(model, feats, ids):
    with torch.no_grad():
        if isinstance(model, Whisper):
            return model(feats, ids)
        return model(input_features=feats.transpose(1, 2), decoder_input_ids=ids).logits


def test_ctranslate2_float32_directory_gives_transformers_outputs(ct2_dirs):
    hf, dirs = ct2_dirs
    ours = from_ctranslate2(dirs["float32"])
    assert ours.config.suppress_tokens == tuple(SUPPRESS)
    assert ours.config.begin_suppress_tokens == tuple(BEGIN_SUPPRESS)
    assert ours.config.languages == ("en", "de")
    assert (ours.config.no_timestamps_token_id, ours.config.eot_token_id) == (NO_TS, EOT)
    feats, ids = features(), torch.tensor([[SOT, NO_TS, 4, 5], [SOT, NO_TS, 6, 1]])
    torch.testing.assert_close(_logits(ours, feats, ids), _logits(hf, feats, ids),
                               atol=1e-4, rtol=0)
    assert strip(ours.generate(feats, max_new_tokens=12)) == \
        strip(hf_generate(hf, feats, [SOT, NO_TS]))
    # the same entry point as Hugging Face folders
    assert isinstance(mm.from_hf(dirs["float32"]), Whisper)


def test_ctranslate2_float16_weights_are_the_rounded_weights(ct2_dirs):
    _, dirs = ct2_dirs
    ours = from_ctranslate2(dirs["float16"])
    rounded = hf_whisper()
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.half().float())
    feats, ids = features(), torch.tensor([[SOT, NO_TS, 4, 5]] * 2)
    torch.testing.assert_close(_logits(ours, feats, ids), _logits(rounded, feats, ids),
                               atol=1e-4, rtol=0)


def test_ctranslate2_int8_weights_dequantise_within_half_a_step(ct2_dirs):
    hf, dirs = ct2_dirs
    model = read_ctranslate2(dirs["int8"])
    assert model.storage == "int8"
    w = model.variables["decoder/layer_0/ffn/linear_0/weight"]
    ref = hf.model.decoder.layers[0].fc1.weight.detach()
    step = ref.abs().amax(dim=1, keepdim=True) / 127  # one int8 step per row
    assert ((w - ref).abs() <= step / 2 + 1e-7).all()
    assert (w - ref).abs().max() > 0  # really quantised
    ours = from_ctranslate2(dirs["int8"])
    feats, ids = features(), torch.tensor([[SOT, NO_TS, 4, 5]] * 2)
    err = (_logits(ours, feats, ids) - _logits(hf, feats, ids)).abs().max()
    assert err < 0.5


def _same_variables(a, b):
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_split_model_bin_parts_are_joined(ct2_dirs, tmp_path):
    _, dirs = ct2_dirs
    whole = read_ctranslate2(dirs["float16"]).variables
    data = (dirs["float16"] / "model.bin").read_bytes()
    cut = len(data) // 3
    here = tmp_path / "here"
    shutil.copytree(dirs["float16"], here)
    (here / "model.bin").unlink()
    (here / "model.bin.part1").write_bytes(data[:cut])
    (here / "model.bin.part2").write_bytes(data[cut:])
    _same_variables(read_ctranslate2(here).variables, whole)
    # as split wheels install: part2 in the folder whose path differs by the part number
    one, two = tmp_path / "pkg_part1" / "data", tmp_path / "pkg_part2" / "data"
    shutil.copytree(here, one)
    two.mkdir(parents=True)
    (one / "model.bin.part2").rename(two / "model.bin.part2")
    _same_variables(read_ctranslate2(one).variables, whole)
    assert isinstance(mm.from_hf(one), Whisper)
    (two / "model.bin.part2").unlink()
    with pytest.raises(ValueError, match=r"truncated.*model.bin.partN missing"):
        read_ctranslate2(one)


def test_ctranslate2_bad_files_are_named_errors(ct2_dirs, tmp_path):
    _, dirs = ct2_dirs
    data = (dirs["float32"] / "model.bin").read_bytes()
    bad = tmp_path / "bad"
    shutil.copytree(dirs["float32"], bad)
    (bad / "model.bin").write_bytes(data[: len(data) - 1000])
    with pytest.raises(ValueError, match=r"bad/model.bin is truncated"):
        read_ctranslate2(bad)
    (bad / "model.bin").write_bytes(struct.pack("<I", 5) + data[4:])
    with pytest.raises(ValueError, match="unsupported CTranslate2 binary version 5"):
        read_ctranslate2(bad)
    # the first variable's dtype byte: after version, name, revision, count, the
    # variable's name and its rank / shape
    (n,) = struct.unpack_from("<H", data, 4)
    pos = 4 + 2 + n + 4 + 4
    (m,) = struct.unpack_from("<H", data, pos)
    pos += 2 + m
    rank = data[pos]
    pos += 1 + 4 * rank
    corrupt = bytearray(data)
    corrupt[pos] = 9
    (bad / "model.bin").write_bytes(bytes(corrupt))
    with pytest.raises(ValueError, match="unsupported dtype code 9"):
        read_ctranslate2(bad)
    (bad / "model.bin").write_bytes(data + b"junk")
    with pytest.raises(ValueError, match="bytes after the last alias"):
        read_ctranslate2(bad)
    (bad / "model.bin").write_bytes(data)
    (bad / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        mm.from_hf(bad)


def test_load_encoder_of_a_ctranslate2_directory_is_the_audio_encoder(ct2_dirs):
    hf, dirs = ct2_dirs
    enc = mm.load_encoder(dirs["float32"])
    assert type(enc.backbone).__name__ == "AudioClassifier"
    feats = features()
    want = hf.model.encoder(feats.transpose(1, 2)).last_hidden_state
    torch.testing.assert_close(enc.backbone.forward_features(feats), want, atol=1e-4, rtol=0)


def test_vocabulary_and_config_come_from_the_directory(ct2_dirs):
    _, dirs = ct2_dirs
    meta = json.loads((dirs["float32"] / "config.json").read_text())
    assert meta["suppress_ids"] == SUPPRESS  # what CTranslate2 wrote, what we read
    vocab = json.loads((dirs["float32"] / "vocabulary.json").read_text())
    assert vocab[: len(VOCAB)] == VOCAB


def test_bf16_layers_with_a_float32_front_end_stay_close_to_float32():
    ours = whisper_from_hf(hf_whisper(), languages=("en", "de"), no_timestamps_token_id=NO_TS)
    feats, ids = features(), torch.tensor([[SOT, NO_TS, 4, 5]] * 2)
    with torch.no_grad():
        want = ours(feats, ids)
        half = ours.to_compute_dtype(torch.bfloat16)
        assert half.encoder.tokenizer.mean.dtype == torch.float32  # the front end stays
        got = half(feats, ids)
    assert got.dtype == torch.bfloat16
    # bf16 keeps 8 bits of mantissa: relative error ~ 2^-8 per op, a few % at the end
    err = (got.float() - want).abs().max() / want.abs().max()
    assert err < 0.05
    assert half.generate(feats, max_new_tokens=4).shape[0] == 2


def test_cross_attention_maps_equal_transformers_cross_attentions():
    hf = hf_whisper()
    hf.config._attn_implementation = "eager"  # the attention probabilities are returned
    ours = whisper_from_hf(hf, languages=("en", "de"), translate_token_id=SOT + 3,
                           transcribe_token_id=SOT + 4, no_timestamps_token_id=NO_TS)
    feats = features()
    ids = torch.tensor([[SOT, NO_TS, 1, 2, 3], [SOT, NO_TS, 9, 8, 7]])
    with torch.no_grad():
        want = hf(input_features=feats.transpose(1, 2), decoder_input_ids=ids,
                  output_attentions=True)
        hidden, maps = ours.forward_features(feats, ids, return_attention=True)
    assert len(maps.cross_attn) == len(want.cross_attentions) == 2
    for got, ref in zip(maps.cross_attn, want.cross_attentions, strict=True):
        assert got.shape == ref.shape == (2, 4, ids.shape[1], MEL_FRAMES // 2)
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    for got, ref in zip(maps.self_attn, want.decoder_attentions, strict=True):
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours.forward_head(hidden), want.logits, atol=1e-4, rtol=0)
