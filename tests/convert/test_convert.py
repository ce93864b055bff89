"""Converted models give the source model's outputs (fp32, atol 1e-4).

Every source model is built here with random weights from a small config: nothing is
downloaded.
"""

import pytest
import torch
from torch import nn

import multimodal as mm
from multimodal import convert

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")
torchvision = pytest.importorskip("torchvision")

from timm.layers import resample_abs_pos_embed  # noqa: E402
from timm.models.vision_transformer import VisionTransformer as TimmViT  # noqa: E402
from torchvision.models.vision_transformer import VisionTransformer as TorchvisionViT  # noqa: E402

# Ours and the peer compute the same maths in float32 in another order of operations:
# an absolute floor for values near zero plus float32's relative resolution (torch's default
# rtol, about ten ulps) so that the tolerance scales with the outputs' magnitude.
ATOL = 1e-4
RTOL = 1.3e-6


def _randomise_norms(model: nn.Module) -> nn.Module:
    """LayerNorms start at (1, 0); random affine parameters make a mix-up visible."""
    for m in model.modules():
        if isinstance(m, nn.LayerNorm) and m.weight is not None:
            with torch.no_grad():
                m.weight.normal_(1.0, 0.2)
                m.bias.normal_(0.0, 0.2)
    return model.eval()


def _images(size: int = 32, batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, size, size)


# -- torchvision ------------------------------------------------------------------------


def small_torchvision(**kw) -> TorchvisionViT:
    args = dict(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32,
                mlp_dim=64, num_classes=5)
    torch.manual_seed(0)
    model = TorchvisionViT(**{**args, **kw})
    with torch.no_grad():  # torchvision zero-initialises the head and the class token
        model.heads.head.weight.normal_(0, 0.2)
        model.class_token.normal_(0, 0.2)
    return _randomise_norms(model)


def test_torchvision_small_matches():
    source = small_torchvision()
    ours = convert.from_torchvision(source)
    assert isinstance(ours, mm.ViT)
    assert ours.config.norm_eps == 1e-6 and ours.config.heads == 2
    x = _images()
    with torch.no_grad():
        want = source(x)
        got = ours(x)
    assert got.shape == (2, 5)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)
    assert want.abs().max() > 0.1  # the comparison is not between two near-zero tensors


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vit_b_16", "vit_b_32"])
def test_torchvision_real_sizes_match(name):
    source = _randomise_norms(getattr(torchvision.models, name)(weights=None))
    with torch.no_grad():
        source.heads.head.weight.normal_(0, 0.02)
    ours = convert.from_torchvision(source)
    assert ours.config.dim == 768 and ours.config.depth == 12
    x = _images(224, batch=1)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), source(x), atol=ATOL, rtol=RTOL)


# -- timm -------------------------------------------------------------------------------


def small_timm(**kw) -> TimmViT:
    args = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=10)
    torch.manual_seed(0)
    return _randomise_norms(TimmViT(**{**args, **kw}))


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
    x = _images()
    with torch.no_grad():
        torch.testing.assert_close(ours(x), source(x), atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(ours.forward_features(x), source.forward_features(x),
                                   atol=ATOL, rtol=RTOL)


def test_timm_registered_model_matches():
    source = _randomise_norms(timm.create_model("vit_tiny_patch16_224", pretrained=False,
                                                num_classes=10))
    ours = convert.from_timm(source)
    assert (ours.config.dim, ours.config.depth, ours.config.heads) == (192, 12, 3)
    x = _images(224, batch=1)
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
    # layer scale, registers and qk_norm convert now (tests/test_convert_modern.py)
    ({"class_token": False, "no_embed_class": True, "global_pool": "avg", "fc_norm": False},
     "no_embed_class"),
    ({"global_pool": "avg"}, "fc_norm"),
    ({"global_pool": "map"}, "attention pooling"),
])
def test_timm_unsupported_features_are_named(kw, words):
    with pytest.raises(ValueError, match=words):
        convert.from_timm(small_timm(**kw))


# -- transformers ViT -----------------------------------------------------------------


def hf_vit_config(**kw):
    args = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                image_size=32, patch_size=8, num_labels=4)
    return transformers.ViTConfig(**{**args, **kw})


def test_hf_vit_model_features_match_last_hidden_state():
    torch.manual_seed(0)
    source = _randomise_norms(transformers.ViTModel(hf_vit_config()))
    ours = convert.from_hf(source)
    assert ours.config.norm_eps == 1e-12 and ours.config.num_classes == 0
    x = _images()
    with torch.no_grad():
        hidden = source(pixel_values=x).last_hidden_state
        torch.testing.assert_close(ours.forward_features(x), hidden, atol=ATOL, rtol=RTOL)
        # documented: forward returns the normalised class token, not the tanh pooler
        torch.testing.assert_close(ours(x), hidden[:, 0], atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("act", ["gelu", "gelu_new"])
def test_hf_vit_classifier_matches(act):
    torch.manual_seed(0)
    source = _randomise_norms(transformers.ViTForImageClassification(
        hf_vit_config(hidden_act=act)))
    ours = convert.from_hf(source)
    x = _images()
    with torch.no_grad():
        torch.testing.assert_close(ours(x), source(pixel_values=x).logits, atol=ATOL, rtol=RTOL)


# -- transformers GPT-2 ----------------------------------------------------------------


def gpt2_config(**kw):
    args = dict(vocab_size=97, n_positions=48, n_embd=32, n_layer=2, n_head=4,
                bos_token_id=0, eos_token_id=1, pad_token_id=1)
    return transformers.GPT2Config(**{**args, **kw})


def test_gpt2_logits_and_greedy_generation_match():
    torch.manual_seed(0)
    source = _randomise_norms(transformers.GPT2LMHeadModel(gpt2_config()))
    ours = convert.from_hf(source)
    assert isinstance(ours, mm.TextDecoder)
    assert ours.config.activation == "gelu_tanh" and ours.config.norm_eps == 1e-5
    assert ours.lm_head.weight is ours.tok_embed.weight
    ids = torch.randint(2, 97, (3, 9))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), source(ids).logits, atol=ATOL, rtol=RTOL)
    want = source.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                           do_sample=False, pad_token_id=1)
    got = ours.generate(ids, max_new_tokens=12, do_sample=False)
    assert torch.equal(got, want)


def test_gpt2_base_model_and_untied_head():
    torch.manual_seed(0)
    base = _randomise_norms(transformers.GPT2Model(gpt2_config(n_inner=48)))
    ours = convert.from_hf(base)
    ids = torch.randint(0, 97, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_features(ids), base(ids).last_hidden_state,
                                   atol=ATOL, rtol=RTOL)
    lm = transformers.GPT2LMHeadModel(gpt2_config(tie_word_embeddings=False)).eval()
    with torch.no_grad():
        lm.lm_head.weight.normal_(0, 0.1)
    ours = convert.from_hf(lm)
    assert ours.lm_head.weight is not ours.tok_embed.weight
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), lm(ids).logits, atol=ATOL, rtol=RTOL)


# -- transformers BERT -----------------------------------------------------------------


def bert_config(**kw):
    args = dict(vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=64, max_position_embeddings=40, num_labels=3)
    return transformers.BertConfig(**{**args, **kw})


def _bert_inputs():
    ids = torch.randint(0, 101, (2, 11))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    types = torch.zeros_like(ids)
    types[:, 6:] = 1
    return ids, mask, types


def test_bert_hidden_states_and_pooler_match():
    torch.manual_seed(0)
    source = _randomise_norms(transformers.BertModel(bert_config()))
    ours = convert.from_hf(source)
    assert isinstance(ours, mm.TextEncoder)
    assert ours.config.norm == "post" and ours.config.embed_norm
    ids, mask, types = _bert_inputs()
    with torch.no_grad():
        ref = source(ids, attention_mask=mask, token_type_ids=types)
        hidden = ours(ids, attention_mask=mask, token_type_ids=types)
        torch.testing.assert_close(hidden, ref.last_hidden_state, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(ours.pooled(hidden), ref.pooler_output, atol=ATOL, rtol=RTOL)


def test_bert_masked_lm_and_classifier_match():
    torch.manual_seed(0)
    ids, mask, types = _bert_inputs()
    mlm = _randomise_norms(transformers.BertForMaskedLM(bert_config()))
    with torch.no_grad():
        mlm.cls.predictions.bias.normal_(0, 0.5)
    ours = convert.from_hf(mlm)
    with torch.no_grad():
        want = mlm(ids, attention_mask=mask, token_type_ids=types).logits
        got = ours.mlm_logits(ours(ids, attention_mask=mask, token_type_ids=types))
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)
    cls = _randomise_norms(transformers.BertForSequenceClassification(bert_config()))
    ours = convert.from_hf(cls)
    with torch.no_grad():
        want = cls(ids, attention_mask=mask, token_type_ids=types).logits
        got = ours.classify(ours(ids, attention_mask=mask, token_type_ids=types))
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)


# -- errors ----------------------------------------------------------------------------


def test_unsupported_models_name_what_is_supported():
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        convert.from_hf(transformers.BertForQuestionAnswering(bert_config()))
    with pytest.raises(ValueError, match="VisionTransformer"):
        convert.from_torchvision(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="timm"):
        convert.from_timm(small_torchvision())
    with pytest.raises(ValueError, match="supported"):
        convert.convert(nn.Linear(2, 2))


def test_dispatch_by_library():
    assert isinstance(convert.convert(small_torchvision()), mm.ViT)
    assert isinstance(convert.convert(small_timm()), mm.ViT)
    assert isinstance(convert.convert(transformers.BertModel(bert_config())), mm.TextEncoder)


def test_missing_and_unconverted_keys_are_listed():
    source = small_torchvision()
    source.encoder.ln.weight = None  # a LayerNorm without scale: no such key
    source.register_buffer("extra_scale", torch.ones(1))  # a key nothing converts
    with pytest.raises(ValueError) as err:
        convert.from_torchvision(source)
    message = str(err.value)
    assert "missing: encoder.ln.weight" in message
    assert "not converted" in message and "extra_scale" in message


def test_mis_shaped_keys_are_listed():
    source = small_timm()
    source.head = nn.Linear(32, 7)  # the config still says 10 classes
    with pytest.raises(ValueError, match=r"mis-shaped: head.weight: expected \(10, 32\), "
                                         r"got \(7, 32\)"):
        convert.from_timm(source)
