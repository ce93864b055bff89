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
    from multimodal.hub import Encoder

    tok = mm.WordPieceTokenizer.train(TEXTS * 10, vocab_size=120)
    torch.manual_seed(0)
    model = mm.TextEncoder(mm.TextEncoderConfig(vocab_size=tok.vocab_size, max_len=16, dim=32,
                                                depth=2, heads=2, mlp_dim=64))
    return Encoder(model, tok, pooling="mean").save_pretrained(
        tmp_path_factory.mktemp("serve") / "tiny")
