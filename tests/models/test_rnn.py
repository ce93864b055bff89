"""The recurrent encoder-decoders: scores against their formulas, masking, decoding through
the shared loop, bad input, weights round trip."""

from __future__ import annotations

import math

import pytest
import torch

from multimodal.loading import from_pretrained
from multimodal.models.rnn import RecurrentState, RNNSeq2Seq, RNNSeq2SeqConfig
from multimodal.nn.alignment import AdditiveScore, MultiplicativeScore, attend
from multimodal.tasks.seq2seq import Seq2SeqTask
from multimodal.tokenizers.text import BOS_ID, EOS_ID, PAD_ID

VARIANTS = [(cell, att) for cell in ("gru", "lstm")
            for att in ("none", "additive", "multiplicative")]


def make(cell: str = "gru", attention: str = "additive", **kw: object) -> RNNSeq2Seq:
    torch.manual_seed(0)
    cfg = dict(source_vocab_size=20, target_vocab_size=12, max_source_len=10,
               max_target_len=8, embed_dim=8, hidden_dim=16, cell=cell, attention=attention)
    cfg.update(kw)
    return RNNSeq2Seq(RNNSeq2SeqConfig(**cfg)).eval()


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(7, 20, (3, 6), generator=g)
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 2 + [0] * 4])
    src = src.masked_fill(mask == 0, PAD_ID)
    tgt = torch.cat([torch.full((3, 1), BOS_ID), torch.randint(7, 12, (3, 4), generator=g)], 1)
    return src, mask, tgt


# --- the scores against their formulas -------------------------------------------------


def test_additive_score_is_v_tanh_ws_plus_uh() -> None:
    torch.manual_seed(0)
    score = AdditiveScore(query_dim=3, key_dim=5, attention_dim=4)
    s, h = torch.randn(2, 2, 3), torch.randn(2, 6, 5)
    W, U, v = score.W.weight.detach(), score.U.weight.detach(), score.v.weight[0].detach()
    expected = torch.empty(2, 2, 6)
    for b in range(2):
        for t in range(2):
            for i in range(6):
                hidden = [math.tanh(sum(W[a, j] * s[b, t, j] for j in range(3))
                                    + sum(U[a, j] * h[b, i, j] for j in range(5)))
                          for a in range(4)]
                expected[b, t, i] = sum(v[a] * hidden[a] for a in range(4))
    with torch.no_grad():
        got = score.scores(s, score.keys(h))
    torch.testing.assert_close(got, expected)


def test_multiplicative_score_is_s_w_h() -> None:
    torch.manual_seed(0)
    score = MultiplicativeScore(query_dim=3, key_dim=5)
    s, h = torch.randn(2, 2, 3), torch.randn(2, 6, 5)
    W = score.W.weight.detach()  # (3, 5): W h maps key_dim -> query_dim
    expected = torch.empty(2, 2, 6)
    for b in range(2):
        for t in range(2):
            for i in range(6):
                expected[b, t, i] = sum(s[b, t, p] * W[p, q] * h[b, i, q]
                                        for p in range(3) for q in range(5))
    with torch.no_grad():
        got = score.scores(s, score.keys(h))
    torch.testing.assert_close(got, expected)


def test_attend_is_a_masked_softmax_and_weighted_sum() -> None:
    scores = torch.tensor([[[1.0, 2.0, 0.5, 9.0]]])
    memory = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [100.0, 100.0]]])
    pad = torch.tensor([[False, False, False, True]])
    context, weights = attend(scores, memory, pad)
    e = [math.exp(1.0), math.exp(2.0), math.exp(0.5)]
    a = [x / sum(e) for x in e] + [0.0]
    torch.testing.assert_close(weights, torch.tensor([[a]]))
    c = [a[0] * 1 + a[2] * 2, a[1] * 1 + a[2] * 2]
    torch.testing.assert_close(context, torch.tensor([[c]]))


@pytest.mark.parametrize("attention", ["additive", "multiplicative"])
def test_model_attention_weights_follow_the_formula(attention: str) -> None:
    """The weights the model returns = softmax over the real source positions of the
    score of each decoder RNN output against each encoder state, recomputed here."""
    model = make("gru", attention)
    src, mask, tgt = batch()
    with torch.no_grad():
        _, maps = model(src, tgt, mask, return_attention=True)
        assert maps.self_attn == [] and len(maps.cross_attn) == 1
        assert maps.cross_attn[0].shape == (3, 1, tgt.shape[1], src.shape[1])
        weights = maps.cross_attn[0][:, 0]
        memory, _, state = model.encode(src, mask)
        out, _ = model.decoder.rnn(model.decoder.embed(tgt), state[:, 0].transpose(0, 1)
                                   .contiguous())
        sc = model.decoder.score
        for b in range(3):
            n = int(mask[b].sum())
            for t in range(tgt.shape[1]):
                if attention == "additive":
                    e = [float(sc.v.weight[0] @ torch.tanh(sc.W.weight @ out[b, t]
                                                           + sc.U.weight @ memory[b, i]))
                         for i in range(n)]
                else:
                    e = [float(out[b, t] @ sc.W.weight @ memory[b, i]) for i in range(n)]
                m = max(e)
                z = sum(math.exp(x - m) for x in e)
                expected = [math.exp(x - m) / z for x in e] + [0.0] * (src.shape[1] - n)
                torch.testing.assert_close(weights[b, t], torch.tensor(expected))


# --- masking of padded encoder states ---------------------------------------------------


@pytest.mark.parametrize(("cell", "attention"), VARIANTS)
def test_source_padding_changes_nothing(cell: str, attention: str) -> None:
    """Each source alone (no padding) gives the same logits as in a padded batch, and so
    does the batch with junk ids (not [PAD]) in its padded positions."""
    model = make(cell, attention)
    src, mask, tgt = batch()
    junk = src.masked_fill(mask == 0, 13)
    with torch.no_grad():
        logits, maps = model(src, tgt, mask, return_attention=True)
        weights = maps.cross_attn[0][:, 0] if maps.cross_attn else None
        logits_junk = model(junk, tgt, mask)
        longer = torch.cat([src, torch.full((3, 3), PAD_ID)], 1)
        longer_mask = torch.cat([mask, torch.zeros(3, 3, dtype=mask.dtype)], 1)
        logits_longer = model(longer, tgt, longer_mask)
        for b in range(3):
            n = int(mask[b].sum())
            alone = model(src[b : b + 1, :n], tgt[b : b + 1])
            torch.testing.assert_close(logits[b : b + 1], alone)
    torch.testing.assert_close(logits_junk, logits)
    torch.testing.assert_close(logits_longer, logits)
    if weights is not None:
        assert bool((weights.masked_select(mask[:, None, :] == 0) == 0).all())
        torch.testing.assert_close(weights.sum(-1), torch.ones(3, tgt.shape[1]))


def test_without_attention_the_context_is_the_last_encoder_state() -> None:
    """No attention: the decoder sees the source only through the final encoder state, so
    two sources with the same final state give the same logits."""
    model = make("gru", "none")
    src, mask, tgt = batch()
    with torch.no_grad():
        memory, _, state = model.encode(src, mask)
        other_memory = torch.randn_like(memory)
        a = model.decoder(tgt, memory=memory, encoder_state=state)
        b = model.decoder(tgt, memory=other_memory, encoder_state=state)
        c = model.decoder(tgt, memory=memory, encoder_state=state + 0.1)
        for i in range(3):  # the top layer's final state is the output at the last token
            torch.testing.assert_close(state[i, 0, -1], memory[i, int(mask[i].sum()) - 1])
    torch.testing.assert_close(a, b)
    assert not torch.allclose(a, c)


# --- decoding through the shared loop ----------------------------------------------------


@pytest.mark.parametrize(("cell", "attention"), VARIANTS)
def test_stepwise_cached_decoding_equals_teacher_forcing(cell: str, attention: str) -> None:
    model = make(cell, attention)
    src, mask, tgt = batch()
    with torch.no_grad():
        full = model(src, tgt, mask)
        memory, pad, state = model.encode(src, mask)
        cache = model.decoder.make_cache()
        steps = [model.decoder(tgt[:, t : t + 1], cache=cache, memory=memory,
                               memory_padding_mask=pad, encoder_state=state)
                 for t in range(tgt.shape[1])]
    assert cache.length == tgt.shape[1]
    torch.testing.assert_close(torch.cat(steps, 1), full)


@pytest.mark.parametrize(("cell", "attention"), VARIANTS)
def test_generate_is_the_argmax_of_teacher_forced_logits(cell: str, attention: str) -> None:
    """Greedy generate (cached or not) = feeding the argmax back through the full forward."""
    model = make(cell, attention)
    src, mask, _ = batch()
    ids = torch.full((3, 1), BOS_ID)
    with torch.no_grad():
        for _ in range(5):
            ids = torch.cat([ids, model(src, ids, mask)[:, -1].argmax(-1, keepdim=True)], 1)
    cached = model.generate(src, mask, max_new_tokens=5, eos_token_id=None)
    uncached = model.generate(src, mask, max_new_tokens=5, eos_token_id=None, use_cache=False)
    assert torch.equal(cached, ids)
    assert torch.equal(uncached, ids)


@pytest.mark.parametrize(("cell", "attention"), VARIANTS)
def test_beam_search_of_one_beam_is_greedy_and_beams_reorder_the_state(
        cell: str, attention: str) -> None:
    model = make(cell, attention)
    src, mask, _ = batch()
    greedy = model.generate(src, mask, max_new_tokens=6)
    assert torch.equal(model.generate(src, mask, max_new_tokens=6, num_beams=1), greedy)
    beams = model.generate(src, mask, max_new_tokens=6, num_beams=3)
    # the recurrent state is reordered by beam: without a cache (the whole prefix re-read
    # at every step) beam search finds the same sequences
    assert torch.equal(model.generate(src, mask, max_new_tokens=6, num_beams=3,
                                      use_cache=False), beams)
    # and a batch gives each source what it gets alone
    for b in range(3):
        n = int(mask[b].sum())
        alone = model.generate(src[b : b + 1, :n], max_new_tokens=6, num_beams=3)
        assert torch.equal(alone[0], beams[b, : alone.shape[1]])
        assert bool((beams[b, alone.shape[1]:] == PAD_ID).all())
    with torch.no_grad():  # sharper weights: the decoded tokens depend on the state more
        for p in model.parameters():
            p.mul_(4.0)
    for k in (2, 5):  # no EOS: every beam runs to the end, parents get shuffled
        kw = dict(max_new_tokens=7, num_beams=k, eos_token_id=None, length_penalty=0.0)
        assert torch.equal(model.generate(src, mask, use_cache=False, **kw),
                           model.generate(src, mask, **kw))


def test_beam_search_finds_a_sequence_at_least_as_likely_as_greedy() -> None:
    model = make("lstm", "multiplicative")
    src, mask, _ = batch()

    def logprob(ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            logp = model(src, ids[:, :-1], mask).log_softmax(-1)
        tok = ids[:, 1:]
        lp = logp.gather(-1, tok[..., None])[..., 0]
        alive = torch.ones_like(tok, dtype=torch.bool)
        alive[:, 1:] = (tok[:, :-1] != EOS_ID).cumprod(1).bool()
        return (lp * alive).sum(1)

    greedy = model.generate(src, mask, max_new_tokens=4, eos_token_id=None)
    beams = model.generate(src, mask, max_new_tokens=4, eos_token_id=None, num_beams=4,
                           length_penalty=0.0)
    assert bool((logprob(beams) >= logprob(greedy) - 1e-5).all())


def test_recurrent_state_reorder_follows_the_index() -> None:
    state = RecurrentState(4)
    state.hidden = (torch.arange(6.0).view(1, 3, 2),)
    state.keys = torch.arange(3.0).view(3, 1, 1)
    state.reorder(torch.tensor([2, 2, 0]))
    torch.testing.assert_close(state.hidden[0], torch.tensor([[[4.0, 5.0], [4.0, 5.0],
                                                               [0.0, 1.0]]]))
    torch.testing.assert_close(state.keys.flatten(), torch.tensor([2.0, 2.0, 0.0]))


# --- bad input -----------------------------------------------------------------------------


def test_bad_input_gives_clear_errors() -> None:
    model = make()
    src, mask, tgt = batch()
    with pytest.raises(ValueError, match=r"source_ids holds ids outside the vocabulary \[0, 20\)"):
        model(src.masked_fill(src == src[0, 0], 20), tgt, mask)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(src.masked_fill(src == src[0, 0], -1), tgt, mask)
    with pytest.raises(ValueError, match=r"target_ids holds ids outside the vocabulary \[0, 12\)"):
        model(src, tgt.masked_fill(tgt == BOS_ID, 12), mask)
    with pytest.raises(ValueError, match="source_ids is empty"):
        model(src[:, :0], tgt)
    with pytest.raises(ValueError, match="source_ids is empty"):
        model.generate(src[:, :0])
    with pytest.raises(ValueError, match=r"source rows \[1\] are empty"):
        model(src, tgt, mask * torch.tensor([[1], [0], [1]]))
    with pytest.raises(ValueError, match="target_ids is empty"):
        model(src, tgt[:, :0], mask)
    with pytest.raises(ValueError, match="source of 11 tokens exceeds max_source_len 10"):
        model(torch.full((1, 11), 9), tgt[:1])
    with pytest.raises(ValueError, match="exceeds max_target_len 8"):
        model(src, torch.full((3, 9), 9), mask)
    with pytest.raises(ValueError, match="exceeds the model's context of 8"):
        model.generate(src, mask, max_new_tokens=8)
    with pytest.raises(ValueError, match="right-padded"):
        model(src, tgt, mask.flip(1))
    with pytest.raises(ValueError, match="source_mask must match"):
        model(src, tgt, mask[:, :3])
    with pytest.raises(ValueError, match="integer tensor"):
        model(src.float(), tgt, mask)
    with pytest.raises(ValueError, match=r"source_ids must be \(batch, tokens\), got shape \(6,\)"):
        model(src[0], tgt)
    with pytest.raises(ValueError, match=r"target_ids must be \(batch, tokens\)"):
        model(src, tgt[None], mask)
    with pytest.raises(ValueError, match="target_ids has 3 rows but source_ids has 2"):
        model(src[:2], tgt, mask[:2])


@pytest.mark.parametrize("num_beams", [1, 2])
def test_generate_refuses_bad_sources_clearly(num_beams: int) -> None:
    """Decoding reads the source through the same checks as training."""
    model = make("lstm", "multiplicative")
    src, mask, _ = batch()
    with pytest.raises(ValueError, match=r"source_ids holds ids outside the vocabulary \[0, 20\)"):
        model.generate(src.masked_fill(src == src[0, 0], 20), mask, num_beams=num_beams)
    with pytest.raises(ValueError, match="source_ids is empty"):
        model.generate(src[:, :0], num_beams=num_beams)
    with pytest.raises(ValueError, match=r"source rows \[1\] are empty"):
        model.generate(src, mask * torch.tensor([[1], [0], [1]]), num_beams=num_beams)
    with pytest.raises(ValueError, match="source of 11 tokens exceeds max_source_len 10"):
        model.generate(torch.full((1, 11), 9), num_beams=num_beams)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("cell", "rnn", "cell must be one of"),
    ("attention", "dot", "attention must be one of"),
    ("hidden_dim", 0, "hidden_dim must be >= 1"),
    ("max_source_len", 0, "max_source_len must be >= 1"),
    ("dropout", 1.0, "dropout must be in"),
])
def test_bad_config_is_refused(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RNNSeq2SeqConfig(**{field: value})


# --- weights and task ----------------------------------------------------------------------


@pytest.mark.parametrize(("cell", "attention"), [("gru", "additive"), ("lstm", "none")])
def test_save_and_load_pretrained(tmp_path, cell: str, attention: str) -> None:
    model = make(cell, attention, num_layers=2)
    src, mask, tgt = batch()
    model.save_pretrained(tmp_path / "m")
    loaded = from_pretrained(tmp_path / "m")
    again = RNNSeq2Seq.from_pretrained(tmp_path / "m")
    assert isinstance(loaded, RNNSeq2Seq)
    assert loaded.config == model.config
    with torch.no_grad():
        torch.testing.assert_close(loaded(src, tgt, mask), model(src, tgt, mask))
        torch.testing.assert_close(again(src, tgt, mask), model(src, tgt, mask))


def test_seq2seq_task_trains_the_rnn() -> None:
    """The seq2seq task's loss and an optimiser step: the loss on a fixed batch falls."""
    model = make("gru", "additive").train()
    task = Seq2SeqTask(model)
    src, mask, tgt = batch()
    data = {"source_ids": src, "source_mask": mask, "target_ids": tgt}
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = float(task.loss(data).detach())
    assert math.isfinite(first)
    for _ in range(30):
        opt.zero_grad()
        task.loss(data).backward()
        opt.step()
    assert float(task.loss(data).detach()) < 0.5 * first
