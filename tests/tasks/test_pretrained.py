"""``pretrained: PATH`` on the tasks: the model and its weights from a Hugging Face folder, a
save_pretrained folder or one of our checkpoints; overrides; the new head; bad input.
Folders are written by transformers from small random-weight configs
(tests/pretrained_folders.py) and compared with ``mm.from_hf`` of the same folder."""

from __future__ import annotations

import logging

import pytest
import torch

import multimodal as mm
from multimodal.tasks import (
    CaptioningTask,
    ClassificationTask,
    ContrastiveTask,
    LanguageModelTask,
    MaskedLMTask,
)
from multimodal.tasks.pretrained import data_settings, head_names

pytest.importorskip("transformers")
from tests import pretrained_folders as folders  # needs transformers

CLASSES = ["cat", "dog", "fish"]


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {name: getattr(folders, f"{name}_folder")(root / name)
            for name in ("vit", "bert", "clip", "llama", "ast")}


def _same_weights(ours: torch.nn.Module, reference: torch.nn.Module, skip=()) -> int:
    ref = reference.state_dict()
    n = 0
    for name, value in ours.state_dict().items():
        if name.split(".")[0] in skip:
            continue
        torch.testing.assert_close(value, ref[name], rtol=0, atol=0, msg=name)
        n += 1
    return n


def test_image_classifier_from_a_vit_folder(hf, caplog):
    with caplog.at_level(logging.INFO):
        task = ClassificationTask(pretrained=str(hf["vit"]), class_names=CLASSES)
    model = task.model
    assert isinstance(model, mm.ViT) and model.config.num_classes == 3
    assert task.class_names == CLASSES
    reference = mm.from_hf(hf["vit"])  # no head (num_classes 0)
    assert _same_weights(model, reference, skip=("head",)) == len(reference.state_dict())
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("pretrained:")]
    assert len(lines) == 1
    assert "ViT from" in lines[0] and "new: head" in lines[0] and "left out: nothing" in lines[0]
    x = torch.randn(2, 3, 32, 32)
    assert task(x).shape == (2, 3)


def test_overrides_change_regularisation_not_weights(hf):
    task = ClassificationTask(pretrained=str(hf["vit"]), num_classes=4,
                              overrides={"drop_path": 0.1, "dropout": 0.05})
    cfg = task.model.config
    assert (cfg.num_classes, cfg.drop_path, cfg.dropout) == (4, 0.1, 0.05)
    _same_weights(task.model, mm.from_hf(hf["vit"]), skip=("head",))
    with pytest.raises(ValueError, match="change the architecture"):
        ClassificationTask(pretrained=str(hf["vit"]), overrides={"dim": 64, "heads": 4})
    with pytest.raises(ValueError, match="no field"):
        ClassificationTask(pretrained=str(hf["vit"]), overrides={"dorpout": 0.1})


def test_explicit_num_classes_that_disagrees_with_the_data_is_an_error(hf):
    with pytest.raises(ValueError, match="num_classes=4 but the data has 3 classes"):
        ClassificationTask(pretrained=str(hf["vit"]), num_classes=4, class_names=CLASSES)


def test_text_classifier_from_a_bert_folder(hf):
    task = ClassificationTask(modality="text", pretrained=str(hf["bert"]), class_names=CLASSES)
    assert isinstance(task.model, mm.TextEncoder) and task.model.config.num_classes == 3
    _same_weights(task.model, mm.from_hf(hf["bert"]), skip=("head",))
    ids = torch.randint(5, 50, (2, 7))
    assert task({"input_ids": ids, "attention_mask": torch.ones_like(ids)}).shape == (2, 3)
    # the data follows the model: its tokenizer.json (the folder) for a text data module
    assert data_settings(hf["bert"])["tokenizer"] == str(hf["bert"])


def test_clip_folder_gives_its_towers(hf):
    clip = mm.from_hf(hf["clip"])
    image = ClassificationTask(pretrained=str(hf["clip"]), modality="image", num_classes=3)
    assert isinstance(image.model, mm.ViT)
    n = _same_weights(image.model, clip.vision_model, skip=("head",))
    assert n == len(clip.vision_model.state_dict())
    text = ClassificationTask(modality="text", pretrained=str(hf["clip"]), num_classes=2)
    assert isinstance(text.model, mm.TextEncoder)
    _same_weights(text.model, clip.text_model, skip=("head",))
    with pytest.raises(ValueError, match="set the task's modality"):
        ClassificationTask(pretrained=str(hf["clip"]), num_classes=3)
    with pytest.raises(ValueError, match=r"holds a CLIP \(image\+text model\).*no part"):
        ClassificationTask(pretrained=str(hf["clip"]), modality="audio", num_classes=3)
    contrastive = ContrastiveTask(pretrained=str(hf["clip"]))
    _same_weights(contrastive.model, clip)


def test_audio_classifier_from_an_ast_folder(hf):
    task = ClassificationTask(pretrained=str(hf["ast"]), class_names=CLASSES)
    assert isinstance(task.model, mm.AudioClassifier) and task.model.config.num_classes == 3
    reference = mm.from_hf(hf["ast"])
    _same_weights(task.model, reference, skip=("head", "head_dist"))
    assert data_settings(hf["ast"]) == {"features": False}  # waveforms for its front end
    with pytest.raises(ValueError, match="no part"):
        ClassificationTask(pretrained=str(hf["vit"]), modality="audio", num_classes=3)


def test_language_model_from_a_llama_folder_and_llama_is_no_classifier(hf):
    task = LanguageModelTask(pretrained=str(hf["llama"]))
    _same_weights(task.model, mm.from_hf(hf["llama"]))
    with pytest.raises(ValueError, match=r"holds a TextDecoder.*no part ClassificationTask"):
        ClassificationTask(pretrained=str(hf["llama"]), num_classes=3)
    with pytest.raises(ValueError, match="needs a Captioner"):
        CaptioningTask(pretrained=str(hf["llama"]))


def test_bad_paths_are_named(tmp_path, hf):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ClassificationTask(pretrained=str(tmp_path / "nowhere"), num_classes=3)
    text = tmp_path / "notes.ckpt"
    text.write_text("not a checkpoint")
    with pytest.raises(ValueError, match=r"notes\.ckpt is not a checkpoint file"):
        ClassificationTask(pretrained=str(text), num_classes=3)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=r"has no config\.json"):
        ClassificationTask(pretrained=str(empty), num_classes=3)
    with pytest.raises(ValueError, match="give model or pretrained, not both"):
        ClassificationTask(mm.from_hf(hf["vit"]), pretrained=str(hf["vit"]))


def _checkpoint(task, path):
    """A checkpoint as Lightning writes it (state_dict + the task's own entries)."""
    ckpt = {"state_dict": task.state_dict(), "hyper_parameters": dict(task.hparams)}
    task.on_save_checkpoint(ckpt)
    torch.save(ckpt, path)
    return path


def test_a_checkpoint_of_another_task_is_refused(tmp_path, hf):
    lm = _checkpoint(LanguageModelTask(pretrained=str(hf["llama"])), tmp_path / "lm.ckpt")
    with pytest.raises(ValueError, match=r"lm\.ckpt holds a TextDecoder"):
        ClassificationTask(pretrained=str(lm), num_classes=3)


def test_our_checkpoint_and_save_pretrained_folder_as_pretrained(tmp_path, hf):
    first = ClassificationTask(pretrained=str(hf["vit"]), class_names=CLASSES)
    ckpt = _checkpoint(first, tmp_path / "run.ckpt")
    again = ClassificationTask(pretrained=str(ckpt))
    assert again.class_names == CLASSES  # from the checkpoint
    _same_weights(again.model, first.model)
    folder = first.save_pretrained(tmp_path / "saved")
    third = ClassificationTask(pretrained=str(folder), class_names=["a", "b"])
    _same_weights(third.model, first.model, skip=("head",))
    assert third.model.config.num_classes == 2


def test_a_tokenizer_too_big_for_the_embedding_is_an_error(tmp_path, hf):
    clip = mm.from_hf(hf["clip"])
    folder = clip.save_pretrained(tmp_path / "clip")
    folders.word_tokenizer(folder, folders.VOCAB + [f"extra{i}" for i in range(10)])
    with pytest.raises(ValueError, match=r"tokenizer has 65 tokens but the model's embedding "
                                         r"has 55 rows"):
        ContrastiveTask(pretrained=str(folder))


def test_reset_classifier_updates_the_config_and_round_trips(tmp_path):
    vit = mm.ViT(mm.ViTConfig(image_size=16, patch_size=8, dim=32, depth=1, heads=2,
                              num_classes=10, distill_token=True))
    vit.reset_classifier(4)
    assert vit.config.num_classes == 4 and vit.head.out_features == 4
    assert vit.head_dist.out_features == 4
    again = mm.from_pretrained(vit.save_pretrained(tmp_path / "v"))
    _same_weights(again, vit)
    vit.reset_classifier(0)
    assert vit(torch.randn(1, 3, 16, 16)).shape == (1, 32)  # pooled features
    assert head_names(vit) == []


def test_model_summary_counts_the_vit_flops():
    """Lightning's summary runs the task on ``example_input_array``: its count is the ViT's
    matrix products written out (patch projection, per block qkv, attention, projection,
    MLP, then the head); attention's two products may or may not be counted by torch's flop
    counter on this device, so both sums are accepted."""
    from lightning.pytorch.utilities.model_summary import ModelSummary

    cfg = dict(image_size=16, patch_size=8, dim=32, depth=2, heads=2, num_classes=3)
    task = ClassificationTask(mm.ViT(mm.ViTConfig(**cfg)))
    patches, d, m, classes = 4, 32, 4 * 32, 3
    n = patches + 1
    linear = 2 * patches * (3 * 8 * 8) * d + 2 * 32 * classes + 2 * (
        2 * n * d * 3 * d + 2 * n * d * d + 2 * 2 * n * d * m)
    attention = 2 * (2 * 2 * n * n * d)
    assert ModelSummary(task).total_flops in (linear, linear + attention)


def test_audio_fine_tuning_feeds_waveforms_and_keeps_the_folder_normalisation(hf, tmp_path):
    """With an AST folder the data module yields waveforms (data_settings) and the model's
    own front end, with the folder's feature extractor statistics, makes the features: the
    data's statistics are not adopted."""
    import lightning as L
    import numpy as np
    import soundfile as sf

    from multimodal.data.audio import AudioClassificationDataModule

    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (tmp_path / "clips" / c).mkdir(parents=True)
        for i in range(4):
            sf.write(tmp_path / "clips" / c / f"{i}.wav",
                     rng.normal(0, 0.1 * (1 + 3 * (c == "b")), 8000).astype("float32"), 16000)
    dm = AudioClassificationDataModule(train=str(tmp_path / "clips"), batch_size=2,
                                       val_size=2, test_size=2,
                                       **data_settings(hf["ast"]))
    task = ClassificationTask(pretrained=str(hf["ast"]), class_names=dm.class_names)
    stats = task.model.tokenizer.to_dict()
    reference = mm.from_hf(hf["ast"]).tokenizer.to_dict()
    assert stats == reference
    L.Trainer(fast_dev_run=1, accelerator="cpu", logger=False, enable_progress_bar=False,
              enable_model_summary=False, default_root_dir=tmp_path).fit(task, dm)
    assert task.model.tokenizer.to_dict() == reference


def test_masked_lm_continues_pretraining_a_bert_folder(hf):
    """A BERT folder has no MLM head: MaskedLMTask adds one, its decoder tied to the
    folder's token embedding."""
    task = MaskedLMTask(pretrained=str(hf["bert"]))
    model = task.model
    assert model.mlm is not None and model.mlm.decoder.weight is model.tok_embed.weight
    _same_weights(model.transformer, mm.from_hf(hf["bert"]).transformer)
    ids = torch.randint(5, 50, (2, 9))
    loss, logits, _ = task.step({"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                                torch.Generator().manual_seed(0))
    assert logits.shape == (2, 9, len(folders.VOCAB)) and torch.isfinite(loss)


def test_contrastive_fine_tuning_tokenises_with_the_folder_tokenizer(hf, tmp_path):
    """A CLIP folder with its tokenizer.json: captions are tokenised by it (its [CLS] /
    [SEP]), cut to the text tower's context, and a training step runs."""
    from multimodal.tokenizers.hf_json import HFTokenizer

    folder = tmp_path / "clip"
    folder.mkdir()
    for file in hf["clip"].iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    folders.word_tokenizer(folder)
    task = ContrastiveTask(pretrained=str(folder))
    assert isinstance(task.tokenizer, HFTokenizer)
    long = " ".join(["red circle"] * 20)
    batch = task.tokenize(["a red circle", "the big blue square", long])
    ids = batch["input_ids"]
    assert ids.shape == (3, task.model.config.text.max_len)  # the long one is cut
    assert ids[0, 0].item() == 2 and ids[0, 4].item() == 3  # [CLS] a red circle [SEP]
    images = torch.randn(3, 3, 32, 32)
    loss = task.training_step({"images": images, "captions": ["a red circle",
                                                              "the big blue square", long]}, 0)
    assert torch.isfinite(loss)


def test_captioning_and_seq2seq_tasks_start_from_save_pretrained_folders(tmp_path):
    from multimodal.models.seq2seq import Seq2Seq, Seq2SeqConfig
    from multimodal.tasks import Seq2SeqTask

    captioner = mm.create_model("captioner_scenes")
    task = CaptioningTask(pretrained=str(captioner.save_pretrained(tmp_path / "cap")))
    _same_weights(task.model, captioner)
    seq = Seq2Seq(Seq2SeqConfig(source_vocab_size=20, target_vocab_size=20, dim=16, heads=2))
    task = Seq2SeqTask(pretrained=str(seq.save_pretrained(tmp_path / "seq")))
    _same_weights(task.model, seq)
    # the seq2seq encoder is a text part a classifier can take
    text = ClassificationTask(modality="text", pretrained=str(tmp_path / "seq"), num_classes=2)
    _same_weights(text.model, seq.encoder, skip=("head",))


def test_audio_waveforms_at_another_rate_than_the_model_are_refused(hf, monkeypatch):
    from types import SimpleNamespace

    task = ClassificationTask(pretrained=str(hf["ast"]), num_classes=2)
    data = SimpleNamespace(features=False, sample_rate=8000, num_classes=2,
                           class_names=["a", "b"])
    monkeypatch.setattr(ClassificationTask, "datamodule", property(lambda self: data))
    with pytest.raises(ValueError, match="waveforms are at 8000 Hz but the model's front "
                                         "end expects 16000 Hz"):
        task.setup("fit")


def test_a_llama_folder_for_image_classification_is_named(hf):
    with pytest.raises(ValueError, match=r"llama holds a TextDecoder \(text model\): it has no "
                                         r"part ClassificationTask can train as an image model"):
        ClassificationTask(pretrained=str(hf["llama"]), modality="image", num_classes=3)


def test_num_classes_rules_for_a_model_from_the_config():
    """A config model whose num_classes is left at its default takes the task's / data's;
    one set away from its default is the user's choice: a different data count is an
    error (the head is never silently replaced)."""
    base = dict(image_size=16, patch_size=8, dim=32, depth=1, heads=2)
    task = ClassificationTask(mm.ViT(mm.ViTConfig(**base)), num_classes=4)
    assert task.model.config.num_classes == 4 and task.model.head.out_features == 4
    task = ClassificationTask(mm.ViT(mm.ViTConfig(**base)), class_names=CLASSES)
    assert task.model.head.out_features == 3 and task.class_names == CLASSES
    with pytest.raises(ValueError, match="the data has 3 classes but the model's head has 7"):
        ClassificationTask(mm.ViT(mm.ViTConfig(**base, num_classes=7)), class_names=CLASSES)


def test_language_model_from_a_gguf_file(tmp_path):
    """A llama.cpp GGUF file (anything mm.from_hf reads) starts a LanguageModelTask, and a
    classifier is refused it by name."""
    pytest.importorskip("gguf")
    from tests.convert.test_gguf import llama, write_gguf  # the tiny-file writer

    path = write_gguf(tmp_path / "tiny.gguf", llama(97, tie_word_embeddings=False))
    task = LanguageModelTask(pretrained=str(path))
    _same_weights(task.model, mm.from_hf(path))
    with pytest.raises(ValueError, match=r"tiny\.gguf holds a TextDecoder"):
        ClassificationTask(pretrained=str(path), num_classes=2)


def test_audio_classifier_from_a_whisper_folder(tmp_path):
    """A Whisper folder: its encoder is the part an audio classifier trains."""
    import transformers as t

    torch.manual_seed(0)
    args = dict(d_model=32, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=48,
                decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=48,
                num_mel_bins=16, max_source_positions=30, vocab_size=100, pad_token_id=0,
                bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    t.WhisperForConditionalGeneration(t.WhisperConfig(**args)).save_pretrained(
        tmp_path / "whisper")
    task = ClassificationTask(pretrained=str(tmp_path / "whisper"), modality="audio",
                              class_names=CLASSES)
    assert isinstance(task.model, mm.AudioClassifier) and task.model.config.num_classes == 3
    whole = mm.from_hf(tmp_path / "whisper")
    encoder = whole if isinstance(whole, mm.AudioClassifier) else whole.encoder
    _same_weights(task.model, encoder, skip=("head", "head_dist"))
