"""Draft proposals for speculative greedy decoding (the verify step is in
:mod:`multimodal.generation`, the one decoding loop).

Speculative decoding guesses the next ``k`` tokens cheaply, runs the model once over all of
them (a ``k + 1``-row forward costs about what a one-row step costs where decoding is bound
by the bytes of weights read, as on a CPU at batch 1), and keeps the longest prefix of the
guess that equals the model's own greedy choices, plus the model's token after it: with
``m`` guesses accepted, one forward pass yields ``m + 1`` tokens, the same ones greedy
decoding gives (up to the rounding of a k-row vs a one-row matrix product).

Two proposers:

- :func:`prompt_lookup` (prompt lookup decoding, A. Saxena 2023): find the most recent
  earlier occurrence of the last ``n`` tokens in the prompt + output so far, and propose
  the tokens that followed it. Free (no model); it pays off where the output copies its
  input (summaries, edits of code, quoting a passage, repetitive text).
- a small *draft model* of the same tokenizer decoding ``k`` tokens greedily
  (:class:`multimodal.generation` keeps its KV cache in step with the accepted tokens).

:func:`speculative_stats` reports the last speculative ``generate`` call of this thread:
tokens proposed, tokens accepted, forward passes of the model.
"""

from __future__ import annotations

import threading

from torch import Tensor

__all__ = ["METHODS", "DraftLength", "SpeculativeStats", "prompt_lookup", "speculative_stats"]

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
