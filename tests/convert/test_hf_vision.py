"""transformers' vision encoders (ViT, DINOv2, DeiT) converted to our ViT give the source's
outputs (fp32, atol 1e-4); sources are built with random weights from small configs (no
download)."""

import pytest
import torch

from multimodal import convert
from tests.convert.sources import perturb_norms, random_images, randomise_layer_norms

transformers = pytest.importorskip("transformers")

# Ours and the peer compute the same maths in float32 in another order of operations:
# an absolute floor for values near zero plus float32's relative resolution (torch's default
# rtol, about ten ulps) so that the tolerance scales with the outputs' magnitude.
ATOL = 1e-4
RTOL = 1.3e-6


# -- ViT --------------------------------------------------------------------------------
def hf_vit_config(**kw):
    args = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                image_size=32, patch_size=8, num_labels=4)
    return transformers.ViTConfig(**{**args, **kw})


def test_hf_vit_model_features_match_last_hidden_state():
    torch.manual_seed(0)
    source = randomise_layer_norms(transformers.ViTModel(hf_vit_config()))
    ours = convert.from_hf(source)
    assert ours.config.norm_eps == 1e-12 and ours.config.num_classes == 0
    x = random_images()
    with torch.no_grad():
        hidden = source(pixel_values=x).last_hidden_state
        torch.testing.assert_close(ours.forward_features(x), hidden, atol=ATOL, rtol=RTOL)
        # documented: forward returns the normalised class token, not the tanh pooler
        torch.testing.assert_close(ours(x), hidden[:, 0], atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("act", ["gelu", "gelu_new"])
def test_hf_vit_classifier_matches(act):
    torch.manual_seed(0)
    source = randomise_layer_norms(transformers.ViTForImageClassification(
        hf_vit_config(hidden_act=act)))
    ours = convert.from_hf(source)
    x = random_images()
    with torch.no_grad():
        torch.testing.assert_close(ours(x), source(pixel_values=x).logits, atol=ATOL, rtol=RTOL)


# -- DINOv2 -----------------------------------------------------------------------------
def dinov2(registers=0, **kw):
    args = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, image_size=42,
                patch_size=14, layerscale_value=0.5)
    args.update(kw)
    torch.manual_seed(1)
    if registers:
        model = transformers.Dinov2WithRegistersModel(
            transformers.Dinov2WithRegistersConfig(num_register_tokens=registers, **args))
    else:
        model = transformers.Dinov2Model(transformers.Dinov2Config(**args))
    with torch.no_grad():
        model.embeddings.cls_token.normal_()
        if registers:
            model.embeddings.register_tokens.normal_()
    return perturb_norms(model)


@pytest.mark.parametrize("registers, kw", [(0, {}), (0, dict(use_swiglu_ffn=True)),
                                           (4, {})])
def test_hf_dinov2_matches(registers, kw):
    source = dinov2(registers, **kw)
    ours = convert.from_hf(source)
    assert ours.config.registers == registers and ours.num_prefix_tokens == 1 + registers
    x = torch.randn(2, 3, 42, 42)
    with torch.no_grad():
        want = source(pixel_values=x)
        torch.testing.assert_close(ours.forward_features(x), want.last_hidden_state,
                                   atol=ATOL, rtol=1e-4)
        torch.testing.assert_close(ours(x), want.pooler_output, atol=ATOL, rtol=1e-4)


# -- DeiT (distillation token) ----------------------------------------------------------
def deit(kind):
    torch.manual_seed(4)
    cfg = transformers.DeiTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=48, image_size=32, patch_size=8,
                                  num_labels=5)
    model = getattr(transformers, kind)(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "token" in name:
                p.normal_()
    return perturb_norms(model)


def test_hf_deit_model_features_match():
    source = deit("DeiTModel")
    ours = convert.from_hf(source)
    assert ours.config.distill_token and ours.num_prefix_tokens == 2
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_features(x),
                                   source(pixel_values=x).last_hidden_state, atol=ATOL, rtol=1e-4)


def test_hf_deit_with_teacher_logits_match():
    source = deit("DeiTForImageClassificationWithTeacher")
    ours = convert.from_hf(source)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = source(pixel_values=x)
        torch.testing.assert_close(ours(x), want.logits, atol=ATOL, rtol=1e-4)
        feats = ours.forward_features(x)
        torch.testing.assert_close(ours.head_dist(feats[:, 1]), want.distillation_logits,
                                   atol=ATOL, rtol=1e-4)
