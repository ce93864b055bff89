"""Errors as the OpenAI API returns them: ``{"error": {"message", "type", "param", "code"}}``
with a 4xx status that names the offending field in ``param``."""

from __future__ import annotations

import json
from typing import Any

from fastapi import HTTPException as FastAPIHTTPException
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          413: "invalid_request_error", 422: "invalid_request_error",
          503: "server_overloaded", 504: "timeout"}


_CODES = {400: "invalid_request", 401: "invalid_api_key", 404: "not_found",
          405: "method_not_allowed", 413: "payload_too_large", 422: "invalid_value",
          503: "unavailable", 504: "timeout"}
"""The ``code`` of an error raised without one (a framework's own 404 / 405, ...)."""

_PYDANTIC_CODES = {"missing": "missing_field", "json_invalid": "invalid_json",
                   "extra_forbidden": "unknown_field"}
"""pydantic's error ``type`` -> our ``code``; a type ending in ``_type`` or ``_parsing`` is
``invalid_type``, any other ``invalid_value``."""


def pydantic_code(kind: str) -> str:
    """The ``code`` of a pydantic validation error of type ``kind``."""
    if kind in _PYDANTIC_CODES:
        return _PYDANTIC_CODES[kind]
    if kind.endswith(("_type", "_parsing")) or kind in ("model_attributes_type",):
        return "invalid_type"
    return "invalid_value"


class ApiError(FastAPIHTTPException):
    """A request the server refuses: ``status`` (4xx / 503), a one-line ``message`` and the
    field it is about (``param``, e.g. ``"input[3]"``). FastAPI's kind of HTTPException, so
    that LitServe's OpenAI spec passes one raised by a chat worker on as the 4xx it is."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(status_code=status, detail=message, headers=headers)
        self.param = param
        self.code = code

    def portable(self) -> FastAPIHTTPException:
        """This error as it survives the trip from an inference worker to the HTTP process
        (LitServe pickles only status and detail): message, param and code in ``detail``,
        unpacked again by :func:`http_exception_handler`."""
        return FastAPIHTTPException(self.status_code, {"message": self.detail,
                                                       "param": self.param,
                                                       "code": self.code}, self.headers)


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
    param, code = getattr(exc, "param", None), getattr(exc, "code", None)
    detail = exc.detail
    if isinstance(detail, dict) and isinstance(detail.get("message"), str):  # portable()
        param, code, detail = detail.get("param"), detail.get("code"), detail["message"]
    detail = detail if isinstance(detail, str) else json.dumps(detail)
    if exc.status_code >= 500 and not isinstance(exc, ApiError):
        detail = detail or "internal server error"
    code = code or _CODES.get(exc.status_code)
    return error_response(exc.status_code, detail, param, code, getattr(exc, "headers", None))


async def validation_exception_handler(request: Request, exc: Exception) -> Response:
    """FastAPI's request validation (pydantic) as a 400 naming the first bad field."""
    errors = getattr(exc, "errors", lambda: [])()
    if not errors:
        return error_response(400, "invalid request", None, "invalid_request")
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = loc[0] + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in loc[1:]) \
        if loc else None
    if first.get("type") == "json_invalid":
        return error_response(400, "request body is not valid JSON", None, "invalid_json")
    return error_response(400, f"{param or 'body'}: {first.get('msg', 'invalid value')}", param,
                          pydantic_code(str(first.get("type", ""))))
