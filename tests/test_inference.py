"""``multimodal embed / zero-shot / caption``: folders and manifests of images, clips and
texts, against transformers on the same random-weight folders; unreadable inputs named or
skipped; an interrupted ``embed`` resumed without recomputing what was written."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path

import numpy as np
import PIL.Image
import pytest
import soundfile as sf
import torch

import multimodal as mm
from multimodal.cli.main import main
from multimodal.encoder import Encoder
from multimodal.pipelines._loaders import captioner
from multimodal.pipelines.caption import CaptionerBundle, caption
from multimodal.pipelines.embed import embed, read_embeddings
from multimodal.pipelines.inputs import UnreadableInput, collect_inputs
from multimodal.pipelines.zero_shot import zero_shot

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

WORDS = ["<pad>", "<unk>", "a", "photo", "of", "cat", "dog", "bird", "red", "the", "sat",
         "on", "mat", "ran", ".", "<|startoftext|>", "<|endoftext|>"]


def _run(args: list[str]) -> int:
    try:
        main(args)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    return 0


def _word_tokenizer_json(folder: Path, template: str = "clip") -> None:
    """A tiny Hugging Face tokenizer.json (word level, lower case) in ``folder``: CLIP's
    layout ``<|startoftext|> ... <|endoftext|>`` with ``<|endoftext|>`` as padding, or
    BERT-like without specials (``template="plain"``)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    vocab = {w: i for i, w in enumerate(WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if template == "clip":
        tok.post_processor = processors.TemplateProcessing(
            single="<|startoftext|> $A <|endoftext|>",
            special_tokens=[("<|startoftext|>", vocab["<|startoftext|>"]),
                            ("<|endoftext|>", vocab["<|endoftext|>"])])
    tok.save(str(folder / "tokenizer.json"))
    pad = "<|endoftext|>" if template == "clip" else "<pad>"
    (folder / "tokenizer_config.json").write_text(json.dumps({"pad_token": pad}))


def _images(folder: Path, sizes=((32, 32), (40, 28), (20, 36))) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    gen = np.random.default_rng(0)
    paths = []
    for i, (w, h) in enumerate(sizes):
        paths.append(folder / f"img{i}.png")
        PIL.Image.fromarray(gen.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(paths[-1])
    return paths


# -- embed --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def vit_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("vit")
    torch.manual_seed(0)
    cfg = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32,
                                 num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=48)
    transformers.ViTModel(cfg, add_pooling_layer=False).eval().save_pretrained(folder)
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    return folder


def _vit_reference(folder: Path, files: list[Path]) -> torch.Tensor:
    model = transformers.ViTModel.from_pretrained(folder, add_pooling_layer=False).eval()
    proc = transformers.ViTImageProcessor.from_pretrained(folder)
    images = [PIL.Image.open(f).convert("RGB") for f in files]
    with torch.no_grad():
        hidden = model(**proc(images, return_tensors="pt")).last_hidden_state
    return hidden[:, 0]  # the class token after the final norm: our ViT's pool


def test_embed_a_folder_of_images_matches_transformers(tmp_path, vit_folder, capsys):
    files = _images(tmp_path / "photos")
    out = tmp_path / "emb.safetensors"
    assert _run(["embed", "--model", str(vit_folder), "--inputs", str(tmp_path / "photos"),
                 "--out", str(out), "--batch_size", "2"]) == 0
    assert "wrote 3 embeddings of 32 dims" in capsys.readouterr().out
    ids, emb, meta = read_embeddings(out)
    assert ids == ["img0.png", "img1.png", "img2.png"]
    torch.testing.assert_close(emb, _vit_reference(vit_folder, files), atol=1e-4, rtol=1e-4)
    assert meta["model"] == str(vit_folder.resolve()) and meta["skipped"] == []
    assert not (tmp_path / "emb.safetensors.parts").exists()


def test_embed_names_an_unreadable_file_or_skips_it(tmp_path, vit_folder, capsys):
    files = _images(tmp_path / "photos")
    (tmp_path / "photos" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    out = tmp_path / "emb.npy"
    args = ["embed", "--model", str(vit_folder), "--inputs", str(tmp_path / "photos"),
            "--out", str(out)]
    assert _run(args) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "broken.png: not a readable image (" in err
    assert _run([*args, "--skip_corrupt"]) == 0
    assert "skipped 1 unreadable input(s)" in capsys.readouterr().err
    ids, emb, meta = read_embeddings(out)
    assert ids == ["img0.png", "img1.png", "img2.png"] and meta["skipped"] == ["broken.png"]
    assert np.load(out).shape == (3, 32)
    torch.testing.assert_close(emb, _vit_reference(vit_folder, files), atol=1e-4, rtol=1e-4)


def test_interrupted_embed_resumes_without_recomputing(tmp_path, vit_folder):
    _images(tmp_path / "photos", sizes=[(32, 32)] * 7)
    out = tmp_path / "emb.safetensors"
    full_ids, full = embed(str(vit_folder), tmp_path / "photos")

    def stop_after_two(batch: int) -> None:
        if batch == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        embed(str(vit_folder), tmp_path / "photos", out, batch_size=2,
              on_batch=stop_after_two)
    assert not out.exists() and len(list((tmp_path / "emb.safetensors.parts").iterdir())) == 2
    encoder = mm.load_encoder(vit_folder)
    seen: list[int] = []
    original = encoder.encode

    def counting(inputs, *args, **kwargs):
        seen.append(len(inputs))
        return original(inputs, *args, **kwargs)

    encoder.encode = counting  # type: ignore[method-assign]
    ids, emb = embed(encoder, tmp_path / "photos", out, batch_size=2,
                     model_name=str(vit_folder))
    assert sum(seen) == 3  # 4 of the 7 were written before the interruption
    assert ids == full_ids
    torch.testing.assert_close(emb, full)
    torch.testing.assert_close(read_embeddings(out)[1], full)
    seen.clear()
    embed(encoder, tmp_path / "photos", out, model_name=str(vit_folder))
    assert seen == []  # complete: nothing recomputed
    with pytest.raises(ValueError, match="was written with model"):
        embed(mm.load_encoder(vit_folder), tmp_path / "photos", out)  # another model name


def test_embed_texts_from_a_folder_and_a_manifest_with_the_folder_pooling(tmp_path):
    folder = tmp_path / "st"
    torch.manual_seed(0)
    bert = transformers.BertModel(transformers.BertConfig(
        vocab_size=len(WORDS), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=48, max_position_embeddings=40), add_pooling_layer=False).eval()
    bert.save_pretrained(folder)
    _word_tokenizer_json(folder, "plain")
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"pooling_mode_mean_tokens": True}))
    texts = {"a.txt": "the cat sat on the mat", "b.txt": "a dog", "c.txt": "a red bird ran"}
    (tmp_path / "texts").mkdir()
    for name, text in texts.items():
        (tmp_path / "texts" / name).write_text(text + "\n")
    manifest = tmp_path / "texts.jsonl"
    manifest.write_text("".join(json.dumps({"id": n, "text": t}) + "\n"
                                for n, t in texts.items()))
    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    want = []
    for text in texts.values():
        ids = torch.tensor([tok.encode(text).ids])
        with torch.no_grad():
            want.append(bert(input_ids=ids).last_hidden_state[0].mean(0))
    for source in (tmp_path / "texts", manifest):
        ids, emb = embed(str(folder), source)
        assert ids == list(texts)
        torch.testing.assert_close(emb, torch.stack(want), atol=1e-5, rtol=1e-5)


def test_embed_clips_of_different_lengths(tmp_path):
    torch.manual_seed(0)
    model = mm.AudioClassifier(mm.AudioClassifierConfig(
        num_classes=0, dim=32, depth=2, heads=2, mlp_dim=64, n_mels=40, mode="frames",
        stack_frames=2, pool="mean")).eval()
    model.save_pretrained(tmp_path / "audio_model")
    gen = torch.Generator().manual_seed(1)
    clips = {"short.wav": torch.randn(8000, generator=gen) * 0.1,
             "long.flac": torch.randn(16000, generator=gen) * 0.1}
    (tmp_path / "clips").mkdir()
    for name, clip in clips.items():
        sf.write(str(tmp_path / "clips" / name), clip.numpy(), 16000)
    stereo = torch.stack([clips["short.wav"], clips["short.wav"]], dim=1)
    sf.write(str(tmp_path / "clips" / "stereo_8k.wav"),
             stereo[::2].numpy(), 8000)  # another rate, two channels
    (tmp_path / "clips" / "tiny.wav").write_bytes(b"RIFF....WAVEfmt ")  # not audio
    sf.write(str(tmp_path / "clips" / "blip.wav"), np.zeros(50, np.float32), 16000)  # < 1 window
    log = io.StringIO()
    ids, emb = embed(str(tmp_path / "audio_model"), tmp_path / "clips", skip_corrupt=True,
                     stream=log)
    assert ids == ["long.flac", "short.wav", "stereo_8k.wav"]
    assert "skipped 2 unreadable input(s)" in log.getvalue()
    assert "blip.wav: clip(s) [0] too short" in log.getvalue()
    assert "embed: 5/5 inputs (100%)" in log.getvalue()  # plain progress lines off a terminal
    encoder = Encoder(model)
    for i, name in enumerate(["long.flac", "short.wav"]):
        wave, _ = sf.read(str(tmp_path / "clips" / name), dtype="float32")
        alone = encoder.encode([torch.from_numpy(wave)])[0]
        torch.testing.assert_close(emb[i], alone, atol=1e-5, rtol=1e-5)
    with pytest.raises(UnreadableInput, match=r"tiny\.wav: cannot read .* as audio"):
        embed(str(tmp_path / "audio_model"), tmp_path / "clips")


def test_manifest_errors_name_the_line(tmp_path):
    manifest = tmp_path / "m.csv"
    manifest.write_text("path,label\nimg0.png,cat\n,dog\n")
    with pytest.raises(ValueError, match=r"m\.csv:3: a row needs a 'path'"):
        collect_inputs(manifest)
    manifest.write_text("path\na.png\na.png\n")
    with pytest.raises(ValueError, match="appears twice"):
        collect_inputs(manifest)
    with pytest.raises(FileNotFoundError, match="do not exist"):
        collect_inputs(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no images"):
        collect_inputs(tmp_path / "empty", ("image",))


def test_inputs_of_another_modality_are_named(tmp_path, vit_folder):
    (tmp_path / "texts.txt").write_text("a cat\na dog\n")
    with pytest.raises(ValueError, match=r"texts\.txt:1 is a text but the model \(ViT\) "
                                         "reads image"):
        embed(str(vit_folder), tmp_path / "texts.txt")


# -- zero-shot ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("clip")
    torch.manual_seed(0)
    small = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                 num_attention_heads=4)
    eot = WORDS.index("<|endoftext|>")
    model = transformers.CLIPModel(transformers.CLIPConfig(
        text_config=dict(vocab_size=len(WORDS), max_position_embeddings=16,
                         eos_token_id=eot, bos_token_id=eot - 1, pad_token_id=eot, **small),
        vision_config=dict(image_size=32, patch_size=8, **small), projection_dim=16)).eval()
    with torch.no_grad():
        model.logit_scale.fill_(2.0)  # peaked enough that the labels differ
    model.save_pretrained(folder)
    transformers.CLIPImageProcessor(size={"shortest_edge": 32},
                                    crop_size={"height": 32, "width": 32}).save_pretrained(folder)
    _word_tokenizer_json(folder, "clip")
    return folder


def test_zero_shot_probabilities_match_transformers_clip(tmp_path, clip_folder, capsys):
    files = _images(tmp_path / "photos")
    labels = ["cat", "dog", "bird"]
    out = tmp_path / "probs.csv"
    assert _run(["zero-shot", "--model", str(clip_folder), "--labels", ",".join(labels),
                 "--inputs", str(tmp_path / "photos"), "--out", str(out)]) == 0
    printed = [line.split("\t") for line in capsys.readouterr().out.strip().splitlines()]
    model = transformers.CLIPModel.from_pretrained(clip_folder).eval()
    proc = transformers.CLIPImageProcessor.from_pretrained(clip_folder)
    tok = tokenizers.Tokenizer.from_file(str(clip_folder / "tokenizer.json"))
    prompts = [tok.encode(f"a photo of a {label}.").ids for label in labels]
    ids = torch.tensor(prompts)  # one length: no padding needed
    with torch.no_grad():
        pixels = proc([PIL.Image.open(f).convert("RGB") for f in files],
                      return_tensors="pt")["pixel_values"]
        want = model(input_ids=ids, pixel_values=pixels).logits_per_image.softmax(-1)
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["file"] for r in rows] == [p[0] for p in printed] == [f.name for f in files]
    got = torch.tensor([[float(r[label]) for label in labels] for r in rows])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    for r, p, w in zip(rows, printed, want, strict=True):
        assert r["label"] == p[1] == labels[int(w.argmax())]
        assert float(p[2]) == pytest.approx(float(w.max()), abs=1e-4)
    assert len(set(r["label"] for r in rows)) > 1 or want.max(1).values.min() > 0.34
    loaded = mm.zero_shot(mm.load(clip_folder), tmp_path / "photos", labels,
                          stream=io.StringIO())  # mm.load + the verb
    torch.testing.assert_close(torch.tensor([r.probabilities for r in loaded]), want,
                               atol=1e-4, rtol=1e-4)


def test_zero_shot_siglip_probabilities_match_transformers(tmp_path, capsys):
    """SigLIP: texts padded to the full context and read without a mask (as its processor
    gives them), each label's probability its own sigmoid, as transformers' pipeline."""
    folder = tmp_path / "siglip"
    torch.manual_seed(0)
    small = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                 num_attention_heads=4)
    model = transformers.SiglipModel(transformers.SiglipConfig(
        text_config=dict(vocab_size=len(WORDS), max_position_embeddings=16,
                         projection_size=32, pad_token_id=0, **small),
        vision_config=dict(image_size=32, patch_size=8, **small))).eval()
    with torch.no_grad():
        model.logit_scale.fill_(2.3)
        model.logit_bias.fill_(-1.0)
    model.save_pretrained(folder)
    transformers.SiglipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    _word_tokenizer_json(folder, "plain")
    files = _images(tmp_path / "photos")
    labels = ["cat", "dog", "bird"]
    assert _run(["zero-shot", "--model", str(folder), "--labels", ",".join(labels),
                 "--inputs", str(tmp_path / "photos"), "--out", str(tmp_path / "p.csv")]) == 0
    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = torch.zeros(len(labels), 16, dtype=torch.long)  # pad id 0 to the full context
    for i, label in enumerate(labels):
        row = tok.encode(f"a photo of a {label}.").ids
        ids[i, :len(row)] = torch.tensor(row)
    proc = transformers.SiglipImageProcessor.from_pretrained(folder)
    with torch.no_grad():
        pixels = proc([PIL.Image.open(f).convert("RGB") for f in files],
                      return_tensors="pt")["pixel_values"]
        want = model(input_ids=ids, pixel_values=pixels).logits_per_image.sigmoid()
    with open(tmp_path / "p.csv", newline="") as f:
        got = torch.tensor([[float(r[label]) for label in labels] for r in csv.DictReader(f)])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert float((want - 0.5).abs().max()) > 0.05  # not a flat answer


def test_zero_shot_with_templates_is_clips_prompt_ensemble(tmp_path, clip_folder):
    _images(tmp_path / "photos")
    templates = ["a photo of a {}.", "the {}", "a red {}"]
    rows = zero_shot(str(clip_folder), tmp_path / "photos", ["cat", "dog"], templates)
    encoder = mm.load_encoder(clip_folder)
    images = encoder.preprocessor(sorted((tmp_path / "photos").glob("*.png")))
    want = encoder.backbone.zero_shot(images, ["cat", "dog"], templates,
                                      tokenizer=encoder.tokenizer)
    torch.testing.assert_close(torch.tensor([r.probabilities for r in rows]), want,
                               atol=1e-5, rtol=1e-5)
    (tmp_path / "photos" / "empty.jpg").write_bytes(b"")
    with pytest.raises(UnreadableInput,
                       match=r"empty\.jpg: not a readable image \(the file is empty\)"):
        zero_shot(str(clip_folder), tmp_path / "photos", ["cat", "dog"], templates)
    kept = zero_shot(str(clip_folder), tmp_path / "photos", ["cat", "dog"], templates,
                     skip_corrupt=True)
    assert [r.id for r in kept] == [r.id for r in rows]


def test_zero_shot_refuses_a_model_that_is_not_clip(tmp_path, vit_folder, capsys):
    _images(tmp_path / "photos")
    assert _run(["zero-shot", "--model", str(vit_folder), "--labels", "cat,dog",
                 "--inputs", str(tmp_path / "photos")]) == 2
    assert "zero-shot needs a CLIP / SigLIP (image+text) model" in capsys.readouterr().err
    with pytest.raises(ValueError, match="at least two labels"):
        zero_shot(str(vit_folder), tmp_path / "photos", ["cat"])


# -- caption ------------------------------------------------------------------------------
def test_caption_a_vision_encoder_decoder_folder_matches_transformers(tmp_path, capsys):
    t = transformers
    torch.manual_seed(1)
    bos, eos = WORDS.index("<|startoftext|>"), WORDS.index("<|endoftext|>")
    enc = t.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=4, intermediate_size=40, initializer_range=0.5)
    dec = t.GPT2Config(vocab_size=len(WORDS), n_positions=24, n_embd=32, n_layer=2, n_head=4,
                       add_cross_attention=True, is_decoder=True, bos_token_id=bos,
                       eos_token_id=eos, initializer_range=0.5)
    cfg = t.VisionEncoderDecoderConfig.from_encoder_decoder_configs(enc, dec)
    cfg.decoder_start_token_id, cfg.pad_token_id, cfg.eos_token_id = bos, eos, eos
    source = t.VisionEncoderDecoderModel(config=cfg).eval()
    folder = tmp_path / "ved"
    source.save_pretrained(folder)
    t.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    _word_tokenizer_json(folder, "plain")
    files = _images(tmp_path / "photos")
    out = tmp_path / "captions.csv"
    assert _run(["caption", "--model", str(folder), "--inputs", str(tmp_path / "photos"),
                 "--max_new_tokens", "6", "--out", str(out)]) == 0
    printed = [line.split("\t") for line in capsys.readouterr().out.strip().splitlines()]
    proc = t.ViTImageProcessor.from_pretrained(folder)
    pixels = proc([PIL.Image.open(f).convert("RGB") for f in files],
                  return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        ids = source.generate(pixel_values=pixels, max_new_tokens=6, do_sample=False)
    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    want = []
    for row in ids[:, 1:].tolist():
        row = row[: row.index(eos)] if eos in row else row
        want.append(tok.decode(row, skip_special_tokens=True).strip())
    assert [p[0] for p in printed] == [f.name for f in files]
    assert len(set(want)) > 1  # captions that differ by image
    assert [p[1] if len(p) > 1 else "" for p in printed] == want
    with open(out, newline="") as f:
        assert [r["caption"] for r in csv.DictReader(f)] == want


def test_caption_a_task_checkpoint_measures_its_data_normalisation(tmp_path):
    """A CaptioningTask checkpoint keeps the tokenizer but not the image statistics: they
    are measured again by the run's data module (procedural scenes here)."""
    from multimodal.data.captions import CaptionDataModule
    from multimodal.tasks.captioning import CaptioningTask

    data_args = dict(dataset="scenes", image_size=32, num_train=64, num_val=8, num_test=8,
                     batch_size=8)
    dm = CaptionDataModule(**data_args)
    dm.setup("fit")
    torch.manual_seed(1)  # an untrained captioner whose captions are not empty
    task = CaptioningTask(mm.create_model("captioner_scenes"))
    task.tokenizer = mm.WordTokenizer.train(dm.train_captions())
    ckpt = {"state_dict": task.state_dict(),
            "datamodule_hyper_parameters": {
                **data_args, "_class_path": "multimodal.data.captions.CaptionDataModule"}}
    task.on_save_checkpoint(ckpt)
    torch.save(ckpt, tmp_path / "cap.ckpt")
    files = _images(tmp_path / "photos")
    bundle = CaptionerBundle(*captioner(tmp_path / "cap.ckpt"))
    torch.testing.assert_close(bundle.preprocessor.mean, dm.mean)
    rows = caption(bundle, tmp_path / "photos", max_new_tokens=5)
    from torchvision.transforms.v2 import functional as tvf

    images = torch.stack([tvf.resize(tvf.pil_to_tensor(PIL.Image.open(f).convert("RGB")),
                                     [32, 32], antialias=True) for f in files])
    pixels = (images.float() / 255 - dm.mean.view(1, 3, 1, 1)) / dm.std.view(1, 3, 1, 1)
    want = mm.models.captioner.caption(task.model.eval(), pixels, task.tokenizer,
                                       max_new_tokens=5)
    assert all(want)
    assert [r[1] for r in rows] == [w.strip() for w in want]
    loaded = mm.load(tmp_path / "cap.ckpt")  # mm.load + the verb: the same captions
    assert caption(loaded, tmp_path / "photos", max_new_tokens=5) == rows
    with pytest.raises(ValueError, match="apply to a model path"):
        caption(bundle, tmp_path / "photos", image_size=32)
    with pytest.raises(ValueError, match="not a captioner"):
        caption(mm.load(_vit_ckpt(tmp_path)), tmp_path / "photos")


def _vit_ckpt(tmp_path: Path) -> Path:
    vit = mm.ViT(mm.ViTConfig(image_size=16, patch_size=4, in_channels=3, num_classes=2,
                              dim=32, depth=1, heads=2, mlp_dim=32))
    ckpt = {"state_dict": {f"model.{k}": v for k, v in vit.state_dict().items()},
            "multimodal_model": {"model_type": "ViT",
                                 "model_config": dataclasses.asdict(vit.config)}}
    torch.save(ckpt, tmp_path / "vit.ckpt")
    return tmp_path / "vit.ckpt"


def test_mm_embed_is_exported():
    assert mm.embed is embed and mm.zero_shot is zero_shot and mm.caption is caption


@pytest.mark.parametrize("recorded", [True, False], ids=["mean-std-in-ckpt", "measured-again"])
def test_embed_with_an_image_task_checkpoint_uses_its_data_normalisation(tmp_path, recorded):
    """A grey ViT's checkpoint: the image size, channels and normalisation come from the
    run's data arguments, or from its data module measuring the training images again."""
    from multimodal.data.vision import ImageClassificationDataModule

    gen = np.random.default_rng(0)
    for cls in ("a", "b"):
        (tmp_path / "train" / cls).mkdir(parents=True)
        for i in range(3):
            PIL.Image.fromarray(gen.integers(0, 256, (20, 24), dtype=np.uint8)).save(
                tmp_path / "train" / cls / f"{i}.png")
    args = {"train": str(tmp_path / "train"), "image_size": 16, "in_channels": 1}
    if recorded:
        args |= {"mean": 0.4, "std": 0.2}
    dm = ImageClassificationDataModule(**args)
    dm.setup("fit")
    torch.manual_seed(0)
    vit = mm.ViT(mm.ViTConfig(image_size=16, patch_size=4, in_channels=1, num_classes=2,
                              dim=32, depth=1, heads=2, mlp_dim=32)).eval()
    ckpt = {"state_dict": {f"model.{k}": v for k, v in vit.state_dict().items()},
            "multimodal_model": {"model_type": "ViT",
                                 "model_config": dataclasses.asdict(vit.config)},
            "datamodule_hyper_parameters": {
                **args, "_class_path": "multimodal.data.vision.ImageClassificationDataModule"}}
    torch.save(ckpt, tmp_path / "vit.ckpt")
    ids, emb = embed(str(tmp_path / "vit.ckpt"), tmp_path / "train")
    assert ids == ["a/0.png", "a/1.png", "a/2.png", "b/0.png", "b/1.png", "b/2.png"]
    from torchvision.transforms.v2 import functional as tvf

    mean, std = torch.tensor(dm.mean), torch.tensor(dm.std)
    if recorded:
        assert torch.allclose(mean, torch.tensor([0.4]))
    for i, name in enumerate(ids):
        grey = tvf.pil_to_tensor(PIL.Image.open(tmp_path / "train" / name).convert("L"))
        x = (tvf.resize(grey, [16, 16], antialias=True).float() / 255 - mean) / std
        with torch.no_grad():
            want = vit.forward_features(x[None])[:, 0]
        torch.testing.assert_close(emb[i], want[0], atol=1e-5, rtol=1e-5)
    # mm.load + the verb: the checkpoint's normalisation is measured for a Loaded too
    again_ids, again = embed(mm.load(tmp_path / "vit.ckpt"), tmp_path / "train")
    assert again_ids == ids
    torch.testing.assert_close(again, emb)


@pytest.mark.slow
def test_killed_embed_process_resumes(tmp_path, vit_folder):
    """``multimodal embed`` killed (SIGKILL) after some batches were written: the same
    command again embeds only the rest, and the file equals an uninterrupted run's."""
    import os
    import subprocess
    import sys
    import time

    _images(tmp_path / "photos", sizes=[(32, 32)] * 150)
    out = tmp_path / "emb.safetensors"
    parts = tmp_path / "emb.safetensors.parts"
    cmd = [sys.executable, "-c", "from multimodal.cli.main import main; main()", "embed",
           "--model", str(vit_folder), "--inputs", str(tmp_path / "photos"), "--out", str(out),
           "--batch_size", "2"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if parts.is_dir() and len(list(parts.glob("part-*.safetensors"))) >= 3:
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    assert not out.exists(), "the run finished before it could be interrupted"
    written = len(list(parts.glob("part-*.safetensors")))
    assert written >= 3
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    resumed = int(again.stderr.split("resuming: ")[1].split(" of ")[0])
    assert resumed >= 2 * (written - 1)  # a part being written when killed may be lost
    ids, emb, _ = read_embeddings(out)
    want_ids, want = embed(str(vit_folder), tmp_path / "photos")
    assert ids == want_ids
    torch.testing.assert_close(emb, want)
