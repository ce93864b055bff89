"""Word2Vec: the negative-sampling gradients against a hand-computed case (autograd and the
fused step), sub-sampling / noise / windows against their formulas, and a tiny corpus whose
analogy must come out."""

from __future__ import annotations

import math
import random

import pytest
import torch

from multimodal.data.word2vec import (
    Batches,
    Vocabulary,
    encode,
    keep_probabilities,
    noise_cumulative,
    tokenize,
)
from multimodal.embeddings import WordVectors, analogy
from multimodal.models.word2vec import Word2Vec, Word2VecConfig
from multimodal.tasks.word2vec import linear_lr, train_word2vec

E0 = [[0.1, 0.2], [0.3, -0.1], [0.0, 0.5]]
U0 = [[0.2, 0.1], [-0.3, 0.4], [0.5, 0.5]]


def sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def dot(a, b):
    return sum(x * y for x, y in zip(a, b, strict=True))


def model_with(mode: str, context_grad: str = "full", sparse: bool = False) -> Word2Vec:
    m = Word2Vec(Word2VecConfig(vocab_size=3, dim=2, mode=mode, context_grad=context_grad),
                 sparse=sparse)
    with torch.no_grad():
        m.in_embed.weight.copy_(torch.tensor(E0))
        m.out_embed.weight.copy_(torch.tensor(U0))
    return m


def skipgram_by_hand():
    """centre 0 predicts word 1 against noise word 2: h = E[0],
    L = -log s(U1.h) - log s(-U2.h); dL/dU1 = (s(U1.h) - 1) h, dL/dU2 = s(U2.h) h,
    dL/dE0 = (s(U1.h) - 1) U1 + s(U2.h) U2."""
    h = E0[0]
    s1, s2 = dot(U0[1], h), dot(U0[2], h)
    loss = -math.log(sig(s1)) - math.log(sig(-s2))
    gU1 = [(sig(s1) - 1) * x for x in h]
    gU2 = [sig(s2) * x for x in h]
    gE0 = [(sig(s1) - 1) * a + sig(s2) * b for a, b in zip(U0[1], U0[2], strict=True)]
    return loss, gE0, gU1, gU2


def test_skipgram_loss_and_gradients_by_hand():
    loss, gE0, gU1, gU2 = skipgram_by_hand()
    assert abs(loss - (-math.log(sig(0.05)) - math.log(sig(-0.15)))) < 1e-12  # U1.h, U2.h
    m = model_with("skipgram")
    out = m.loss(torch.tensor([0]), torch.tensor([[1, 2]]))
    out.backward()
    assert out.item() == pytest.approx(loss, abs=1e-6)
    gE, gU = m.in_embed.weight.grad, m.out_embed.weight.grad
    assert torch.allclose(gE[0], torch.tensor(gE0), atol=1e-6)
    assert torch.allclose(gE[1:], torch.zeros(2, 2))
    assert torch.allclose(gU[1], torch.tensor(gU1), atol=1e-6)
    assert torch.allclose(gU[2], torch.tensor(gU2), atol=1e-6)
    # the fused step moves each row by -lr times its gradient
    f = model_with("skipgram")
    step_loss = f.sgd_step(torch.tensor([0]), torch.tensor([[1, 2]]), lr=0.5)
    assert step_loss.item() == pytest.approx(loss, abs=1e-6)
    assert torch.allclose(f.in_embed.weight[0], torch.tensor(E0[0]) - 0.5 * torch.tensor(gE0),
                          atol=1e-6)
    assert torch.allclose(f.out_embed.weight[1], torch.tensor(U0[1]) - 0.5 * torch.tensor(gU1),
                          atol=1e-6)
    assert torch.allclose(f.out_embed.weight[2], torch.tensor(U0[2]) - 0.5 * torch.tensor(gU2),
                          atol=1e-6)
    assert torch.equal(f.out_embed.weight[0], torch.tensor(U0[0]))  # untouched row


def test_cbow_loss_and_gradients_by_hand():
    """context {1, 2} predicts word 0 against noise word 1: h = (E1 + E2) / 2,
    dL/dh = (s(U0.h) - 1) U0 + s(U1.h) U1, dL/dE1 = dL/dE2 = dL/dh / 2."""
    h = [(a + b) / 2 for a, b in zip(E0[1], E0[2], strict=True)]
    s0, s1 = dot(U0[0], h), dot(U0[1], h)
    loss = -math.log(sig(s0)) - math.log(sig(-s1))
    gh = [(sig(s0) - 1) * a + sig(s1) * b for a, b in zip(U0[0], U0[1], strict=True)]
    gU0 = [(sig(s0) - 1) * x for x in h]
    gU1 = [sig(s1) * x for x in h]
    inputs, targets = torch.tensor([[1, 2]]), torch.tensor([[0, 1]])
    m = model_with("cbow")
    out = m.loss(inputs, targets)
    out.backward()
    assert out.item() == pytest.approx(loss, abs=1e-6)
    gE, gU = m.in_embed.weight.grad, m.out_embed.weight.grad
    for row in (1, 2):
        assert torch.allclose(gE[row], torch.tensor(gh) / 2, atol=1e-6)
    assert torch.allclose(gU[0], torch.tensor(gU0), atol=1e-6)
    assert torch.allclose(gU[1], torch.tensor(gU1), atol=1e-6)
    lr = 0.5
    for context_grad, scale in (("mean", 0.5), ("full", 1.0)):  # full: as the C code
        f = model_with("cbow", context_grad)
        f.sgd_step(inputs, targets, lr)
        for row in (1, 2):
            want = torch.tensor(E0[row]) - lr * scale * torch.tensor(gh)
            assert torch.allclose(f.in_embed.weight[row], want, atol=1e-6), context_grad
        assert torch.allclose(f.out_embed.weight[0], torch.tensor(U0[0]) - lr
                              * torch.tensor(gU0), atol=1e-6)


@pytest.mark.parametrize("mode", ["skipgram", "cbow"])
def test_fused_step_is_minus_lr_times_autograd(mode):
    """A random batch with repeated rows, padding and masked noise words: the fused step's
    change of every row is -lr times autograd's gradient of the summed loss (CBOW with
    the exact 'mean' context gradient)."""
    g = torch.Generator().manual_seed(0)
    cfg = Word2VecConfig(vocab_size=7, dim=4, mode=mode, context_grad="mean")
    a, b = Word2Vec(cfg), Word2Vec(cfg)
    with torch.no_grad():
        for m in (a, b):
            m.in_embed.weight.copy_(torch.randn(7, 4, generator=g) if m is a else
                                    a.in_embed.weight)
            m.out_embed.weight.copy_(torch.randn(7, 4, generator=g) if m is a else
                                     a.out_embed.weight)
    targets = torch.randint(0, 7, (6, 4), generator=g)
    valid = torch.rand(6, 4, generator=g) > 0.3
    valid[:, 0] = True
    if mode == "cbow":
        inputs = torch.randint(0, 7, (6, 3), generator=g)
        mask = torch.rand(6, 3, generator=g) > 0.3
        mask[:, 0] = True
        inputs = torch.where(mask, inputs, -1)
    else:
        inputs, mask = torch.randint(0, 7, (6,), generator=g), None
    a.loss(inputs, targets, mask=mask, valid=valid).backward()
    E, U = b.in_embed.weight.clone(), b.out_embed.weight.clone()
    b.sgd_step(inputs, targets, 0.1, mask=mask, valid=valid)
    assert torch.allclose(b.in_embed.weight - E, -0.1 * a.in_embed.weight.grad, atol=1e-6)
    assert torch.allclose(b.out_embed.weight - U, -0.1 * a.out_embed.weight.grad, atol=1e-6)
    # under a bf16-mixed run's autocast the step is the same fp32 arithmetic (on a GPU,
    # `accelerator: auto` gives word2vec.yaml bf16-mixed; the update used to meet index_add_
    # with a bf16 source and fail)
    c = Word2Vec(cfg)
    with torch.no_grad():
        c.in_embed.weight.copy_(E)
        c.out_embed.weight.copy_(U)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        c.sgd_step(inputs, targets, 0.1, mask=mask, valid=valid)
    assert c.in_embed.weight.dtype == torch.float32
    assert torch.equal(c.in_embed.weight, b.in_embed.weight)
    assert torch.equal(c.out_embed.weight, b.out_embed.weight)


def test_sparse_gradients_and_bad_config():
    m = model_with("skipgram", sparse=True)
    m.loss(torch.tensor([0]), torch.tensor([[1, 2]])).backward()
    assert m.in_embed.weight.grad.is_sparse
    with pytest.raises(ValueError, match="mode"):
        Word2VecConfig(mode="glove")


def test_keep_probability_and_noise_formulas():
    counts = [1000, 100, 10]
    sample = 0.01
    t = sample * sum(counts)
    want = [min(1.0, (math.sqrt(f / t) + 1) * t / f) for f in counts]
    assert torch.allclose(keep_probabilities(counts, sample), torch.tensor(want,
                          dtype=torch.float64))
    assert torch.equal(keep_probabilities(counts, 0), torch.ones(3, dtype=torch.float64))
    p = [f ** 0.75 for f in counts]
    cum = noise_cumulative(counts)
    assert torch.allclose(cum, torch.tensor([sum(p[:i + 1]) / sum(p) for i in range(3)],
                                            dtype=torch.float64))
    b = Batches(torch.tensor([0, 1, 2]), torch.tensor([0, 0, 0]), counts, negatives=4,
                sample=0)
    draws = b.noise(20000, torch.Generator().manual_seed(0)).flatten()
    freq = torch.bincount(draws, minlength=3).double() / draws.numel()
    assert torch.allclose(freq, torch.tensor(p, dtype=torch.float64) / sum(p), atol=0.01)


def test_windows_stay_in_sentences_and_are_dynamic():
    vocab = Vocabulary.build([["a", "b", "c", "d"], ["e", "f"]], min_count=1)
    ids, sent = encode([["a", "b", "c", "d"], ["e", "f"]], vocab)
    b = Batches(ids, sent, vocab.counts, mode="skipgram", window=3, sample=0)

    def epoch_pairs(seed: int) -> set[tuple[int, int]]:
        centre, context, _ = b.examples(torch.Generator().manual_seed(seed))
        return set(zip(centre.tolist(), context.tolist(), strict=True))

    pairs = set().union(*(epoch_pairs(s) for s in range(30)))
    index = vocab.index()
    assert (index["d"], index["e"]) not in pairs and (index["e"], index["d"]) not in pairs
    assert (index["a"], index["d"]) in pairs  # distance 3 reachable
    # the half-width is uniform on 1..3: distance-1 pairs appear in every epoch, distance 3
    # only when the draw is 3 (1/3 of the time for a centre word)
    far = sum((index["a"], index["d"]) in epoch_pairs(s) for s in range(300))
    assert 60 < far < 140
    cbow = Batches(ids, sent, vocab.counts, mode="cbow", window=3, sample=0)
    inputs, _, mask = cbow.examples(torch.Generator().manual_seed(0))
    assert inputs.shape == (6, 6) and mask.any(1).all()
    assert torch.equal(mask, inputs >= 0)


def test_tokenize_and_vocabulary():
    assert tokenize("O'er the King's 3 hills, 'tis!") == ["o'er", "the", "king's", "hills",
                                                         "tis"]
    v = Vocabulary.build([["a", "b", "a"], ["c", "a", "b"]], min_count=2)
    assert v.words == ["a", "b"] and v.counts == [3, 2]
    with pytest.raises(ValueError, match="min_count"):
        Vocabulary.build([["a"]], min_count=2)
    assert linear_lr(0.025, 0.0001, 0.5) == pytest.approx(0.01255)


def tiny_corpus(seed: int = 0, n: int = 3000) -> list[list[str]]:
    """Four people, each with a gender and a rank; a sentence names one and draws words of
    its gender and of its rank. Vectors learn gender + rank, so man : king :: woman : queen."""
    rng = random.Random(seed)
    gender = {"m": ["he", "his", "him", "beard"], "f": ["she", "her", "hers", "gown"]}
    rank = {"royal": ["crown", "throne", "palace", "reign"],
            "common": ["field", "plough", "market", "cottage"]}
    people = {"king": ("m", "royal"), "queen": ("f", "royal"), "man": ("m", "common"),
              "woman": ("f", "common")}
    out = []
    for _ in range(n):
        who = rng.choice(sorted(people))
        g, r = people[who]
        words = [rng.choice(gender[g]), rng.choice(rank[r]), rng.choice(gender[g]),
                 rng.choice(rank[r])]
        rng.shuffle(words)
        out.append([*words[:2], who, *words[2:]])
    return out


@pytest.mark.parametrize("mode", ["cbow", "skipgram"])
def test_tiny_corpus_analogy_comes_out(mode):
    sentences = tiny_corpus()
    vocab = Vocabulary.build(sentences, min_count=1)
    ids, sent = encode(sentences, vocab)
    batches = Batches(ids, sent, vocab.counts, mode=mode, window=2, negatives=5, sample=0,
                      batch_size=256)
    model = Word2Vec(Word2VecConfig(vocab_size=len(vocab), dim=16, mode=mode))
    stats = train_word2vec(model, batches, epochs=5, lr=0.025, seed=0)
    assert stats["words"] == 5 * ids.numel()
    wv = WordVectors(vocab.words, model.vectors)
    assert analogy(wv, wv, "man", "king", "woman", k=1)[0][0] == "queen"
    assert analogy(wv, wv, "king", "queen", "man", k=1)[0][0] == "woman"
