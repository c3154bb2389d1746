"""OpenAI-style error responses: `{"error": {"message", "type", "code"}}` with a matching status."""

from __future__ import annotations

import orjson
from aiohttp import web

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}
HTTP_ERROR_CODES = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}
SSE_DONE = b"data: [DONE]\n\n"


class RouterHTTPError(Exception):
    """Raised inside handlers; rendered by `error_response`."""

    def __init__(self, status: int, message: str, code: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}


def error_body(status: int, message: str, code: str) -> dict:
    """The JSON error object for a status."""
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"), "code": code}}


def error_response(status: int, message: str, code: str, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON error response in the OpenAI format."""
    out = {"Content-Type": "application/json"}
    out.update(headers or {})
    return web.Response(body=orjson.dumps(error_body(status, message, code)), status=status, headers=out)


def sse_error_event(message: str, code: str) -> bytes:
    """Server-sent events that end a broken stream: an error the OpenAI client raises, then `[DONE]`."""
    return b"data: " + orjson.dumps(error_body(502, message, code)) + b"\n\n" + SSE_DONE
