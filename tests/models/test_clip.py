"""CLIP: features, temperature, pooling, zero-shot against the formulas; bad input."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import multimodal as mm
from multimodal.models.clip import tokenize_texts
from multimodal.tokenizers.text import WordTokenizer

VISION = dict(image_size=16, patch_size=4, in_channels=3, dim=32, depth=1, heads=2,
              mlp_dim=64)
TEXT = dict(vocab_size=40, max_len=12, dim=24, depth=1, heads=2, mlp_dim=48)


def tiny(**kw) -> mm.CLIP:
    torch.manual_seed(0)
    text = {**TEXT, **kw.pop("text", {})}
    return mm.CLIP(mm.CLIPConfig(vision=mm.ViTConfig(**VISION),
                                 text=mm.TextEncoderConfig(**text), embed_dim=16, **kw)).eval()


@pytest.fixture(scope="module")
def tokenizer() -> WordTokenizer:
    return WordTokenizer.train(["a red circle", "a blue square", "a photo of a green star",
                                "this is a cat"], vocab_size=None, lowercase=True)


def test_features_are_unit_vectors_and_scale_starts_at_1_over_007():
    model = tiny()
    images, ids = torch.randn(3, 3, 16, 16), torch.randint(8, 40, (3, 5))
    img, txt = model.forward_features(images, ids).unbind(1)
    assert img.shape == txt.shape == (3, 16)
    torch.testing.assert_close(img.norm(dim=-1), torch.ones(3))
    torch.testing.assert_close(txt.norm(dim=-1), torch.ones(3))
    assert model.logit_scale.item() == pytest.approx(math.log(1 / 0.07))
    assert model.scale().item() == pytest.approx(1 / 0.07, rel=1e-6)
    expected = (1 / 0.07) * img @ txt.T
    torch.testing.assert_close(model.similarity(images, ids), expected)
    torch.testing.assert_close(model(images, ids), expected)  # logits_per_image of the pairs
    # projections are bias-free Linear layers, the layout converters rely on
    assert model.visual_projection.bias is None and model.text_projection.bias is None
    assert model.logit_bias is None


def test_logit_scale_is_capped_at_log_100_and_gets_no_gradient_above():
    model = tiny()
    with torch.no_grad():
        model.logit_scale.fill_(7.0)
    s = model.scale()
    assert s.item() == pytest.approx(100.0, rel=1e-6)
    s.backward()
    assert model.logit_scale.grad.item() == 0.0
    model.clamp_logit_scale()
    assert model.logit_scale.item() == pytest.approx(math.log(100.0))


def test_sigmoid_switch_adds_a_learnable_bias_to_the_similarity():
    model = tiny(loss="sigmoid")
    assert model.logit_bias.item() == -10.0 and model.logit_bias.requires_grad
    images, ids = torch.randn(2, 3, 16, 16), torch.randint(8, 40, (4, 5))
    expected = model.scale() * model.encode_image(images) @ model.encode_text(ids).T - 10.0
    torch.testing.assert_close(model.similarity(images, ids), expected)


@pytest.mark.parametrize("causal", [False, True])
def test_eot_pooling_reads_the_last_real_token_whatever_the_padding(causal):
    model = tiny(text={"causal": causal})
    short, long = [9, 10, 11, 6], [12, 13, 14, 15, 16, 6]
    ids = torch.tensor([[*short, 0, 0], long])
    mask = torch.tensor([[1] * 4 + [0, 0], [1] * 6])
    both = model.encode_text(ids, mask)
    torch.testing.assert_close(both[0], model.encode_text(torch.tensor([short]))[0])
    torch.testing.assert_close(both[1], model.encode_text(torch.tensor([long]))[0])
    hidden = model.text_model(torch.tensor([long]))
    expected = F.normalize(model.text_projection(hidden[:, -1]), dim=-1)
    torch.testing.assert_close(both[1:], expected)


def test_causal_text_tower_does_not_look_ahead():
    model = tiny(text={"causal": True})
    a = torch.tensor([[9, 10, 11, 12]])
    b = torch.tensor([[9, 10, 11, 30]])
    ha, hb = model.text_model(a), model.text_model(b)
    torch.testing.assert_close(ha[:, :3], hb[:, :3])
    assert not torch.allclose(ha[:, 3], hb[:, 3])


def test_cls_pooling_reads_position_zero(tokenizer):
    model = tiny(text_pool="cls")
    batch = tokenize_texts(tokenizer, ["a red circle", "a blue square"], "cls")
    assert (batch["input_ids"][:, 0] == tokenizer.cls_token_id).all()
    hidden = model.text_model(batch["input_ids"], batch["attention_mask"])
    expected = F.normalize(model.text_projection(hidden[:, 0]), dim=-1)
    torch.testing.assert_close(model.encode_text(**batch), expected)
    with pytest.raises(ValueError, match="causal"):
        mm.CLIPConfig(text=mm.TextEncoderConfig(**TEXT, causal=True), text_pool="cls")


def test_mean_pooling_averages_the_real_tokens_only(tokenizer):
    model = tiny(text_pool="mean")
    texts = ["a red circle", "a large blue square left of a cat"]
    batch = tokenize_texts(tokenizer, texts, "mean")
    assert (batch["attention_mask"] == 0).any()  # the short text is padded
    # by hand: each text alone (no padding), the plain mean of its hidden states
    expected = []
    for text in texts:
        ids = torch.tensor([tokenizer.encode(text, add_eos=True)])
        hidden = model.text_model(ids)[0]
        expected.append(F.normalize(model.text_projection(hidden.sum(0) / len(hidden)), dim=-1))
    torch.testing.assert_close(model.encode_text(**batch), torch.stack(expected))
    with pytest.raises(ValueError, match="text_pool"):
        mm.CLIPConfig(text_pool="max")


def test_zero_shot_is_the_softmax_over_template_averaged_class_embeddings(tokenizer):
    model = tiny()
    images = torch.randn(5, 3, 16, 16)
    names, templates = ["red circle", "blue square", "cat"], ["a {}", "a photo of a {}"]
    probs = model.zero_shot(images, names, templates, tokenizer=tokenizer)
    # by hand: embed every prompt alone (no padding), average per class, renormalise
    cls = []
    for name in names:
        embs = [model.encode_text(torch.tensor([tokenizer.encode(t.format(name),
                                                                 add_eos=True)]))[0]
                for t in templates]
        mean = torch.stack(embs).mean(0)
        cls.append(mean / mean.norm())
    logits = (1 / 0.07) * model.encode_image(images) @ torch.stack(cls).T
    expected = torch.exp(logits - logits.max(1, keepdim=True).values)
    expected = expected / expected.sum(1, keepdim=True)
    assert probs.shape == (5, 3)
    torch.testing.assert_close(probs, expected)


def test_zero_shot_sum_ensemble_is_the_probability_of_any_of_the_class_prompts(tokenizer):
    model = tiny()
    images = torch.randn(4, 3, 16, 16)
    names, templates = ["red circle", "blue square", "cat"], ["a small {}", "a large {}"]
    probs = model.zero_shot(images, names, templates, tokenizer=tokenizer, ensemble="sum")
    # by hand: every prompt alone, one softmax over the 6 prompts, summed per class
    prompts = torch.stack([model.encode_text(torch.tensor([tokenizer.encode(
        t.format(n), add_eos=True)]))[0] for n in names for t in templates])
    logits = (1 / 0.07) * model.encode_image(images) @ prompts.T
    p = logits.softmax(dim=1)
    expected = torch.stack([p[:, 0] + p[:, 1], p[:, 2] + p[:, 3], p[:, 4] + p[:, 5]], dim=1)
    torch.testing.assert_close(probs, expected)
    with pytest.raises(ValueError, match="ensemble"):
        model.zero_shot(images, names, templates, tokenizer=tokenizer, ensemble="max")


def test_save_and_load_give_the_same_model(tmp_path):
    model = tiny(loss="sigmoid", text={"causal": True})
    with torch.no_grad():
        model.logit_scale.fill_(3.0)
    path = model.save_pretrained(tmp_path / "clip")
    again = mm.from_pretrained(path)
    assert isinstance(again, mm.CLIP) and again.config == model.config
    images, ids = torch.randn(2, 3, 16, 16), torch.randint(8, 40, (3, 5))
    torch.testing.assert_close(again.eval().similarity(images, ids), model.similarity(images, ids))
    assert isinstance(mm.CLIP.from_pretrained(path), mm.CLIP)


# -- bad input ----------------------------------------------------------------------------

def test_images_and_texts_of_different_batch_sizes_are_an_error():
    model = tiny()
    with pytest.raises(ValueError, match="3 images but 2 texts"):
        model(torch.randn(3, 3, 16, 16), torch.randint(8, 40, (2, 5)))


def test_empty_class_or_template_lists_and_templates_without_braces(tokenizer):
    model, images = tiny(), torch.randn(1, 3, 16, 16)
    with pytest.raises(ValueError, match="class_names must be a non-empty"):
        model.zero_shot(images, [], ["a {}"], tokenizer=tokenizer)
    with pytest.raises(ValueError, match="templates must be a non-empty"):
        model.zero_shot(images, ["cat"], [], tokenizer=tokenizer)
    with pytest.raises(ValueError, match=r"has no '\{\}'"):
        model.zero_shot(images, ["cat"], ["a {}", "a photo"], tokenizer=tokenizer)
    with pytest.raises(ValueError, match="exactly one"):
        model.zero_shot(images, ["cat"], ["a {} of a {}"], tokenizer=tokenizer)
    with pytest.raises(ValueError, match="exactly one"):
        model.zero_shot(images, ["cat"], ["a {name} {}"], tokenizer=tokenizer)


def test_texts_longer_than_the_context_are_truncated_with_one_warning():
    model = tiny()
    long = torch.randint(8, 40, (2, 20))
    with pytest.warns(UserWarning, match="longer than the text tower's context of 12"):
        out = model.encode_text(long)
    torch.testing.assert_close(out, model.encode_text(long[:, :12]))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.encode_text(long)  # the second time: no warning


def test_a_tokenizer_that_does_not_fit_the_text_tower_is_an_error(tokenizer):
    model = tiny(text={"vocab_size": 10})
    with pytest.raises(ValueError, match="not trained together"):
        model.zero_shot(torch.randn(1, 3, 16, 16), ["cat"], ["a {}"], tokenizer=tokenizer)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.encode_text(torch.tensor([[3, 12]]))


def test_eot_token_id_pools_at_first_occurrence_else_last_real_token():
    torch.manual_seed(0)
    clip = mm.CLIP(mm.CLIPConfig(eot_token_id=9)).eval()
    ids = torch.tensor([[1, 9, 4, 9, 5], [2, 3, 4, 5, 6], [1, 2, 9, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    with torch.no_grad():
        hidden = clip.text_model(ids, mask)
        # row 0: first 9 at 1; row 1: no 9 -> last real token 3; row 2: 9 at 2
        want = clip.text_projection(hidden[torch.arange(3), torch.tensor([1, 3, 2])])
        torch.testing.assert_close(clip.encode_text(ids, mask, normalize=False), want)
        clip.config.eot_token_id = None  # the default: the last real token of each row
        want = clip.text_projection(hidden[torch.arange(3), torch.tensor([4, 3, 2])])
        torch.testing.assert_close(clip.encode_text(ids, mask, normalize=False), want)
