from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("litserve")

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "red green blue circle square",
         "the big red square is small", "a circle"]


@pytest.fixture(scope="session")
def tiny_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight text encoder (2 blocks, width 32, 16-token context, mean pooling) and
    its word-piece tokenizer, written by ``save_pretrained``."""
    import multimodal as mm
    from multimodal.encoder import Encoder

    tok = mm.WordPieceTokenizer.train(TEXTS * 10, vocab_size=120)
    torch.manual_seed(0)
    model = mm.TextEncoder(mm.TextEncoderConfig(vocab_size=tok.vocab_size, max_len=16, dim=32,
                                                depth=2, heads=2, mlp_dim=64))
    return Encoder(model, tok, pooling="mean").save_pretrained(
        tmp_path_factory.mktemp("serve") / "tiny")


@pytest.fixture(scope="session")
def tiny_chat(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight Llama (2 blocks, width 64) with a byte-level BPE and a ChatML template
    in one GGUF file, written as llama.cpp's converter does (tests/convert/test_gguf.py)."""
    pytest.importorskip("gguf")
    pytest.importorskip("transformers")
    from tests.convert.test_gguf import Q, byte_level_bpe, llama, write_gguf

    tok = byte_level_bpe()
    model = llama(tok.get_vocab_size())
    torch.manual_seed(0)
    with torch.no_grad():  # spread the blocks' weights: replies of several tokens
        for name, p in model.named_parameters():
            if "layers" in name and "norm" not in name:
                p.normal_(0, 0.2)
    return write_gguf(tmp_path_factory.mktemp("serve") / "chat.gguf", model, tok, qtype=Q.F32)


@pytest.fixture(scope="session")
def tiny_classifier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``.ckpt`` as the classification task writes it (``multimodal_model``, state dict under
    ``model.``, class names, the tokenizer as JSON) for a random 3-class text encoder."""
    import multimodal as mm
    from multimodal.tasks.classification import ClassificationTask

    folder = tmp_path_factory.mktemp("serve")
    tok = mm.WordPieceTokenizer.train(TEXTS * 10, vocab_size=120)
    tok.save(folder / "tokenizer.json")
    torch.manual_seed(1)
    model = mm.TextEncoder(mm.TextEncoderConfig(vocab_size=tok.vocab_size, max_len=16, dim=32,
                                                depth=2, heads=2, mlp_dim=64, num_classes=3))
    task = ClassificationTask(model=model, class_names=["animals", "colours", "shapes"])
    ckpt = {"state_dict": task.state_dict(), "hyper_parameters": {}}
    task.on_save_checkpoint(ckpt)
    ckpt["tokenizer"] = (folder / "tokenizer.json").read_text()
    torch.save(ckpt, folder / "classifier.ckpt")
    return folder / "classifier.ckpt"


def tiny_clip_folder(folder: Path, loss: str = "softmax", preprocessor: bool = True) -> Path:
    """A random-weight CLIP (``loss="sigmoid"``: SigLIP) of ours (two 2-block towers of
    width 32, 16-d embeddings, 32x32 images), its word-piece tokenizer and, unless told
    otherwise, its image preprocessing, written by ``save_pretrained``."""
    import multimodal as mm
    from multimodal.encoder import Encoder

    tok = mm.WordPieceTokenizer.train(TEXTS * 10 + ["a photo of a cat", "a dog"] * 10,
                                      vocab_size=120)
    torch.manual_seed(0)
    config = mm.CLIPConfig(
        vision=mm.ViTConfig(image_size=32, patch_size=8, dim=32, depth=2, heads=2, mlp_dim=64,
                            pool="mean", class_token=False),
        text=mm.TextEncoderConfig(vocab_size=tok.vocab_size, max_len=24, dim=32, depth=2,
                                  heads=2, mlp_dim=64),
        embed_dim=16, loss=loss)
    model = mm.CLIP(config)
    with torch.no_grad():  # peaked enough that the labels differ
        model.logit_scale.fill_(3.0)
    pre = mm.ImagePreprocessor(size=32) if preprocessor else None
    return Encoder(model, tok, preprocessor=pre).save_pretrained(folder)


@pytest.fixture(scope="session")
def tiny_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """:func:`tiny_clip_folder` (softmax CLIP)."""
    return tiny_clip_folder(tmp_path_factory.mktemp("serve") / "clip")
