"""The LitServe plumbing our endpoints share: a :class:`litserve.specs.base.LitSpec` whose
endpoints run in the API server process, check the request there (so a bad request is
refused alone, never failing the batch it would have joined), put a clean payload on the
worker's queue, and wait for the worker's answer."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import litserve as ls
from litserve.specs.base import LitSpec
from litserve.utils import LitAPIStatus, ResponseBufferItem
from starlette.exceptions import HTTPException
from starlette.requests import Request

from multimodal.serve.errors import ApiError


async def read_json(request: Request) -> Any:
    """The request's JSON body, or a 400 saying why it is not JSON."""
    raw = await request.body()
    if not raw:
        raise ApiError(400, "request body is empty: send a JSON object", None, "invalid_json")
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ApiError(400, f"request body is not valid JSON: {err}", None,
                       "invalid_json") from None


class QueueSpec(LitSpec):
    """Base of our specs: :meth:`submit` sends one payload to the inference worker."""

    def __init__(self, api_path: str) -> None:
        super().__init__()
        self.api_path = api_path

    def decode_request(self, request: Any, context_kwargs: dict | None = None) -> Any:
        return request

    def encode_response(self, output: Any, context_kwargs: dict | None = None) -> Any:
        return output

    async def submit(self, payload: Any) -> Any:
        """The worker's output for ``payload``; its error re-raised (4xx kept, else 500)."""
        uid = uuid.uuid4()
        event = asyncio.Event()
        self.response_buffer[uid] = ResponseBufferItem(event=event)
        try:
            self.request_queue.put((self.response_queue_id, uid, time.monotonic(), payload))
            await event.wait()
            response, status = self.response_buffer.pop(uid).response
        finally:
            self.response_buffer.pop(uid, None)
        if status == LitAPIStatus.ERROR:
            if isinstance(response, HTTPException):
                raise response
            raise ApiError(500, "the model failed on this request", None, "internal_error")
        return response


class CheckedRequestsAPI(ls.LitAPI):
    """A LitAPI whose requests reach it already checked and decoded (by its
    :class:`QueueSpec`, in the HTTP process) and whose batches are plain lists of them: the
    worker's decode, batch and unbatch steps pass them through."""

    def decode_request(self, request: Any, **kwargs: Any) -> Any:
        return request

    def batch(self, inputs: list[Any]) -> list[Any]:
        return list(inputs)

    def unbatch(self, output: list[Any]) -> list[Any]:
        return output
