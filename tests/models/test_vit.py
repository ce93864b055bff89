"""ViT model: shapes, attention maps, positions for other sizes, bad input; register tokens,
attention pooling and 2-D rotary positions against their formulas."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import multimodal as mm
from multimodal.nn.embed import ConvPatchEmbed, PatchEmbed
from multimodal.nn.position import grid_positions
from multimodal.tokenizers.image import patchify, unpatchify
from tests.nn.test_block import _ln, close


def tiny(**kw) -> mm.ViT:
    cfg = dict(image_size=32, patch_size=8, in_channels=3, num_classes=5, dim=32, depth=2,
               heads=4)
    cfg.update(kw)
    return mm.ViT(mm.ViTConfig(**cfg)).eval()


def test_patchify_is_raster_order_and_inverts():
    images = torch.arange(2 * 3 * 8 * 12, dtype=torch.float32).view(2, 3, 8, 12)
    patches = patchify(images, 4)
    assert patches.shape == (2, 6, 4 * 4 * 3)
    # patch (row 1, col 2) is the 5th+1 patch in raster order; first entry = pixel (4, 8), ch 0
    assert patches[0, 1 * 3 + 2, 0] == images[0, 0, 4, 8]
    # channels last inside a patch: entry 1 is channel 1 of the same pixel
    assert patches[0, 0, 1] == images[0, 1, 0, 0]
    assert torch.equal(unpatchify(patches, 4, (2, 3), 3), images)


def test_patch_embed_is_a_linear_map_of_each_patch():
    embed = PatchEmbed(4, 3, 16)
    images = torch.randn(2, 3, 8, 8)
    # the conv weight (D, C, p, p) as a matrix acting on the (p, p, C)-ordered patch vector
    w = embed.proj.weight.permute(0, 2, 3, 1).reshape(16, -1)
    expected = patchify(images, 4) @ w.T + embed.proj.bias
    torch.testing.assert_close(embed(images), expected, atol=1e-5, rtol=1e-5)


def test_conv_stem_grid_and_translation_equivariance():
    stem = ConvPatchEmbed(4, 3, 32).eval()
    assert [m.stride for m in stem.proj if isinstance(m, torch.nn.Conv2d)] == [
        (2, 2), (2, 2), (1, 1)]
    images = torch.zeros(1, 3, 32, 32)
    images[..., 8:20, 8:16] = torch.randn(3, 12, 8)
    tokens = stem(images)
    assert tokens.shape == (1, 8 * 8, 32) and stem.grid_size(32, 32) == (8, 8)
    # moving the picture by one patch (4 px) right and down moves every token by one grid
    # cell: the convolutions are translation-equivariant (checked away from the border)
    shifted = stem(torch.roll(images, shifts=(4, 4), dims=(2, 3)))
    grid, moved = tokens.view(8, 8, 32), shifted.view(8, 8, 32)
    torch.testing.assert_close(moved[2:7, 2:7], grid[1:6, 1:6], atol=1e-5, rtol=1e-5)
    for bad in (3, 6, (4, 8)):
        with pytest.raises(ValueError, match="power-of-two"):
            ConvPatchEmbed(bad, 3, 32)
    vit = tiny(stem="conv", patch_size=4, pool="mean")
    assert vit(torch.randn(2, 3, 32, 32)).shape == (2, 5)
    with pytest.raises(ValueError, match="stem"):
        mm.ViTConfig(stem="resnet")


@pytest.mark.parametrize("pool", ["cls", "mean"])
@pytest.mark.parametrize("pos", ["learned", "sincos"])
def test_shapes_square_nonsquare_and_resized(pool, pos):
    vit = tiny(pool=pool, pos_embed=pos)
    assert vit(torch.randn(3, 3, 32, 32)).shape == (3, 5)
    assert vit.forward_features(torch.randn(3, 3, 32, 32)).shape == (3, 1 + 16, 32)
    # another size: positions resampled (dynamic_size defaults to True)
    assert vit(torch.randn(2, 3, 48, 24)).shape == (2, 5)
    assert vit.forward_features(torch.randn(2, 3, 48, 24)).shape == (2, 1 + 6 * 3, 32)
    # non-square model
    rect = tiny(image_size=(16, 40), pool=pool, pos_embed=pos)
    assert rect.forward_features(torch.randn(2, 3, 16, 40)).shape == (2, 1 + 2 * 5, 32)


def test_mean_pool_averages_patch_tokens_and_head_is_linear():
    vit = tiny(pool="mean")
    x = torch.randn(2, 3, 32, 32)
    feats = vit.forward_features(x)
    expected = F.linear(feats[:, 1:].mean(1), vit.head.weight, vit.head.bias)
    torch.testing.assert_close(vit(x), expected)


def test_fixed_size_model_refuses_other_sizes():
    vit = tiny(dynamic_size=False)
    with pytest.raises(ValueError, match="patch grid"):
        vit(torch.randn(1, 3, 48, 48))


def test_resampling_at_the_same_size_changes_nothing():
    vit = tiny()
    x = torch.randn(2, 3, 32, 32)
    tokens = vit.patch_embed(x)
    cls = vit.cls_token.expand(2, -1, -1)
    by_hand = torch.cat([cls, tokens], 1) + vit.pos_embed
    torch.testing.assert_close(vit.embed(x), by_hand)


def test_attention_maps_are_row_stochastic_and_match_logits():
    vit = tiny()
    x = torch.randn(2, 3, 32, 32)
    logits, maps = vit(x, return_attention=True)
    assert len(maps.self_attn) == 2 and maps.cross_attn == []
    for a in maps.self_attn:
        assert a.shape == (2, 4, 17, 17)
        assert (a >= 0).all()
        torch.testing.assert_close(a.sum(-1), torch.ones(2, 4, 17))
    torch.testing.assert_close(logits, vit(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "images, match",
    [
        (torch.randn(2, 1, 32, 32), "3 channel"),
        (torch.randn(3, 32, 32), "shape"),
        (torch.randint(0, 255, (2, 3, 32, 32), dtype=torch.uint8), "floating-point"),
        (torch.randn(2, 3, 30, 32), "multiple of the patch size"),
        ([[1.0]], "torch.Tensor"),
    ],
)
def test_bad_images_get_clear_errors(images, match):
    with pytest.raises(ValueError, match=match):
        tiny()(images)


def test_config_errors():
    with pytest.raises(ValueError, match="class_token"):
        mm.ViTConfig(pool="cls", class_token=False)
    with pytest.raises(ValueError, match="multiple of patch_size"):
        mm.ViTConfig(image_size=30, patch_size=16)


def test_presets_and_save_load(tmp_path):
    vit = mm.create_model("vit_fashion_mnist", depth=1)
    assert vit.config.depth == 1 and vit.config.image_size == 32
    x = torch.randn(2, 1, 32, 32)
    vit.eval().save_pretrained(tmp_path)
    torch.testing.assert_close(mm.from_pretrained(tmp_path)(x), vit(x), atol=0, rtol=0)
    with pytest.raises(ValueError, match="unknown preset"):
        mm.create_model("vit_nope")


# -- ViT: register tokens, attention pooling, 2-D rotary ---------------------------------
def _vit(**kw):
    base = dict(image_size=16, patch_size=4, dim=32, depth=2, heads=4, num_classes=0)
    return mm.ViT(mm.ViTConfig(**{**base, **kw})).eval()


def test_vit_register_tokens_follow_class_token_without_positions():
    torch.manual_seed(5)
    vit = _vit(registers=3)
    assert vit.num_prefix_tokens == 4 and vit.pos_embed.shape == (1, 1 + 16, 32)
    images = torch.randn(2, 3, 16, 16)
    patches = vit.patch_embed(images)
    want = torch.cat([(vit.cls_token + vit.pos_embed[:, :1]).expand(2, -1, -1),
                      vit.reg_token.expand(2, -1, -1), patches + vit.pos_embed[:, 1:]], 1)
    torch.testing.assert_close(vit.embed(images), want)
    feats = vit.forward_features(images)
    assert feats.shape == (2, 20, 32)
    torch.testing.assert_close(vit.forward_head(feats), feats[:, 0])
    mean_vit = _vit(registers=3, pool="mean")
    f = mean_vit.forward_features(images)
    torch.testing.assert_close(mean_vit.forward_head(f), f[:, 4:].mean(1))  # patches only


def test_vit_attention_pooling_formula():
    """MAP: ``z = softmax(q k^T / sqrt(d)) v W_o`` with q from the probe, ``y = z + MLP(LN z)``."""
    torch.manual_seed(6)
    vit = _vit(pool="map")
    pool = vit.attn_pool
    x = torch.randn(2, 17, 32).double()
    a = pool.attn
    q = pool.probe.double() @ a.q.weight.double().T + a.q.bias.double()
    kv = x @ a.kv.weight.double().T + a.kv.bias.double()
    k, v = kv[..., :32], kv[..., 32:]
    heads = []
    for h in range(4):
        r = slice(8 * h, 8 * h + 8)
        s = q[..., r] @ k[..., r].transpose(-2, -1) / math.sqrt(8)
        heads.append(torch.softmax(s, -1) @ v[..., r])
    z = torch.cat(heads, -1) @ a.proj.weight.double().T + a.proj.bias.double()
    n = pool.norm
    h1 = _ln(z, n.weight.double(), n.bias.double(), n.eps) @ pool.mlp.fc1.weight.double().T \
        + pool.mlp.fc1.bias.double()
    h1 = 0.5 * h1 * (1 + torch.erf(h1 / math.sqrt(2)))
    want = (z + h1 @ pool.mlp.fc2.weight.double().T + pool.mlp.fc2.bias.double())[:, 0]
    close(vit.pool(x.float()), want)


def test_vit_2d_rope_gets_grid_positions():
    """A rope='2d' ViT rotates by (row, column): moving the image content moves features."""
    torch.manual_seed(7)
    vit = _vit(pos_embed="none", rope="2d", registers=1)
    assert vit.pos_embed is None
    images = torch.randn(1, 3, 16, 16)
    x = vit.embed(images)
    want = vit.transformer(x, positions=grid_positions(4, 4, prefix=2))
    torch.testing.assert_close(vit.forward_features(images), want)
    assert not torch.allclose(want, vit.transformer(x, positions=grid_positions(4, 4, 2) * 2))
