"""Word vectors in the word2vec formats: ours read back by gensim identically (text and
binary), gensim's read by ours, and a word2vec file used by analogy / nearest_neighbours and
as a text model's initial embedding table."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from multimodal.embeddings import (
    WordVectors,
    analogy,
    init_embedding,
    load_word2vec_format,
    nearest_neighbours,
    save_word2vec_format,
)

WORDS = ["king", "queen", "man", "woman", "o'er", "naïve"]


def vectors() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    v = torch.randn(len(WORDS), 7, generator=g) * torch.logspace(-6, 3, 7)  # tiny to large
    v[0, 0] = 1e-30
    v[1, 1] = -0.0
    return v


@pytest.mark.parametrize("binary", [False, True])
def test_gensim_reads_ours_identically(tmp_path, binary):
    gensim_models = pytest.importorskip("gensim.models")
    v = vectors()
    path = save_word2vec_format(tmp_path / ("v.bin" if binary else "v.txt"), WORDS, v,
                                binary=binary)
    kv = gensim_models.KeyedVectors.load_word2vec_format(str(path), binary=binary)
    assert list(kv.index_to_key) == WORDS
    assert np.array_equal(kv.vectors, v.numpy())  # bit for bit, text included
    ours = load_word2vec_format(path)
    assert ours.words == WORDS and torch.equal(ours.vectors, v)


@pytest.mark.parametrize("binary", [False, True])
def test_ours_reads_gensims(tmp_path, binary):
    gensim_models = pytest.importorskip("gensim.models")
    v = vectors()
    kv = gensim_models.KeyedVectors(vector_size=7)
    kv.add_vectors(WORDS, v.numpy())
    path = tmp_path / "g.bin"
    kv.save_word2vec_format(str(path), binary=binary)
    ours = load_word2vec_format(path, binary=binary)
    assert ours.words == WORDS
    assert torch.equal(ours.vectors, torch.from_numpy(kv.vectors))


def test_bad_files_and_words(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("2 3\na 1 2 3\nb 1 2\n")
    with pytest.raises(ValueError, match="entry 2 has 2 values"):
        load_word2vec_format(bad)
    (tmp_path / "h.txt").write_text("two three\n")
    with pytest.raises(ValueError, match="first line"):
        load_word2vec_format(tmp_path / "h.txt")
    cut = save_word2vec_format(tmp_path / "c.bin", ["a", "b"], torch.ones(2, 3), binary=True)
    cut.write_bytes(cut.read_bytes()[:-6])
    with pytest.raises(ValueError, match="ends inside entry 2"):
        load_word2vec_format(cut)
    with pytest.raises(ValueError, match="whitespace"):
        save_word2vec_format(tmp_path / "w.txt", ["a b"], torch.ones(1, 3))


def test_word_vectors_in_analogy_and_neighbours(tmp_path):
    # king = royal + male, queen = royal + female ...: the analogy is exact
    royal, common = torch.tensor([1.0, 0, 0]), torch.tensor([0, 1.0, 0])
    male, female = torch.tensor([0, 0, 1.0]), torch.tensor([0, 0, -1.0])
    v = torch.stack([royal + male, royal + female, common + male, common + female])
    path = save_word2vec_format(tmp_path / "v.txt", WORDS[:4], v)
    wv = load_word2vec_format(path)
    assert analogy(wv, wv, "man", "king", "woman", k=1)[0][0] == "queen"
    near = nearest_neighbours(wv, wv, "king", k=3)
    assert {w for w, _ in near[:2]} == {"queen", "man"} and near[2][0] == "woman"
    with pytest.raises(ValueError, match="not in the vocabulary"):
        nearest_neighbours(wv, wv, "emperor")


class _Tok:
    def __init__(self, vocab: list[str]) -> None:
        self.vocab = {w: i for i, w in enumerate(vocab)}

    def token_to_id(self, word: str) -> int | None:
        return self.vocab.get(word)


def test_init_embedding_copies_known_words(tmp_path):
    from multimodal.models.text import TextDecoder, TextDecoderConfig

    model = TextDecoder(TextDecoderConfig(vocab_size=6, max_len=8, dim=7, depth=1, heads=1,
                                          mlp_dim=8))
    before = model.tok_embed.weight.detach().clone()
    path = save_word2vec_format(tmp_path / "v.bin", WORDS, vectors(), binary=True)
    tok = _Tok(["[PAD]", "queen", "x", "king", "y", "woman"])
    assert init_embedding(model, tok, path) == 3
    w = model.tok_embed.weight.detach()
    assert torch.equal(w[1], vectors()[1]) and torch.equal(w[3], vectors()[0])
    assert torch.equal(w[5], vectors()[3])
    assert torch.equal(w[[0, 2, 4]], before[[0, 2, 4]])
    with pytest.raises(ValueError, match="7 dimensions"):
        init_embedding(torch.zeros(6, 5), tok, WordVectors(WORDS, vectors()))
