"""One ASGI middleware in front of every route: API key, payload size, queue bound, drain.

* ``api_key``: every route but ``/health`` needs ``Authorization: Bearer <key>``, compared in
  constant time (:func:`hmac.compare_digest`); otherwise 401.
* ``max_bytes``: a body over it (by ``Content-Length``, or counted as it streams in) -> 413.
* ``max_queue``: POST requests in flight (waiting or running, across all API server
  processes: the counter is shared memory) beyond it -> 503 with ``Retry-After``, instead of
  latency growing without bound.
* ``draining``: once set (SIGTERM), new POST requests get 503 while those in flight finish.
"""

from __future__ import annotations

import hmac
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from multimodal.serve.errors import ApiError, error_bytes

OPEN_PATHS = ("/health",)


async def _reply(send: Send, status: int, message: str, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
    body = error_bytes(status, message, param, code)
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """The middleware (module docstring). ``inflight`` and ``draining`` are
    ``multiprocessing.Value("i")`` made before the API server processes fork."""

    def __init__(self, app: ASGIApp, *, inflight: Any, draining: Any,
                 api_key: str | None = None, max_bytes: int | None = None,
                 max_queue: int | None = None, retry_after_s: int = 1) -> None:
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.max_bytes = max_bytes
        self.max_queue = max_queue
        self.inflight = inflight
        self.draining = draining
        self.retry_after = str(retry_after_s)

    def _authorized(self, scope: Scope) -> bool:
        if self.api_key is None or scope["path"] in OPEN_PATHS:
            return True
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                return scheme.lower() == b"bearer" \
                    and hmac.compare_digest(token.strip(), self.api_key)
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self._authorized(scope):
            await _reply(send, 401, "missing or wrong API key: send 'Authorization: Bearer "
                         "<key>'", None, "invalid_api_key", {"WWW-Authenticate": "Bearer"})
            return
        if scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        if self.draining.value:
            await _reply(send, 503, "the server is shutting down", None, "shutting_down",
                         {"Retry-After": self.retry_after, "Connection": "close"})
            return
        if self.max_bytes is not None:
            for name, value in scope.get("headers", ()):
                if name == b"content-length" and value.isdigit() \
                        and int(value) > self.max_bytes:
                    await _reply(send, 413, f"request body is {int(value)} bytes, over the "
                                 f"server's limit of {self.max_bytes} (--max_request_mb)",
                                 None, "payload_too_large")
                    return
        with self.inflight.get_lock():
            full = self.max_queue is not None and self.inflight.value >= self.max_queue
            if not full:
                self.inflight.value += 1
        if full:
            await _reply(send, 503, f"the server has {self.max_queue} requests in flight "
                         "(--max_queue): retry later", None, "queue_full",
                         {"Retry-After": self.retry_after})
            return
        try:
            await self.app(scope, self._counted(receive), send)
        finally:
            with self.inflight.get_lock():
                self.inflight.value -= 1

    def _counted(self, receive: Receive) -> Receive:
        if self.max_bytes is None:
            return receive
        seen = 0
        limit = self.max_bytes

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                raise ApiError(413, f"request body is over the server's limit of {limit} "
                               "bytes (--max_request_mb)", None, "payload_too_large")
            return message

        return counted
