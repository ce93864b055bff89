"""Modern models converted from transformers / timm give the source's outputs (fp32,
atol 1e-4); sources are built with random weights from small configs (no download)."""

import pytest
import torch
from torch import nn

import multimodal as mm
from multimodal import convert

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")

ATOL = 1e-4


def _randomise_norms(model: nn.Module) -> nn.Module:
    """Norms start at (1, 0); random affine parameters make a mix-up visible."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() or "lambda" in name or "gamma" in name:
                p.add_(torch.randn_like(p) * 0.2)
    return model.eval()


# -- Llama ------------------------------------------------------------------------------
def llama(kind="LlamaForCausalLM", **kw):
    args = dict(vocab_size=97, hidden_size=32, intermediate_size=56, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                rms_norm_eps=1e-5, rope_theta=500.0, tie_word_embeddings=False)
    args.update(kw)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**args)
    model = _randomise_norms(getattr(transformers, kind)(cfg))
    with torch.no_grad():  # peaked logits: random weights otherwise give near-ties that
        # float rounding (1e-6) may break either way in greedy decoding
        model.get_input_embeddings().weight.mul_(30.0)
        if hasattr(model, "lm_head"):
            model.lm_head.weight.mul_(30.0)
    return model


@pytest.mark.parametrize("kw", [dict(), dict(num_key_value_heads=1, tie_word_embeddings=True),
                                dict(num_key_value_heads=4, attention_bias=True, mlp_bias=True)])
def test_llama_logits_and_greedy_generation_match(kw):
    source = llama(**kw)
    ours = convert.from_hf(source)
    assert isinstance(ours, mm.TextDecoder)
    bb = ours.config.backbone
    assert (bb.rope, bb.norm_type, bb.mlp_type, bb.activation) == ("1d", "rmsnorm", "glu", "silu")
    assert bb.rope_base == 500.0 and bb.kv_heads == source.config.num_key_value_heads
    ids = torch.randint(0, 97, (2, 11))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), source(ids).logits, atol=ATOL, rtol=1e-4)
        want = source.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0,
                               eos_token_id=None)
    got = ours.generate(ids, max_new_tokens=12)
    assert torch.equal(got, want)


def test_llama_left_padded_batch_matches():
    source = llama()
    ours = convert.from_hf(source)
    ids = torch.randint(1, 97, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0
    with torch.no_grad():
        want = source(ids, attention_mask=mask).logits
        got = ours(ids, attention_mask=mask)
    torch.testing.assert_close(got[0], want[0], atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(got[1, 3:], want[1, 3:], atol=ATOL, rtol=1e-4)


def test_llama_base_model_matches_last_hidden_state():
    source = llama("LlamaModel")
    ours = convert.from_hf(source)
    ids = torch.randint(0, 97, (1, 7))
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_features(ids), source(ids).last_hidden_state,
                                   atol=ATOL, rtol=1e-4)


def test_llama_rope_scaling_refused():
    source = llama(rope_scaling={"rope_type": "linear", "factor": 2.0})
    with pytest.raises(ValueError, match="rope scaling"):
        convert.from_hf(source)


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
    return _randomise_norms(model)


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


@pytest.mark.parametrize("name", ["vit_small_patch14_dinov2", "vit_small_patch14_reg4_dinov2"])
def test_timm_dinov2_matches(name):
    torch.manual_seed(2)
    source = timm.create_model(name, pretrained=False, img_size=42, depth=2, num_classes=0)
    with torch.no_grad():
        source.cls_token.normal_()
        if source.reg_token is not None:
            source.reg_token.normal_()
    _randomise_norms(source)
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
    _randomise_norms(source)
    ours = convert.from_timm(source)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), source(x), atol=ATOL, rtol=1e-4)


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
    return _randomise_norms(model)


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


def test_timm_deit_distilled_matches():
    torch.manual_seed(5)
    source = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False,
                               img_size=32, depth=2, num_classes=7)
    with torch.no_grad():
        source.cls_token.normal_()
        source.dist_token.normal_()
    _randomise_norms(source)
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
    _randomise_norms(source)
    ours = convert.from_timm(source)
    assert ours.config.pre_norm and ours.config.activation == "quick_gelu"
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), source(x), atol=ATOL, rtol=1e-4)


# -- CLIP -------------------------------------------------------------------------------
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
    return _randomise_norms(source)


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
