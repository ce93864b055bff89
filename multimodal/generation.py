"""One decoding loop for every decoder in the package (text, pixels, captions).

Strategies: greedy, sampling with temperature, top-k, top-p (nucleus), and beam search
with length normalisation; stopping at ``eos_token_id``; left-padded batches of prompts
of different lengths; a KV cache throughout (prefill the prompt once, then one token
per step).

A *decoder* here is any module with
``model(input_ids, attention_mask=..., cache=..., **model_kwargs) -> logits (B, N, V)``,
``model.make_cache(max_len)`` and ``model.max_len`` (:class:`multimodal.stepper.Decoder`,
fed one step at a time by :class:`multimodal.stepper.Stepper`: TextDecoder, ImageGPT, the
Captioner's decoder with ``memory=`` in ``model_kwargs``, the RNN decoder of
:mod:`multimodal.models.rnn`). The loop never looks inside the cache: it passes it back to
the model and calls ``cache.reorder(index)`` when beam search keeps some rows, so a
recurrent decoder's state (:class:`~multimodal.models.rnn.RecurrentState`) serves as well as
a :class:`~multimodal.nn.cache.KVCache`. Tensors in ``model_kwargs`` are batch-first: beam
search repeats and reorders them along dim 0.

Only the last position's logits are ever read. A decoder whose class sets
``logits_per_position`` (its ``forward`` is ``forward_head(forward_features(...))``
position by position: TextDecoder, ImageGPT, the RNN decoder) is called as
``forward_features`` on the prompt, then ``forward_head`` on the last row alone: the
vocabulary projection of the other prompt positions (a (N, dim) x (dim, V) product,
about a tenth of a SmolLM2 prompt's prefill) is not computed.

Speculative greedy decoding (``generate(..., speculative=...)``) is all in
:mod:`multimodal.speculative`: :func:`generate` checks its arguments and hands it the call.
"""

from __future__ import annotations

import shutil
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from multimodal.nn.cache import KVCache, StaticKVCache
from multimodal.nn.quantized import check_mode, quantized_copy
from multimodal.nn.step import static_step
from multimodal.speculative import check_speculative, speculative_greedy
from multimodal.stepper import Cache, Decoder, LogitsProcessor, Stepper

# --- logits processing ----------------------------------------------------------------

def check_sampling_args(temperature: float, top_k: int | None, top_p: float | None) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be an integer >= 1 (or None), got {top_k!r}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (or None), got {top_p}")


def process_logits(logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
                   top_p: float | None = None) -> Tensor:
    """Scale by ``1 / temperature``, then keep only the top-k tokens and the smallest set
    of most likely tokens whose probability reaches ``top_p``; the rest get ``-inf``.

    Nucleus: with tokens sorted by probability ``p_(1) >= p_(2) >= ...``, token (j) is
    kept iff ``sum_{i<j} p_(i) < top_p`` (so the most likely token is always kept).
    """
    check_sampling_args(temperature, top_k, top_p)
    return _process(logits, temperature, top_k, top_p)


def _process(logits: Tensor, temperature: float, top_k: int | None,
             top_p: float | None) -> Tensor:
    """:func:`process_logits` without the argument checks (the decoding loop checks once)."""
    if temperature != 1.0:  # x / 1.0 == x exactly: skip the copy
        logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # probability mass ranked above each token
        drop_sorted = before >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def next_token(logits: Tensor, do_sample: bool = False, temperature: float = 1.0,
               top_k: int | None = None, top_p: float | None = None,
               generator: torch.Generator | None = None) -> Tensor:
    """(B, V) logits -> (B,) token ids: argmax, or a sample from the processed logits."""
    if not do_sample:
        return logits.argmax(dim=-1)
    check_sampling_args(temperature, top_k, top_p)
    return _sample(logits, temperature, top_k, top_p, generator)


def _sample(logits: Tensor, temperature: float, top_k: int | None, top_p: float | None,
            generator: torch.Generator | None) -> Tensor:
    """:func:`next_token`'s sampling without the argument checks."""
    probs = _process(logits.float(), temperature, top_k, top_p).softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


# --- the compiled one-token step ----------------------------------------------------------

# Compilations of the static step since import, and the seconds of the calls that compiled
# (tracing + inductor + the first run): compile time, apart from steady-state speed.
_COMPILE_STATS = {"compilations": 0, "compile_seconds": 0.0}
_COMPILED: dict[str, Callable[..., Tensor]] = {}
#: threads of the compiled CPU step's generated (elementwise) kernels; -1: torch's
CPU_STEP_KERNEL_THREADS = 1


def compile_stats() -> dict[str, float]:
    """``{"compilations": n, "compile_seconds": s}``: how often the one-token step of
    ``generate(..., compile=True)`` was compiled since import (a second call with the same
    shapes adds none) and the wall seconds those compiling calls took."""
    return dict(_COMPILE_STATS)


def compile_unavailable(device: torch.device) -> str | None:
    """Why ``torch.compile`` cannot build the step on ``device`` (None: it can)."""
    if not torch._dynamo.is_dynamo_supported():
        return "torch.compile (dynamo) is not supported on this Python / platform"
    if device.type == "cpu" and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        return "no C++ compiler (g++) for inductor's CPU kernels"
    if device.type not in ("cpu", "cuda"):
        return f"no inductor backend for device {device.type!r}"
    return None


def _counting_backend(cudagraphs: bool) -> Callable[..., Any]:
    def backend(gm: torch.fx.GraphModule, example_inputs: list[Tensor]) -> Any:
        from torch._inductor.compile_fx import compile_fx

        _COMPILE_STATS["compilations"] += 1
        # CUDA: graphs (mode="reduce-overhead"); CPU: a C++ wrapper around the kernels
        # instead of Python (measured 15 % less CPU per ImageGPT step, slower to compile),
        # and the generated kernels serial: one token's norms and activations are a few
        # KB, less work than an OpenMP fork-join, which on a busy machine waits for the
        # other thread to be scheduled, at every kernel; the GEMMs and the attention
        # (ATen calls) still use every thread. (Serial kernels also keep a cached graph
        # compiled at one thread count correct to run at another.)
        patches = {"triton.cudagraphs": True} if cudagraphs else {
            "cpp_wrapper": True, "cpp.threads": CPU_STEP_KERNEL_THREADS}
        return compile_fx(gm, example_inputs, config_patches=patches)
    return backend


class _CompiledStep:
    """:func:`~multimodal.nn.step.static_step` through ``torch.compile`` (inductor; on
    CUDA with CUDA graphs, as ``mode="reduce-overhead"``). A call that compiles is timed
    into :func:`compile_stats`. If compiling fails, one warning and the eager step from
    then on (the same arithmetic, the same tokens)."""

    def __init__(self, device: torch.device) -> None:
        key = device.type
        if key not in _COMPILED:
            _COMPILED[key] = torch.compile(static_step, fullgraph=True,
                                           backend=_counting_backend(key == "cuda"))
        self.fn: Callable[..., Tensor] = _COMPILED[key]
        self.cuda = key == "cuda"
        self.marked = False

    def __call__(self, *args: Any) -> Tensor:
        if self.cuda and not self.marked:  # the cache buffers: static inputs of the graph
            for group in args[2:4]:
                for t in group:
                    torch._dynamo.mark_static_address(t)
            self.marked = True
        if args[6].shape[1] < args[2][0].shape[2]:
            # a prefix step: the attended length is the one symbolic size of the graph
            torch._dynamo.mark_dynamic(args[6], 1)
        before = _COMPILE_STATS["compilations"]
        start = time.perf_counter()
        try:
            with torch._dynamo.config.patch(automatic_dynamic_shapes=False):
                out = self.fn(*args)
        except Exception as err:  # a compiler failure of any kind (eager re-raises a real one)
            if _COMPILE_STATS["compilations"] == before and not _is_compile_error(err):
                raise
            warnings.warn(f"generate(compile=True): compiling the one-token step failed "
                          f"({type(err).__name__}: {str(err).splitlines()[0][:200]}); "
                          "decoding eagerly (the same tokens)", RuntimeWarning, stacklevel=2)
            self.fn = static_step
            return static_step(*args)
        if _COMPILE_STATS["compilations"] != before:
            _COMPILE_STATS["compile_seconds"] += time.perf_counter() - start
        return out


def _is_compile_error(err: Exception) -> bool:
    return type(err).__module__.startswith(("torch._dynamo", "torch._inductor"))


def _static_cache(cache: KVCache | Cache | None, compile_step: bool,
                  device: torch.device) -> KVCache | Cache | None:
    """``cache`` as a :class:`StaticKVCache` of the same size (with a compiled step if
    asked and possible; one warning and eager decoding where not)."""
    if not isinstance(cache, KVCache):
        if compile_step:
            warnings.warn("generate(compile=True): this decoder has no KV cache of "
                          "transformer blocks (a static cache needs one); decoding eagerly",
                          RuntimeWarning, stacklevel=4)
        return cache
    if compile_step:
        reason = compile_unavailable(device)
        if reason is not None:
            warnings.warn(f"generate(compile=True): {reason}; decoding eagerly (the same "
                          "tokens)", RuntimeWarning, stacklevel=4)
            return cache
    # CUDA graphs replay fixed shapes: attend over every slot there; elsewhere the prefix
    static = StaticKVCache(len(cache), cache.max_len,
                           prefix=not (compile_step and device.type == "cuda"))
    if compile_step:
        static.step_fn = _CompiledStep(device)
    return static


def _stepper(model: Decoder, use_cache: bool, max_len: int, model_kwargs: dict[str, Any],
             static: bool = False, compile_step: bool = False,
             device: torch.device | None = None) -> Stepper:
    """A :class:`~multimodal.stepper.Stepper` on ``model``'s cache of ``max_len`` positions
    (none without ``use_cache``; a static one, its step compiled or eager, with ``static``)."""
    cache = model.make_cache(max_len) if use_cache else None
    if static and use_cache:
        cache = _static_cache(cache, compile_step, device or torch.device("cpu"))
    return Stepper(model, cache, model_kwargs)


# --- public entry point ---------------------------------------------------------------


@torch.no_grad()
def generate(
    model: Decoder,
    input_ids: Tensor,
    max_new_tokens: int = 20,
    *,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    num_beams: int = 1,
    length_penalty: float = 1.0,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
    attention_mask: Tensor | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
    logits_processor: LogitsProcessor | None = None,
    early_stopping: bool | str = "never",
    compile: bool = False,
    static_cache: bool | None = None,
    cache_len: int | None = None,
    quantize: str | None = None,
    speculative: str | None = None,
    draft_model: Decoder | None = None,
    num_draft_tokens: int = 8,
    ngram: int = 3,
    **model_kwargs: Any,
) -> Tensor:
    """Continue ``input_ids`` (B, N) by up to ``max_new_tokens`` tokens; returns (B, N + T).

    - greedy (default), or ``do_sample=True`` with ``temperature``, ``top_k``, ``top_p``;
    - ``num_beams > 1``: beam search; a finished hypothesis of T generated tokens
      (its EOS included) and log-probability S scores ``S / T ** length_penalty``; a
      row stops (``early_stopping``, transformers' meaning) once it holds ``num_beams``
      finished hypotheses and: ``True`` at once; ``"never"`` (default) when no running
      beam can still beat them (its score over the longest length it could reach);
      ``False`` when the best running beam's score over its *current* length cannot;
    - after ``eos_token_id`` a sequence is filled with ``pad_token_id`` (default: EOS);
    - prompts of different lengths: left-pad them and pass ``attention_mask`` (1 = token);
    - ``logits_processor(ids (B, N), scores (B, V)) -> scores``: the model's own rules on
      the next token (e.g. Whisper's suppressed tokens), applied to the logits before
      greedy / sampling and to the log-probabilities in beam search (as transformers
      does: tokens it removes are not renormalised away);
    ``model_kwargs`` go to every model call (e.g. ``memory=`` for a cross-attending decoder).

    Static-cache decoding (the gpt-fast recipe): ``compile=True`` preallocates a
    :class:`~multimodal.nn.cache.StaticKVCache` of ``cache_len`` positions (default
    ``prompt + max_new_tokens``), prefills the prompt eagerly, then runs every one-token
    step through one fixed-shape function compiled with ``torch.compile`` (inductor; CUDA
    graphs on a GPU): compiled once per shape, replayed after (:func:`compile_stats`
    counts compilations and their seconds). Same tokens as eager decoding for the same
    seed. Where compilation is unavailable (no C++ compiler, no dynamo, a decoder without
    a transformer KV cache) one ``RuntimeWarning`` and eager decoding. ``static_cache=True``
    without ``compile``: the same fixed-shape step, eager (default: ``compile``).
    A fixed ``cache_len`` keeps the shapes, hence the compiled step, across prompts of
    different lengths.

    Weight-only quantised decoding (CPU): ``quantize="int8"`` (one scale per output
    channel) or ``"int4"`` (groups of 32 inputs, a scale and a zero point each) decodes
    with a copy of ``model`` whose ``nn.Linear`` layers hold packed weights multiplied by
    PyTorch's packed kernels (:mod:`multimodal.nn.quantized`; activations bf16 inside the
    kernel, fp32 between layers). The copy shares every other tensor with ``model`` and is
    kept for the next call while the weights are unchanged; ``model`` is untouched.

    Speculative greedy decoding (batch 1, KV cache, eager; :mod:`multimodal.speculative`):
    each step proposes up to ``num_draft_tokens`` tokens, runs the model once over them,
    keeps the longest proposed prefix equal to the model's argmax plus the model's token
    after it, and rolls the KV cache back over the rest (:meth:`KVCache.crop`): the tokens
    of greedy decoding, several per forward pass when the guesses are right.
    ``speculative="prompt_lookup"``: the guess is what followed the most recent earlier
    occurrence of the last ``ngram`` (down to 1) tokens in the prompt + output (no second
    model; pays off when the output copies the input: summaries, quotes, code edits).
    ``speculative="draft"``: ``draft_model`` (same tokenizer, much smaller; it gets the same
    ``model_kwargs`` and ``quantize``) decodes the guess greedily. Prompt lookup verifies
    fewer than ``num_draft_tokens`` (none) where recent guesses failed: the count with the
    most expected tokens per measured cost (:class:`multimodal.speculative.DraftLength`).
    :func:`multimodal.speculative.speculative_stats` counts what was accepted.
    """
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
        raise ValueError("input_ids must be a (batch, tokens) integer tensor, got "
                         f"{getattr(input_ids, 'shape', type(input_ids).__name__)}")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids is empty: give at least one token (e.g. a BOS token)")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if num_beams < 1:
        raise ValueError(f"num_beams must be >= 1, got {num_beams}")
    if early_stopping not in (True, False, "never"):
        raise ValueError(f"early_stopping must be True, False or 'never', got {early_stopping!r}")
    check_sampling_args(temperature, top_k, top_p)
    if quantize is not None:
        check_mode(quantize)
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"quantize={quantize!r} needs a torch.nn.Module decoder, got "
                             f"{type(model).__name__}")
    total = input_ids.shape[1] + max_new_tokens
    if total > model.max_len:
        raise ValueError(f"prompt of {input_ids.shape[1]} tokens + max_new_tokens="
                         f"{max_new_tokens} exceeds the model's context of {model.max_len}")
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask must match input_ids {tuple(input_ids.shape)}, got "
                         f"{tuple(attention_mask.shape)}")
    if attention_mask is not None and not bool(attention_mask[:, -1].all()):
        raise ValueError("prompts must be left-padded: the last column of attention_mask "
                         "must be all ones")
    static = compile if static_cache is None else static_cache
    if cache_len is not None:
        if not static or not use_cache:
            raise ValueError("cache_len sizes the static KV cache: use it with compile=True "
                             "or static_cache=True (and use_cache=True)")
        if total > cache_len:
            raise ValueError(f"prompt of {input_ids.shape[1]} tokens + max_new_tokens="
                             f"{max_new_tokens} = {total} positions do not fit the static "
                             f"KV cache of cache_len={cache_len}")
    pad = pad_token_id if pad_token_id is not None else (eos_token_id or 0)
    if speculative is not None or draft_model is not None:
        attention_mask = check_speculative(
            model, input_ids, attention_mask, speculative, draft_model, num_draft_tokens,
            ngram, do_sample, num_beams, use_cache, static, compile)
    if max_new_tokens == 0:
        return input_ids
    cache_kw = dict(static=static, compile_step=compile, device=input_ids.device,
                    cache_len=cache_len or total)
    if quantize is not None:
        model = quantized_copy(model, quantize)  # type: ignore[arg-type]
        if draft_model is not None:
            draft_model = quantized_copy(draft_model, quantize)  # type: ignore[arg-type]
    was_training = getattr(model, "training", False)
    if was_training:
        model.eval()
    draft_training = draft_model is not None and getattr(draft_model, "training", False)
    if draft_training:
        draft_model.eval()  # type: ignore[union-attr]
    try:
        if speculative is not None:
            return speculative_greedy(model, input_ids, max_new_tokens, eos_token_id,
                                      model_kwargs, logits_processor, speculative,
                                      draft_model, num_draft_tokens, ngram)
        if num_beams > 1:
            if do_sample:
                raise ValueError("beam search is deterministic: use do_sample=False with "
                                 "num_beams > 1")
            return _beam_search(model, input_ids, attention_mask, max_new_tokens, num_beams,
                                length_penalty, eos_token_id, pad, use_cache, model_kwargs,
                                logits_processor, early_stopping, cache_kw)
        return _greedy_or_sample(model, input_ids, attention_mask, max_new_tokens, do_sample,
                                 temperature, top_k, top_p, eos_token_id, pad, generator,
                                 use_cache, model_kwargs, logits_processor, cache_kw)
    finally:
        if was_training:
            model.train()
        if draft_training:
            draft_model.train()  # type: ignore[union-attr]


def _greedy_or_sample(model: Decoder, ids: Tensor, mask: Tensor | None, max_new_tokens: int,
                      do_sample: bool, temperature: float, top_k: int | None,
                      top_p: float | None, eos: int | None, pad: int,
                      generator: torch.Generator | None, use_cache: bool,
                      model_kwargs: dict[str, Any],
                      logits_processor: LogitsProcessor | None = None,
                      cache_kw: dict[str, Any] | None = None) -> Tensor:
    # One (B, prompt + max_new_tokens) buffer for the ids (and the mask), written one
    # column per step: no concatenation (a new allocation and a copy) per token.
    batch, start = ids.shape
    total = start + max_new_tokens
    out = ids.new_empty(batch, total)
    out[:, :start] = ids
    full_mask = None
    if mask is not None:
        full_mask = mask.new_ones(batch, total)
        full_mask[:, :start] = mask
    cache_kw = dict(cache_kw or {})
    step = _stepper(model, use_cache, cache_kw.pop("cache_len", total), dict(model_kwargs),
                    **cache_kw)
    finished = torch.zeros(batch, dtype=torch.bool, device=ids.device)
    new = ids
    end = start
    for _ in range(max_new_tokens):
        logits = step(new, out[:, :end], None if full_mask is None else full_mask[:, :end])
        if logits_processor is not None:
            logits = logits_processor(out[:, :end], logits)
        if do_sample:
            token = _sample(logits, temperature, top_k, top_p, generator)
        else:
            token = logits.argmax(dim=-1)
        if eos is not None:
            token = token.masked_fill(finished, pad)
            finished |= token == eos
        out[:, end] = token
        new = out[:, end : end + 1]
        end += 1
        if eos is not None and bool(finished.all()):
            break
    return out[:, :end]


def _beam_search(model: Decoder, input_ids: Tensor, mask: Tensor | None, max_new_tokens: int,
                 num_beams: int, length_penalty: float, eos: int | None, pad: int,
                 use_cache: bool, model_kwargs: dict[str, Any],
                 logits_processor: LogitsProcessor | None = None,
                 early_stopping: bool | str = "never",
                 cache_kw: dict[str, Any] | None = None) -> Tensor:
    """Beam search: keep the ``num_beams`` best partial sequences (by summed
    log-probability); a batch row stops once it holds ``num_beams`` finished hypotheses
    that no running beam can beat under the length penalty."""
    batch, prompt_len = input_ids.shape
    k = num_beams
    expand = torch.arange(batch, device=input_ids.device).repeat_interleave(k)
    ids = input_ids.index_select(0, expand)
    mask = mask.index_select(0, expand) if mask is not None else None
    cache_kw = dict(cache_kw or {})
    step = _stepper(model, use_cache, cache_kw.pop("cache_len", prompt_len + max_new_tokens),
                    dict(model_kwargs), **cache_kw)
    for key, value in step.kwargs.items():
        if isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] == batch:
            step.kwargs[key] = value.index_select(0, expand)
    scores = torch.zeros(batch, k, device=ids.device)
    scores[:, 1:] = float("-inf")  # all beams start identical: expand only the first
    scores = scores.view(-1)
    finished: list[list[tuple[float, Tensor]]] = [[] for _ in range(batch)]
    done = [False] * batch
    new = ids
    offsets = torch.arange(batch, device=ids.device)[:, None] * k
    for t in range(max_new_tokens):
        logp = F.log_softmax(step(new, ids, mask).float(), dim=-1)
        if logits_processor is not None:
            logp = logits_processor(ids, logp)
        vocab = logp.shape[-1]
        cand = (scores[:, None] + logp).view(batch, k * vocab)
        top_scores, top_idx = cand.topk(min(2 * k, k * vocab), dim=1)
        parents = torch.zeros(batch, k, dtype=torch.long, device=ids.device)
        tokens = torch.full((batch, k), pad, dtype=torch.long, device=ids.device)
        new_scores = torch.zeros(batch, k, device=ids.device)
        for b in range(batch):
            if done[b]:
                parents[b] = torch.arange(k)
                continue
            j = 0
            for rank, (s, idx) in enumerate(
                    zip(top_scores[b].tolist(), top_idx[b].tolist(), strict=True)):
                parent, token = divmod(idx, vocab)
                if eos is not None and token == eos:
                    if rank < k and s > float("-inf"):
                        hyp = torch.cat([ids[b * k + parent, prompt_len:],
                                         ids.new_tensor([eos])])
                        finished[b].append((s / (t + 1) ** length_penalty, hyp))
                    continue
                parents[b, j], tokens[b, j], new_scores[b, j] = parent, token, s
                j += 1
                if j == k:
                    break
            finished[b] = sorted(finished[b], key=lambda h: -h[0])[:k]
            if len(finished[b]) == k:
                # best a running beam can still reach: its sum only falls, its length grows
                best = float(new_scores[b, 0])
                if early_stopping == "never":
                    longest = max_new_tokens if length_penalty > 0 else t + 2
                else:  # False: transformers' heuristic, the current length
                    longest = t + 1
                done[b] = early_stopping is True or \
                    finished[b][-1][0] >= best / longest ** length_penalty
        flat = (offsets + parents).view(-1)
        ids = torch.cat([ids.index_select(0, flat), tokens.view(-1, 1)], dim=1)
        if mask is not None:
            mask = torch.cat([mask.index_select(0, flat), mask.new_ones(len(flat), 1)], dim=1)
        step.reorder(flat)
        scores = new_scores.view(-1)
        new = tokens.view(-1, 1)
        if all(done):
            break
    gen_len = ids.shape[1] - prompt_len
    best_hyps = []
    for b in range(batch):
        if not done[b]:
            for j in range(k):
                s = float(scores[b * k + j])
                if s > float("-inf"):
                    finished[b].append((s / gen_len ** length_penalty,
                                        ids[b * k + j, prompt_len:]))
        best_hyps.append(max(finished[b], key=lambda h: h[0])[1])
    width = max(len(h) for h in best_hyps)
    out = input_ids.new_full((batch, prompt_len + width), pad)
    out[:, :prompt_len] = input_ids
    for b, hyp in enumerate(best_hyps):
        out[b, prompt_len : prompt_len + len(hyp)] = hyp
    return out
