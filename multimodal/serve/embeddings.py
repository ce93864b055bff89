"""``POST /v1/embeddings``: OpenAI's embeddings API over an :class:`~multimodal.hub.Encoder`,
with dynamic batching.

Request ``{"input": str | [str], "model"?: str, "encoding_format"?: "float" | "base64",
"dimensions"?: int (must equal the model's width), "truncate"?: bool}``. A text longer than
the model's context is refused with 413 naming ``input[i]`` unless ``"truncate": true``
(then it is cut to the context, as sentence-transformers does). ``base64`` is the vector as
little-endian float32 bytes (what the ``openai`` client decodes).

Batching (the response's ``X-Batch-Requests`` header says how many requests shared the
worker call): requests arriving within ``batch_timeout`` (up to ``max_batch_size`` requests)
become one worker call; their texts, sorted by length so that each forward pass pads
little, go through :meth:`Encoder.encode` ``chunk`` texts at a time, and each request gets
its own rows back. The encoder pools over each text's own tokens (padding masked), so a
text's embedding does not depend on what it was batched with (tested).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

import litserve as ls
import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from multimodal.serve.errors import ApiError
from multimodal.serve.spec import QueueSpec, read_json


@dataclass
class TextRules:
    """What the API process checks before a request is queued: the tokenizer (to count
    tokens), the context (``max_tokens``, special tokens included), the embedding width and
    the most texts one request may hold."""

    tokenizer: Any
    max_tokens: int
    dim: int
    bidirectional: bool = True
    max_inputs: int = 2048

    @classmethod
    def of(cls, encoder: Any, max_inputs: int = 2048) -> TextRules:
        if encoder.modality != "text" or encoder.tokenizer is None:
            raise ValueError(f"/v1/embeddings serves text encoders with a tokenizer; this "
                             f"model reads {encoder.modality}")
        config = encoder.backbone.config
        limit = int(config.max_len)
        if encoder.pooling is not None and encoder.pooling.max_length is not None:
            limit = min(limit, int(encoder.pooling.max_length))
        bidirectional = not config.backbone.causal
        return cls(encoder.tokenizer, limit, encoder.dim, bidirectional, max_inputs)

    def token_counts(self, texts: list[str]) -> list[int]:
        ids = self.tokenizer.encode_many(texts, add_cls=self.bidirectional,
                                         add_sep=self.bidirectional, truncation=False)
        return [len(row) for row in ids]


@dataclass
class EmbeddingJob:
    texts: list[str]
    encoding_format: str
    model: str | None
    tokens: int


def _what(value: Any) -> str:
    """A JSON value's type in words: 'a number', 'an object', 'null', ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {str: "a string", list: "a list", dict: "an object"}.get(type(value),
                                                                   type(value).__name__)


def parse_texts(body: Any, rules: TextRules) -> tuple[list[str], str | None, int]:
    """The fields every text endpoint shares: ``input`` (a string or a list of strings),
    ``model`` and ``truncate``; (texts, model, tokens), or an :class:`ApiError` naming the
    field."""
    if not isinstance(body, dict):
        raise ApiError(400, f"request body must be a JSON object, got {_what(body)}")
    if "input" not in body:
        raise ApiError(400, "missing required field 'input' (a string or a list of strings)",
                       "input", "missing_field")
    raw = body["input"]
    texts = [raw] if isinstance(raw, str) else raw
    if not isinstance(texts, list):
        raise ApiError(400, f"'input' must be a string or a list of strings, got "
                       f"{_what(raw)}", "input", "invalid_type")
    if not texts:
        raise ApiError(400, "'input' is an empty list", "input", "invalid_value")
    if len(texts) > rules.max_inputs:
        raise ApiError(400, f"'input' holds {len(texts)} texts, more than {rules.max_inputs} "
                       "in one request", "input", "too_many_inputs")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ApiError(400, f"input[{i}] is {_what(text)}, not a string (token "
                           "ids are not accepted: send text)", f"input[{i}]", "invalid_type")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, f"'model' must be a string, got {_what(model)}", "model",
                       "invalid_type")
    truncate = body.get("truncate", False)
    if not isinstance(truncate, bool):
        raise ApiError(400, f"'truncate' must be true or false, got {truncate!r}", "truncate",
                       "invalid_type")
    counts = rules.token_counts(texts)
    if not truncate:
        for i, n in enumerate(counts):
            if n > rules.max_tokens:
                raise ApiError(413, f"input[{i}] is {n} tokens, over the model's context of "
                               f"{rules.max_tokens}: shorten it or send \"truncate\": true",
                               f"input[{i}]", "input_too_long")
    return texts, model, sum(min(n, rules.max_tokens) for n in counts)


def parse_embeddings(body: Any, rules: TextRules) -> EmbeddingJob:
    """Check an embeddings request (module docstring); :class:`ApiError` naming the field."""
    texts, model, tokens = parse_texts(body, rules)
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise ApiError(400, f"'encoding_format' must be 'float' or 'base64', got {fmt!r}",
                       "encoding_format", "invalid_value")
    dims = body.get("dimensions")
    if dims is not None and (isinstance(dims, bool) or dims != rules.dim):
        raise ApiError(400, f"'dimensions' must be {rules.dim} (this model's width), got "
                       f"{dims!r}", "dimensions", "invalid_value")
    return EmbeddingJob(texts, fmt, model, tokens)


def embedding_payload(rows: np.ndarray, job: EmbeddingJob, model_name: str) -> dict[str, Any]:
    """The OpenAI response object for ``rows`` ``(N, D)``."""
    data = []
    for i, row in enumerate(rows):
        if job.encoding_format == "base64":
            value: Any = base64.b64encode(row.astype("<f4").tobytes()).decode("ascii")
        else:
            value = row.tolist()
        data.append({"object": "embedding", "index": i, "embedding": value})
    return {"object": "list", "data": data, "model": job.model or model_name,
            "usage": {"prompt_tokens": job.tokens, "total_tokens": job.tokens}}


class EmbeddingSpec(QueueSpec):
    """Registers ``POST /v1/embeddings``; checks requests in the API process."""

    def __init__(self, rules: TextRules, model_name: str) -> None:
        super().__init__("/v1/embeddings")
        self.rules = rules
        self.model_name = model_name
        self.add_endpoint(self.api_path, self.embeddings, ["POST"])

    def __getstate__(self) -> dict[str, Any]:  # the worker needs no tokenizer
        state = super().__getstate__()
        state["rules"] = None
        return state

    async def embeddings(self, request: Request) -> Response:
        job = parse_embeddings(await read_json(request), self.rules)
        rows, batched = await self.submit(job.texts)
        body = json.dumps(embedding_payload(rows, job, self.model_name))
        return Response(body, media_type="application/json",
                        headers={"X-Batch-Requests": str(batched)})


class EmbeddingAPI(ls.LitAPI):
    """The inference worker: loads the encoder once, embeds the texts of a batch of
    requests together (module docstring)."""

    def __init__(self, path: str, spec: EmbeddingSpec, *, max_batch_size: int = 32,
                 batch_timeout: float = 0.01, chunk: int = 64, compile: bool = False,
                 quantize: str | None = None) -> None:
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout,
                         spec=spec)
        self.path = path
        self.chunk = chunk
        self.compile = compile
        self.quantize = quantize

    def setup(self, device: str) -> None:
        from multimodal.serve.models import load_served

        served = load_served(self.path, "embed", compile=self.compile, quantize=self.quantize)
        self.encoder = served.model.to(device)

    def decode_request(self, request: Any, **kwargs: Any) -> Any:
        return request

    def batch(self, inputs: list[Any]) -> list[Any]:
        return list(inputs)

    def unbatch(self, output: list[Any]) -> list[Any]:
        return output

    def embed_texts(self, texts: list[str]) -> np.ndarray:
        """``(N, D)`` float32 embeddings of ``texts``, encoded shortest first."""
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        emb = self.encoder.encode([texts[i] for i in order], batch_size=self.chunk)
        out = np.empty((len(texts), emb.shape[-1]), dtype=np.float32)
        out[order] = emb.float().cpu().numpy()
        return out

    def predict(self, x: Any, **kwargs: Any) -> Any:
        """Per request: its rows and how many requests shared the batch (the response's
        ``X-Batch-Requests`` header)."""
        if x and isinstance(x[0], str):  # max_batch_size 1: one request's texts
            return self.embed_texts(x), 1
        rows = self.embed_texts([t for texts in x for t in texts])
        out, start = [], 0
        for texts in x:
            out.append((rows[start:start + len(texts)], len(x)))
            start += len(texts)
        return out

    def encode_response(self, output: Any, **kwargs: Any) -> Any:
        return output
