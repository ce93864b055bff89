"""Weight-only quantised Linears (multimodal.nn.quantized): the packed kernels against the
formulas in float64, the quantisers' error bounds, quantize_ / generate(quantize=)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import multimodal as mm
from multimodal.nn.quantized import (
    QuantizedEmbedding,
    QuantizedLinear,
    quantize_,
    quantize_int4,
    quantize_int8,
    quantized_copy,
)

# The kernels take bf16 inputs and return bf16: a product's relative error is about two
# bf16 roundings (input and output, 2^-8 each) on top of the weights' own.
BF16_REL = 2 * 2.0**-8


def _bf16_reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x W^T in float64 with x rounded to bf16 as the kernel does."""
    return x.to(torch.bfloat16).double() @ w.double().t()


def _assert_product_close(y: torch.Tensor, ref: torch.Tensor) -> None:
    err = (y.double() - ref).abs().max()
    scale = ref.abs().max()
    assert err <= 2 * BF16_REL * scale, (float(err), float(scale))


def test_int8_kernel_computes_scaled_product():
    g = torch.Generator().manual_seed(0)
    q = torch.randint(-128, 128, (48, 64), generator=g, dtype=torch.int8)
    s = torch.rand(48, generator=g) * 0.01 + 1e-3
    x = torch.randn(5, 64, generator=g)
    layer = QuantizedLinear.from_int8(q, s)
    w = q.double() * s.to(torch.bfloat16).double()[:, None]  # the scale is stored in bf16
    _assert_product_close(layer(x), _bf16_reference(x, w))
    assert torch.equal(layer.dequantize().double(), w)


def test_int4_kernel_scales_and_zeros_mean_q_minus_8_times_s_plus_z():
    """qScaleAndZeros of _weight_int4pack_mm_for_cpu: W = (q - 8) s + z per group."""
    g = torch.Generator().manual_seed(1)
    out_f, in_f, group = 32, 128, 32
    q = torch.randint(0, 16, (out_f, in_f), generator=g, dtype=torch.int32)
    s = (torch.rand(out_f, in_f // group, generator=g) * 0.1 + 0.01).to(torch.bfloat16)
    z = (torch.randn(out_f, in_f // group, generator=g) * 0.1).to(torch.bfloat16)
    layer = QuantizedLinear.from_int4(q, s, z, bias=torch.arange(out_f, dtype=torch.float32))
    groups = torch.arange(in_f) // group
    w = (q.double() - 8) * s.double()[:, groups] + z.double()[:, groups]
    x = torch.randn(3, 7, in_f, generator=g)
    ref = _bf16_reference(x.reshape(-1, in_f), w).reshape(3, 7, out_f) + torch.arange(out_f)
    y = layer(x)
    assert y.shape == (3, 7, out_f) and y.dtype == torch.float32
    _assert_product_close(y - torch.arange(out_f), ref - torch.arange(out_f))
    torch.testing.assert_close(layer.dequantize().double(), w, rtol=0, atol=1e-6)


def test_int8_quantiser_error_is_at_most_half_a_step():
    w = torch.randn(40, 96, generator=torch.Generator().manual_seed(2))
    q, s = quantize_int8(w)
    err = (q.float() * s.float()[:, None] - w).abs()
    assert (err <= s.float()[:, None] / 2 + 1e-6).all()


def test_int4_quantiser_error_is_at_most_half_a_step():
    w = torch.randn(32, 128, generator=torch.Generator().manual_seed(3)) * 0.05
    q, s, z = quantize_int4(w, 32)
    assert int(q.min()) >= 0 and int(q.max()) <= 15
    groups = torch.arange(128) // 32
    deq = (q.float() - 8) * s.float()[:, groups] + z.float()[:, groups]
    # half a step, plus the bf16 rounding of the zero point (|z| 2^-9) it is offset by
    bound = s.float()[:, groups] / 2 + z.float().abs()[:, groups] * 2.0**-8 + 1e-7
    assert ((deq - w).abs() <= bound).all()


def test_from_linear_int4_falls_back_to_int8_where_the_kernel_refuses_the_shape():
    torch.manual_seed(0)
    fits, odd = nn.Linear(64, 32), nn.Linear(64, 40)  # 40 % 16 != 0
    assert QuantizedLinear.from_linear(fits, "int4").mode == "int4"
    assert QuantizedLinear.from_linear(odd, "int4").mode == "int8"
    x = torch.randn(2, 64)
    for lin in (fits, odd):
        ql = QuantizedLinear.from_linear(lin, "int4")
        _assert_product_close(ql(x) - lin.bias, _bf16_reference(x, ql.dequantize()))


def test_bad_inputs_raise_one_line_errors():
    with pytest.raises(ValueError, match="quantize must be one of"):
        QuantizedLinear.from_linear(nn.Linear(4, 16), "int3")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="values must lie in"):
        QuantizedLinear.from_int4(torch.full((16, 32), 16), torch.ones(16, 1), torch.ones(16, 1))
    with pytest.raises(ValueError, match=r"no nn\.Linear"):
        quantize_(nn.Sequential(nn.ReLU()), "int8")
    layer = QuantizedLinear.from_linear(nn.Linear(32, 16), "int8")
    with pytest.raises(ValueError, match=r"expected inputs \(\.\.\., 32\)"):
        layer(torch.randn(2, 31))


def test_embedding_tied_to_an_int8_head_looks_up_its_rows():
    head = QuantizedLinear.from_linear(nn.Linear(16, 50, bias=False), "int8")
    emb = QuantizedEmbedding.tied_to(head)
    ids = torch.tensor([[0, 7, 49]])
    torch.testing.assert_close(emb(ids), head.dequantize()[ids])
    assert emb.qweight.data_ptr() == head.qweight.data_ptr()
    with pytest.raises(IndexError):
        emb(torch.tensor([50]))


# --- whole decoders -----------------------------------------------------------------------


def _decoder(seed: int = 0) -> mm.TextDecoder:
    """A random-weight TextDecoder whose logits are spread (embedding std 1, not 0.02), so
    greedy choices are not coin flips between near-equal logits."""
    torch.manual_seed(seed)
    lm = mm.TextDecoder(mm.TextDecoderConfig(vocab_size=96, max_len=64, dim=64, depth=2,
                                             heads=4, mlp_dim=128))
    with torch.no_grad():
        lm.tok_embed.weight.normal_(0, 1.0)
    return lm.eval()


def _prompts(n: int = 20, length: int = 6) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(0, 96, (1, length), generator=g) for _ in range(n)]


def test_quantize_swaps_every_linear_and_keeps_the_float_embedding():
    lm = _decoder()
    linears = sum(type(m) is nn.Linear for m in lm.modules())
    quantize_(lm, "int4")
    quantized = [m for m in lm.modules() if isinstance(m, QuantizedLinear)]
    assert len(quantized) == linears and not any(type(m) is nn.Linear for m in lm.modules())
    assert isinstance(lm.tok_embed, nn.Embedding)


def test_int8_greedy_tokens_equal_fp32_on_20_prompts():
    lm = _decoder()
    for prompt in _prompts():
        ref = lm.generate(prompt, max_new_tokens=12)
        assert torch.equal(lm.generate(prompt, max_new_tokens=12, quantize="int8"), ref)


def test_int4_logits_match_the_dequantised_model_to_bf16_rounding():
    """The packed path computes the float model of its own dequantised weights, up to the
    bf16 activations: each product carries two bf16 roundings (2 x 2^-8 = 0.8 %
    relative), 5 products in a row at most (2 blocks of 2 + the head), so the logits are
    within ~4 % (relative norm); asked: 2 %, measured 0.23 %."""
    lm = _decoder()
    q = quantized_copy(lm, "int4")
    deq = _decoder()
    with torch.no_grad():
        for (_, m), (_, d) in zip(q.named_modules(), deq.named_modules(), strict=True):
            if isinstance(m, QuantizedLinear):  # own Parameters: the head is tied in deq
                d.weight = nn.Parameter(m.dequantize())
    ids = torch.cat(_prompts(4), dim=0)
    with torch.no_grad():
        got, ref = q(ids), deq(ids)
    assert torch.linalg.vector_norm(got - ref) <= 0.02 * torch.linalg.vector_norm(ref)


def test_int4_logits_close_to_fp32_within_quantisation_noise():
    """int4 with groups of 32 rounds each weight by at most half a step, s = range / 15 ~
    4 sigma / 15 for Gaussian rows: an error of s / sqrt(12) ~ 0.08 sigma per weight, so
    each product is off by ~8 % of its size and the logits by about that (residual sums of
    independent errors): 20 % relative error of the logits is a generous bound."""
    lm = _decoder()
    ids = torch.cat(_prompts(4), dim=0)
    with torch.no_grad():
        ref = lm(ids)
        got = quantized_copy(lm, "int4")(ids)
    assert torch.linalg.vector_norm(got - ref) <= 0.2 * torch.linalg.vector_norm(ref)
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9


def test_generate_quantize_leaves_the_model_and_reuses_the_copy_until_weights_change():
    lm = _decoder()
    before = {k: v.clone() for k, v in lm.state_dict().items()}
    prompt = _prompts(1)[0]
    lm.generate(prompt, max_new_tokens=3, quantize="int4")
    assert all(torch.equal(before[k], v) for k, v in lm.state_dict().items())
    assert all(type(m) is not QuantizedLinear for m in lm.modules())
    first = quantized_copy(lm, "int4")
    assert quantized_copy(lm, "int4") is first
    assert first.tok_embed.weight.data_ptr() == lm.tok_embed.weight.data_ptr()  # shared
    with torch.no_grad():
        lm.transformer.blocks[0].mlp.fc1.weight.mul_(2)
    assert quantized_copy(lm, "int4") is not first
    with pytest.raises(ValueError, match="quantize must be one of"):
        lm.generate(prompt, max_new_tokens=3, quantize="fp8")


def test_quantized_decoding_with_beams_and_sampling_runs():
    lm = _decoder()
    prompt = _prompts(1)[0]
    beams = lm.generate(prompt, max_new_tokens=5, num_beams=3, quantize="int8")
    ref = lm.generate(prompt, max_new_tokens=5, num_beams=3)
    assert torch.equal(beams, ref)
    g = torch.Generator().manual_seed(0)
    out = lm.generate(prompt, max_new_tokens=5, do_sample=True, generator=g, quantize="int4")
    assert out.shape == (1, 11)


def test_f_linear_reference_sanity():
    """The float64 reference used above is F.linear's product."""
    x, w = torch.randn(2, 8), torch.randn(4, 8)
    torch.testing.assert_close(_bf16_reference(x, w).float(),
                               F.linear(x.to(torch.bfloat16).float(), w), rtol=1e-5, atol=1e-5)


def test_cross_attending_decoder_quantised_decodes_as_fp32():
    """A Whisper-style decoder (cross-attention to an encoder output, passed as memory=)."""
    torch.manual_seed(0)
    lm = mm.TextDecoder(mm.TextDecoderConfig(vocab_size=96, max_len=32, dim=64, depth=2,
                                             heads=4, mlp_dim=128, cross_attention=True,
                                             memory_dim=48)).eval()
    with torch.no_grad():
        lm.tok_embed.weight.normal_(0, 1.0)
    memory = torch.randn(2, 10, 48)
    ids = torch.randint(0, 96, (2, 3))
    want = mm.generation.generate(lm, ids, 8, memory=memory)
    got = mm.generation.generate(lm, ids, 8, memory=memory, quantize="int8")
    assert torch.equal(got, want)


def test_lm_head_top_logits_are_exact_in_fp32_despite_bf16_outputs():
    """Two logits 25.0 and 25.0039 (bf16 spacing there: 0.125, so the kernel's output
    ties them): refine_top recomputes the near-top ones from the int8 rows in fp32, so
    the order is that of x . W in exact arithmetic."""
    q = torch.randint(-20, 20, (32, 64), generator=torch.Generator().manual_seed(0),
                      dtype=torch.int8)
    q[3] = 100
    q[7] = 100
    q[7, 5] = 101
    layer = QuantizedLinear.from_int8(q, torch.full((32,), 2.0**-8))
    x = torch.ones(1, 64)
    want = (x.double() @ layer.dequantize().double().t())[0]  # 25.0 and 25.00390625
    assert float(want[7] - want[3]) == 2.0**-8
    assert int(layer(x)[0].argmax()) != 7  # the bf16 output cannot tell them apart
    layer.refine_top = True
    got = layer(x)[0]
    assert int(got.argmax()) == int(want.argmax()) == 7
    torch.testing.assert_close(got[[3, 7]].double(), want[[3, 7]], rtol=0, atol=1e-6)
    lm = _decoder()
    quantize_(lm, "int8")
    assert lm.lm_head.refine_top and not lm.transformer.blocks[0].mlp.fc1.refine_top
