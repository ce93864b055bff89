"""``POST /v1/zero-shot`` (ours; OpenAI has no such endpoint) for a CLIP / SigLIP model,
served beside ``/v1/embeddings`` by the same worker, with dynamic batching.

Request ``{"input": image | [image], "labels": [str, ...], "templates"?: [str, ...],
"top_k"?: int, "model"?: str}``: an image is a base64 data URL or an ``{"image_url": ...}``
part, as ``/v1/embeddings`` takes it (:func:`~multimodal.serve.embeddings.parse_texts`);
labels are stripped of surrounding spaces (as :func:`multimodal.pipelines.zero_shot.
zero_shot` does),
at least two, none empty or repeated; each template holds one ``{}`` where the label goes
(default ``"a photo of a {}."``). Response, in the style of ``/v1/classify``:
``{"object": "list", "data": [{"index", "label", "score", "probabilities": {label: p}}],
"model", "activation"}`` with ``probabilities`` the ``top_k`` most likely labels (default:
all), most likely first. The probabilities are those of :func:`multimodal.zero_shot` (one
formula, :class:`multimodal.pipelines.zero_shot.ZeroShotClasses`): ``softmax(s · Î Cᵀ)`` over the
labels for CLIP, each label's ``sigmoid(s · Î Cᵀ + b)`` for SigLIP (``activation`` says
which).

Batching: the images of every request in a worker call (zero-shot and embeddings requests
alike) are embedded together; each request's rows then meet its own label set's class
embeddings, computed once per (labels, templates) and kept (the ``cache_size`` most
recently used sets) for the requests that repeat them. An image's probabilities do not
depend on what it was batched with (tested).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from multimodal.serve.embeddings import (
    EmbeddingAPI,
    EmbeddingSpec,
    TextRules,
    json_type,
    parse_texts,
)
from multimodal.serve.errors import ApiError
from multimodal.serve.spec import read_json

ZERO_SHOT_PATH = "/v1/zero-shot"
DEFAULT_TEMPLATE = "a photo of a {}."


@dataclass
class ZeroShotJob:
    """A checked request as the worker takes it: images (``("image", uint8 HWC)``), the
    label set and its templates."""

    images: list[Any]
    labels: tuple[str, ...]
    templates: tuple[str, ...]


def _is_text(value: Any) -> bool:
    return (isinstance(value, str) and not value.startswith("data:")) or \
        (isinstance(value, dict) and value.get("type") == "text")


def _labels(body: dict[str, Any], max_labels: int) -> tuple[str, ...]:
    if "labels" not in body:
        raise ApiError(400, "missing required field 'labels' (a list of at least two class "
                       "names)", "labels", "missing_field")
    raw = body["labels"]
    if not isinstance(raw, list):
        raise ApiError(400, f"'labels' must be a list of strings, got {json_type(raw)}", "labels",
                       "invalid_type")
    if len(raw) > max_labels:
        raise ApiError(400, f"'labels' holds {len(raw)} labels, more than {max_labels}",
                       "labels", "too_many_inputs")
    labels: list[str] = []
    for i, label in enumerate(raw):
        if not isinstance(label, str):
            raise ApiError(400, f"labels[{i}] must be a string, got {json_type(label)}",
                           f"labels[{i}]", "invalid_type")
        label = label.strip()
        if not label:
            raise ApiError(400, f"labels[{i}] is empty", f"labels[{i}]", "invalid_value")
        if label in labels:
            raise ApiError(400, f"labels[{i}] repeats {label!r}", f"labels[{i}]",
                           "invalid_value")
        labels.append(label)
    if len(labels) < 2:
        raise ApiError(400, f"'labels' must hold at least two labels, got {len(labels)}",
                       "labels", "invalid_value")
    return tuple(labels)


def _templates(body: dict[str, Any]) -> tuple[str, ...]:
    raw = body.get("templates")
    if raw is None:
        return (DEFAULT_TEMPLATE,)
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "'templates' must be a non-empty list of strings with one '{}' "
                       f"where the label goes, got {json_type(raw)}", "templates", "invalid_type")
    for i, t in enumerate(raw):
        if not isinstance(t, str):
            raise ApiError(400, f"templates[{i}] must be a string, got {json_type(t)}",
                           f"templates[{i}]", "invalid_type")
        try:
            ok = "{}" in t and t.format("") is not None
        except (IndexError, KeyError, ValueError):
            ok = False
        if not ok:
            raise ApiError(400, f"templates[{i}] must hold exactly one '{{}}' (where the label "
                           f"goes) and no other braces, got {t!r}", f"templates[{i}]",
                           "invalid_value")
    return tuple(raw)


def parse_zero_shot(body: Any, rules: TextRules) -> tuple[ZeroShotJob, str | None, int]:
    """(job, model, top_k) of a zero-shot request (module docstring); :class:`ApiError`
    naming the field otherwise."""
    if not isinstance(body, dict):
        raise ApiError(400, f"request body must be a JSON object, got {json_type(body)}")
    if isinstance(body.get("input"), dict):  # one image part
        body = {**body, "input": [body["input"]]}
    raw = body.get("input")
    for i, value in enumerate(raw if isinstance(raw, list) else [raw]):
        if _is_text(value):
            raise ApiError(400, f"input[{i}] is a text: /v1/zero-shot classifies images (data "
                           "URLs or image_url parts); the class names go in 'labels'",
                           f"input[{i}]", "unsupported_input")
    images, model, _ = parse_texts(body, rules)
    labels = _labels(body, rules.max_inputs)
    templates = _templates(body)
    top_k = body.get("top_k", len(labels))
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ApiError(400, f"'top_k' must be a whole number >= 1, got {top_k!r}", "top_k",
                       "invalid_value")
    return ZeroShotJob(images, labels, templates), model, top_k


def zero_shot_payload(probs: np.ndarray, labels: tuple[str, ...], top_k: int, model: str,
                      activation: str) -> dict[str, Any]:
    """The response object for ``probs`` ``(N, C)`` (module docstring)."""
    data = []
    for i, row in enumerate(probs):
        order = np.argsort(-row, kind="stable")[:top_k]
        data.append({"index": i, "label": labels[order[0]], "score": float(row[order[0]]),
                     "probabilities": {labels[j]: float(row[j]) for j in order}})
    return {"object": "list", "data": data, "model": model, "activation": activation}


class ClipSpec(EmbeddingSpec):
    """``POST /v1/embeddings`` and ``POST /v1/zero-shot`` of a CLIP / SigLIP; checks requests
    in the API process."""

    def __init__(self, rules: TextRules, model_name: str, activation: str) -> None:
        super().__init__(rules, model_name)
        self.activation = activation
        self.add_endpoint(ZERO_SHOT_PATH, self.zero_shot, ["POST"])

    async def zero_shot(self, request: Request) -> Response:
        job, model, top_k = parse_zero_shot(await read_json(request), self.rules)
        probs, batched = await self.submit(job)
        body = zero_shot_payload(probs, job.labels, top_k, model or self.model_name,
                                 self.activation)
        return Response(json.dumps(body), media_type="application/json",
                        headers={"X-Batch-Requests": str(batched)})


class ClipAPI(EmbeddingAPI):
    """The inference worker of a CLIP / SigLIP: embeddings requests as
    :class:`EmbeddingAPI` serves them and :class:`ZeroShotJob` requests, their images
    embedded in one pass (module docstring)."""

    def __init__(self, path: str, spec: ClipSpec, *, cache_size: int = 64,
                 **kwargs: Any) -> None:
        super().__init__(path, spec, **kwargs)
        self.cache_size = cache_size

    def setup(self, device: str) -> None:
        super().setup(device)
        self.heads: OrderedDict[tuple[Any, ...], Any] = OrderedDict()

    def head(self, labels: tuple[str, ...], templates: tuple[str, ...]) -> Any:
        """The label set's :class:`~multimodal.pipelines.zero_shot.ZeroShotClasses`,
        computed once."""
        from multimodal.pipelines.zero_shot import ZeroShotClasses

        key = (labels, templates)
        if key in self.heads:
            self.heads.move_to_end(key)
        else:
            self.heads[key] = ZeroShotClasses.of(self.encoder, labels, templates)
            while len(self.heads) > self.cache_size:
                self.heads.popitem(last=False)
        return self.heads[key]

    def predict(self, x: Any, **kwargs: Any) -> Any:
        import torch

        single = isinstance(x, ZeroShotJob) or (bool(x) and not isinstance(
            x[0], (list, ZeroShotJob)))  # max_batch_size 1: one request
        jobs = [x] if single else x
        items = [t for job in jobs for t in (job.images if isinstance(job, ZeroShotJob)
                                              else job)]
        rows = self.embed_texts(items)
        out, start = [], 0
        for job in jobs:
            n = len(job.images) if isinstance(job, ZeroShotJob) else len(job)
            mine = rows[start:start + n]
            start += n
            if isinstance(job, ZeroShotJob):
                head = self.head(job.labels, job.templates)
                mine = head.probabilities(torch.from_numpy(mine)).numpy()
            out.append((mine, len(jobs)))
        return out[0] if single else out


def not_served_route(model_name: str, kind: str, clip: bool = False) -> Any:
    """``POST /v1/zero-shot`` of a server that does not serve it (a model that is no CLIP /
    SigLIP, or one without its image preprocessing): a 404 that says why."""
    why = f"{model_name} has no image preprocessing (no preprocessor_config.json): it " \
        "embeds texts only" if clip else f"{model_name} is none (served as {kind!r})"

    async def zero_shot(request: Request) -> Response:
        raise ApiError(404, f"/v1/zero-shot needs a CLIP / SigLIP (image+text) model with its "
                       f"image preprocessing; {why}", None, "not_found")

    return zero_shot
