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

Answers as OpenAI's: ``finish_reason`` is ``"length"`` when the reply was cut at
``max_tokens`` (or at the model's context) and ``"stop"`` when the model ended its turn,
streamed and not; ``model`` is the request's, or the served name when it names none; every
refusal is a 400 with its ``param`` and ``code`` (:mod:`multimodal.serve.errors`).
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import litserve as ls
import torch
from fastapi import BackgroundTasks
from litserve.specs import OpenAISpec
from litserve.specs.openai import ChatCompletionRequest

from multimodal.pipelines.chat import cache_bucket
from multimodal.serve.errors import ApiError

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
                    raise ApiError(400, f"messages[{i}].content: this model reads text "
                                   f"only, got a {getattr(part, 'type', '?')} part",
                                   f"messages[{i}].content", "unsupported_input")
                texts.append(part.text)
            content = "".join(texts)
        out.append({"role": message.role, "content": content or ""})
    if not out:
        raise ApiError(400, "messages: the conversation is empty", "messages", "invalid_value")
    return out


class _Watched:
    """One choice's stream of ``(response, status)`` from the worker, passed on unchanged,
    noting the ``finish_reason`` the worker's last message carries."""

    def __init__(self, pipe: Any) -> None:
        self.pipe = pipe
        self.finish = "stop"

    async def __aiter__(self) -> AsyncIterator[Any]:
        async for response, status in self.pipe:
            if isinstance(response, str) and '"finish_reason"' in response:
                with contextlib.suppress(json.JSONDecodeError):
                    self.finish = json.loads(response).get("finish_reason") or self.finish
            yield response, status


class ChatSpec(OpenAISpec):
    """LitServe's OpenAI chat spec, answering as OpenAI does where it does not: the served
    name as ``model`` when the request gives none, ``finish_reason`` from the decoding
    (``"length"`` when cut at ``max_tokens``) instead of always ``"stop"``."""

    def __init__(self, model_name: str = "") -> None:
        super().__init__()
        self.model_name = model_name

    async def chat_completion(self, request: ChatCompletionRequest,
                              background_tasks: BackgroundTasks) -> Any:
        # what can be checked without the tokenizer is refused here, as a 400 even when
        # streaming (an error raised in the worker after the 200 of a stream is an event)
        _messages(request)
        for name in ("max_tokens", "max_completion_tokens"):
            limit = getattr(request, name)
            if limit is not None and limit < 1:
                raise ApiError(400, f"{name} must be >= 1, got {limit}", name, "invalid_value")
        request.model = request.model or self.model_name
        return await super().chat_completion(request, background_tasks)

    async def get_from_queues(self, uids: Any) -> list[Any]:
        return [_Watched(pipe) for pipe in await super().get_from_queues(uids)]

    async def non_streaming_completion(self, request: ChatCompletionRequest,
                                       generator_list: list[Any]) -> Any:
        response = await super().non_streaming_completion(request, generator_list)
        for choice, pipe in zip(response.choices, generator_list, strict=True):
            choice.finish_reason = pipe.finish
        return response

    async def streaming_completion(self, request: ChatCompletionRequest,
                                   pipe_responses: list[Any]) -> AsyncIterator[str]:
        async for event in super().streaming_completion(request, pipe_responses):
            if event.startswith("data: {") and '"finish_reason":"stop"' in event:
                chunk = json.loads(event[len("data: "):])
                for choice in chunk.get("choices", []):
                    if choice.get("finish_reason") == "stop":
                        choice["finish_reason"] = pipe_responses[choice["index"]].finish
                event = f"data: {json.dumps(chunk)}\n\n"
            yield event


class ChatAPI(ls.LitAPI):
    """The inference worker: one conversation at a time, streamed (module docstring)."""

    def __init__(self, path: str, *, quantize: str | None = None, compile: bool = False,
                 model_name: str = "") -> None:
        super().__init__(spec=ChatSpec(model_name))
        self.path, self.quantize, self.compile = path, quantize, compile

    def setup(self, device: str) -> None:
        from multimodal.pipelines._loaders import served

        encoder, self.tokenizer = served(self.path, "chat", quantize=self.quantize)
        self.model = encoder.backbone.to(device).eval()

    def predict(self, request: Any, context: dict[str, Any]) -> Iterator[dict[str, Any]]:
        try:
            yield from self._reply(request, context)
        except ApiError as err:  # param and code kept across the process boundary
            raise err.portable() from None

    def _reply(self, request: Any, context: dict[str, Any]) -> Iterator[dict[str, Any]]:
        messages = _messages(request)
        tok = self.tokenizer
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True)
        ids = tok.encode_many([prompt], truncation=False)[0]
        room = self.model.max_len - len(ids)
        limit = context.get("max_completion_tokens") or context.get("max_tokens")
        if limit is not None and limit < 1:
            raise ApiError(400, f"max_tokens must be >= 1, got {limit}", "max_tokens",
                           "invalid_value")
        if room < 1:
            raise ApiError(400, f"messages: the conversation is {len(ids)} tokens, the "
                           f"model's context is {self.model.max_len}", "messages",
                           "context_length_exceeded")
        max_new = min(limit or DEFAULT_MAX_TOKENS, room)
        temperature = float(context.get("temperature") or 0.0)
        top_p = context.get("top_p")
        sampling = {"do_sample": True, "temperature": temperature,
                    "top_p": top_p if top_p is not None and top_p < 1 else None} \
            if temperature > 0 else {}
        sent, n_new, ended = "", 0, False
        for tokens, final in self._steps(ids, max_new, sampling):
            eos = tok.eos_token_id
            if eos is not None and eos in tokens:
                tokens = tokens[:tokens.index(eos)]
                ended = True
            n_new = len(tokens)
            # as mm.chat: the reply stripped; trailing spaces wait for what follows
            text = tok.decode(tokens, skip_special_tokens=True).strip()
            if not final and text.endswith("\ufffd"):
                continue  # a character still cut in two
            if len(text) > len(sent) and text.startswith(sent):
                yield {"role": "assistant", "content": text[len(sent):]}
                sent = text
        # OpenAI's rule: "length" when the reply was cut by the token limit (or the context)
        finish = "stop" if ended or n_new < max_new else "length"
        yield {"role": "assistant", "content": "", "prompt_tokens": len(ids),
               "completion_tokens": n_new, "total_tokens": len(ids) + n_new,
               "finish_reason": finish}

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
