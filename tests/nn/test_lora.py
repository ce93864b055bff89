"""LoRA: ``y = W x + b + (alpha / r) B A x`` on chosen Linears, everything else frozen."""

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import multimodal as mm
from multimodal.nn.lora import (
    LoRALinear,
    apply_lora,
    load_lora,
    lora_layers,
    lora_state_dict,
    merge_lora,
    save_lora,
)


def tiny_vit() -> mm.ViT:
    return mm.ViT(mm.ViTConfig(image_size=16, patch_size=4, in_channels=1, num_classes=3, dim=32,
                               depth=2, heads=2, mlp_dim=64))


def test_lora_linear_is_the_formula():
    base = nn.Linear(6, 5)
    layer = LoRALinear(base, rank=2, alpha=8)
    with torch.no_grad():
        layer.lora_B.normal_()
    x = torch.randn(4, 6)
    want = x @ base.weight.T + base.bias + (8 / 2) * (x @ layer.lora_A.T @ layer.lora_B.T)
    torch.testing.assert_close(layer(x), want)
    merged = layer.merged()
    assert type(merged) is nn.Linear
    torch.testing.assert_close(merged.weight, base.weight + 4 * layer.lora_B @ layer.lora_A)
    torch.testing.assert_close(merged(x), want)  # float32 defaults: rtol scales with |y| ~ 10


def test_apply_lora_starts_as_identity_and_freezes_the_rest():
    model = tiny_vit().eval()
    x = torch.randn(2, 1, 16, 16)
    before = model(x)
    apply_lora(model, rank=4, alpha=8, trainable=("head",))
    assert torch.equal(model(x), before)  # B = 0
    layers = lora_layers(model)
    assert sorted(layers) == [f"transformer.blocks.{i}.attn.{p}" for i in range(2)
                              for p in ("proj", "qkv")]
    assert isinstance(model.patch_embed.proj, nn.Conv2d)  # "proj" only wraps Linears
    # the fused qkv projection gets one update over all three blocks: B is (3 * dim, r)
    assert layers["transformer.blocks.0.attn.qkv"].lora_B.shape == (96, 4)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    want = {f"{name}.lora_{f}" for name in layers for f in "AB"} | {"head.weight", "head.bias"}
    assert trainable == want
    # r (in + out) per layer: qkv 4 * (32 + 96), proj 4 * (32 + 32), per block; head 3 * 33
    count = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert count == 2 * (4 * 128 + 4 * 64) + 3 * 33


def test_fine_tuning_changes_only_the_adapters_and_merges_exactly():
    model = tiny_vit()
    reference = copy.deepcopy(model.state_dict())
    apply_lora(model, rank=4, alpha=8, targets=("qkv", "proj", "fc1"))
    a_before = {n: m.lora_A.detach().clone() for n, m in lora_layers(model).items()}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2,
                                  weight_decay=0.1)
    x, y = torch.randn(8, 1, 16, 16), torch.randint(0, 3, (8,))
    losses = []
    for _ in range(5):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    state = model.state_dict()
    for key, value in reference.items():  # frozen weights: bit-for-bit unchanged
        wrapped = key.replace(".weight", ".base.weight").replace(".bias", ".base.bias")
        now = state[key] if key in state else state[wrapped]
        assert torch.equal(now, value), key
    for name, layer in lora_layers(model).items():  # both factors were trained
        assert layer.lora_B.abs().max() > 0, name
        assert not torch.equal(layer.lora_A, a_before[name]), name
    model.eval()
    merged = merge_lora(model)
    assert not lora_layers(merged) and lora_layers(model)  # a copy by default
    assert set(merged.state_dict()) == set(reference)  # a plain ViT again
    torch.testing.assert_close(merged(x), model(x))
    fresh = tiny_vit()
    fresh.load_state_dict(merged.state_dict())
    torch.testing.assert_close(fresh.eval()(x), model(x))
    assert all(p.requires_grad for p in merged.parameters())


def test_adapters_save_and_load_alone(tmp_path):
    torch.manual_seed(1)
    base = tiny_vit().eval()
    model = apply_lora(copy.deepcopy(base), rank=2, alpha=4, trainable=("head",))
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_B.normal_(0, 0.1)
        model.head.weight.normal_()
    adapters = lora_state_dict(model)
    assert all(k.endswith(("lora_A", "lora_B")) or k.startswith("head.") for k in adapters)
    path = save_lora(model, tmp_path / "adapters.safetensors")
    restored = load_lora(copy.deepcopy(base), path)  # wraps with the stored settings
    x = torch.randn(2, 1, 16, 16)
    torch.testing.assert_close(restored(x), model(x), atol=0, rtol=0)
    wrong = apply_lora(copy.deepcopy(base), rank=3, alpha=4, trainable=("head",))
    with pytest.raises(ValueError, match=r"mis-shaped: .*lora_A: expected \(3, 32\)"):
        load_lora(wrong, path)


def test_lora_on_a_text_decoder_with_tied_embeddings_generates():
    lm = mm.TextDecoder(mm.TextDecoderConfig(vocab_size=50, max_len=32, dim=32, depth=2,
                                             heads=2))
    ids = torch.randint(0, 50, (2, 5))
    want = lm.generate(ids, max_new_tokens=6)
    apply_lora(lm, rank=2, targets=("qkv", "fc2"))
    assert lm.lm_head.weight is lm.tok_embed.weight
    assert not lm.tok_embed.weight.requires_grad
    assert torch.equal(lm.generate(ids, max_new_tokens=6), want)


def test_bad_arguments_are_explained(tmp_path):
    with pytest.raises(ValueError, match="rank must be >= 1"):
        apply_lora(tiny_vit(), rank=0)
    with pytest.raises(ValueError, match=r"no nn\.Linear matches targets.*qkv"):
        apply_lora(tiny_vit(), targets=("query",))
    with pytest.raises(ValueError, match="no module named"):
        apply_lora(tiny_vit(), trainable=("classifier",))
    with pytest.raises(ValueError, match="no LoRA layers"):
        merge_lora(tiny_vit())
    model = apply_lora(tiny_vit())
    with pytest.raises(ValueError, match="already has LoRA"):
        apply_lora(model)
    pickled = tmp_path / "adapters.safetensors"
    pickled.write_bytes(pickle.dumps({"x": 1}))
    with pytest.raises(ValueError, match="not a safetensors file"):
        load_lora(tiny_vit(), pickled)
