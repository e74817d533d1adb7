"""The proxy's other routes: the OpenAI Responses API, Anthropic's token counting, and provider-shaped
errors for routes it does not serve.

* ``POST /v1/responses``: the request's ``instructions`` and ``input`` are converted to canonical
  events (:mod:`historygraph.providers.openai_responses`), routed to a session, rendered under B and
  forwarded with every other field unchanged (``tools``, ``tool_choice``, ``store``, ``include``,
  ``reasoning`` …), streamed or not, exactly as the other two APIs (:meth:`Proxy.forward`). A request
  that names state the provider keeps (``previous_response_id``, ``conversation``) or sends no
  ``input`` is forwarded byte for byte, stores nothing, and is marked
  ``X-HistoryGraph-Passthrough: <field>`` and logged.
* ``POST /v1/messages/count_tokens``: ``{"input_tokens": N}`` (Anthropic's shape), N = the
  proxy's token counter (:class:`~historygraph.signals.tokens.TokenCounter`, the counter that
  enforces B) over the messages as they would be forwarded after rendering, plus the tool schemas'
  JSON text (:meth:`TokenCalibration.estimate_request`). Nothing is stored and the upstream is not
  asked.
* Any other route: 404 (or 405) in the provider's error shape: Anthropic's
  ``{"type": "error", "error": {"type": "not_found_error", "message"}}`` when the request looks like
  Anthropic's (an ``anthropic-version`` header, or a path under ``/v1/messages``), else OpenAI's
  ``{"error": {"message", "type", "param", "code"}}`` under ``/v1/``; FastAPI's own shape elsewhere.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException

from historygraph.history.events import EventError
from historygraph.providers import anthropic as anth
from historygraph.providers import openai_responses as resp
from historygraph.history.graph import ContextGraph
from historygraph.server.upstream import forward_headers, response_headers, unreachable_message

log = logging.getLogger("historygraph.server")

PASSTHROUGH_HEADER = "x-historygraph-passthrough"
SERVED = ("POST /v1/chat/completions, POST /v1/responses, POST /v1/messages, POST /v1/messages/count_tokens, "
          "GET /v1/models")


def add_routes(app: FastAPI) -> None:
    """Register this module's routes and the not-found handler on the proxy's ``app`` (its
    ``app.state.proxy`` is the :class:`~historygraph.server.app.Proxy`)."""
    app.add_api_route("/v1/responses", create_response, methods=["POST"], tags=["proxy"],
                      summary="OpenAI Responses, rendered and forwarded")
    app.add_api_route("/v1/messages/count_tokens", count_tokens, methods=["POST"], tags=["proxy"],
                      summary="Anthropic token count of the request as it would be forwarded")
    app.add_exception_handler(HTTPException, not_found)


async def create_response(request: Request) -> Response:
    """``POST /v1/responses`` (see the module docstring)."""
    from historygraph.server.app import ARRIVAL, ClientError, _openai_error, run_in_threadpool

    proxy = request.app.state.proxy
    started = getattr(request.state, ARRIVAL, None) or time.perf_counter()
    url = proxy.config.upstream.rstrip("/") + "/responses"
    try:
        body = await proxy.read_json(request, require=None)
        reason = resp.passthrough_reason(body) or (None if body.get("input") else "input")
        if reason is not None:
            return await passthrough(proxy, request, url, reason)
        sid, policy, budget = proxy.options(request)

        def convert_and_prepare() -> tuple[Any, ...]:
            try:
                messages, pieces = resp.to_canonical(body.get("instructions"), body["input"])
            except EventError as exc:
                raise ClientError(str(exc), "input") from None
            return (*proxy.prepare(messages, sid, policy, budget), pieces)

        sid, rendering, sent_tokens, pieces = await run_in_threadpool(convert_and_prepare)
        items = body["input"] if isinstance(body["input"], str) else resp.from_canonical(
            rendering.messages, [pieces[p] if p is not None and p < len(pieces) else None for p in rendering.positions])
        return await proxy.forward(url, {**body, "input": items}, request, sid, started, resp.StreamAccumulator,
                                   sent_tokens, policy, extra=proxy.notes(rendering))
    except ClientError as exc:
        return _openai_error(exc)


async def passthrough(proxy: Any, request: Request, url: str, reason: str) -> Response:
    """Forward the request's body byte for byte to ``url`` and relay the answer (streamed as it
    arrives when it is an event stream), marked ``X-HistoryGraph-Passthrough: <reason>``; nothing
    is stored."""
    from historygraph.server.app import ClientError

    log.info("passthrough", extra={"reason": reason, "path": request.url.path})
    headers = forward_headers(request.headers)
    headers.setdefault("content-type", "application/json")
    try:
        up = await proxy.send(proxy.request("POST", url, content=request.state.historygraph_body, headers=headers))
    except httpx.HTTPError as exc:
        raise ClientError(unreachable_message(url, exc, timeout=proxy.config.timeout), "upstream", 502) from None
    ours = {PASSTHROUGH_HEADER: reason}
    if up.headers.get("content-type", "").startswith("text/event-stream"):
        return StreamingResponse(up.aiter_raw(), up.status_code, {**response_headers(up.headers), **ours},
                                 background=BackgroundTask(up.aclose))
    try:
        content = await up.aread()
    finally:
        await up.aclose()
    return Response(content, up.status_code, {**response_headers(up.headers), **ours})


async def count_tokens(request: Request) -> Response:
    """``POST /v1/messages/count_tokens`` (see the module docstring); the session header, policy
    and budget headers are read as for ``/v1/messages``."""
    from historygraph.server.app import ClientError, _anthropic_error, run_in_threadpool

    proxy = request.app.state.proxy
    try:
        body = await proxy.read_json(request)
        _, policy, budget = proxy.options(request)

        def count() -> int:
            try:
                messages, _ = anth.to_canonical(body.get("system"), body["messages"])
                graph = ContextGraph("count_tokens", messages)
            except EventError as exc:
                raise ClientError(str(exc), "messages") from None
            b = proxy.calibration.adjusted_budget(budget) if proxy.config.calibrate else budget
            rendering = proxy.render_or_smallest(graph, policy, max(1, b))
            return proxy.calibration.estimate_request(rendering.messages, body.get("tools"))

        return JSONResponse({"input_tokens": await run_in_threadpool(count)})
    except ClientError as exc:
        return _anthropic_error(exc)


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
