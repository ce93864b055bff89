"""transformers' CLIP converted to our CLIP gives its features, logits and zero-shot
probabilities (fp32, atol 1e-4); sources are built with random weights from small configs
(no download)."""

import pytest
import torch
from torch import nn

import multimodal as mm
from multimodal import convert
from tests.convert.sources import Words, perturb_norms, perturb_norms_and_biases

transformers = pytest.importorskip("transformers")

ATOL = 1e-4


def hf_clip(eos_token_id=98, logit_scale=2.0, **text):
    torch.manual_seed(7)
    cfg = transformers.CLIPConfig(
        text_config=dict(vocab_size=99, hidden_size=32, intermediate_size=48,
                         num_hidden_layers=2, num_attention_heads=4,
                         max_position_embeddings=16, eos_token_id=eos_token_id,
                         bos_token_id=97, pad_token_id=0, **text),
        vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                           num_attention_heads=4, image_size=32, patch_size=8),
        projection_dim=24)
    source = transformers.CLIPModel(cfg)
    with torch.no_grad():
        source.vision_model.embeddings.class_embedding.normal_()
        source.logit_scale.fill_(logit_scale)
    return perturb_norms(source)


# right padding; the first row's eot (98) is followed by pads, the second is full
CLIP_IDS = torch.tensor([[97, 5, 6, 7, 98, 0, 0], [97, 9, 10, 11, 12, 13, 98]])


CLIP_MASK = (torch.arange(7) < torch.tensor([[5], [7]])).long()


def _check_clip(source, ours, ids, mask):
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        want = source(input_ids=ids, attention_mask=mask, pixel_values=images)
        # transformers 5 returns the projected features as pooler_output
        img = source.get_image_features(pixel_values=images).pooler_output
        txt = source.get_text_features(input_ids=ids, attention_mask=mask).pooler_output
        torch.testing.assert_close(ours.encode_image(images, normalize=False), img,
                                   atol=ATOL, rtol=1e-4)
        torch.testing.assert_close(ours.encode_text(ids, mask, normalize=False), txt,
                                   atol=ATOL, rtol=1e-4)
        torch.testing.assert_close(ours.similarity(images, ids, mask), want.logits_per_image,
                                   atol=ATOL, rtol=1e-4)
        torch.testing.assert_close(ours.similarity(images, ids, mask).T,
                                   want.logits_per_text, atol=ATOL, rtol=1e-4)


def test_hf_clip_converts_to_our_clip_with_matching_features_and_logits():
    source = hf_clip()
    ours = convert.from_hf(source)
    assert type(ours) is mm.CLIP and type(convert.convert(source)) is mm.CLIP
    text = ours.config.text
    assert (text.causal, text.norm, text.activation, text.embed_norm) == \
        (True, "pre", "quick_gelu", False)
    assert ours.config.eot_token_id == 98
    _check_clip(source, ours, CLIP_IDS, CLIP_MASK)


def test_hf_clip_pools_at_first_eos_not_at_last_real_token():
    """transformers reads the first eos_token_id; here a row has a token after its eos
    (inside the mask), so "last real token" would differ."""
    source, ids = hf_clip(), CLIP_IDS.clone()
    ids[0, 5] = 40
    mask = CLIP_MASK.clone()
    mask[0, 5] = 1
    ours = convert.from_hf(source)
    _check_clip(source, ours, ids, mask)
    with torch.no_grad():  # and that differs from pooling at the last real token
        ours.config.eot_token_id = None
        assert not torch.allclose(ours.encode_text(ids, mask, normalize=False)[0],
                                  source.get_text_features(input_ids=ids, attention_mask=mask)
                                  .pooler_output[0], atol=1e-2)


def test_hf_clip_legacy_eos_2_pools_at_largest_id():
    """Configs with eos_token_id == 2 (before transformers PR 24773) pool at argmax(ids):
    the first <|endoftext|>, the vocabulary's last id (98 here)."""
    source = hf_clip(eos_token_id=2)
    ours = convert.from_hf(source)
    assert ours.config.eot_token_id == 98
    ids = CLIP_IDS.clone()
    ids[0, 5:] = 98  # OpenAI's tokenizer pads with <|endoftext|> too; attended here, so
    _check_clip(source, ours, ids, torch.ones_like(ids))  # the last real token is not eot


def test_hf_clip_logit_scale_above_log100_is_not_clamped():
    source = hf_clip(logit_scale=5.0)  # transformers does not clamp at inference
    _check_clip(source, convert.from_hf(source), CLIP_IDS, CLIP_MASK)


def test_hf_clip_zero_shot_is_softmax_of_logits_per_image():
    source = hf_clip()
    ours = convert.from_hf(source)

    words = {"a": 5, "photo": 6, "of": 7, "dog": 9, "cat": 10, "red": 11, "car": 12}

    class Words:  # a tokenizer of our API over a fixed word -> id table
        vocab_size = 99

        def encode_many(self, texts, add_cls=False, add_eos=False):
            return [[97] + [words[w] for w in t.split()] + [98] * add_eos for t in texts]

        def pad(self, seqs):
            n = max(map(len, seqs))
            ids = torch.tensor([s + [0] * (n - len(s)) for s in seqs])
            return {"input_ids": ids, "attention_mask": (ids != 0).long()}

    classes = ["dog", "cat", "red car"]
    prompts = [f"a photo of {c}" for c in classes]
    batch = Words().pad(Words().encode_many(prompts, add_eos=True))
    images = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        want = source(pixel_values=images, **batch).logits_per_image.softmax(dim=-1)
        got = ours.zero_shot(images, classes, templates=["a photo of {}"], tokenizer=Words())
    torch.testing.assert_close(got, want, atol=ATOL, rtol=1e-4)
    assert got.shape == (4, 3)


def test_clip_without_image_projection_needs_matching_width():
    vision = mm.ViTConfig(image_size=16, patch_size=8, dim=32, depth=1, heads=2, mlp_dim=32)
    text = mm.TextEncoderConfig(vocab_size=20, max_len=8, dim=16, depth=1, heads=2)
    with pytest.raises(ValueError, match=r"embed_dim \(24\) must equal vision.dim \(32\)"):
        mm.CLIPConfig(vision=vision, text=text, embed_dim=24, image_projection=False)
    with pytest.raises(ValueError, match="text_pool must be"):
        mm.CLIPConfig(vision=vision, text=text, text_pool="first")


def hf_clip_small():
    torch.manual_seed(7)
    cfg = transformers.CLIPConfig(
        text_config=dict(vocab_size=99, hidden_size=32, intermediate_size=48,
                         num_hidden_layers=2, num_attention_heads=4,
                         max_position_embeddings=16, eos_token_id=98, bos_token_id=97,
                         pad_token_id=0),
        vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                           num_attention_heads=4, image_size=32, patch_size=8),
        projection_dim=24)
    source = transformers.CLIPModel(cfg)
    with torch.no_grad():
        source.logit_scale.fill_(3.0)
    return perturb_norms_and_biases(source)


def test_clip_zero_shot_equals_transformers_softmax_one_template():
    source = hf_clip_small()
    ours = convert.from_hf(source)
    classes = ["dog", "cat", "red car"]
    batch = Words().pad(Words().encode_many([f"a photo of {c}" for c in classes],
                                            add_eos=True))
    images = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        want = source(pixel_values=images, **batch).logits_per_image.softmax(dim=-1)
    got = ours.zero_shot(images, classes, templates=["a photo of {}"], tokenizer=Words())
    torch.testing.assert_close(got, want, atol=ATOL, rtol=1e-4)
    assert not torch.allclose(got, torch.full_like(got, 1 / 3), atol=1e-2)  # not uniform


def test_clip_zero_shot_prompt_ensemble_equals_transformers_features():
    """Several templates: the class vector is the renormalised mean of the normalised
    text features (CLIP's prompt ensembling), computed here from transformers' features."""
    source = hf_clip_small()
    ours = convert.from_hf(source)
    classes, templates = ["dog", "cat", "red car"], ["a photo of {}", "a sketch of {}",
                                                     "a blurry {}"]
    texts = [t.format(c) for c in classes for t in templates]
    batch = Words().pad(Words().encode_many(texts, add_eos=True))
    images = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        txt = source.get_text_features(**batch).pooler_output
        img = source.get_image_features(pixel_values=images).pooler_output
    txt = nn.functional.normalize(txt, dim=-1).view(3, 3, -1).mean(1)
    txt = nn.functional.normalize(txt, dim=-1)
    img = nn.functional.normalize(img, dim=-1)
    want = (source.logit_scale.exp() * img @ txt.T).softmax(-1)
    got = ours.zero_shot(images, classes, templates=templates, tokenizer=Words())
    torch.testing.assert_close(got, want, atol=ATOL, rtol=1e-4)
