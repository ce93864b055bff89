"""A Hugging Face ``tokenizer.json`` through ``mm.load_encoder(folder)``: raw strings ->
features equal to transformers' tokenizer + model. The CLIP tokenizer is the real one:
OpenAI's BPE merges shipped with open_clip (``bpe_simple_vocab_16e6.txt.gz``), turned into
transformers' ``CLIPTokenizer`` and saved as ``tokenizer.json``; its ids are also checked
against open_clip's own (independent, pure Python) tokenizer."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import torch

import multimodal as mm
from multimodal.encoder import load_encoder
from multimodal.tokenizers.hf_json import HFTokenizer, is_hf_tokenizer_file
from tests.real_weights import real_weights

transformers = pytest.importorskip("transformers")
open_clip = pytest.importorskip("open_clip")

SENTENCES = ["A photo of a dog.", "Two cats sleeping on a red sofa, in the afternoon!",
             "hello", "Diagram of the 3 phases: melt -> cool -> crystallise"]


@pytest.fixture(scope="module")
def clip_tokenizer_folder(tmp_path_factory) -> Path:
    from open_clip.tokenizer import bytes_to_unicode, default_bpe

    with gzip.open(default_bpe()) as f:  # OpenAI's merges, as open_clip reads them
        lines = f.read().decode("utf-8").split("\n")[1:49152 - 256 - 2 + 1]
    merges = [tuple(m.split()) for m in lines]
    vocab = list(bytes_to_unicode().values())
    vocab += [v + "</w>" for v in vocab]
    vocab += ["".join(m) for m in merges] + ["<|startoftext|>", "<|endoftext|>"]
    tok = transformers.CLIPTokenizer(vocab={t: i for i, t in enumerate(vocab)}, merges=merges)
    folder = tmp_path_factory.mktemp("clip")
    tok.save_pretrained(folder)
    return folder


def test_clip_tokenizer_json_matches_transformers_and_open_clip(clip_tokenizer_folder):
    file = clip_tokenizer_folder / "tokenizer.json"
    assert is_hf_tokenizer_file(file)
    ours = HFTokenizer.from_file(file)
    assert ours.vocab_size == 49408 and ours.pad_id == 49407  # pad = <|endoftext|>
    theirs = transformers.AutoTokenizer.from_pretrained(clip_tokenizer_folder)
    got = ours.encode_batch(SENTENCES)
    want = theirs(SENTENCES, padding=True, return_tensors="pt")
    assert torch.equal(got["input_ids"], want["input_ids"])
    assert torch.equal(got["attention_mask"], want["attention_mask"])
    reference = open_clip.tokenize(SENTENCES)  # pads with 0 to 77
    for row, mask, ref in zip(got["input_ids"], got["attention_mask"], reference, strict=True):
        n = int(mask.sum())
        assert row[:n].tolist() == ref[:n].tolist() and int(ref[n]) == 0
    assert got["input_ids"][0, 0] == 49406 and 49407 in got["input_ids"][0].tolist()


def test_clip_tokenizer_truncation_keeps_end_of_text(clip_tokenizer_folder):
    ours = HFTokenizer.from_file(clip_tokenizer_folder / "tokenizer.json")
    theirs = transformers.AutoTokenizer.from_pretrained(clip_tokenizer_folder)
    got = ours.encode_batch(SENTENCES, max_length=6)
    want = theirs(SENTENCES, padding=True, truncation=True, max_length=6, return_tensors="pt")
    assert torch.equal(got["input_ids"], want["input_ids"])
    assert got["input_ids"][1, -1] == 49407
    with pytest.raises(ValueError, match="more than max_length=6"):
        ours.encode_many(SENTENCES, max_length=6, truncation=False)


def test_load_encoder_turns_strings_into_clip_features(clip_tokenizer_folder, tmp_path):
    """A CLIP folder (random weights, the real tokenizer): load_encoder(folder).encode(texts)
    = transformers' get_text_features on its tokenizer's batch; images likewise."""
    torch.manual_seed(0)
    small = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                 num_attention_heads=4)
    model = transformers.CLIPModel(transformers.CLIPConfig(
        text_config=dict(vocab_size=49408, max_position_embeddings=77, eos_token_id=49407,
                         bos_token_id=49406, pad_token_id=49407, **small),
        vision_config=dict(image_size=32, patch_size=8, **small), projection_dim=16)).eval()
    folder = tmp_path / "clip"
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((clip_tokenizer_folder / name).read_bytes())
    encoder = load_encoder(folder)
    assert encoder.modality == "image+text" and isinstance(encoder.tokenizer, HFTokenizer)
    features = encoder.encode(SENTENCES)
    mask = encoder.encode(SENTENCES, output="tokens").attention_mask
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    batch = theirs(SENTENCES, padding=True, return_tensors="pt")
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = model.get_text_features(**batch).pooler_output
        want_img = model.get_image_features(pixel_values=images).pooler_output
    torch.testing.assert_close(features, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(encoder(images), want_img, atol=1e-4, rtol=1e-4)
    assert torch.equal(mask, batch["attention_mask"])
    assert torch.equal(encoder.pool(features), features)
    # and zero-shot takes the same tokenizer
    probs = encoder.backbone.zero_shot(images, ["dog", "cat"], tokenizer=encoder.tokenizer)
    prompts = theirs(["a photo of a dog.", "a photo of a cat."], padding=True,
                     return_tensors="pt")
    with torch.no_grad():
        ref = model(pixel_values=images, **prompts).logits_per_image.softmax(-1)
    torch.testing.assert_close(probs, ref, atol=1e-4, rtol=1e-4)


def test_load_encoder_real_minilm_folder_with_its_tokenizer_json():
    """The real all-MiniLM-L6-v2 folder: load_encoder reads model and tokenizer.json; the
    features equal transformers' AutoTokenizer + AutoModel."""
    folder = real_weights("all-MiniLM-L6-v2")
    encoder = load_encoder(folder)
    assert encoder.modality == "text" and isinstance(encoder.tokenizer, HFTokenizer)
    features, mask = encoder.encode(SENTENCES, output="tokens")
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    model = transformers.AutoModel.from_pretrained(folder).eval()
    with torch.no_grad():
        want = model(**batch).last_hidden_state
    assert torch.equal(mask, batch["attention_mask"])
    m = mask.bool()
    torch.testing.assert_close(features[m], want[m], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(mm.mean_pool(features, mask),
                               mm.mean_pool(want, batch["attention_mask"]), atol=1e-5,
                               rtol=1e-5)


def test_encoder_wraps_a_clip_trained_here_with_its_own_tokenizer():
    """The image-text Encoder with the package's tokenizer: the text tower's rule
    (tokens + [EOS] for "eot" pooling) through tokenize_texts, embeddings unnormalised."""
    from multimodal.models.clip import tokenize_texts

    tok = mm.WordPieceTokenizer.train(["a red car", "a small dog", "two cats"] * 5,
                                      vocab_size=60)
    torch.manual_seed(0)
    clip = mm.CLIP(mm.CLIPConfig(
        vision=mm.ViTConfig(image_size=16, patch_size=8, dim=32, depth=1, heads=2, mlp_dim=32,
                            pool="mean", class_token=False),
        text=mm.TextEncoderConfig(vocab_size=tok.vocab_size, max_len=12, dim=32, depth=1,
                                  heads=2, mlp_dim=32), embed_dim=16)).eval()
    encoder = load_encoder(clip, tokenizer=tok)
    texts = ["a red car", "two small cats"]
    features = encoder.encode(texts)
    mask = encoder.encode(texts, output="tokens").attention_mask
    batch = tokenize_texts(tok, texts, "eot")
    with torch.no_grad():
        want = clip.encode_text(batch["input_ids"], batch["attention_mask"], normalize=False)
    torch.testing.assert_close(features, want)
    assert torch.equal(mask, batch["attention_mask"])
    images = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(encoder(images), clip.encode_image(images, normalize=False))
    with pytest.raises(ValueError, match="attention_mask is for text"):
        encoder(images, torch.ones(2, 4))
