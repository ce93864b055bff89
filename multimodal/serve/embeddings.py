"""``POST /v1/embeddings``: OpenAI's embeddings API over an :class:`~multimodal.encoder.Encoder`,
with dynamic batching.

Request ``{"input": str | [item], "model"?: str, "encoding_format"?: "float" | "base64",
"dimensions"?: int (must equal the model's width), "truncate"?: bool}``. An item is a text
(text and CLIP-style encoders), an image (image and CLIP-style encoders) as a data URL
``"data:image/png;base64,..."`` or ``{"type": "image_url", "image_url": {"url": DATA_URL}}``,
or a clip (audio encoders) as ``"data:audio/wav;base64,..."`` or ``{"type": "input_audio",
"input_audio": {"data": BASE64, "format": "wav"}}``; the server fetches nothing, so an
``http`` URL is refused. Images and clips are decoded in the API process (an unreadable one
is a 400 naming ``input[i]``). An empty string is a 400, as OpenAI's. A text longer than
the model's context is refused with 400 (code ``input_too_long``) naming ``input[i]`` unless
``"truncate": true`` (then it is cut to the context, as sentence-transformers and
text-embeddings-inference do); a body over ``--max_request_mb`` is a 413 (the middleware).
``base64`` is the vector as little-endian float32 bytes (what the ``openai`` client
decodes).

Batching (the response's ``X-Batch-Requests`` header says how many requests shared the
worker call): requests arriving within ``batch_timeout`` (up to ``max_batch_size`` requests)
become one worker call; their texts, sorted by length so that each forward pass pads
little, go through :meth:`Encoder.encode` ``chunk`` texts at a time (images and clips
likewise, by kind), and each request gets its own rows back. The encoder pools over each
text's own tokens (padding masked), so a text's embedding does not depend on what it was
batched with (tested).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from multimodal.serve.errors import ApiError
from multimodal.serve.spec import CheckedRequestsAPI, QueueSpec, read_json


@dataclass
class TextRules:
    """What the API process checks before a request is queued: what the model reads
    (``modality``), the tokenizer (to count tokens), the context (``max_tokens``, special
    tokens included), the embedding width, the most inputs one request may hold, the
    image ``channels`` the model's preprocessing reads (3 RGB, 1 grey) and whether it has an
    image preprocessing at all (``images``: a CLIP saved without one embeds texts only)."""

    tokenizer: Any
    max_tokens: int
    dim: int
    bidirectional: bool = True
    max_inputs: int = 2048
    modality: str = "text"
    specials: dict[str, bool] | None = None
    channels: int = 3
    images: bool = True

    @classmethod
    def of(cls, encoder: Any, max_inputs: int = 2048) -> TextRules:
        modality = encoder.modality
        config = encoder.backbone.config
        channels = int(getattr(encoder.preprocessor, "channels", 3))
        images = encoder.preprocessor is not None
        if modality == "image" and not images:
            raise ValueError("this image encoder has no image preprocessing (no "
                             "preprocessor_config.json beside it): images cannot be served")
        if modality in ("image", "audio"):
            return cls(None, 0, encoder.dim, True, max_inputs, modality, channels=channels)
        if encoder.tokenizer is None:
            raise ValueError("this encoder has no tokenizer: texts cannot be embedded")
        if modality == "image+text":  # as Encoder._tokenize adds them
            pool = config.text_pool
            specials = {"add_cls": pool == "cls", "add_eos": pool in ("eot", "mean")}
            return cls(encoder.tokenizer, int(config.text.max_len), encoder.dim, True,
                       max_inputs, modality, specials, channels, images)
        limit = int(config.max_len)
        if encoder.pooling is not None and encoder.pooling.max_length is not None:
            limit = min(limit, int(encoder.pooling.max_length))
        bidirectional = not config.backbone.causal
        return cls(encoder.tokenizer, limit, encoder.dim, bidirectional, max_inputs)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds of input the model embeds."""
        if self.modality == "image+text":
            return ("image", "text") if self.images else ("text",)
        return (self.modality,)

    def token_counts(self, texts: list[str]) -> list[int]:
        if not texts:
            return []
        specials = self.specials if self.specials is not None else \
            {"add_cls": self.bidirectional, "add_sep": self.bidirectional}
        ids = self.tokenizer.encode_many(texts, truncation=False, **specials)
        return [len(row) for row in ids]


@dataclass
class EmbeddingJob:
    texts: list[Any]  # a text (str), ("image", uint8 HWC array), ("audio", wave, rate)
    encoding_format: str
    model: str | None
    tokens: int


def json_type(value: Any) -> str:
    """A JSON value's type in words: 'a number', 'an object', 'null', ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {str: "a string", list: "a list", dict: "an object"}.get(type(value),
                                                                   type(value).__name__)


def _data_url(url: str, i: int) -> tuple[str, bytes]:
    """(media type, bytes) of a base64 data URL; a 400 naming ``input[i]`` otherwise."""
    if not url.startswith("data:"):
        raise ApiError(400, f"input[{i}] is a URL: the server fetches nothing, send the file "
                       "as a data URL (data:image/png;base64,...)", f"input[{i}]",
                       "invalid_value")
    head, _, data = url[5:].partition(",")
    media, _, encoding = head.partition(";")
    if encoding != "base64" or not data:
        raise ApiError(400, f"input[{i}] is not a base64 data URL", f"input[{i}]",
                       "invalid_value")
    try:
        return media.lower(), base64.b64decode(data, validate=True)
    except ValueError:
        raise ApiError(400, f"input[{i}] holds invalid base64", f"input[{i}]",
                       "invalid_value") from None


def _image(data: bytes, i: int, channels: int = 3) -> tuple[str, np.ndarray]:
    """("image", uint8 ``(H, W, channels)``), read by the reader of the offline loop and of
    training (:func:`multimodal.files.read_image`: RGB, or grey for a model of one
    channel)."""
    from multimodal.files import read_image

    try:
        pixels = read_image(data, channels, f"input[{i}]").permute(1, 2, 0).numpy()
    except Exception as err:  # CorruptFileError; PIL's DecompressionBombError among others
        text = str(err) if str(err).startswith(f"input[{i}]: ") else \
            f"input[{i}]: not a readable image ({err})"
        raise ApiError(400, text, f"input[{i}]", "invalid_image") from None
    return ("image", pixels)


def _audio(data: bytes, i: int) -> tuple[str, np.ndarray, int]:
    import io

    import soundfile as sf

    try:
        wave, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except Exception as err:  # soundfile's own error types
        raise ApiError(400, f"input[{i}] is not readable audio: {err}", f"input[{i}]",
                       "invalid_audio") from None
    if wave.shape[0] == 0 or not np.isfinite(wave).all():
        raise ApiError(400, f"input[{i}] is empty or has NaN samples", f"input[{i}]",
                       "invalid_audio")
    return ("audio", np.ascontiguousarray(wave.mean(axis=1)), int(rate))


def _item(value: Any, i: int, rules: TextRules) -> Any:
    """One input as the worker takes it (:class:`EmbeddingJob`), checked against what the
    model reads."""
    if value == "" or (isinstance(value, dict) and value.get("type") == "text"
                       and value.get("text") == ""):
        raise ApiError(400, f"input[{i}] is an empty string: there is nothing to embed",
                       f"input[{i}]", "invalid_value")
    if isinstance(value, str) and not value.startswith("data:"):
        kind, item = "text", value
    elif isinstance(value, str):
        media, data = _data_url(value, i)
        if media.startswith("image/"):
            kind, item = "image", _image(data, i, rules.channels)
        elif media.startswith("audio/"):
            kind, item = "audio", _audio(data, i)
        else:
            raise ApiError(400, f"input[{i}] is a data URL of {media or 'no type'}: send "
                           "image/* or audio/*", f"input[{i}]", "invalid_value")
    elif isinstance(value, dict) and ("image_url" in value or value.get("type") == "image_url"):
        url = value.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        if not isinstance(url, str):
            raise ApiError(400, f"input[{i}].image_url must hold a data URL string",
                           f"input[{i}]", "invalid_type")
        kind, item = "image", _image(_data_url(url, i)[1], i, rules.channels)
    elif isinstance(value, dict) and ("input_audio" in value
                                      or value.get("type") == "input_audio"):
        audio = value.get("input_audio")
        data = audio.get("data") if isinstance(audio, dict) else None
        if not isinstance(data, str):
            raise ApiError(400, f"input[{i}].input_audio.data must be base64 audio",
                           f"input[{i}]", "invalid_type")
        try:
            raw = base64.b64decode(data, validate=True)
        except ValueError:
            raise ApiError(400, f"input[{i}] holds invalid base64", f"input[{i}]",
                           "invalid_value") from None
        kind, item = "audio", _audio(raw, i)
    elif isinstance(value, dict) and value.get("type") == "text" \
            and isinstance(value.get("text"), str):
        kind, item = "text", value["text"]
    else:
        raise ApiError(400, f"input[{i}] is {json_type(value)}, not a string or an image / audio "
                       "part (token ids are not accepted: send text)", f"input[{i}]",
                       "invalid_type")
    if kind not in rules.kinds:
        why = " (it has no image preprocessing: no preprocessor_config.json)" \
            if kind == "image" and rules.modality == "image+text" else ""
        raise ApiError(400, f"input[{i}] is {'a text' if kind == 'text' else 'an ' + kind}, "
                       f"but this model embeds {' and '.join(rules.kinds)}{why}", f"input[{i}]",
                       "unsupported_input")
    return item


def parse_texts(body: Any, rules: TextRules) -> tuple[list[Any], str | None, int]:
    """The fields every endpoint with ``input`` shares: ``input`` (a string or a list of
    items, module docstring), ``model`` and ``truncate``; (items, model, tokens), or an
    :class:`ApiError` naming the field."""
    if not isinstance(body, dict):
        raise ApiError(400, f"request body must be a JSON object, got {json_type(body)}")
    if "input" not in body:
        raise ApiError(400, "missing required field 'input' (a string or a list of strings)",
                       "input", "missing_field")
    raw = body["input"]
    texts = [raw] if isinstance(raw, str) else raw
    if not isinstance(texts, list):
        raise ApiError(400, f"'input' must be a string or a list of strings, got "
                       f"{json_type(raw)}", "input", "invalid_type")
    if not texts:
        raise ApiError(400, "'input' is an empty list", "input", "invalid_value")
    if len(texts) > rules.max_inputs:
        raise ApiError(400, f"'input' holds {len(texts)} texts, more than {rules.max_inputs} "
                       "in one request", "input", "too_many_inputs")
    texts = [_item(x, i, rules) for i, x in enumerate(texts)]
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, f"'model' must be a string, got {json_type(model)}", "model",
                       "invalid_type")
    truncate = body.get("truncate", False)
    if not isinstance(truncate, bool):
        raise ApiError(400, f"'truncate' must be true or false, got {truncate!r}", "truncate",
                       "invalid_type")
    where = [i for i, x in enumerate(texts) if isinstance(x, str)]
    counts = rules.token_counts([texts[i] for i in where])
    if not truncate:
        for i, n in zip(where, counts, strict=True):
            if n > rules.max_tokens:
                raise ApiError(400, f"input[{i}] is {n} tokens, over the model's context of "
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


class EmbeddingAPI(CheckedRequestsAPI):
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
        from multimodal.pipelines._loaders import served

        encoder, _ = served(self.path, "embed", compile=self.compile, quantize=self.quantize)
        self.encoder = encoder.to(device)

    def embed_texts(self, texts: list[Any]) -> np.ndarray:
        """``(N, D)`` float32 embeddings of the items of :class:`EmbeddingJob`: texts
        encoded shortest first, images and clips (by sample rate) in groups of their own."""
        import torch

        out = np.empty((len(texts), self.encoder.dim), dtype=np.float32)
        dual = self.encoder.modality == "image+text"
        words = [i for i, t in enumerate(texts) if isinstance(t, str)]
        if words:
            order = sorted(words, key=lambda i: len(texts[i]))
            emb = self.encoder.encode([texts[i] for i in order], batch_size=self.chunk,
                                      modality="text" if dual else None)
            out[order] = emb.float().cpu().numpy()
        groups: dict[Any, list[int]] = {}
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                groups.setdefault((t[0], t[2] if t[0] == "audio" else None), []).append(i)
        for (kind, rate), index in groups.items():
            if kind == "image":
                images = [torch.from_numpy(np.array(texts[i][1])).permute(2, 0, 1)
                          for i in index]
                emb = self.encoder.encode(images, batch_size=self.chunk,
                                          modality="image" if dual else None)
            else:
                clips = [torch.from_numpy(np.array(texts[i][1])) for i in index]
                emb = self.encoder.encode(clips, batch_size=self.chunk, sample_rate=rate)
            out[index] = emb.float().cpu().numpy()
        return out

    def predict(self, x: Any, **kwargs: Any) -> Any:
        """Per request: its rows and how many requests shared the batch (the response's
        ``X-Batch-Requests`` header)."""
        if x and not isinstance(x[0], list):  # max_batch_size 1: one request's items
            return self.embed_texts(x), 1
        rows = self.embed_texts([t for texts in x for t in texts])
        out, start = [], 0
        for texts in x:
            out.append((rows[start:start + len(texts)], len(x)))
            start += len(texts)
        return out

    def encode_response(self, output: Any, **kwargs: Any) -> Any:
        return output
