"""Encoder inference optimisations (multimodal/optimize.py): int8 dynamic quantisation,
bf16 autocast, measured precision choice, compiled forward.

References: the fp32 eager model itself (outputs compared with ``F.cosine_similarity`` /
``assert_close`` here, not through the module's helpers), and the int8 formula of one
Linear written out from the quantised weights.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import multimodal.generation as gen
from multimodal.models.audio import AudioClassifier, AudioClassifierConfig
from multimodal.models.text import TextEncoder, TextEncoderConfig
from multimodal.models.vit import ViT, ViTConfig
from multimodal.nn.lora import apply_lora
from multimodal.optimize import (
    INT8_MIN_COSINE,
    choose_inference_precision,
    compile_encoder,
    optimize_encoder,
    output_cosine,
    quantize_int8,
    uncompile_encoder,
    with_precision,
)


def encoders() -> dict[str, tuple[nn.Module, tuple]]:
    torch.manual_seed(0)
    vit = ViT(ViTConfig(image_size=32, patch_size=8, num_classes=0, dim=64, depth=2, heads=4))
    text = TextEncoder(TextEncoderConfig(vocab_size=100, max_len=32, dim=64, depth=2, heads=4))
    audio = AudioClassifier(AudioClassifierConfig(num_classes=0, dim=64, depth=2, heads=4,
                                                  n_mels=32))
    ids = torch.randint(5, 100, (3, 20))
    return {"vit": (vit.eval(), (torch.randn(3, 3, 32, 32),)),
            "text": (text.eval(), (ids, torch.ones_like(ids))),
            "audio": (audio.eval(), audio.example_inputs(3))}


def _is_int8(module: nn.Module) -> bool:
    """A dynamically quantised Linear (torch.ao.nn.quantized.dynamic.Linear)."""
    return "quantized" in type(module).__module__ and type(module).__name__.endswith("Linear")


@pytest.mark.parametrize("name", ["vit", "text", "audio"])
def test_int8_keeps_the_outputs_and_leaves_the_original(name: str) -> None:
    model, inputs = encoders()[name]
    linears = sum(type(m) is nn.Linear for m in model.modules())
    with torch.no_grad():
        ref = model.forward_features(*inputs)
    q = quantize_int8(model)
    quantized = [m for m in q.modules() if _is_int8(m)]
    assert len(quantized) == linears and not any(type(m) is nn.Linear for m in q.modules())
    assert sum(type(m) is nn.Linear for m in model.modules()) == linears  # untouched
    with torch.no_grad():
        out = q.forward_features(*inputs)
    cos = F.cosine_similarity(out.flatten(1), ref.flatten(1), dim=1).min().item()
    assert not torch.equal(out, ref)  # it did change the arithmetic
    assert cos >= INT8_MIN_COSINE
    assert output_cosine(model.forward_features, q.forward_features, *inputs) == \
        pytest.approx(cos, abs=1e-6)


def test_an_int8_linear_follows_the_dynamic_quantisation_formula() -> None:
    torch.manual_seed(0)
    lin = nn.Sequential(nn.Linear(32, 16))
    x = torch.randn(5, 32)
    q = quantize_int8(lin)[0]
    w = q.weight()  # the int8 weight as a quantised tensor
    w_hat = w.dequantize()
    # activations: per-tensor affine uint8 over [min(x, 0), max(x, 0)] (reduce_range on x86)
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    levels = 127 if torch.backends.quantized.engine in ("x86", "fbgemm") else 255
    scale = (hi - lo) / levels
    zero = round(-lo / scale)
    x_hat = (torch.clamp(torch.round(x / scale) + zero, 0, levels) - zero) * scale
    expected = x_hat @ w_hat.T + lin[0].bias
    torch.testing.assert_close(q(x), expected, atol=2e-3, rtol=1e-3)
    assert (q(x) - lin[0](x)).abs().max() > 1e-5  # and it is not the fp32 result


def test_bad_quantisation_requests_are_refused_clearly() -> None:
    model, _ = encoders()["vit"]
    with pytest.raises(ValueError, match=r"quantize must be one of \('int8', 'int4', "):
        optimize_encoder(model, quantize="int3")
    with pytest.raises(ValueError, match="not 'bf16'"):
        optimize_encoder(model, quantize="int8", precision="bf16")
    with pytest.raises(ValueError, match=r"no nn\.Linear layer"):
        quantize_int8(nn.Sequential(nn.Conv2d(3, 4, 3)))
    with pytest.raises(ValueError, match="fp32 weights"):
        quantize_int8(nn.Sequential(nn.Linear(4, 4)).to(torch.bfloat16))
    lora = apply_lora(encoders()["vit"][0], targets=["qkv"], rank=2)
    with pytest.raises(ValueError, match=r"plain nn.Linear .* LoRALinear.*merge_lora"):
        quantize_int8(lora)


def test_bf16_autocast_wrapper_stays_close_and_is_undone() -> None:
    model, inputs = encoders()["vit"]
    with torch.no_grad():
        ref = model.forward_features(*inputs)
        with_precision(model, "bf16")
        out = model.forward_features(*inputs)
    assert out.dtype == torch.float32 and not torch.equal(out, ref)
    cos = F.cosine_similarity(out.flatten(1), ref.flatten(1), dim=1).min().item()
    assert cos > 0.99
    uncompile_encoder(model)
    with torch.no_grad():
        assert torch.equal(model.forward_features(*inputs), ref)
    with pytest.raises(ValueError, match="precision must be one of"):
        with_precision(model, "fp8")


def test_precision_is_chosen_by_measurement_only_with_native_bf16() -> None:
    model, inputs = encoders()["vit"]
    assert choose_inference_precision(model, inputs, bf16=False) == ("fp32", {})
    best, times = choose_inference_precision(model, inputs, bf16=True, repeats=2)
    assert set(times) == {"fp32", "bf16"} and all(t > 0 for t in times.values())
    assert best == ("bf16" if times["bf16"] < 0.95 * times["fp32"] else "fp32")


def test_compile_unavailable_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = encoders()["vit"]
    monkeypatch.setattr(gen, "compile_unavailable", lambda device: "no C++ compiler (test)")
    with pytest.raises(RuntimeError, match=r"no C\+\+ compiler"):
        compile_encoder(model)
    with pytest.raises(ValueError, match="no method 'encode_image'"):
        with_precision(model, "bf16", methods=["encode_image"])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vit", "text", "audio"])
def test_compiled_encoder_matches_eager_and_does_not_recompile(name: str) -> None:
    if gen.compile_unavailable(torch.device("cpu")):
        pytest.skip("torch.compile is unavailable here")
    from torch._dynamo.utils import counters

    model, inputs = encoders()[name]
    with torch.no_grad():
        ref = model.forward_features(*inputs)
        compile_encoder(model)
        out = model.forward_features(*inputs)
        graphs = counters["stats"]["unique_graphs"]
        again = model.forward_features(*inputs)
    assert counters["stats"]["unique_graphs"] == graphs
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(again, ref, atol=1e-5, rtol=1e-4)


def test_encoder_quantize_hook_gives_int8_features_close_to_fp32() -> None:
    from multimodal.encoder import Encoder

    model, (images,) = encoders()["vit"]
    plain, int8 = Encoder(model), Encoder(model, quantize="dynamic-int8")
    assert any(_is_int8(m) for m in int8.modules())
    assert not any(_is_int8(m) for m in plain.modules())
    with torch.no_grad():
        a, b = plain(images), int8(images)
    assert not torch.equal(a, b)
    assert F.cosine_similarity(a.flatten(1), b.flatten(1), dim=1).min() >= INT8_MIN_COSINE
