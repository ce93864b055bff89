"""``mm.chat``: one chat turn with an instruction-tuned decoder: the conversation rendered by the
tokenizer's chat template, the model's reply decoded greedily (or sampled) until its
end-of-turn token.

>>> mm.chat("SmolLM2-135M-Instruct.Q4_1.gguf", "What is the capital of France?")
'The capital of France is Paris.'
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["cache_bucket", "chat"]


def cache_bucket(positions: int, max_len: int, smallest: int = 256) -> int:
    """The static cache size for ``positions``: the next power of two >= ``positions`` (and
    >= ``smallest``), capped at ``max_len``; a compiled step is compiled once per size."""
    size = max(smallest, 1 << max(0, positions - 1).bit_length())
    return min(size, max_len)


def chat(model: Any, messages: str | Sequence[Mapping[str, Any]], tokenizer: Any = None, *,
         max_new_tokens: int = 256, **generate_kwargs: Any) -> str:
    """The assistant's reply to ``messages``.

    ``model``: a model path (a GGUF file, a folder with ``tokenizer.json``: the model and
    tokenizer of :func:`multimodal.load`), a :class:`~multimodal.loading.Loaded`, a decoder
    with ``generate`` (a :class:`~multimodal.TextDecoder`), or an
    :class:`~multimodal.encoder.Encoder` from :func:`~multimodal.load_encoder`; the
    tokenizer that came with it is used when ``tokenizer`` is not given. ``messages``:
    ``[{"role": "user", "content": "..."}, ...]`` or one user message as a string. The prompt is
    ``tokenizer.apply_chat_template(messages, add_generation_prompt=True)`` (the template
    adds any system prompt it was trained with); decoding stops at the tokenizer's EOS
    token (the end of the assistant's turn) or after ``max_new_tokens``;
    ``generate_kwargs`` go to ``generate`` (``do_sample``, ``temperature``, ...).

    ``compile=True`` (the compiled one-token step; with a packed GGUF model the fastest CPU
    decoding, BENCHMARKS.md): the static KV cache is sized to the next power of two (at least
    256 positions, at most the model's context) above prompt + ``max_new_tokens``, so turns of
    different lengths share one compiled step instead of compiling one each; ``cache_len``
    sets it instead."""
    from multimodal.loading import Loaded, load

    if isinstance(model, (str, os.PathLike)):
        model = load(model)
    if tokenizer is None:
        tokenizer = getattr(model, "tokenizer", None)
    model = model.model if isinstance(model, Loaded) else getattr(model, "backbone", model)
    if tokenizer is None or not hasattr(tokenizer, "apply_chat_template"):
        raise ValueError("chat needs a tokenizer with a chat template (an HFTokenizer read "
                         "with the model, e.g. from load_encoder(path) of a GGUF file)")
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    ids = tokenizer.encode_many([prompt], truncation=False)[0]
    if len(ids) + max_new_tokens > model.max_len:
        raise ValueError(f"the conversation is {len(ids)} tokens; with max_new_tokens="
                         f"{max_new_tokens} it exceeds the model's context of {model.max_len}")
    eos = tokenizer.eos_token_id
    generate_kwargs.setdefault("eos_token_id", eos)
    if generate_kwargs.get("compile") and generate_kwargs.get("cache_len") is None:
        generate_kwargs["cache_len"] = cache_bucket(len(ids) + max_new_tokens, model.max_len)
    device = next(model.parameters()).device
    with torch.no_grad():
        out = model.generate(torch.tensor([ids], device=device), max_new_tokens=max_new_tokens,
                             **generate_kwargs)
    reply = out[0, len(ids):].tolist()
    if eos is not None and eos in reply:
        reply = reply[:reply.index(eos)]
    return tokenizer.decode(reply, skip_special_tokens=True).strip()
