"""Errors the proxy answers itself, in the shape of the API the client speaks.

* :class:`ClientError`: a request the proxy refuses (``status``, a message, the field at fault),
  or an upstream it could not use (502); raised anywhere on the request path and turned into a
  response by the endpoint: OpenAI's ``{"error": {"message", "type", "param", "code"}}`` for Chat
  Completions and the Responses API (:func:`openai_error`), Anthropic's ``{"type": "error",
  "error": {"type", "message"}}`` for the Messages API (:func:`anthropic_error`).
* Routes the proxy does not serve: 404 (or 405) in the provider's error shape (:func:`not_found`):
  Anthropic's ``{"type": "error", "error": {"type": "not_found_error", "message"}}`` when the
  request looks like Anthropic's (an ``anthropic-version`` header, or a path under
  ``/v1/messages``), else OpenAI's under ``/v1/``; FastAPI's own shape elsewhere.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, Response

SERVED = ("POST /v1/chat/completions, POST /v1/responses, POST /v1/messages, POST /v1/messages/count_tokens, "
          "GET /v1/models")


class ClientError(Exception):
    """A bad request: ``status``, a message and the field at fault."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.status = param, status


def too_large(limit: int) -> str:
    """The message of a 413: the body is over ``limit`` bytes."""
    return f"request body exceeds the proxy's size limit of {limit} bytes (historygraph serve --max-body-bytes)"


def error_type(status: int) -> str:
    """The providers' error ``type`` for an HTTP status: ``api_error`` for a failure on the server's
    side (5xx, e.g. an unreachable upstream), else the client's request is at fault."""
    return "request_too_large" if status == 413 else "api_error" if status >= 500 else "invalid_request_error"


def openai_error(exc: ClientError) -> JSONResponse:
    """``exc`` in OpenAI's error shape (Chat Completions, Responses, models)."""
    kind = error_type(exc.status)
    return JSONResponse({"error": {"message": str(exc), "type": kind, "param": exc.param, "code": None}}, exc.status)


def anthropic_error(exc: ClientError) -> JSONResponse:
    """``exc`` in Anthropic's error shape (Messages, token counting)."""
    kind = error_type(exc.status)
    return JSONResponse({"type": "error", "error": {"type": kind, "message": str(exc)}}, exc.status)


def looks_anthropic(request: Request) -> bool:
    """Whether a request is an Anthropic client's: an ``anthropic-version`` header or a path
    under ``/v1/messages``."""
    return "anthropic-version" in request.headers or request.url.path.startswith("/v1/messages")


async def not_found(request: Request, exc: Exception) -> Response:
    """Routing errors (404, 405) under ``/v1/`` in the provider's error shape; any other HTTP
    error, and any path outside ``/v1/``, as FastAPI answers it."""
    status = getattr(exc, "status_code", 500)
    if not request.url.path.startswith("/v1/") or status not in (404, 405):
        return await http_exception_handler(request, exc)  # type: ignore[arg-type]
    what = "no route" if status == 404 else "method not allowed for"
    message = f"historygraph proxy: {what} {request.method} {request.url.path}; it serves {SERVED}"
    if looks_anthropic(request):
        kind = "not_found_error" if status == 404 else "invalid_request_error"
        return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status)
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                   "code": "unknown_url" if status == 404 else "method_not_allowed"}}, status)
