"""timm's ViTs (plain, DINOv2 with registers, qk-norm, distilled DeiT, CLIP's vision tower)
converted to our ViT give timm's outputs (fp32, atol 1e-4), image-size resampling included;
sources are built with random weights from small configs (no download)."""

import pytest
import torch

from multimodal import convert
from tests.convert.sources import perturb_norms, random_images, randomise_layer_norms

timm = pytest.importorskip("timm")

from timm.layers import resample_abs_pos_embed  # noqa: E402
from timm.models.vision_transformer import VisionTransformer as TimmViT  # noqa: E402

# Ours and the peer compute the same maths in float32 in another order of operations:
# an absolute floor for values near zero plus float32's relative resolution (torch's default
# rtol, about ten ulps) so that the tolerance scales with the outputs' magnitude.
ATOL = 1e-4
RTOL = 1.3e-6


def small_timm(**kw) -> TimmViT:
    args = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=10)
    torch.manual_seed(0)
    return randomise_layer_norms(TimmViT(**{**args, **kw}))


@pytest.mark.parametrize("kw", [
    {},
    {"global_pool": "avg", "fc_norm": False},
    {"class_token": False, "global_pool": "avg", "fc_norm": False},
    {"act_layer": "gelu_tanh", "qkv_bias": False, "mlp_ratio": 2.0},
    {"num_classes": 0},
], ids=["token", "avg", "no-cls", "tanh-nobias", "headless"])
def test_timm_small_matches(kw):
    source = small_timm(**kw)
    ours = convert.from_timm(source)
    x = random_images()
    with torch.no_grad():
        torch.testing.assert_close(ours(x), source(x), atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(ours.forward_features(x), source.forward_features(x),
                                   atol=ATOL, rtol=RTOL)


def test_timm_registered_model_matches():
    source = randomise_layer_norms(timm.create_model("vit_tiny_patch16_224", pretrained=False,
                                                num_classes=10))
    ours = convert.from_timm(source)
    assert (ours.config.dim, ours.config.depth, ours.config.heads) == (192, 12, 3)
    x = random_images(224, batch=1)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), source(x), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("new_size", [48, 16, (48, 24)])
def test_timm_other_image_size_resamples_like_timm(new_size):
    source = small_timm()
    ours = convert.from_timm(source, img_size=new_size)
    h, w = (new_size, new_size) if isinstance(new_size, int) else new_size
    want_pos = resample_abs_pos_embed(source.pos_embed.detach(), [h // 8, w // 8],
                                      num_prefix_tokens=1)
    torch.testing.assert_close(ours.pos_embed.detach(), want_pos, atol=1e-6, rtol=RTOL)
    # timm's own model at the new size, with the resampled grid, gives the same outputs
    target = small_timm(img_size=(h, w))
    state = dict(source.state_dict(), pos_embed=want_pos)
    target.load_state_dict(state)
    x = torch.randn(2, 3, h, w)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), target.eval()(x), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("kw,words", [
    # layer scale, registers and qk_norm convert now (test_timm_dinov2_matches, below)
    ({"class_token": False, "no_embed_class": True, "global_pool": "avg", "fc_norm": False},
     "no_embed_class"),
    ({"global_pool": "avg"}, "fc_norm"),
    ({"global_pool": "map"}, "attention pooling"),
])
def test_timm_unsupported_features_are_named(kw, words):
    with pytest.raises(ValueError, match=words):
        convert.from_timm(small_timm(**kw))


@pytest.mark.parametrize("name", ["vit_small_patch14_dinov2", "vit_small_patch14_reg4_dinov2"])
def test_timm_dinov2_matches(name):
    torch.manual_seed(2)
    source = timm.create_model(name, pretrained=False, img_size=42, depth=2, num_classes=0)
    with torch.no_grad():
        source.cls_token.normal_()
        if source.reg_token is not None:
            source.reg_token.normal_()
    perturb_norms(source)
    ours = convert.from_timm(source)
    assert ours.config.registers == source.num_reg_tokens
    x = torch.randn(2, 3, 42, 42)
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_features(x), source.forward_features(x),
                                   atol=ATOL, rtol=1e-4)
        torch.testing.assert_close(ours(x), source(x), atol=ATOL, rtol=1e-4)


def test_timm_qk_norm_matches():
    torch.manual_seed(3)
    source = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=3,
        qk_norm=True, init_values=0.1)
    perturb_norms(source)
    ours = convert.from_timm(source)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), source(x), atol=ATOL, rtol=1e-4)


def test_timm_deit_distilled_matches():
    torch.manual_seed(5)
    source = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False,
                               img_size=32, depth=2, num_classes=7)
    with torch.no_grad():
        source.cls_token.normal_()
        source.dist_token.normal_()
    perturb_norms(source)
    ours = convert.from_timm(source)
    assert ours.config.distill_token
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_features(x), source.forward_features(x),
                                   atol=ATOL, rtol=1e-4)
        torch.testing.assert_close(ours(x), source(x), atol=ATOL, rtol=1e-4)


def test_timm_clip_vision_tower_matches():
    """timm's CLIP image towers: a LayerNorm before the blocks (pre_norm) and quick_gelu."""
    torch.manual_seed(6)
    source = timm.create_model("vit_base_patch16_clip_quickgelu_224", pretrained=False,
                               img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4,
                               num_classes=6)
    perturb_norms(source)
    ours = convert.from_timm(source)
    assert ours.config.pre_norm and ours.config.activation == "quick_gelu"
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), source(x), atol=ATOL, rtol=1e-4)
