"""What ``multimodal serve`` makes of a path is :mod:`multimodal.loading`'s answer: a whole
Whisper (:func:`~multimodal.loading.is_whisper`) is served for transcription, what
:func:`~multimodal.loading.load` reads as an encoder is served for embeddings."""

from __future__ import annotations

import json

import pytest

from multimodal.loading import is_whisper, load
from multimodal.models.whisper import Whisper
from multimodal.serve.models import kind_of
from tests.serve.conftest import tiny_clip_folder

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def whisper_folders(tmp_path_factory):
    """A transformers Whisper folder with a tokenizer.json, the same without one (read whole
    too: the transcriber then asks for the tokenizer), our own
    Whisper written by ``save_pretrained`` and a CTranslate2 directory."""
    from multimodal.convert.hf_audio import whisper_from_hf
    from tests.models.test_whisper import NO_TS, hf_whisper, write_ct2

    root = tmp_path_factory.mktemp("kinds")
    hf = hf_whisper()
    hf.save_pretrained(root / "hf_bare")
    hf.save_pretrained(root / "hf")
    (root / "hf" / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE"}}))
    ours = whisper_from_hf(hf, languages=("en", "de"), no_timestamps_token_id=NO_TS)
    ours.save_pretrained(root / "ours")
    return {"hf": root / "hf", "hf_bare": root / "hf_bare", "ours": root / "ours",
            "ct2": write_ct2(hf, root / "ct2", "float32")}


@pytest.mark.parametrize("name,whole", [("hf", True), ("ours", True), ("ct2", True),
                                        ("hf_bare", True)])
def test_a_whole_whisper_is_served_for_transcription(whisper_folders, name, whole):
    path = whisper_folders[name]
    assert is_whisper(path) is whole
    assert kind_of(path) == ("transcribe" if whole else "embed")
    if name in ("ours", "hf_bare"):  # what load gives agrees: the whole model
        assert isinstance(load(path).model, Whisper) is whole


def test_a_whisper_encoder_folder_is_served_for_embeddings(whisper_folders, tmp_path):
    """A transformers ``WhisperModel`` folder (no LM head) is read as its encoder."""
    folder = tmp_path / "encoder_only"
    folder.mkdir()
    for f in whisper_folders["hf_bare"].iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    meta = json.loads((folder / "config.json").read_text())
    meta["architectures"] = ["WhisperModel"]
    (folder / "config.json").write_text(json.dumps(meta))
    assert not is_whisper(folder)
    assert kind_of(folder) == "embed"
    assert not isinstance(load(folder).model, Whisper)


def test_encoders_are_served_for_embeddings(tmp_path, tiny_encoder):
    clip = tiny_clip_folder(tmp_path / "clip")
    for path in (clip, tiny_encoder):
        assert not is_whisper(path)
        assert kind_of(path) == "embed"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        is_whisper(tmp_path / "nothing")
