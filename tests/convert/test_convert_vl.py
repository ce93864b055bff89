"""Vision-language converters (SigLIP, open_clip, VisionEncoderDecoder) give the source's
outputs on the same inputs (fp32, atol 1e-4); sources are built with random weights from
small configs (no download)."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

import multimodal as mm
from multimodal import convert

transformers = pytest.importorskip("transformers")

ATOL = 1e-4
ROOT = Path(__file__).resolve().parents[2]


def _randomise(model: nn.Module) -> nn.Module:
    """Norms start at (1, 0) and biases at 0: random values make a mix-up visible."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() or name.endswith("bias") or "probe" in name:
                p.add_(torch.randn_like(p) * 0.2)
    return model.eval()


# -- SigLIP -------------------------------------------------------------------------------
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
    return _randomise(source)


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


def test_clip_without_image_projection_needs_matching_width():
    vision = mm.ViTConfig(image_size=16, patch_size=8, dim=32, depth=1, heads=2, mlp_dim=32)
    text = mm.TextEncoderConfig(vocab_size=20, max_len=8, dim=16, depth=1, heads=2)
    with pytest.raises(ValueError, match=r"embed_dim \(24\) must equal vision.dim \(32\)"):
        mm.CLIPConfig(vision=vision, text=text, embed_dim=24, image_projection=False)
    with pytest.raises(ValueError, match="text_pool must be"):
        mm.CLIPConfig(vision=vision, text=text, text_pool="first")


# -- open_clip ----------------------------------------------------------------------------
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
    return _randomise(model)


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


# -- VisionEncoderDecoderModel (ViT + GPT-2) -> Captioner ------------------------------------
BOS, EOS, PAD = 1, 2, 11  # PAD not 0: transformers' beam search fills with EOS when pad is 0


def hf_vision_encoder_decoder(seed=1, enc_width=24):
    """Random weights with a wide init (0.5) so that logits are peaked and captions vary
    with the image and end at EOS at different steps."""
    t = transformers
    torch.manual_seed(seed)
    enc = t.ViTConfig(image_size=32, patch_size=8, hidden_size=enc_width, num_hidden_layers=2,
                      num_attention_heads=4, intermediate_size=40, initializer_range=0.5)
    dec = t.GPT2Config(vocab_size=12, n_positions=24, n_embd=32, n_layer=2, n_head=4,
                       add_cross_attention=True, is_decoder=True, bos_token_id=BOS,
                       eos_token_id=EOS, initializer_range=0.5)
    cfg = t.VisionEncoderDecoderConfig.from_encoder_decoder_configs(enc, dec)
    cfg.decoder_start_token_id, cfg.pad_token_id, cfg.eos_token_id = BOS, PAD, EOS
    return t.VisionEncoderDecoderModel(config=cfg).eval()


def _generate_both(source, ours, images, **kw):
    with torch.no_grad():
        want = source.generate(pixel_values=images, do_sample=False, early_stopping="never",
                               **kw)
    return ours.generate(images, **kw), want


@pytest.mark.parametrize("enc_width", [24, 32])  # 24: enc_to_dec_proj folded into kv
def test_vision_encoder_decoder_logits_match(enc_width):
    source = hf_vision_encoder_decoder(enc_width=enc_width)
    assert ("enc_to_dec_proj.weight" in source.state_dict()) == (enc_width == 24)
    ours = convert.from_hf(source)
    assert type(ours) is mm.Captioner and ours.config.memory == "all"
    assert (ours.config.bos_token_id, ours.config.eos_token_id, ours.config.pad_token_id) \
        == (BOS, EOS, PAD)
    images = torch.randn(3, 3, 32, 32)
    ids = torch.randint(3, 12, (3, 6))
    ids[:, 0] = BOS
    with torch.no_grad():
        want = source(pixel_values=images, decoder_input_ids=ids).logits
        torch.testing.assert_close(ours(images, ids), want, atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("beams", [dict(num_beams=1), dict(num_beams=3),
                                   dict(num_beams=3, length_penalty=0.5)])
def test_vision_encoder_decoder_generation_is_token_for_token(seed, beams):
    source = hf_vision_encoder_decoder(seed=seed)
    ours = convert.from_hf(source)
    torch.manual_seed(100)
    images = torch.randn(4, 3, 32, 32)
    got, want = _generate_both(source, ours, images, max_new_tokens=14, **beams)
    assert torch.equal(got, want), (got.tolist(), want.tolist())
    ended = [(row == EOS).any().item() for row in want]  # the EOS rule was exercised:
    assert any(ended) and got.shape[1] == 15  # some rows end early, another runs to the end


def test_vision_encoder_decoder_refuses_other_decoders():
    t = transformers
    enc = t.ViTConfig(image_size=16, patch_size=8, hidden_size=16, num_hidden_layers=1,
                      num_attention_heads=2, intermediate_size=16)
    dec = t.BertConfig(vocab_size=10, hidden_size=16, num_hidden_layers=1,
                       num_attention_heads=2, intermediate_size=16, is_decoder=True,
                       add_cross_attention=True)
    cfg = t.VisionEncoderDecoderConfig.from_encoder_decoder_configs(enc, dec)
    with pytest.raises(ValueError, match="'bert' decoder is not supported"):
        convert.from_hf(t.VisionEncoderDecoderModel(config=cfg))


_BLOCKED = textwrap.dedent("""
    import sys
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name == "transformers" or name.startswith("transformers."):
                raise ImportError("transformers is blocked in this test")
    sys.meta_path.insert(0, Block())
    import torch
    from safetensors.torch import load_file
    import multimodal as mm
    siglip, captioner = sys.argv[1], sys.argv[2]

    io = load_file(siglip + "/io.safetensors")
    model = mm.from_hf(siglip)
    assert type(model) is mm.CLIP and model.config.loss == "sigmoid", type(model)
    with torch.no_grad():
        logits = model.similarity(io["images"], io["ids"], io["mask"])
        text = model.encode_text(io["ids"], io["mask"], normalize=False)
        image = model.encode_image(io["images"], normalize=False)
    for got, key in ((logits, "logits_per_image"), (text, "text"), (image, "image")):
        torch.testing.assert_close(got, io[key], atol=1e-4, rtol=1e-4)
    print("ok siglip")

    io = load_file(captioner + "/io.safetensors")
    model = mm.from_hf(captioner)
    assert type(model) is mm.Captioner, type(model)
    got = model.generate(io["images"], max_new_tokens=10, num_beams=3)
    assert torch.equal(got, io["beam"]), (got, io["beam"])
    with torch.no_grad():
        torch.testing.assert_close(model(io["images"], io["ids"]), io["logits"], atol=1e-4,
                                   rtol=1e-4)
    assert "transformers" not in sys.modules
    print("ok captioner")
""")


def test_siglip_and_captioner_folders_load_without_transformers(tmp_path):
    """save_pretrained folders -> mm.from_hf with transformers blocked (one subprocess)."""
    source = hf_siglip()
    source.save_pretrained(tmp_path / "siglip")
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        out = source(input_ids=SIG_IDS, attention_mask=SIG_MASK, pixel_values=images)
        text = source.get_text_features(input_ids=SIG_IDS, attention_mask=SIG_MASK)
        image = source.get_image_features(pixel_values=images)
    save_file({"images": images, "ids": SIG_IDS, "mask": SIG_MASK,
               "logits_per_image": out.logits_per_image.contiguous(),
               "text": text.pooler_output.contiguous(),
               "image": image.pooler_output.contiguous()},
              str(tmp_path / "siglip" / "io.safetensors"))
    assert "logit_bias" in load_file(str(tmp_path / "siglip" / "model.safetensors"))

    source = hf_vision_encoder_decoder(seed=2)
    source.save_pretrained(tmp_path / "captioner")
    ids = torch.tensor([[BOS, 4, 5, 6], [BOS, 7, 8, 9], [BOS, 3, 3, 10]])
    with torch.no_grad():
        beam = source.generate(pixel_values=images, max_new_tokens=10, num_beams=3,
                               early_stopping="never")
        logits = source(pixel_values=images, decoder_input_ids=ids).logits
    save_file({"images": images, "ids": ids, "beam": beam.contiguous(),
               "logits": logits.contiguous()},
              str(tmp_path / "captioner" / "io.safetensors"))
    run = subprocess.run([sys.executable, "-c", _BLOCKED, str(tmp_path / "siglip"),
                          str(tmp_path / "captioner")],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "ok siglip" in run.stdout and "ok captioner" in run.stdout


# -- zero-shot on imported CLIP / SigLIP ---------------------------------------------------
WORDS = {"a": 5, "photo": 6, "of": 7, "dog": 9, "cat": 10, "red": 11, "car": 12, "sketch": 13,
         "blurry": 14}


class Words:
    """A tokenizer of our API over a fixed word -> id table (BOS 97, EOS 98, PAD 0)."""

    vocab_size = 99

    def encode_many(self, texts, add_cls=False, add_eos=False):
        return [[97] + [WORDS[w] for w in t.split()] + [98] * add_eos for t in texts]

    def pad(self, seqs, length=None):
        n = length or max(map(len, seqs))
        ids = torch.tensor([s + [0] * (n - len(s)) for s in seqs])
        return {"input_ids": ids, "attention_mask": (ids != 0).long()}


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
    return _randomise(source)


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


def test_captioner_with_class_token_memory_maps_show_the_patch_share():
    """memory='all': the class token is in the memory; the maps keep the patches' share,
    equal to transformers' cross-attentions without the class-token column."""
    source = hf_vision_encoder_decoder(seed=1)
    ours = convert.from_hf(source)
    source.set_attn_implementation("eager")  # sdpa returns no attention maps
    images = torch.randn(2, 3, 32, 32)
    ids = ours.generate(images, max_new_tokens=4)
    maps = ours.cross_attention_maps(images, ids)
    assert maps.shape == (2, ids.shape[1] - 1, 4, 4)
    with torch.no_grad():
        out = source(pixel_values=images, decoder_input_ids=ids[:, :-1],
                     output_attentions=True)
    want = out.cross_attentions[-1].mean(dim=1)[..., 1:].reshape(maps.shape)
    torch.testing.assert_close(maps, want, atol=ATOL, rtol=1e-4)
    share = maps.sum(dim=(-1, -2))  # the class token takes the rest
    assert bool((share <= 1 + 1e-6).all()) and bool((share < 0.99).any())
