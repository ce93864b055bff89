"""``pretrained: <CTranslate2 Whisper folder>`` on an audio classifier: the
task trains the real encoder, whose features equal transformers' Whisper encoder."""

from __future__ import annotations

import pytest
import torch

from tests.real_weights import real_weights

pytest.importorskip("transformers")


def _tiny_en():
    return real_weights("whisper-tiny.en")


@pytest.mark.slow
def test_classification_task_from_ctranslate2_folder_keeps_whisper_encoder():
    from multimodal.convert.ctranslate2 import ctranslate2_to_transformers
    from multimodal.tasks import ClassificationTask

    folder = _tiny_en()
    task = ClassificationTask(pretrained=str(folder), modality="audio",
                              class_names=["a", "b", "c"])
    model = task.model.eval()
    assert model.config.num_classes == 3
    hf = ctranslate2_to_transformers(folder).eval()
    torch.manual_seed(0)
    feats = torch.randn(1, 3000, 80) * 0.3  # a 30 s window of normalised log-mel
    with torch.no_grad():
        want = hf.model.encoder(feats.transpose(1, 2)).last_hidden_state
        got = model.forward_features(feats)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    # short clips are read as they are (no 30 s padding): 100 frames -> 50 tokens
    with torch.no_grad():
        assert model.forward_features(feats[:, :100]).shape == (1, 50, 384)
        assert model(feats[:, :100]).shape == (1, 3)


def test_ctranslate2_folder_is_a_pretrained_path(tmp_path):
    from multimodal.loading import load

    (tmp_path / "model.bin").write_bytes(b"not a CTranslate2 model")
    # read as a CTranslate2 folder (its own error), not "not a Hugging Face folder"
    with pytest.raises(FileNotFoundError, match=r"a CTranslate2 Whisper directory holds"):
        load(tmp_path)
