"""Errors as the OpenAI API returns them: ``{"error": {"message", "type", "param", "code"}}``
with a 4xx status that names the offending field in ``param``."""

from __future__ import annotations

import json
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          413: "invalid_request_error", 422: "invalid_request_error",
          503: "server_overloaded", 504: "timeout"}


class ApiError(HTTPException):
    """A request the server refuses: ``status`` (4xx / 503), a one-line ``message`` and the
    field it is about (``param``, e.g. ``"input[3]"``)."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(status_code=status, detail=message, headers=headers)
        self.param = param
        self.code = code


def error_body(status: int, message: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    kind = _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None,
                   code: str | None = None, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse(error_body(status, message, param, code), status_code=status,
                        headers=headers)


def error_bytes(status: int, message: str, param: str | None = None,
                code: str | None = None) -> bytes:
    return json.dumps(error_body(status, message, param, code)).encode()


async def http_exception_handler(request: Request, exc: Exception) -> Response:
    """Every HTTPException (ours, FastAPI's, LitServe's 504 / 500) in the OpenAI shape."""
    assert isinstance(exc, HTTPException)
    detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
    if exc.status_code >= 500 and not isinstance(exc, ApiError):
        detail = detail or "internal server error"
    return error_response(exc.status_code, detail, getattr(exc, "param", None),
                          getattr(exc, "code", None), getattr(exc, "headers", None))


async def validation_exception_handler(request: Request, exc: Exception) -> Response:
    """FastAPI's request validation (pydantic) as a 400 naming the first bad field."""
    errors = getattr(exc, "errors", lambda: [])()
    if not errors:
        return error_response(400, "invalid request")
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = loc[0] + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in loc[1:]) \
        if loc else None
    if first.get("type") == "json_invalid":
        return error_response(400, "request body is not valid JSON", None, "invalid_json")
    return error_response(400, f"{param or 'body'}: {first.get('msg', 'invalid value')}", param)
