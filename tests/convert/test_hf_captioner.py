"""transformers' VisionEncoderDecoderModel (ViT + GPT-2) converted to our Captioner gives
its logits and generations token for token (fp32, atol 1e-4); SigLIP and captioner folders
load without transformers. Sources are built with random weights from small configs."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import multimodal as mm
from multimodal import convert
from tests.convert.test_hf_siglip import SIG_IDS, SIG_MASK, hf_siglip

transformers = pytest.importorskip("transformers")

ATOL = 1e-4
BOS, EOS, PAD = 1, 2, 11  # PAD not 0: transformers' beam search fills with EOS when pad is 0
ROOT = Path(__file__).resolve().parents[2]


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
