"""Speculative greedy decoding, all of it: the argument checks, the proposers, the draft
length, the verify loop and its counters. :func:`multimodal.generation.generate` checks its
arguments with :func:`check_speculative` and hands ``speculative=...`` calls to
:func:`speculative_greedy`; this module stands on :mod:`multimodal.stepper` alone (never on
``generation``, so the two do not import each other).

Speculative decoding guesses the next ``k`` tokens cheaply, runs the model once over all of
them (a ``k + 1``-row forward costs about what a one-row step costs where decoding is bound
by the bytes of weights read, as on a CPU at batch 1), and keeps the longest prefix of the
guess that equals the model's own greedy choices, plus the model's token after it: with
``m`` guesses accepted, one forward pass yields ``m + 1`` tokens, the same ones greedy
decoding gives (up to the rounding of a k-row vs a one-row matrix product).

The rule is the greedy case of speculative *sampling* (Leviathan et al. 2023; Chen et al.
2023), which accepts a guess ``d`` drawn from the proposer's ``q`` with probability
``min(1, p(d) / q(d))`` under the model's ``p`` and, on a rejection, draws the model's token
from the residual ``norm(max(0, p - q))``, so that every token is distributed as ``p``.
Greedy decoding makes ``p`` the point mass on ``g = argmax p`` and a deterministic proposer
makes ``q`` the point mass on ``d``: the acceptance probability is 1 if ``d = g`` and 0
otherwise, and the residual ``norm(max(0, p - q))`` is the point mass on ``g``: keep the
guesses while they equal the model's argmax, then take the model's token. Only this greedy
case is implemented (``do_sample=True`` with ``speculative=`` is refused).

Two proposers:

- :func:`prompt_lookup` (prompt lookup decoding, A. Saxena 2023): find the most recent
  earlier occurrence of the last ``n`` tokens in the prompt + output so far, and propose
  the tokens that followed it. Free (no model); it pays off where the output copies its
  input (summaries, edits of code, quoting a passage, repetitive text). How many of its
  tokens are verified is :class:`DraftLength`'s choice.
- a small *draft model* of the same tokenizer decoding ``k`` tokens greedily
  (:class:`_DraftProposer` keeps its KV cache in step with the accepted tokens).

:func:`speculative_stats` reports the last speculative ``generate`` call of this thread:
tokens proposed, tokens accepted, forward passes of the model.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from multimodal.nn.cache import KVCache
from multimodal.stepper import Decoder, LogitsProcessor, Stepper

__all__ = ["METHODS", "DraftLength", "SpeculativeStats", "check_speculative", "prompt_lookup",
           "speculative_greedy", "speculative_stats"]

#: the values of ``generate(..., speculative=...)``
METHODS = ("prompt_lookup", "draft")


class SpeculativeStats:
    """Counts of one speculative decoding call."""

    def __init__(self) -> None:
        self.proposed = 0  # draft tokens sent to the model for verification
        self.accepted = 0  # of those, equal to the model's greedy token
        self.forwards = 0  # forward passes of the (large) model, the prefill included
        self.tokens = 0  # tokens generated

    @property
    def acceptance(self) -> float:
        """accepted / proposed (0 when nothing was proposed)."""
        return self.accepted / self.proposed if self.proposed else 0.0

    def as_dict(self) -> dict[str, float]:
        return {"proposed": self.proposed, "accepted": self.accepted,
                "forwards": self.forwards, "tokens": self.tokens,
                "acceptance": self.acceptance,
                "tokens_per_forward": self.tokens / self.forwards if self.forwards else 0.0}


_LAST = threading.local()


def new_stats() -> SpeculativeStats:
    """Fresh counters, recorded as this thread's last call's."""
    _LAST.stats = SpeculativeStats()
    return _LAST.stats


def speculative_stats() -> dict[str, float]:
    """This thread's last ``generate(..., speculative=...)`` call: ``proposed``,
    ``accepted``, ``acceptance`` (= accepted / proposed), ``forwards`` (model passes),
    ``tokens`` (generated) and ``tokens_per_forward``; empty before any call."""
    stats = getattr(_LAST, "stats", None)
    return stats.as_dict() if stats is not None else {}


def prompt_lookup(ids: Tensor, num_tokens: int, ngram: int = 3,
                  min_ngram: int = 1) -> Tensor:
    """Up to ``num_tokens`` tokens that followed the most recent earlier occurrence of
    the last ``n`` tokens of ``ids`` (1-D: prompt + output so far), trying
    ``n = ngram, ngram - 1, ..., min_ngram`` (longer matches first: better guesses);
    empty when none occurs or ``num_tokens`` is 0.

    With ``ids = x_0 .. x_{N-1}``: the largest ``s < N - n`` with
    ``x_s .. x_{s+n-1} = x_{N-n} .. x_{N-1}`` gives the proposal ``y_i = x_{s+n+i}``,
    ``i < k``, where an index past the end reads the proposal itself,
    ``y_i = y_{i-p}`` for ``s + n + i >= N`` with ``p = N - s - n``: a match overlapping
    the end means the text repeats with period ``p`` (a loop, the way small models
    degenerate), and the guess continues the loop instead of stopping at ``N``.
    """
    if ids.dim() != 1:
        raise ValueError(f"ids must be 1-D, got shape {tuple(ids.shape)}")
    length = ids.shape[0]
    if num_tokens <= 0:
        return ids[:0]
    for n in range(min(ngram, length - 1), min_ngram - 1, -1):
        # windows starting at 0 .. N - n - 1 (the last window is the pattern itself)
        windows = ids[:-1].unfold(0, n, 1)
        hits = (windows == ids[-n:]).all(dim=1).nonzero()
        if hits.numel():
            begin = int(hits[-1]) + n
            found = ids[begin : begin + num_tokens]
            if found.shape[0] < num_tokens:  # overlaps the end: continue the period
                found = found.repeat(-(-num_tokens // found.shape[0]))[:num_tokens]
            return found
    return ids[:0]


class DraftLength:
    """How many of a prompt-lookup proposal's tokens to verify: the ``k`` that maximises
    the expected tokens per unit of time.

    If each guess is right with probability ``a`` (given the ones before it were) and a
    pass over ``1 + k`` rows costs ``1 + b k`` one-row passes, a pass with ``k`` guesses
    yields ``E(k) = 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a)`` tokens, and the best
    ``k`` maximises ``E(k) / (1 + b k)``; guesses are verified only where that ratio
    beats a plain step's (``k = 0``: 1) by ``margin`` (the estimates are noisy, and a gain
    of a few percent is not worth the risk of a loss; so ``a > b`` at least). ``a`` is
    estimated from every step's proposal against the tokens that came out, verified or
    not (a proposal not sent to the model is still compared with the model's next token:
    free evidence), with older
    steps' counts decayed by ``decay`` (a memory of ~10 judged guesses) and a prior of
    ``prior`` worth ``prior_weight`` guesses that does not decay, so one lucky guess
    among failures does not switch verification on:
    ``a = (hits + prior * prior_weight) / (trials + prior_weight)``. ``b`` comes from the
    measured times of one-row and several-row passes (``cost`` until measured; about 0.1
    for SmolLM2 in fp32 at one thread, 0.2-0.45 in packed int4, whose kernel time grows
    with the rows).
    """

    def __init__(self, max_tokens: int, decay: float = 0.9, cost: float = 0.15,
                 prior: float = 0.3, prior_weight: float = 2.0, margin: float = 0.1) -> None:
        self.max_tokens = max_tokens
        self.margin = margin
        self.decay = decay
        self.cost = cost
        self.prior, self.prior_weight = prior, prior_weight
        self.hits, self.trials = 0.0, 0.0  # decayed counts of right / judged guesses
        self.one_row: float | None = None  # seconds of a one-row pass (moving average)

    @property
    def acceptance(self) -> float:
        return (self.hits + self.prior * self.prior_weight) / (self.trials + self.prior_weight)

    def choose(self, available: int) -> int:
        """The number of guesses to verify, of ``available`` proposed."""
        a, b = min(self.acceptance, 0.99), self.cost
        best_k, best = 0, 1.0 + self.margin
        for k in range(1, min(available, self.max_tokens) + 1):
            ratio = (1 - a ** (k + 1)) / (1 - a) / (1 + b * k)
            if ratio > best:
                best_k, best = k, ratio
        return best_k

    def observe(self, guess: list[int], new: list[int]) -> None:
        """Score a proposal against the tokens that followed: right guesses up to the
        first wrong one (which counts as one failure)."""
        right = 0
        wrong = 0
        for g, t in zip(guess, new, strict=False):
            if g != t:
                wrong = 1
                break
            right += 1
        self.hits = self.decay * self.hits + right
        self.trials = self.decay * self.trials + right + wrong

    def timed(self, rows: int, seconds: float) -> None:
        """A pass over ``rows`` rows took ``seconds``: update the cost model."""
        if rows == 1:
            self.one_row = seconds if self.one_row is None else \
                0.7 * self.one_row + 0.3 * seconds
        elif self.one_row:
            per_row = (seconds - self.one_row) / (rows - 1) / self.one_row
            self.cost = 0.7 * self.cost + 0.3 * min(max(per_row, 0.02), 2.0)


# --- the decoding loop -------------------------------------------------------------------


def check_speculative(model: Decoder, input_ids: Tensor, mask: Tensor | None,
                       speculative: str | None, draft_model: Decoder | None,
                       num_draft_tokens: int, ngram: int, do_sample: bool, num_beams: int,
                       use_cache: bool, static: bool, compile_step: bool) -> Tensor | None:
    """One-line errors for what speculative decoding does not serve; returns the
    attention mask to use (None: a batch of one real prompt needs none)."""
    if speculative not in METHODS:
        if speculative is None:
            raise ValueError("draft_model is used by speculative='draft': pass both")
        raise ValueError(f"speculative must be one of {METHODS} (or None), got {speculative!r}")
    if (speculative == "draft") != (draft_model is not None):
        raise ValueError("speculative='draft' needs draft_model= (a small decoder of the same "
                         "tokenizer), and draft_model is only used by speculative='draft'")
    if do_sample or num_beams > 1:
        raise ValueError("speculative decoding is greedy: use do_sample=False and num_beams=1")
    if input_ids.shape[0] != 1:
        raise ValueError(f"speculative decoding takes one prompt (batch 1), got a batch of "
                         f"{input_ids.shape[0]}: decode the prompts one at a time")
    if not use_cache:
        raise ValueError("speculative decoding needs the KV cache (use_cache=True)")
    if static or compile_step:
        raise ValueError("speculative decoding runs on the eager KV cache: use "
                         "compile=False and static_cache=False")
    if not isinstance(num_draft_tokens, int) or num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens must be an integer >= 1, got {num_draft_tokens!r}")
    if not isinstance(ngram, int) or ngram < 1:
        raise ValueError(f"ngram must be an integer >= 1, got {ngram!r}")
    if draft_model is not None:
        vocab = getattr(getattr(model, "config", None), "vocab_size", None)
        draft_vocab = getattr(getattr(draft_model, "config", None), "vocab_size", None)
        if vocab is not None and draft_vocab is not None and vocab != draft_vocab:
            raise ValueError(f"draft_model has a vocabulary of {draft_vocab} tokens, the model "
                             f"{vocab}: they must share one tokenizer")
    if mask is not None and not bool(mask.all()):
        raise ValueError("speculative decoding takes one unpadded prompt: drop the "
                         "padding (attention_mask must be all ones)")
    return None


def _cropping_stepper(model: Decoder, total: int, model_kwargs: dict[str, Any],
                      needs: str) -> tuple[Stepper, KVCache]:
    """A stepper on ``model``'s eager KV cache of ``total`` positions, which a rejected
    guess is cropped out of; ``needs`` opens the error raised for a model without one."""
    step = Stepper(model, model.make_cache(total), dict(model_kwargs))
    if not isinstance(step.cache, KVCache):
        raise ValueError(f"{needs} with a KV cache of transformer blocks (its rollback "
                         "crops the cache)")
    return step, step.cache


class _DraftProposer:
    """A draft model's greedy guess of the next ``k`` tokens, its KV cache kept in step
    with the accepted tokens: on each call the cached tokens that differ from ``ids``
    (rejected guesses) are cropped away before decoding on."""

    def __init__(self, draft: Decoder, total: int, model_kwargs: dict[str, Any],
                 like: Tensor) -> None:
        if total > draft.max_len:
            raise ValueError(f"prompt + max_new_tokens = {total} positions exceed the "
                             f"draft_model's context of {draft.max_len}")
        self.step, self.cache = _cropping_stepper(draft, total, model_kwargs,
                                                  "speculative='draft' needs a draft_model")
        self.fed = like.new_empty(total)  # the tokens whose keys / values are cached

    def __call__(self, ids: Tensor, k: int) -> Tensor:
        end = ids.shape[0]
        kept = min(self.cache.length, end - 1)
        if kept:
            differ = (self.fed[:kept] != ids[:kept]).nonzero()
            if differ.numel():
                kept = int(differ[0])
        self.cache.crop(kept)
        guess = ids.new_empty(k)
        pending = ids[kept:end]
        self.fed[kept:end] = pending
        for i in range(k):
            token = self.step(pending[None], ids[None], None).argmax(dim=-1)
            guess[i] = token[0]
            pending = guess[i : i + 1]
            if i + 1 < k:
                self.fed[end + i] = token[0]
        return guess


def speculative_greedy(model: Decoder, ids: Tensor, max_new_tokens: int, eos: int | None,
                       model_kwargs: dict[str, Any],
                       logits_processor: LogitsProcessor | None, method: str,
                       draft_model: Decoder | None, num_draft_tokens: int,
                       ngram: int) -> Tensor:
    """Greedy decoding of one prompt (1, N), verifying proposed tokens in one forward pass.

    With the cache holding ``x_0 .. x_{c-1}`` and ``x_c .. x_{e-1}`` not yet cached
    (the prompt at first, then the last accepted token), a proposal ``d_1 .. d_k`` is
    appended and ``x_c .. x_{e-1} d_1 .. d_k`` run through the model: its argmax rows
    ``g_0 .. g_k`` (``g_j`` follows ``d_j``) are greedy's tokens as long as the guesses
    were right, so with ``m = max{j : d_i = g_{i-1} for i <= j}`` the tokens
    ``g_0 .. g_m`` are kept (cut after an EOS) and the cache cropped to the ``e + m``
    positions whose keys / values came from kept tokens (the acceptance rule
    ``min(1, p / q)`` with point masses ``p``, ``q``: see the module docstring).

    The prompt is prefilled alone, as greedy does; the verify passes after it attend row
    by row (:attr:`~multimodal.nn.cache.LayerCache.rowwise`), so with a row-independent
    model (the packed int4 / int8 kernels) every logit is bitwise the one greedy's
    one-token step computes, and the tokens are greedy's even at exact ties of bf16
    logits; in fp32 a k-row matrix product rounds differently from a one-row one (about
    1e-6 relative), which only a near-tie of the two best logits could show.
    """
    start = ids.shape[1]
    total = start + max_new_tokens
    out = ids.new_empty(1, total)
    out[:, :start] = ids
    step, cache = _cropping_stepper(model, total, model_kwargs,
                                    "speculative decoding needs a decoder")
    stats: SpeculativeStats = new_stats()
    if method == "draft":
        assert draft_model is not None
        proposer: Callable[[Tensor, int], Tensor] = _DraftProposer(
            draft_model, total, model_kwargs, ids)
    else:
        def proposer(seq: Tensor, k: int) -> Tensor:
            return prompt_lookup(seq, k, ngram)
    policy = DraftLength(num_draft_tokens) if method == "prompt_lookup" else None
    end = start
    row = out[0]
    while end < total:
        # the prompt alone first (greedy's own prefill), then verify passes whose rows are
        # one-token steps' arithmetic (LayerCache.rowwise); the model adds a token after
        # the guess
        k = min(num_draft_tokens, total - end - 1) if end > start else 0
        proposal = proposer(row[:end], k) if k > 0 else row[:0]
        guess = proposal if policy is None else proposal[: policy.choose(proposal.shape[0])]
        d = guess.shape[0]
        row[end : end + d] = guess
        cached = cache.length
        began = time.perf_counter()
        logits = step.last_rows(out[:, cached : end + d], None, d + 1)[0]
        if logits_processor is not None:
            logits = torch.stack([logits_processor(out[:, : end + j], logits[j : j + 1])[0]
                                  for j in range(d + 1)])
        greedy = logits.argmax(dim=-1)
        m = int((guess == greedy[:d]).long().cumprod(0).sum()) if d else 0
        new = greedy[: m + 1]
        stop = False
        if eos is not None:
            hits = (new == eos).nonzero()
            if hits.numel():
                new = new[: int(hits[0]) + 1]
                stop = True
        n = new.shape[0]
        row[end : end + n] = new
        cache.crop(end + n - 1)
        if policy is not None and end > start:
            policy.timed(end + d - cached, time.perf_counter() - began)
            policy.observe(proposal.tolist(), new.tolist())
        stats.proposed += d
        stats.accepted += m
        stats.forwards += 1
        if end == start:
            cache.set_rowwise(True)
        end += n
        if stop:
            break
    stats.tokens = end - start
    return out[:, :end]
