"""``POST /v1/chat/completions`` for a chat decoder (a GGUF file such as SmolLM2-Instruct),
on LitServe's :class:`~litserve.specs.OpenAISpec` (request model, ``stream: true`` as
server-sent events, usage).

The conversation goes through the tokenizer's chat template (as :func:`multimodal.chat`),
then the decoder continues it up to its end-of-turn token or ``max_tokens`` (default 256,
and never past the context). ``temperature`` 0 is greedy decoding (then the reply equals
``mm.chat(model, messages)``); above 0 it samples with ``temperature`` and ``top_p``.

Streaming is real: :func:`multimodal.generation.generate` runs in a thread and its
``logits_processor`` hook, called once per step with the tokens so far, hands them to the
response, so each new piece of text is sent while the next token is computed. Text is sent
only up to its last complete character (a byte-level BPE can split one across tokens).

``multimodal serve --quantize int8 | int4`` loads the decoder packed (a GGUF file's 4-bit
blocks kept as they are); ``--compile`` decodes through the compiled one-token step, its
static cache sized as :func:`multimodal.chat` sizes it (a power of two), so the first turn
of each size compiles and the later ones reuse it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import litserve as ls
import torch
from fastapi import HTTPException
from litserve.specs import OpenAISpec

from multimodal.pipelines.chat import cache_bucket

DEFAULT_MAX_TOKENS = 256


def _messages(request: Any) -> list[dict[str, str]]:
    """The request's messages as ``{"role", "content"}`` with text content (text parts of
    a list joined); other parts are refused with a 400 naming the message."""
    out = []
    for i, message in enumerate(request.messages):
        content = message.content
        if isinstance(content, list):
            texts = []
            for part in content:
                if getattr(part, "type", None) != "text":
                    raise HTTPException(400, f"messages[{i}].content: this model reads text "
                                        f"only, got a {getattr(part, 'type', '?')} part")
                texts.append(part.text)
            content = "".join(texts)
        out.append({"role": message.role, "content": content or ""})
    if not out:
        raise HTTPException(400, "messages: the conversation is empty")
    return out


class ChatAPI(ls.LitAPI):
    """The inference worker: one conversation at a time, streamed (module docstring)."""

    def __init__(self, path: str, *, quantize: str | None = None, compile: bool = False) -> None:
        super().__init__(spec=OpenAISpec())
        self.path, self.quantize, self.compile = path, quantize, compile

    def setup(self, device: str) -> None:
        from multimodal.serve.models import load_served

        served = load_served(self.path, "chat", quantize=self.quantize)
        self.model = served.model.backbone.to(device).eval()
        self.tokenizer = served.tokenizer

    def predict(self, request: Any, context: dict[str, Any]) -> Iterator[dict[str, Any]]:
        messages = _messages(request)
        tok = self.tokenizer
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True)
        ids = tok.encode_many([prompt], truncation=False)[0]
        room = self.model.max_len - len(ids)
        limit = context.get("max_completion_tokens") or context.get("max_tokens")
        if limit is not None and limit < 1:
            raise HTTPException(400, f"max_tokens must be >= 1, got {limit}")
        if room < 1:
            raise HTTPException(400, f"messages: the conversation is {len(ids)} tokens, the "
                                f"model's context is {self.model.max_len}")
        max_new = min(limit or DEFAULT_MAX_TOKENS, room)
        temperature = float(context.get("temperature") or 0.0)
        top_p = context.get("top_p")
        sampling = {"do_sample": True, "temperature": temperature,
                    "top_p": top_p if top_p is not None and top_p < 1 else None} \
            if temperature > 0 else {}
        sent, n_new = "", 0
        for tokens, final in self._steps(ids, max_new, sampling):
            eos = tok.eos_token_id
            if eos is not None and eos in tokens:
                tokens = tokens[:tokens.index(eos)]
            n_new = len(tokens)
            # as mm.chat: the reply stripped; trailing spaces wait for what follows
            text = tok.decode(tokens, skip_special_tokens=True).strip()
            if not final and text.endswith("\ufffd"):
                continue  # a character still cut in two
            if len(text) > len(sent) and text.startswith(sent):
                yield {"role": "assistant", "content": text[len(sent):]}
                sent = text
        yield {"role": "assistant", "content": "", "prompt_tokens": len(ids),
               "completion_tokens": n_new, "total_tokens": len(ids) + n_new}

    def _steps(self, ids: list[int], max_new: int,
               sampling: dict[str, Any]) -> Iterator[tuple[list[int], bool]]:
        """(tokens generated so far, is this the end) while ``generate`` runs."""
        steps: queue.Queue[Any] = queue.Queue()
        start = len(ids)

        def hook(seq: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            steps.put(seq[0, start:].tolist())
            return scores

        compiled = {"compile": True, "cache_len": cache_bucket(len(ids) + max_new,
                                                                self.model.max_len)} \
            if self.compile else {}

        def work() -> None:
            try:
                with torch.no_grad():
                    out = self.model.generate(
                        torch.tensor([ids], device=next(self.model.parameters()).device),
                        max_new_tokens=max_new, eos_token_id=self.tokenizer.eos_token_id,
                        logits_processor=hook, **sampling, **compiled)
                steps.put(("done", out[0, start:].tolist()))
            except Exception as err:  # handed to the response
                steps.put(("error", err))

        threading.Thread(target=work, daemon=True).start()
        while True:
            item = steps.get()
            if isinstance(item, tuple):
                if item[0] == "error":
                    raise item[1]
                yield item[1], True
                return
            yield item, False
