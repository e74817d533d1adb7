"""Errors the proxy answers itself, in the shape of the API the client speaks.

* :class:`ClientError`: a request the proxy refuses (``status``, a message, the field at fault),
  or an upstream it could not use (502); raised anywhere on the request path and turned into a
  response by the endpoint: OpenAI's ``{"error": {"message", "type", "param", "code"}}`` for Chat
  Completions and the Responses API (:func:`openai_error`), Anthropic's ``{"type": "error",
  "error": {"type", "message"}}`` for the Messages API (:func:`anthropic_error`), Google's
  ``{"error": {"code", "message", "status"}}`` for the Gemini API (:func:`google_error`).
* An upstream that answered but not usably (issue 38, class 3): a body cut after the headers, a
  2xx body that is not a JSON object (:func:`upstream_fault`: a 502 whose message says what the
  upstream did), or, once a stream has begun, an answer the proxy cannot read or a stream cut
  mid-way (:func:`stream_error`: the provider's own error event ends the stream). Nothing is
  stored as the answer; the request's messages are, so sending the request again continues the
  session.
* A full disk under the store (issue 38, class 6; :func:`store_full`): 507 Insufficient Storage,
  ``api_error``, saying so; the request was not forwarded and nothing of it was stored.
* Routes the proxy does not serve: 404 (or 405) in the provider's error shape (:func:`not_found`):
  Anthropic's ``{"type": "error", "error": {"type": "not_found_error", "message"}}`` when the
  request looks like Anthropic's (an ``anthropic-version`` header, or a path under
  ``/v1/messages``), else OpenAI's under ``/v1/``; Google's under ``/v1beta/`` (a 404 ``NOT_FOUND``
  also for a wrong method); FastAPI's own shape elsewhere.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, Response

from historygraph.server.config import masked_url

SERVED = ("POST /v1/chat/completions, POST /v1/responses, POST /v1/messages, POST /v1/messages/count_tokens, "
          "GET /v1/models, POST /v1beta/models/{model}:generateContent, :streamGenerateContent and :countTokens, "
          "GET /v1beta/models")
GOOGLE_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
                 409: "ABORTED", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED", 500: "INTERNAL",
                 502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED", 507: "RESOURCE_EXHAUSTED"}
"""The ``status`` of Google's error body per HTTP status (the canonical codes of Google's API
design guide, "Errors", https://cloud.google.com/apis/design/errors; 413 and 507, which have no
code of their own there, as their nearest)."""


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


def google_error(exc: ClientError) -> JSONResponse:
    """``exc`` in Google's error shape (the Gemini API): ``{"error": {"code", "message", "status"}}``,
    ``status`` from :data:`GOOGLE_STATUS` (``UNKNOWN`` for a status not there); the field at
    fault is named in the message."""
    return JSONResponse({"error": {"code": exc.status, "message": str(exc), "status": GOOGLE_STATUS.get(exc.status, "UNKNOWN")}},
                        exc.status)


def anthropic_error(exc: ClientError) -> JSONResponse:
    """``exc`` in Anthropic's error shape (Messages, token counting)."""
    kind = error_type(exc.status)
    return JSONResponse({"type": "error", "error": {"type": kind, "message": str(exc)}}, exc.status)


RETRY = "nothing was stored as its answer; sending the request again continues the session"


def upstream_fault(url: str, status: int, what: str) -> ClientError:
    """The 502 for an upstream at ``url`` that answered HTTP ``status`` unusably: ``what`` it did."""
    return ClientError(f"upstream {masked_url(url)} answered HTTP {status} but {what}; {RETRY}", "upstream", 502)


def store_full(exc: BaseException) -> ClientError:
    """The 507 for a request whose messages could not be stored because the store's disk is full
    (``exc``: the :class:`~historygraph.store.StoreFullError`). The proxy forwards nothing it has
    not stored, so the request was not sent upstream. The message does not name the store's file
    (:attr:`StoreFullError.reason`): the proxy's log does."""
    return ClientError(f"historygraph proxy: {getattr(exc, 'reason', None) or exc}; the request was not forwarded and nothing of it was stored. "
                       f"Free space on the store's disk and send it again (GET /health reports the state)", "store", 507)


def not_json(content: bytes, content_type: str | None) -> str:
    """What an upstream did that sent ``content`` where a JSON object was due (for :func:`upstream_fault`)."""
    return (f"its body is not a JSON object ({content_type or 'no content-type'}, {len(content)} bytes, "
            f"starting {content[:60]!r})")


def stream_error(api: str, message: str, code: str) -> bytes:
    """The server-sent event that ends a stream the proxy cannot finish, as each provider sends an
    error mid-stream (its SDK raises it): Anthropic's ``event: error`` with ``{"type": "error",
    "error": {"type": "api_error", "message"}}``, the Responses API's ``event: error`` with
    ``{"type": "error", "code", "message", "param", "sequence_number"}``, and for Chat Completions
    a ``data:`` line holding ``{"error": {"message", "type"}}``, for the Gemini API one holding
    Google's ``{"error": {"code": 502, "message", "status": "UNAVAILABLE"}}`` (``api``:
    ``anthropic``, ``responses``, ``gemini`` or ``openai``; ``code``: the error's type or code, e.g.
    ``upstream_stream_cut``, in the message of Google's)."""
    data: dict[str, Any]
    if api == "anthropic":
        data = {"type": "error", "error": {"type": "api_error", "message": message}}
        return ("event: error\ndata: " + json.dumps(data) + "\n\n").encode()
    if api == "responses":
        data = {"type": "error", "code": code, "message": message, "param": None, "sequence_number": 0}
        return ("event: error\ndata: " + json.dumps(data) + "\n\n").encode()
    if api == "gemini":
        data = {"error": {"code": 502, "message": f"{code}: {message}", "status": "UNAVAILABLE"}}
        return ("data: " + json.dumps(data) + "\n\n").encode()
    return ("data: " + json.dumps({"error": {"message": message, "type": code}}) + "\n\n").encode()


def looks_anthropic(request: Request) -> bool:
    """Whether a request is an Anthropic client's: an ``anthropic-version`` header or a path
    under ``/v1/messages``."""
    return "anthropic-version" in request.headers or request.url.path.startswith("/v1/messages")


async def not_found(request: Request, exc: Exception) -> Response:
    """Routing errors (404, 405) under ``/v1/`` in the provider's error shape; any other HTTP
    error, and any path outside ``/v1/``, as FastAPI answers it."""
    status = getattr(exc, "status_code", 500)
    if request.url.path.startswith("/v1beta/") and status in (404, 405):
        return google_error(ClientError(f"historygraph proxy: no route {request.method} {request.url.path}; it serves {SERVED}",
                                        None, 404))
    if not request.url.path.startswith("/v1/") or status not in (404, 405):
        return await http_exception_handler(request, exc)  # type: ignore[arg-type]
    what = "no route" if status == 404 else "method not allowed for"
    message = f"historygraph proxy: {what} {request.method} {request.url.path}; it serves {SERVED}"
    if looks_anthropic(request):
        kind = "not_found_error" if status == 404 else "invalid_request_error"
        return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status)
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                   "code": "unknown_url" if status == 404 else "method_not_allowed"}}, status)
