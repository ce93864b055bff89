"""open_clip's CLIP variants converted to our CLIP give open_clip's image and text features
(fp32, atol 1e-4); sources are built with random weights from small configs (no download)."""

import pytest
import torch
from torch import nn

import multimodal as mm
from multimodal import convert
from tests.convert.sources import perturb_norms_and_biases

transformers = pytest.importorskip("transformers")

ATOL = 1e-4


def open_clip_model(kind="CLIP", seed=0, vision=None, text=None, **kw):
    open_clip = pytest.importorskip("open_clip")
    torch.manual_seed(seed)
    vision_cfg = dict(image_size=32, patch_size=8, width=32, layers=2, head_width=8,
                      mlp_ratio=1.5)
    text_cfg = dict(context_length=9, vocab_size=99, width=24, heads=4, layers=2,
                    mlp_ratio=2.0)
    vision_cfg.update(vision or {})
    text_cfg.update(text or {})
    model = getattr(open_clip, kind)(embed_dim=16, vision_cfg=vision_cfg, text_cfg=text_cfg,
                                     **kw)
    with torch.no_grad():  # open_clip initialises positions and norms plainly
        model.logit_scale.fill_(2.5)
    return perturb_norms_and_biases(model)


# full context rows (open_clip's encode_text takes no mask): eot = 98, the largest id,
# then zero padding, as open_clip's tokenizer writes them
OC_IDS = torch.tensor([[97, 5, 6, 98, 0, 0, 0, 0, 0], [97, 9, 10, 11, 12, 13, 14, 15, 98],
                       [97, 40, 98, 0, 0, 0, 0, 0, 0]])


def _check_open_clip(source, ours, ids=OC_IDS):
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        img, txt = source.encode_image(images), source.encode_text(ids)
        got_img = ours.encode_image(images, normalize=False)
        got_txt = ours.encode_text(ids, normalize=False)
        want_logits, _ = source.get_logits(images, ids)
        logits = ours.similarity(images, ids)
    torch.testing.assert_close(got_img, img, atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(got_txt, txt, atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(logits, want_logits, atol=ATOL, rtol=1e-4)
    return max(float((got_img - img).abs().max()), float((got_txt - txt).abs().max()),
               float((logits - want_logits).abs().max()))


def test_open_clip_converts_with_matching_image_and_text_features():
    source = open_clip_model()
    ours = convert.from_open_clip(source)
    assert type(ours) is mm.CLIP and type(convert.convert(source)) is mm.CLIP
    c = ours.config
    assert c.eot_token_id == 98 and c.text.causal and c.vision.pre_norm
    assert (c.vision.activation, c.text.activation) == ("gelu", "gelu")
    _check_open_clip(source, ours)


@pytest.mark.parametrize("variant", [
    dict(quick_gelu=True),
    dict(vision=dict(ls_init_value=0.5, pool_type="avg"), text=dict(ls_init_value=0.5)),
    dict(kind="CustomTextCLIP", text=dict(pool_type="eos", eos_id=98, proj_type="linear",
                                          proj_bias=True)),
    dict(kind="CustomTextCLIP", init_logit_bias=-3.0,
         text=dict(no_causal_mask=True, pool_type="last", proj_type="linear")),
])
def test_open_clip_variants_match(variant):
    source = open_clip_model(**variant)
    ours = convert.from_open_clip(source)
    if variant.get("quick_gelu"):
        assert ours.config.text.activation == ours.config.vision.activation == "quick_gelu"
    if "init_logit_bias" in variant:
        assert ours.config.loss == "sigmoid" and not ours.config.text.causal
    _check_open_clip(source, ours)


def test_open_clip_argmax_pooling_is_the_first_largest_id():
    """open_clip pools at argmax(ids); with the eot id (the vocabulary's largest) in each
    row that is the first eot, which is where ours pools; here a padded row repeats it."""
    source = open_clip_model(seed=1)
    ids = OC_IDS.clone()
    ids[0, 4:] = 98
    _check_open_clip(source, convert.from_open_clip(source), ids)


def test_open_clip_unsupported_features_are_named():
    source = open_clip_model(vision=dict(attentional_pool=True, attn_pooler_heads=4))
    with pytest.raises(ValueError, match="attentional pooling"):
        convert.from_open_clip(source)
    with pytest.raises(ValueError, match=r"cannot convert a .*open_clip: CLIP"):
        convert.convert(nn.Linear(2, 2))


@pytest.mark.slow
def test_open_clip_builtin_vit_b_32_matches():
    """A built-in config at full size (random weights, pretrained=None: no download)."""
    open_clip = pytest.importorskip("open_clip")
    torch.manual_seed(0)
    source = open_clip.create_model("ViT-B-32", pretrained=None).eval()
    ours = convert.convert(source)
    ids = torch.zeros(2, 77, dtype=torch.long)
    ids[0, :4] = torch.tensor([49406, 320, 1929, 49407])
    ids[1, :6] = torch.tensor([49406, 320, 1125, 539, 320, 49407])
    images = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours.encode_image(images, normalize=False),
                                   source.encode_image(images), atol=ATOL, rtol=1e-4)
        torch.testing.assert_close(ours.encode_text(ids, normalize=False),
                                   source.encode_text(ids), atol=ATOL, rtol=1e-4)
