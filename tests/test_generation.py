"""Decoding checked against the definitions of each strategy, not against the code.

The references here are written from scratch: greedy = argmax of a full forward pass at
every step; beam search = exhaustive search over every continuation, scored by a full
forward pass; top-k / top-p = the sets defined on sorted probabilities.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from multimodal.generation import generate, process_logits
from multimodal.models.text import TextDecoder, TextDecoderConfig
from tests.random_weights import o1_weights

V = 4  # tiny vocabulary for exhaustive search


def tiny_model(vocab: int = V, seed: int = 0, scale: float = 0.5) -> TextDecoder:
    """A random decoder with O(1) weights (not the small training init) and an untied,
    O(``scale``) output layer: its next-token distributions differ from step to step and
    its best sequences are separated by clear margins rather than near-ties."""
    torch.manual_seed(seed)
    model = TextDecoder(TextDecoderConfig(vocab_size=vocab, max_len=16, dim=16, depth=2,
                                          heads=2, tie_embeddings=False))
    return o1_weights(model, "tok_embed", "pos_embed", head=scale).eval()


@torch.no_grad()
def seq_logprob(model: TextDecoder, prompt: list[int], cont: list[int]) -> float:
    """sum_t log p(cont_t | prompt, cont_<t) from ONE full forward pass (no cache)."""
    ids = torch.tensor([prompt + cont])
    logp = model(ids).log_softmax(-1)[0]
    p = len(prompt)
    return float(sum(logp[p - 1 + t, tok] for t, tok in enumerate(cont)))


@torch.no_grad()
def reference_greedy(model: TextDecoder, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids


def exhaustive_best(model: TextDecoder, prompt: list[int], n: int, eos: int | None = None,
                    length_penalty: float = 1.0) -> tuple[list[int], float, float]:
    """Best continuation over all sequences that end at ``eos`` or reach ``n`` tokens,
    scored ``S / T ** length_penalty`` (S = summed log-prob, T = generated length incl.
    EOS). Returns (best, its score, margin to the second best)."""
    scored = []
    for length in range(1, n + 1):
        for cont in itertools.product(range(V), repeat=length):
            cont = list(cont)
            if eos is not None and eos in cont[:-1]:
                continue  # the sequence would have stopped earlier
            if length < n and (eos is None or cont[-1] != eos):
                continue  # unfinished and shorter than the limit
            score = seq_logprob(model, prompt, cont) / length ** length_penalty
            scored.append((score, cont))
    scored.sort(key=lambda s: -s[0])
    return scored[0][1], scored[0][0], scored[0][0] - scored[1][0]


# --- process_logits: the top-k / top-p sets ------------------------------------------


def test_top_p_keeps_smallest_set_reaching_p() -> None:
    probs = torch.tensor([0.10, 0.40, 0.05, 0.30, 0.15])
    logits = probs.log()
    # sorted: 0.40 (1), 0.30 (3), 0.15 (4), 0.10 (0), 0.05 (2)
    cases = {0.35: {1}, 0.5: {1, 3}, 0.8: {1, 3, 4}, 0.9: {1, 3, 4, 0}, 0.99: {0, 1, 2, 3, 4}}
    for p, kept in cases.items():
        out = process_logits(logits[None], top_p=p)[0]
        assert set(torch.isfinite(out).nonzero().flatten().tolist()) == kept, p
        # kept tokens keep their logits, so probabilities renormalise over the set
        idx = sorted(kept)
        expected = probs[idx] / probs[idx].sum()
        torch.testing.assert_close(out.softmax(-1)[idx], expected)


def test_top_k_keeps_k_largest_and_temperature_scales() -> None:
    logits = torch.tensor([[0.3, 2.0, -1.0, 1.5, 0.0]])
    out = process_logits(logits, temperature=0.5, top_k=2)
    assert torch.isfinite(out).nonzero()[:, 1].tolist() == [1, 3]
    torch.testing.assert_close(out[0, [1, 3]], torch.tensor([4.0, 3.0]))
    # top_k >= V keeps everything
    assert torch.isfinite(process_logits(logits, top_k=10)).all()


def test_top_k_samples_fall_in_top_k_with_renormalised_frequencies() -> None:
    torch.manual_seed(1)
    logits = torch.randn(1, 12)
    k = 3
    top = logits[0].topk(k).indices
    gen = torch.Generator().manual_seed(123)
    model = _ConstantLogits(logits[0])
    n = 4000
    out = generate(model, torch.zeros(n, 1, dtype=torch.long), 1, do_sample=True, top_k=k,
                   generator=gen, use_cache=False)[:, 1]
    assert set(out.tolist()) == set(top.tolist())  # only (and all of) the k most likely
    freq = torch.bincount(out, minlength=12).float() / n
    expected = logits[0, top].softmax(-1)
    # multinomial std <= sqrt(0.25 / n) = 0.008; allow 4 sigma
    torch.testing.assert_close(freq[top], expected, atol=0.032, rtol=0)


class _ConstantLogits(torch.nn.Module):
    """A 'decoder' whose next-token logits never change: isolates the sampling step."""

    max_len = 64

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = logits

    def forward(self, input_ids, attention_mask=None, cache=None):
        b, n = input_ids.shape
        return self.logits.expand(b, n, -1)

    def make_cache(self, max_len=None):
        return None


# --- greedy and its equivalents ------------------------------------------------------

PROMPT = [1, 2, 0]


def test_greedy_matches_step_by_step_argmax() -> None:
    model = tiny_model()
    ref = reference_greedy(model, PROMPT, 6)
    for use_cache in (True, False):
        out = generate(model, torch.tensor([PROMPT]), 6, use_cache=use_cache)
        assert out[0].tolist() == ref


@pytest.mark.parametrize(
    "kwargs",
    [
        {"do_sample": True, "top_k": 1},
        {"do_sample": True, "top_p": 1e-6},
        {"do_sample": True, "temperature": 1e-4},
        {"num_beams": 1},
    ],
    ids=["top_k=1", "tiny_top_p", "low_temperature", "num_beams=1"],
)
def test_degenerate_settings_equal_greedy(kwargs: dict) -> None:
    ref = reference_greedy(tiny_model(vocab=11, seed=3), PROMPT, 8)
    model = tiny_model(vocab=11, seed=3)
    gen = torch.Generator().manual_seed(0)
    out = generate(model, torch.tensor([PROMPT]), 8, generator=gen, **kwargs)
    assert out[0].tolist() == ref


# --- beam search = exhaustive search -------------------------------------------------


def test_wide_beam_equals_exhaustive_search_without_eos() -> None:
    n, not_greedy = 3, 0
    for seed in range(8):
        model = tiny_model(seed=seed)
        best, _, margin = exhaustive_best(model, PROMPT, n, eos=None)
        assert margin > 1e-4  # the test is only meaningful without a near-tie
        out = generate(model, torch.tensor([PROMPT]), n, num_beams=V ** (n - 1))
        assert out[0, len(PROMPT):].tolist() == best, seed
        not_greedy += reference_greedy(model, PROMPT, n)[len(PROMPT):] != best
    assert not_greedy > 0  # some case where greedy misses the best sequence


def test_wide_beam_equals_exhaustive_search_with_eos_and_length_penalty() -> None:
    n, eos, pad = 3, 3, 0
    early = 0
    for seed in range(6):
        model = tiny_model(seed=seed)
        for lp in (0.0, 1.0, 2.0):
            best, _, margin = exhaustive_best(model, PROMPT, n, eos=eos, length_penalty=lp)
            if margin < 1e-4:
                continue
            out = generate(model, torch.tensor([PROMPT]), n, num_beams=V ** (n - 1),
                           eos_token_id=eos, pad_token_id=pad, length_penalty=lp)
            got = out[0, len(PROMPT):].tolist()
            assert got == best + [pad] * (len(got) - len(best)), (seed, lp)
            early += len(best) < n
    assert early > 0  # at least one winner stopped at EOS before the length limit


def test_beam_prefers_short_or_long_as_length_penalty_says() -> None:
    """S / T**lp: with a high lp long hypotheses win more often than with lp = 0."""
    n, eos = 3, 3
    lengths = {0.0: 0, 4.0: 0}
    for seed in range(6):
        model = tiny_model(seed=seed)
        for lp in lengths:
            best, _, _ = exhaustive_best(model, PROMPT, n, eos=eos, length_penalty=lp)
            lengths[lp] += len(best)
    assert lengths[4.0] > lengths[0.0]


# --- cache, EOS, padding -------------------------------------------------------------


def test_cached_and_uncached_decoding_agree() -> None:
    model = tiny_model(vocab=11, seed=5, scale=1.0)
    prompt = torch.tensor([PROMPT])
    for kwargs in ({}, {"do_sample": True, "top_k": 5, "temperature": 1.5},
                   {"do_sample": True, "top_p": 0.9}, {"num_beams": 3},
                   {"num_beams": 4, "eos_token_id": 2, "length_penalty": 0.5}):
        outs = []
        for use_cache in (True, False):
            gen = torch.Generator().manual_seed(7)
            outs.append(generate(model, prompt, 8, use_cache=use_cache, generator=gen,
                                 **kwargs))
        assert outs[0].tolist() == outs[1].tolist(), kwargs


@pytest.mark.parametrize("cache", ["kv", "static", "none"])
def test_prefill_projects_only_the_last_position_with_the_full_forward_logits(
        cache: str) -> None:
    """The prompt's logits come from the head on the last row alone, and equal (to float
    rounding) the last row of a full forward pass, for a left-padded text batch and for
    class-conditional ImageGPT (whose features have one row more: the class token)."""
    from multimodal.models.image_gpt import ImageGPT, ImageGPTConfig

    text = tiny_model(vocab=11, seed=2, scale=1.0)
    ids = torch.randint(0, 11, (3, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    torch.manual_seed(1)
    igpt = ImageGPT(ImageGPTConfig(image_size=4, vocab_size=8, dim=16, depth=2, heads=2,
                                   num_classes=3)).eval()
    pixels = torch.randint(0, 8, (2, 6), generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([2, 0])
    kw = {"kv": {}, "static": {"static_cache": True}, "none": {"use_cache": False}}[cache]
    for model, prompt, extra in ((text, ids, {"attention_mask": mask}),
                                 (igpt, pixels, {"class_label": labels})):
        with torch.no_grad():
            full = model(prompt, **extra)[:, -1]
        seen: list[tuple[int, torch.Tensor]] = []
        hook = model.lm_head.register_forward_hook(
            lambda mod, args, out, seen=seen: seen.append((args[0].shape[1],
                                                           out[:, -1].clone())))
        try:
            generate(model, prompt, 1, **extra, **kw)
        finally:
            hook.remove()
        assert [rows for rows, _ in seen] == [1]
        torch.testing.assert_close(seen[0][1], full, atol=1e-5, rtol=1e-5)


def test_stops_at_eos_and_pads_the_rest() -> None:
    model = tiny_model(vocab=11, seed=3)
    ref = reference_greedy(model, PROMPT, 10)[len(PROMPT):]
    eos = ref[2]
    first = ref.index(eos)
    pad = next(t for t in range(11) if t != eos)
    out = generate(model, torch.tensor([PROMPT, PROMPT]), 10, eos_token_id=eos,
                   pad_token_id=pad)
    for row in out:
        got = row[len(PROMPT):].tolist()
        assert got[: first + 1] == ref[: first + 1]
        assert all(t == pad for t in got[first + 1:])


def test_left_padded_batch_matches_each_prompt_alone() -> None:
    model = tiny_model(vocab=11, seed=4, scale=1.0)
    prompts = [[5, 1], [2, 7, 3, 9], [8]]
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    for kwargs in ({}, {"num_beams": 3}):
        for use_cache in (True, False):
            batch = generate(model, ids, 5, attention_mask=mask, use_cache=use_cache,
                             **kwargs)
            for i, p in enumerate(prompts):
                alone = generate(model, torch.tensor([p]), 5, **kwargs)
                assert batch[i, width:].tolist() == alone[0, len(p):].tolist(), (kwargs, i)


def test_generate_on_model_method_and_restores_training_mode() -> None:
    model = tiny_model().train()
    out = model.generate(torch.tensor([PROMPT]), 3)
    assert out.shape == (1, len(PROMPT) + 3) and model.training


# --- bad arguments -------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": 0.0, "do_sample": True},
        {"temperature": -1.0},
        {"top_k": 0, "do_sample": True},
        {"top_k": 2.5, "do_sample": True},
        {"top_p": 0.0, "do_sample": True},
        {"top_p": 1.5, "do_sample": True},
        {"num_beams": 0},
        {"num_beams": 2, "do_sample": True},
        {"max_new_tokens": -1},
        {"max_new_tokens": 100},  # beyond the model's context
    ],
)
def test_bad_arguments_raise_value_error(kwargs: dict) -> None:
    model = tiny_model()
    kwargs = {"max_new_tokens": 2, **kwargs}
    with pytest.raises(ValueError):
        generate(model, torch.tensor([PROMPT]), **kwargs)


def test_bad_inputs_raise_value_error() -> None:
    model = tiny_model()
    with pytest.raises(ValueError, match="batch, tokens"):
        generate(model, torch.tensor(PROMPT), 2)
    with pytest.raises(ValueError, match="empty"):
        generate(model, torch.zeros(1, 0, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="attention_mask"):
        generate(model, torch.tensor([PROMPT]), 2, attention_mask=torch.ones(1, 2))
    with pytest.raises(ValueError, match="left-padded"):
        generate(model, torch.tensor([PROMPT]), 2, attention_mask=torch.tensor([[1, 1, 0]]))
    with pytest.raises(ValueError):
        process_logits(torch.zeros(1, 3), top_p=math.nan)
