"""transformers' SigLIP converted to our CLIP (sigmoid loss, MAP head) gives its features,
logits and zero-shot probabilities (fp32, atol 1e-4); sources are built with random weights
from small configs (no download)."""

import pytest
import torch
from torch import nn

import multimodal as mm
from multimodal import convert
from tests.convert.sources import Words, perturb_norms_and_biases

transformers = pytest.importorskip("transformers")

ATOL = 1e-4


def hf_siglip(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.SiglipConfig(
        text_config=dict(vocab_size=99, hidden_size=32, intermediate_size=48,
                         num_hidden_layers=2, num_attention_heads=4,
                         max_position_embeddings=16, projection_size=24, bos_token_id=1,
                         eos_token_id=2, pad_token_id=0),
        vision_config=dict(hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                           num_attention_heads=4, image_size=32, patch_size=8))
    source = transformers.SiglipModel(cfg)
    with torch.no_grad():
        source.logit_scale.fill_(2.3)
        source.logit_bias.fill_(-1.5)
    return perturb_norms_and_biases(source)


# right padding (pad id 0); SigLIP pools at the last column even where it is padding
SIG_IDS = torch.tensor([[5, 6, 7, 2, 0, 0, 0], [9, 10, 11, 12, 13, 14, 2]])


SIG_MASK = (SIG_IDS != 0).long()


def _check_pair_model(source, ours, ids, mask, images):
    with torch.no_grad():
        want = source(input_ids=ids, attention_mask=mask, pixel_values=images)
        img = source.get_image_features(pixel_values=images).pooler_output
        txt = source.get_text_features(input_ids=ids, attention_mask=mask).pooler_output
        got_img = ours.encode_image(images, normalize=False)
        got_txt = ours.encode_text(ids, mask, normalize=False)
        logits = ours.similarity(images, ids, mask)
    torch.testing.assert_close(got_img, img, atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(got_txt, txt, atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(logits, want.logits_per_image, atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(logits.T, want.logits_per_text, atol=ATOL, rtol=1e-4)
    return max(float((got_img - img).abs().max()), float((got_txt - txt).abs().max()),
               float((logits - want.logits_per_image).abs().max()))


def test_hf_siglip_converts_to_our_clip_with_matching_features_and_logits():
    source = hf_siglip()
    ours = convert.from_hf(source)
    assert type(ours) is mm.CLIP and type(convert.convert(source)) is mm.CLIP
    c = ours.config
    assert (c.loss, c.text_pool, c.image_projection, c.text_projection_bias) == \
        ("sigmoid", "last", False, True)
    assert c.vision.pool == "map" and not c.vision.class_token and not c.text.causal
    assert isinstance(ours.visual_projection, nn.Identity)
    assert ours.text_projection.bias is not None
    torch.testing.assert_close(ours.logit_bias, source.logit_bias[0])
    images = torch.randn(3, 3, 32, 32)
    _check_pair_model(source, ours, SIG_IDS, SIG_MASK, images)


def test_hf_siglip_pools_at_the_last_column_even_when_padded():
    """Row 0 is padded: transformers reads its last (padding) column, not its last real
    token; the two differ, and ours follows transformers."""
    source = hf_siglip()
    ours = convert.from_hf(source)
    with torch.no_grad():
        txt = source.get_text_features(input_ids=SIG_IDS, attention_mask=SIG_MASK).pooler_output
        hidden = ours.text_model(SIG_IDS, SIG_MASK)
        by_hand_last = ours.text_projection(hidden[:, -1])
        by_hand_real = ours.text_projection(hidden[0, 3])
    torch.testing.assert_close(by_hand_last, txt, atol=ATOL, rtol=1e-4)
    assert not torch.allclose(by_hand_real, txt[0], atol=1e-2)


def test_hf_siglip_map_head_matches_by_hand():
    """The attention-pooling head, computed by hand from transformers' weights:
    z = softmax(q kᵀ / sqrt(d)) v per head (q from the probe), y = z + MLP(LN z)."""
    source = hf_siglip(seed=3)
    ours = convert.from_hf(source)
    head = source.vision_model.head
    x = torch.randn(2, 16, 24)
    with torch.no_grad():
        w, b = head.attention.in_proj_weight, head.attention.in_proj_bias
        q = (head.probe @ w[:24].T + b[:24]).view(1, 1, 4, 6).transpose(1, 2)
        k = (x @ w[24:48].T + b[24:48]).view(2, 16, 4, 6).transpose(1, 2)
        v = (x @ w[48:].T + b[48:]).view(2, 16, 4, 6).transpose(1, 2)
        att = (q @ k.transpose(-1, -2) / 6 ** 0.5).softmax(-1) @ v
        z = head.attention.out_proj(att.transpose(1, 2).reshape(2, 1, 24))
        want = (z + head.mlp(head.layernorm(z)))[:, 0]
        got = ours.vision_model.attn_pool(x)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=1e-4)


def test_hf_siglip_without_head_is_refused():
    torch.manual_seed(0)
    cfg = transformers.SiglipConfig(
        text_config=dict(vocab_size=20, hidden_size=16, intermediate_size=16,
                         num_hidden_layers=1, num_attention_heads=2,
                         max_position_embeddings=8),
        vision_config=dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                           num_attention_heads=2, image_size=16, patch_size=8,
                           vision_use_head=False))
    with pytest.raises(ValueError, match="vision_use_head"):
        convert.from_hf(transformers.SiglipModel(cfg))


def test_siglip_zero_shot_equals_transformers_softmax():
    """SigLIP pools at the last column: prompts padded to one length give the same ids to
    both; the bias does not change a softmax over classes."""
    source = hf_siglip()
    ours = convert.from_hf(source)
    classes = ["dog", "cat", "red car"]
    batch = Words().pad(Words().encode_many([f"a photo of {c}" for c in classes]))
    images = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        want = source(pixel_values=images, **batch).logits_per_image.softmax(dim=-1)
    got = ours.zero_shot(images, classes, templates=["a photo of {}"], tokenizer=Words())
    torch.testing.assert_close(got, want, atol=ATOL, rtol=1e-4)
