"""``POST /v1/classify`` (ours; OpenAI has no such endpoint) for a text classifier checkpoint
(a ``.ckpt`` of :class:`~multimodal.tasks.classification.ClassificationTask`), with dynamic
batching.

Request ``{"input": str | [str], "model"?, "truncate"?, "top_k"?}``, checked as
``/v1/embeddings`` checks it; response ``{"object": "list", "data": [{"index", "label",
"score", "probabilities": {class name: p}}], "model", "usage"}``: the softmax of the
classifier's logits (the task's own forward: the head on the [CLS] token), labels named
by the class names the checkpoint recorded from its data, ``probabilities`` the ``top_k``
most likely (default: all classes).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from multimodal.pipelines._loaders import classifier
from multimodal.serve.embeddings import TextRules, parse_texts
from multimodal.serve.errors import ApiError
from multimodal.serve.spec import CheckedRequestsAPI, QueueSpec, read_json


class ClassifySpec(QueueSpec):
    """Registers ``POST /v1/classify``; checks requests in the API process."""

    def __init__(self, rules: TextRules, names: list[str], model_name: str) -> None:
        super().__init__("/v1/classify")
        self.rules = rules
        self.names = names
        self.model_name = model_name
        self.add_endpoint(self.api_path, self.classify, ["POST"])

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["rules"] = None
        return state

    async def classify(self, request: Request) -> Response:
        body = await read_json(request)
        texts, model, tokens = parse_texts(body, self.rules)
        top_k = body.get("top_k", len(self.names))
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ApiError(400, f"'top_k' must be a whole number >= 1, got {top_k!r}", "top_k",
                           "invalid_value")
        probs = await self.submit(texts)
        data = []
        for i, row in enumerate(probs):
            order = np.argsort(-row, kind="stable")[:top_k]
            data.append({"index": i, "label": self.names[order[0]],
                         "score": float(row[order[0]]),
                         "probabilities": {self.names[j]: float(row[j]) for j in order}})
        payload = {"object": "list", "data": data, "model": model or self.model_name,
                   "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
        return Response(json.dumps(payload), media_type="application/json")


class ClassifyAPI(CheckedRequestsAPI):
    """The inference worker: the texts of a batch of requests classified together."""

    def __init__(self, path: str, spec: ClassifySpec, *, max_batch_size: int = 32,
                 batch_timeout: float = 0.01, chunk: int = 64) -> None:
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout,
                         spec=spec)
        self.path = path
        self.chunk = chunk

    def setup(self, device: str) -> None:
        self.encoder, self.model, _ = classifier(self.path)
        self.encoder.to(device)

    def probabilities(self, texts: list[str]) -> np.ndarray:
        import torch

        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.empty((len(texts), int(self.model.config.num_classes)), dtype=np.float32)
        with torch.no_grad():
            for start in range(0, len(texts), self.chunk):
                index = order[start:start + self.chunk]
                ids, mask = self.encoder._tokenize([texts[i] for i in index], None,
                                                   self.encoder.device)
                logits = self.model.classify(self.model(ids, attention_mask=mask))
                out[index] = torch.softmax(logits.float(), dim=-1).cpu().numpy()
        return out

    def predict(self, x: Any, **kwargs: Any) -> Any:
        if x and isinstance(x[0], str):  # max_batch_size 1
            return self.probabilities(x)
        rows = self.probabilities([t for texts in x for t in texts])
        out, start = [], 0
        for texts in x:
            out.append(rows[start:start + len(texts)])
            start += len(texts)
        return out

    def encode_response(self, output: Any, **kwargs: Any) -> Any:
        return output
