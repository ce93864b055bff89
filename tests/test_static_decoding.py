"""Static-cache decoding: a preallocated KV cache and a fixed-shape one-token step,
eager or compiled with torch.compile.

References: a full forward pass without any cache (the logits of every position), and the
ordinary cached decoding loop, itself checked against the strategies' definitions in
tests/test_generation.py. The compiled tests take tens of seconds of inductor time each:
they are marked slow; the eager static path, the fallbacks and the errors are fast.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import multimodal.generation as gen
import multimodal.nn.block as block_module
from multimodal.generation import compile_stats, generate
from multimodal.models.captioner import Captioner, CaptionerConfig
from multimodal.models.codec_lm import CodecARConfig, CodecLM, CodecLMConfig, CodecNARConfig
from multimodal.models.image_gpt import ImageGPT, ImageGPTConfig
from multimodal.models.rnn import RNNSeq2Seq, RNNSeq2SeqConfig
from multimodal.models.text import TextDecoder, TextDecoderConfig
from multimodal.models.vit import ViTConfig
from multimodal.models.whisper import Whisper
from multimodal.nn.cache import StaticKVCache
from tests.random_weights import o1_weights

VOCAB = 40


def decoder(seed: int = 0, **overrides: object) -> TextDecoder:
    """A random decoder with O(1) weights (distinct, well separated next tokens)."""
    torch.manual_seed(seed)
    cfg = dict(vocab_size=VOCAB, max_len=24, dim=32, depth=2, heads=4, tie_embeddings=False)
    cfg.update(overrides)
    model = TextDecoder(TextDecoderConfig(**cfg))
    return o1_weights(model, "tok_embed").eval()


LLAMA = dict(norm_type="rmsnorm", mlp_type="glu", activation="silu", rope="1d",
             pos_embed="none", kv_heads=2, qkv_bias=False, proj_bias=False, mlp_bias=False)


def _seeded(kwargs: dict) -> dict:
    return {**kwargs, "generator": torch.Generator().manual_seed(7)} \
        if kwargs.get("do_sample") else dict(kwargs)


STRATEGIES = [{}, {"do_sample": True, "temperature": 1.2, "top_k": 20}, {"num_beams": 3}]


@pytest.fixture
def count_static_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the calls of the static step (the fast tests must take it)."""
    calls = [0]
    original = block_module.static_step

    def counted(*args: object) -> torch.Tensor:
        calls[0] += 1
        return original(*args)

    monkeypatch.setattr(block_module, "static_step", counted)
    return calls


# --- the static step against the full forward --------------------------------------------


@pytest.mark.parametrize("overrides", [{}, LLAMA, {"norm": "post"}],
                         ids=["gpt", "llama", "post-norm"])
def test_static_steps_give_the_full_forward_logits(overrides: dict,
                                                   count_static_steps: list[int]) -> None:
    model = decoder(**overrides)
    ids = torch.randint(0, VOCAB, (3, 12))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, :3] = 0  # a left-padded row
    with torch.no_grad():
        full = model(ids, attention_mask=mask)
        cache = StaticKVCache(len(model.transformer.blocks), 16)
        steps = [model(ids[:, :5], attention_mask=mask[:, :5], cache=cache)[:, -1]]
        for t in range(5, 12):
            steps.append(model(ids[:, t : t + 1], attention_mask=mask[:, : t + 1],
                               cache=cache)[:, -1])
    assert count_static_steps[0] == 7 and cache.length == 12
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 4:], atol=1e-5, rtol=1e-4)


def test_a_cross_attending_decoder_steps_statically(count_static_steps: list[int]) -> None:
    model = decoder(cross_attention=True, memory_dim=16)
    ids = torch.randint(0, VOCAB, (2, 9))
    memory = torch.randn(2, 5, 16)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    with torch.no_grad():
        full = model(ids, memory=memory, memory_padding_mask=pad)
        cache = StaticKVCache(len(model.transformer.blocks), 9)
        steps = [model(ids[:, :4], memory=memory, memory_padding_mask=pad, cache=cache)[:, -1]]
        for t in range(4, 9):
            steps.append(model(ids[:, t : t + 1], memory=memory, memory_padding_mask=pad,
                               cache=cache)[:, -1])
    assert count_static_steps[0] == 5
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 3:], atol=1e-5, rtol=1e-4)


# --- the same tokens as eager decoding ------------------------------------------------------


@pytest.mark.parametrize("kwargs", STRATEGIES, ids=["greedy", "sample", "beam"])
@pytest.mark.parametrize("overrides", [{}, LLAMA], ids=["gpt", "llama"])
def test_static_cache_decoding_gives_the_eager_tokens(kwargs: dict, overrides: dict,
                                                      count_static_steps: list[int]) -> None:
    model = decoder(**overrides)
    ids = torch.randint(0, VOCAB, (3, 5))
    mask = torch.ones_like(ids)
    mask[2, :2] = 0
    eager = generate(model, ids, 12, attention_mask=mask, **_seeded(kwargs))
    assert count_static_steps[0] == 0
    static = generate(model, ids, 12, attention_mask=mask, static_cache=True,
                      **_seeded(kwargs))
    assert count_static_steps[0] >= 11
    assert torch.equal(static, eager)


def test_image_gpt_captioner_and_codec_lm_decode_the_same_statically(
        count_static_steps: list[int]) -> None:
    torch.manual_seed(0)
    igpt = ImageGPT(ImageGPTConfig(image_size=6, vocab_size=16, dim=32, depth=2, heads=2,
                                   num_classes=3)).eval()
    runs = [igpt.generate(num_images=3, do_sample=True,
                          generator=torch.Generator().manual_seed(3), static_cache=s)
            for s in (False, True)]
    assert torch.equal(*runs) and count_static_steps[0] == 34

    enc = ViTConfig(image_size=16, patch_size=4, num_classes=0, dim=32, depth=1, heads=2,
                    mlp_dim=64)
    dec = TextDecoderConfig(vocab_size=24, max_len=12, dim=32, depth=2, heads=4, mlp_dim=64)
    cap = Captioner(CaptionerConfig(encoder=enc, decoder=dec)).eval()
    with torch.no_grad():
        for p in cap.decoder.parameters():
            p.mul_(4.0)
    images = torch.randn(2, 3, 16, 16)
    for kw in ({}, {"num_beams": 2}):
        runs = [cap.generate(images, 8, eos_token_id=-1, static_cache=s, **kw)
                for s in (False, True)]
        assert torch.equal(*runs)

    common = {"dim": 32, "depth": 2, "heads": 2, "codebook_size": 16, "num_phonemes": 20,
              "max_len": 40}
    codec = CodecLM(CodecLMConfig(ar=CodecARConfig(**common),
                                  nar=CodecNARConfig(num_codebooks=2, **common))).eval()
    g = torch.Generator().manual_seed(0)
    phon, plen = torch.randint(0, 20, (2, 5), generator=g), torch.tensor([5, 3])
    prompt, prlen = torch.randint(0, 16, (2, 4), generator=g), torch.tensor([4, 2])
    runs = [codec.ar.generate(phon, plen, prompt, prlen, max_new_tokens=10, min_new_tokens=3,
                              do_sample=True, generator=torch.Generator().manual_seed(5),
                              static_cache=s) for s in (False, True)]
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])


# --- fallbacks and errors ---------------------------------------------------------------------


def _one_warning(record: list[warnings.WarningMessage]) -> str:
    mine = [w for w in record if "compile=True" in str(w.message)]
    assert len(mine) == 1, [str(w.message) for w in record]
    return str(mine[0].message)


def test_compile_unavailable_warns_once_and_decodes_eagerly(
        monkeypatch: pytest.MonkeyPatch) -> None:
    model = decoder()
    ids = torch.randint(0, VOCAB, (2, 4))
    eager = generate(model, ids, 10)
    monkeypatch.setattr(gen, "compile_unavailable", lambda device: "no C++ compiler (test)")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = generate(model, ids, 10, compile=True)
    assert "no C++ compiler (test)" in _one_warning(record)
    assert torch.equal(out, eager)


def test_a_failing_compiler_warns_once_and_decodes_eagerly(
        monkeypatch: pytest.MonkeyPatch) -> None:
    model = decoder()
    ids = torch.randint(0, VOCAB, (2, 4))
    eager = generate(model, ids, 10)

    def broken(*args: object) -> torch.Tensor:
        raise torch._dynamo.exc.TorchDynamoException("inductor exploded (test)")

    monkeypatch.setattr(gen, "compile_unavailable", lambda device: None)
    monkeypatch.setitem(gen._COMPILED, "cpu", broken)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = generate(model, ids, 10, compile=True)
    assert "inductor exploded (test)" in _one_warning(record)
    assert torch.equal(out, eager)


def test_a_decoder_without_a_kv_cache_warns_once_and_decodes_eagerly() -> None:
    torch.manual_seed(0)
    rnn = RNNSeq2Seq(RNNSeq2SeqConfig(source_vocab_size=20, target_vocab_size=12,
                                      max_source_len=10, max_target_len=8, embed_dim=8,
                                      hidden_dim=16)).eval()
    src = torch.randint(7, 20, (2, 6))
    eager = rnn.generate(src, max_new_tokens=5, eos_token_id=None)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = rnn.generate(src, max_new_tokens=5, eos_token_id=None, compile=True)
    assert "no KV cache" in _one_warning(record)
    assert torch.equal(out, eager)


def test_a_prompt_longer_than_the_static_cache_is_refused_naming_both_lengths() -> None:
    model = decoder()
    ids = torch.randint(0, VOCAB, (2, 10))
    with pytest.raises(ValueError, match=r"10 tokens .* 16 positions .* cache_len=12"):
        generate(model, ids, 6, static_cache=True, cache_len=12)
    with pytest.raises(ValueError, match="cache_len sizes the static KV cache"):
        generate(model, ids, 6, cache_len=20)
    cache = StaticKVCache(2, 8)
    with pytest.raises(ValueError, match=r"10 tokens is longer than the cache \(8\)"):
        model(ids, cache=cache)


def test_a_larger_fixed_cache_len_gives_the_same_tokens() -> None:
    model = decoder()
    ids = torch.randint(0, VOCAB, (2, 4))
    assert torch.equal(generate(model, ids, 8, static_cache=True, cache_len=24),
                       generate(model, ids, 8))


# --- compiled (inductor: slow) --------------------------------------------------------------


@pytest.mark.slow
def test_compiled_decoding_gives_the_eager_tokens_and_compiles_once() -> None:
    if gen.compile_unavailable(torch.device("cpu")):
        pytest.skip("torch.compile is unavailable here")
    from torch._dynamo.utils import counters

    model = decoder(**LLAMA)
    ids = torch.randint(0, VOCAB, (3, 5))
    for kwargs in STRATEGIES:
        eager = generate(model, ids, 12, **_seeded(kwargs))
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # no eager fallback
            compiled = generate(model, ids, 12, compile=True, **_seeded(kwargs))
        assert torch.equal(compiled, eager), kwargs
        # a second call with the same shapes compiles nothing
        before, graphs = compile_stats()["compilations"], counters["stats"]["unique_graphs"]
        again = generate(model, ids, 12, compile=True, **_seeded(kwargs))
        assert compile_stats()["compilations"] == before
        assert counters["stats"]["unique_graphs"] == graphs
        assert torch.equal(again, eager)
    assert compile_stats()["compilations"] >= 1 and compile_stats()["compile_seconds"] > 0


@pytest.mark.slow
def test_compiled_image_gpt_samples_the_eager_images() -> None:
    if gen.compile_unavailable(torch.device("cpu")):
        pytest.skip("torch.compile is unavailable here")
    torch.manual_seed(0)
    igpt = ImageGPT(ImageGPTConfig(image_size=8, vocab_size=16, dim=32, depth=2,
                                   heads=2)).eval()
    runs = [igpt.generate(num_images=4, do_sample=True,
                          generator=torch.Generator().manual_seed(3), compile=c)
            for c in (False, True)]
    assert torch.equal(*runs)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_compiled_packed_decoding_gives_the_eager_packed_tokens(mode: str) -> None:
    """The compiled step around the packed kernels (the fast path of a GGUF file kept
    packed, BENCHMARKS.md) decodes the tokens of the eager packed model."""
    if gen.compile_unavailable(torch.device("cpu")):
        pytest.skip("torch.compile is unavailable here")
    model = decoder(**LLAMA, vocab_size=48, mlp_dim=64)
    ids = torch.randint(0, 48, (1, 5), generator=torch.Generator().manual_seed(1))
    eager = generate(model, ids, 12, quantize=mode)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no eager fallback
        compiled = generate(model, ids, 12, quantize=mode, compile=True)
    assert torch.equal(compiled, eager)


@pytest.mark.parametrize("prefix", [True, False])
def test_beam_reorder_follows_the_index_with_and_without_keeping_storage(prefix: bool) -> None:
    model = decoder()
    ids = torch.randint(0, VOCAB, (3, 6))
    cache = StaticKVCache(len(model.transformer.blocks), 10, prefix=prefix)
    with torch.no_grad():
        model(ids, cache=cache)
    before = [(layer.k.clone(), layer.k.data_ptr()) for layer in cache.layers]
    valid = cache.valid.clone()
    index = torch.tensor([2, 0, 0])
    cache.reorder(index)
    for layer, (k, ptr) in zip(cache.layers, before, strict=True):
        assert torch.equal(layer.k, k[index])
        assert (layer.k.data_ptr() == ptr) == (not prefix)  # kept for CUDA graphs only
    assert torch.equal(cache.valid, valid[index])


def test_whisper_decoder_decodes_the_same_statically(count_static_steps: list[int]) -> None:
    pytest.importorskip("transformers")
    from multimodal.convert.hf_audio import whisper_from_hf
    from tests.models.test_whisper import NO_TS, features, hf_whisper

    whisper = whisper_from_hf(hf_whisper(), languages=("en", "de"),
                              no_timestamps_token_id=NO_TS)
    feats = features(3)
    with torch.no_grad():
        memory = whisper.encode(feats)
    start = torch.tensor(whisper.prompt())[None].expand(3, -1)
    for kwargs in ({}, {"num_beams": 2}):
        runs = [generate(whisper.decoder, start, 8, memory=memory, static_cache=s, **kwargs)
                for s in (False, True)]
        assert torch.equal(*runs)
    assert count_static_steps[0] >= 14


def _tiny_whisper() -> Whisper:
    from multimodal.convert.hf_audio import whisper_from_hf
    from tests.models.test_whisper import NO_TS, hf_whisper

    return whisper_from_hf(hf_whisper(), languages=("en", "de"), no_timestamps_token_id=NO_TS)


def test_whisper_generate_passes_static_cache_and_compile_through(
        count_static_steps: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """``Whisper.generate(static_cache=True)`` and ``(compile=True)`` decode through the
    static step (the compiled one replaced here by a counted eager step: the plumbing, not
    inductor, which the slow test below runs) and give the eager tokens."""
    pytest.importorskip("transformers")
    from tests.models.test_whisper import features

    whisper = _tiny_whisper()
    feats = features(3)
    compiled_calls = [0]

    def fake_compiled(*args: object) -> torch.Tensor:
        compiled_calls[0] += 1
        return block_module.static_step(*args)

    monkeypatch.setattr(gen, "compile_unavailable", lambda device: None)
    monkeypatch.setitem(gen._COMPILED, "cpu", fake_compiled)
    for kwargs in ({}, {"num_beams": 2}):
        count_static_steps[0] = compiled_calls[0] = 0
        eager = whisper.generate(feats, max_new_tokens=8, **kwargs)
        assert count_static_steps[0] == 0
        static = whisper.generate(feats, max_new_tokens=8, static_cache=True, **kwargs)
        assert torch.equal(static, eager) and count_static_steps[0] >= 7
        assert compiled_calls[0] == 0
        compiled = whisper.generate(feats, max_new_tokens=8, compile=True, **kwargs)
        assert torch.equal(compiled, eager) and compiled_calls[0] >= 7


@pytest.mark.slow
def test_compiled_whisper_transcribes_the_eager_tokens() -> None:
    pytest.importorskip("transformers")
    if gen.compile_unavailable(torch.device("cpu")):
        pytest.skip("torch.compile is unavailable here")
    from tests.models.test_whisper import features

    whisper = _tiny_whisper()
    feats = features(2)
    eager = whisper.generate(feats, max_new_tokens=10)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no eager fallback
        compiled = whisper.generate(feats, max_new_tokens=10, compile=True)
    assert torch.equal(compiled, eager)
